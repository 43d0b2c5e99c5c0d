"""`DialogScreen`: a modal screen with buttons, whose buttons toasts never cover.

Textual stacks toasts from the bottom right of the screen (above the footer), where a
dialog's buttons are when it is centred or right-aligned. A dialog keeps its screen's
toast rack to the rows below its lowest button (`keep_toasts_below`), showing the newest
toast only (app.tcss: the rack's scrolling cannot be relied on to show the newest of a
stack taller than the room); a toast taller than the room is cut at the bottom. The
dialogs are laid out at the top of the screen with rows left below them for a toast
(app.tcss). The toasts not shown are not lost: those not expired show again on the screen
beneath once the dialog closes.

Every modal with buttons is one (tests/console/test_toasts.py checks it).
"""

from __future__ import annotations

from typing import TypeVar

from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Button

ResultT = TypeVar("ResultT")

#: Textual's container of a screen's toasts (absent where notifications are off: tests).
TOAST_RACK = "textual-toastrack"
#: Rows below the rack that Textual keeps free (its `margin-bottom`: the footer's row).
RACK_MARGIN = 1


class DialogScreen(ModalScreen[ResultT]):
    # Textual calls these as well as a subclass's own `on_mount` / `on_resize`.
    def on_mount(self) -> None:
        self.call_after_refresh(self.keep_toasts_below)

    def on_resize(self) -> None:
        self.call_after_refresh(self.keep_toasts_below)

    def keep_toasts_below(self) -> None:
        """The toast rack's height: the rows under the lowest button, once laid out."""
        try:
            rack = self.get_child_by_id(TOAST_RACK)
        except NoMatches:
            return
        bottoms = [button.region.bottom for button in self.query(Button)]
        if not bottoms:
            return
        rack.styles.max_height = max(0, self.size.height - RACK_MARGIN - max(bottoms))
