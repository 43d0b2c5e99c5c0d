"""`KeyScroll`: a vertical scroll area that also takes the console's `j`/`k`."""

from __future__ import annotations

from textual.actions import SkipAction
from textual.binding import Binding
from textual.containers import VerticalScroll


class KeyScroll(VerticalScroll):
    """Focused with its tab, so that the arrows, PgUp/PgDn, Home/End and `j`/`k`
    scroll what does not fit (`g`/`G` too) (the State and Result tabs)."""

    BINDINGS = [
        Binding("j", "scroll_down", "Down", show=False),
        Binding("k", "scroll_up", "Up", show=False),
        Binding("g", "scroll_home", "Top", show=False),
        Binding("G", "scroll_end", "Bottom", show=False),
    ]

    # Textual defers a line's scroll until after the next refresh but computes its target
    # when the key arrives: two keys between refreshes (`j j` typed fast, a held key, a
    # busy embedded engine) both aimed one line below the same place and one was lost.
    # These set the target at once, so each key moves on from where the last one aimed.

    def action_scroll_down(self) -> None:
        if not self.allow_vertical_scroll:
            raise SkipAction()
        self.scroll_down(immediate=True)

    def action_scroll_up(self) -> None:
        if not self.allow_vertical_scroll:
            raise SkipAction()
        self.scroll_up(immediate=True)
