"""`StateCounts`: executions per state, coloured, and a live throughput sparkline."""

from __future__ import annotations

import time
from collections import deque

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Sparkline, Static

from obelisk_tui import model

ORDER = ("pending_at", "locked", "blocked_by_join_set", "paused", "cancelling", "finished")

#: Seconds of throughput history in the sparkline.
HISTORY = 60
#: Columns the rate and the sparkline take, beside the counts.
RATE_WIDTH = 14
SPARKLINE_WIDTH = 34  # 32 and its margins


class PerSecond:
    """Executions finished per second over the last HISTORY seconds (pure: no Textual).

    `count(grown, at)` adds what finished since the previous count. Counts come when
    the list refreshes: several a second while it is busy, none while it is idle or
    hidden behind another screen; so what finished since the previous count is spread
    evenly over the seconds in between rather than piled into the current one.
    `advance(at)` (each second) closes the seconds that passed without a count."""

    def __init__(self) -> None:
        self.closed: deque[float] = deque([0.0] * HISTORY, maxlen=HISTORY)
        self.second: int | None = None  # the open second, `current` counts in it
        self.current = 0.0
        self._counted: int | None = None  # the second of the previous count

    def advance(self, at: float) -> None:
        second = int(at)
        if self.second is None:
            self.second = second
            return
        for _ in range(min(HISTORY, max(0, second - self.second))):
            self.closed.append(self.current)
            self.current = 0.0
        self.second = max(self.second, second)

    def count(self, grown: int, at: float) -> None:
        self.advance(at)
        assert self.second is not None
        # The seconds after the previous count's, up to this one (the open one).
        span = 1 if self._counted is None else max(1, self.second - self._counted)
        spread = min(span, HISTORY)
        share = grown / spread
        self.current += share
        for i in range(1, spread):  # the closed ones among them
            self.closed[-i] += share
        self._counted = self.second

    @property
    def bars(self) -> list[float]:
        return list(self.closed)

    @property
    def last_second(self) -> float:
        """Finished in the last whole second."""
        return self.closed[-1]


class StateCounts(Horizontal):
    DEFAULT_CSS = """
    StateCounts { height: 1; background: $panel; }
    StateCounts > #counts { width: 1fr; }
    StateCounts > #rate { width: 14; text-align: right; color: $text-muted; }
    StateCounts > Sparkline { width: 32; margin: 0 1; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.per_second = PerSecond()
        self._finished: int | None = None  # the finished count last shown
        self._shown: tuple[dict[str, int], bool] = ({}, False)  # (counts, frozen)

    def compose(self) -> ComposeResult:
        yield Static(id="counts")
        yield Static(f"{0.0:7.1f} fin/s", id="rate")
        yield Sparkline(self.per_second.bars, summary_function=max, id="throughput")

    def on_mount(self) -> None:
        self.set_interval(1.0, self.tick)

    def on_resize(self, event: events.Resize) -> None:
        self._layout()

    def tick(self, at: float | None = None) -> None:
        """Each second: the seconds that passed move the sparkline on."""
        self.per_second.advance(time.monotonic() if at is None else at)
        self._show_rate()

    def show(
        self, counts: dict[str, int], *, frozen: bool = False, at: float | None = None
    ) -> None:
        """New counts; the finished count's growth since the last call goes to the
        sparkline (finished executions per second) and the rate beside it."""
        now = time.monotonic() if at is None else at
        finished = counts.get("finished", 0)
        if self._finished is None:
            self.per_second.advance(now)
        else:
            self.per_second.count(max(0, finished - self._finished), now)
        self._finished = finished
        self._shown = (counts, frozen)
        self._show_rate()
        self._layout()

    def _show_rate(self) -> None:
        if not self.is_mounted:
            return
        self.query_one("#rate", Static).update(f"{self.per_second.last_second:7.1f} fin/s")
        self.query_one("#throughput", Sparkline).data = self.per_second.bars

    def _layout(self) -> None:
        """The counts come first: written in full with the sparkline when both fit, else
        without the sparkline, else short (with the sparkline if that fits)."""
        if not self.is_mounted:
            return
        counts, frozen = self._shown
        width = self.size.width
        full = counts_text(counts, frozen=frozen)
        short = counts_text(counts, frozen=frozen, compact=True)
        sparkline = self.query_one("#throughput", Sparkline)
        if width >= full.cell_len + RATE_WIDTH + SPARKLINE_WIDTH:
            text, sparkline.display = full, True
        elif width >= full.cell_len + RATE_WIDTH:
            text, sparkline.display = full, False
        else:
            text = short
            sparkline.display = width >= short.cell_len + RATE_WIDTH + SPARKLINE_WIDTH
        self.query_one("#counts", Static).update(text)


#: State names in the counts bar of a narrow terminal.
COMPACT_NAMES = {
    "pending_at": "pend",
    "locked": "lock",
    "blocked_by_join_set": "blkd",
    "paused": "paus",
    "cancelling": "canc",
    "finished": "fin",
}


def counts_text(counts: dict[str, int], *, frozen: bool = False, compact: bool = False) -> Text:
    text = Text(no_wrap=True)
    total = sum(counts.values())
    text.append(f" {total:,} " + ("" if compact else "executions "), "bold")
    for name in ORDER:
        n = counts.get(name, 0)
        style = model.STATE_COLOURS[name] if n else "grey50"
        label = COMPACT_NAMES[name] if compact else model.STATE_SHORT[name]
        text.append(f" {label} ", style)
        text.append(f"{n:,}", ("bold " + style) if n else style)
        text.append(" ")
    if frozen:
        text.append("  ❚❚ FROZEN (space) ", "bold black on #f0c674")
    return text
