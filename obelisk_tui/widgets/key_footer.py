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

Its keys are not data-bound to the footer's `compact` (Textual's are): a bound key
registered a watcher of the footer that Textual drops only when `compact` changes
(Textual #6666: each rebuild's keys stayed alive), and its mount restyled it twice (the
key's own default `compact=True`, then the footer's `False`): about half the cost of a
rebuild. The keys are given the footer's `compact` when composed, and a change of it
rebuilds them.

A screen whose keys depend on what it loads (the detail screen: which actions apply to
the execution) can make it `wait` until the first load is shown, so that it is composed
once with those keys, not once without and again with them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

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


class Shown(NamedTuple):
    """Everything a footer's composed keys depend on (`KeyFooter._shows`)."""

    ready: bool
    show_palette: bool
    width: int
    #: The shown bindings (and the palette's): (binding, enabled, tooltip) each.
    bindings: tuple[tuple[Any, bool, str], ...]
    compact: bool

    def layout(self) -> tuple[Any, ...]:
        """Less the enabled states and tooltips: what lays the keys out."""
        return (*self[:3], tuple(binding for binding, _, _ in self.bindings), self.compact)


class KeyFooter(Footer):
    """The footer of every screen and dialog of the console."""

    #: What the keys were last composed from (`_shows`); None: not composed yet.
    _composed: Shown | None = None
    #: A check of the bindings is scheduled (one per refresh, however many signals).
    _check_pending = False

    def __init__(self, *, wait: bool = False) -> None:
        super().__init__()
        #: Not composed until `release()` (the screen's keys are not known yet).
        self.waiting = wait

    def release(self) -> None:
        """The screen's keys are known: compose them (if `wait`ing)."""
        if self.waiting:
            self.waiting = False
            self._schedule_check()

    def bindings_changed(self, screen: Screen[Any]) -> None:
        self._bindings_ready = True
        if not screen.app.app_focus or not self.is_attached or screen is not self.screen:
            return
        # A screen below the top one (suspended, or behind a dialog) keeps its keys as
        # they were; its resume is a bindings change, checked then.
        if screen is self.app.screen:
            self._schedule_check()

    def _schedule_check(self) -> None:
        if not self._check_pending:
            self._check_pending = True
            self.call_after_refresh(self._recompose_if_changed)

    async def _recompose_if_changed(self) -> None:
        self._check_pending = False
        if not self.is_attached or self.waiting or not self._bindings_ready:
            return
        shows = self._shows()
        if shows == self._composed:
            return
        if self._composed is not None and shows.layout() == self._composed.layout():
            self._update_keys(shows)  # only which keys are enabled (greyed) changed
            return
        # In the footer's context whoever asked (Textual's keys are data-bound to it).
        with self._context():
            await self.recompose()

    def _shows(self) -> Shown:
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
        return Shown(
            self._bindings_ready, self.show_command_palette, self.size.width, bindings, self.compact
        )

    def _update_keys(self, shows: Shown) -> None:
        """The composed keys greyed or not (and their tooltips) as `shows` says, in place."""
        state = {(b.key, b.action): (enabled, tooltip) for b, enabled, tooltip in shows.bindings}
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

    def compose(self) -> ComposeResult:
        if self.waiting:
            return
        keys = list(super().compose())
        for key in keys:
            # Not bound to the footer's `compact` (the module's docstring): set. (The
            # palette's key is not bound: it keeps its own `compact`.)
            if isinstance(key, FooterKey) and key._reactive_connect:
                key._reactive_connect = None
                key.set_reactive(FooterKey.compact, self.compact)
                key.set_class(self.compact, "-compact", update=False)
        if self.size.width == 0 or not all(isinstance(k, FooterKey) for k in keys):
            yield from keys  # not laid out yet (a resize recomposes), or grouped keys
            return
        yield from self._fit(keys, self.size.width)  # type: ignore[arg-type]

    def _watch_compact(self) -> None:
        self._schedule_check()

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
        # The width is part of `_shows`: rebuilt if it changed since the keys were fitted
        # (not when the first layout gives the width they were already composed for).
        if self._composed is not None and event.size.width != self._composed.width:
            self._schedule_check()
