"""`KeyFooter`: Textual's footer, with the keys that do not fit dropped whole.

Textual's `Footer` lays its keys out in a row and cuts the row at the terminal's edge, so
at 80–100 columns the last keys — the app's own, `? Help` among them — were cut mid-word
or missing. This footer measures its keys and, when they do not fit, leaves out the least
needed ones (`DROP_ORDER`), never `? Help`: the help screen lists every key.

It is also rebuilt only when what it shows changes. Textual's footer answers every
`refresh_bindings` of its screen (focus moves, bindings-reactives, the screens' own calls)
with a full recompose — every key widget unmounted, new ones mounted and styled, the
screen laid out again — and several in one go are not coalesced: 7–9 of them, 30–100 ms
each, while a detail screen opened (`bench/console.py --only detail`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from textual import events
from textual.app import ComposeResult
from textual.screen import Screen
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

    #: What the keys were last composed from (`_shows`); None: not composed yet.
    _composed: tuple[Any, ...] | None = None
    #: A check of the bindings is scheduled (one per refresh, however many signals).
    _check_pending = False

    def bindings_changed(self, screen: Screen[Any]) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus or not self.is_attached or screen is not self.screen:
            return
        # A screen below the top one (suspended, or behind a dialog) keeps its keys as
        # they were; its resume is a bindings change, checked then.
        if screen is self.app.screen and not self._check_pending:
            self._check_pending = True
            self.call_after_refresh(self._recompose_if_changed)

    async def _recompose_if_changed(self) -> None:
        self._check_pending = False
        if not self.is_attached:
            return
        shows = self._shows()
        if shows == self._composed:
            return
        if self._composed is not None and _keys_of(shows) == _keys_of(self._composed):
            self._update_keys(shows)  # only which keys are enabled (greyed) changed
            return
        await self.recompose()

    def _shows(self) -> tuple[Any, ...]:
        """Everything the composed keys depend on: the shown bindings (and the palette's)
        with whether each is enabled and its tooltip, the width, the palette setting."""
        active = self.screen.active_bindings
        palette = active.get(self.app.COMMAND_PALETTE_BINDING)
        bindings = tuple(
            (binding, enabled, tooltip)
            for _, binding, enabled, tooltip in [
                *(b for b in active.values() if b[1].show),
                *([palette] if palette else []),
            ]
        )
        return (self._bindings_ready, self.show_command_palette, self.size.width, bindings)

    def _update_keys(self, shows: tuple[Any, ...]) -> None:
        """The composed keys greyed or not (and their tooltips) as `shows` says, in place."""
        state = {(b.key, b.action): (enabled, tooltip) for b, enabled, tooltip in shows[3]}
        for key in self.query(FooterKey):
            if (key.key, key.action) not in state:
                continue
            enabled, tooltip = state[key.key, key.action]
            key._disabled = not enabled
            key.set_class(not enabled, "-disabled")
            if not key.has_class("-command-palette"):  # (the palette's: its binding's)
                key.tooltip = tooltip or None
        self._composed = shows

    async def recompose(self) -> None:
        self._composed = self._shows() if self.is_attached else None
        await super().recompose()
        # Each key registers a watcher of the footer's `compact`, dropped by Textual only
        # when `compact` changes (Textual #6666): the unmounted keys would stay alive.
        watchers = getattr(self, "__watchers", {}).get("compact")
        if watchers:
            watchers[:] = [(node, callback) for node, callback in watchers if node.is_attached]

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


def _keys_of(shows: tuple[Any, ...]) -> tuple[Any, ...]:
    """`KeyFooter._shows` less the enabled states and tooltips: what lays the keys out."""
    return (*shows[:3], tuple(binding for binding, _, _ in shows[3]))
