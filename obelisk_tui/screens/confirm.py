"""A yes/no question.

Toasts never cover its buttons: Textual stacks them from the bottom right of the screen,
where a centred dialog's buttons were. The dialog sits at the top, as tall as its
question, and its screen's toast rack is kept to the rows below it (`keep_toasts_below`),
showing the newest toast only (app.tcss: the rack's scrolling cannot be relied on to show
the newest of a stack taller than the room). The others are not lost: those not expired
show again on the screen beneath once the question is answered.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Button, Label

#: Textual's container of a screen's toasts (absent where notifications are off: tests).
TOAST_RACK = "textual-toastrack"
#: Rows below the rack that Textual keeps free (its `margin-bottom`).
RACK_MARGIN = 1


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "Yes"),
        Binding("n,escape", "answer(False)", "No"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Label(self.question, id="question")
            with Horizontal(id="confirm-buttons"):
                yield Button("Yes (y)", variant="error", id="yes")
                yield Button("No (n)", variant="primary", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()
        self.call_after_refresh(self.keep_toasts_below)

    def on_resize(self) -> None:
        self.call_after_refresh(self.keep_toasts_below)

    def keep_toasts_below(self) -> None:
        """The toast rack's height: the rows under the dialog, once it is laid out."""
        try:
            rack = self.get_child_by_id(TOAST_RACK)
        except NoMatches:
            return
        dialog = self.query_one("#confirm", Vertical).region
        rack.styles.max_height = max(0, self.size.height - RACK_MARGIN - dialog.bottom)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
