"""`KeyScroll`: a vertical scroll area that also takes the console's `j`/`k`."""

from __future__ import annotations

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
