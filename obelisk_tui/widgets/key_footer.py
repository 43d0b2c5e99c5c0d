"""`KeyFooter`: Textual's footer, with the keys that do not fit dropped whole.

Textual's `Footer` lays its keys out in a row and cuts the row at the terminal's edge, so
at 80–100 columns the last keys — the app's own, `? Help` among them — were cut mid-word
or missing. This footer measures its keys and, when they do not fit, leaves out the least
needed ones (`DROP_ORDER`), never `? Help`: the help screen lists every key.
"""

from __future__ import annotations

from collections.abc import Iterator

from textual import events
from textual.app import ComposeResult
from textual.widget import Widget
from textual.widgets import Footer
from textual.widgets._footer import FooterKey  # noqa: PLC2701 (textual internals, version pinned)

#: Dropped first to last when the keys do not fit; then the rest from the right.
#: `PALETTE` stands for the `^p palette` key docked on the right.
PALETTE = "<palette>"
DROP_ORDER = ("freeze", "components", PALETTE, "submit", "quit", "order", "parent", "mark")
#: Always shown.
KEEP = frozenset({"help"})


def key_width(key_display: str, description: str) -> int:
    """Columns a `FooterKey` takes in the footer's normal (not compact) style."""
    return len(key_display) + len(description) + 3 if description else len(key_display) + 2


def fitting(items: list[tuple[str, int]], width: int) -> set[int]:
    """The indices of `items` (action, columns) to leave out so that the rest fit `width`."""
    total = sum(columns for _, columns in items)
    dropped: set[int] = set()
    order = [i for name in DROP_ORDER for i, (action, _) in enumerate(items) if action == name]
    order += [i for i in reversed(range(len(items))) if i not in order and items[i][0] not in KEEP]
    for i in order:
        if total <= width:
            break
        dropped.add(i)
        total -= items[i][1]
    return dropped


class KeyFooter(Footer):
    """The footer of every screen and dialog of the console."""

    def compose(self) -> ComposeResult:
        keys = list(super().compose())
        if self.size.width == 0 or not all(isinstance(k, FooterKey) for k in keys):
            yield from keys  # not laid out yet (a resize recomposes), or grouped keys
            return
        yield from self._fit(keys, self.size.width)  # type: ignore[arg-type]

    @staticmethod
    def _fit(keys: list[FooterKey], width: int) -> Iterator[Widget]:
        items = [
            (
                PALETTE if k.has_class("-command-palette") else k.action,
                key_width(k.key_display, k.description) + k.has_class("-command-palette"),
            )
            for k in keys
        ]
        dropped = fitting(items, width)
        yield from (key for i, key in enumerate(keys) if i not in dropped)

    def on_resize(self, event: events.Resize) -> None:
        if event.size.width != getattr(self, "_laid_out_width", None):
            self._laid_out_width = event.size.width
            self.call_after_refresh(self.recompose)
