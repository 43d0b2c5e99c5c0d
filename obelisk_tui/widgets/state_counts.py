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
#: Narrower than this, the bar shows the counts and the rate without the sparkline.
SPARKLINE_MIN_WIDTH = 110


class StateCounts(Horizontal):
    DEFAULT_CSS = """
    StateCounts { height: 1; background: $panel; }
    StateCounts > #counts { width: 1fr; }
    StateCounts > #rate { width: 14; text-align: right; color: $text-muted; }
    StateCounts > Sparkline { width: 32; margin: 0 1; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        #: Executions finished in each of the last HISTORY whole seconds, oldest first.
        self._rates: deque[float] = deque([0.0] * HISTORY, maxlen=HISTORY)
        self._last: tuple[float, int] | None = None  # (monotonic time, finished count)
        self._second: int | None = None  # the second `_pending` counts for
        self._pending = 0
        self._compact = False
        self._shown: tuple[dict[str, int], bool] | None = None  # (counts, frozen)

    def compose(self) -> ComposeResult:
        yield Static(id="counts")
        yield Static(id="rate")
        yield Sparkline(list(self._rates), summary_function=max, id="throughput")

    def on_resize(self, event: events.Resize) -> None:
        # The counts come first: on a narrow terminal the sparkline makes room for them,
        # and they are written short.
        wide = event.size.width >= SPARKLINE_MIN_WIDTH
        self.query_one("#throughput", Sparkline).display = wide
        if self._compact == wide:
            self._compact = not wide
            if self._shown is not None:
                self.query_one("#counts", Static).update(
                    counts_text(self._shown[0], frozen=self._shown[1], compact=self._compact)
                )

    def show(
        self, counts: dict[str, int], *, frozen: bool = False, at: float | None = None
    ) -> None:
        """New counts. The finished count's growth since the last call is the rate shown,
        and goes to the current second's bar of the sparkline (one bar per second,
        however often this is called; seconds without a call are empty bars)."""
        now = time.monotonic() if at is None else at
        finished = counts.get("finished", 0)
        if self._last is not None and now > self._last[0]:
            grown = max(0, finished - self._last[1])
            rate = grown / (now - self._last[0])
            self.query_one("#rate", Static).update(f"{rate:7.1f} fin/s")
            if self._add(grown, int(now)):
                self.query_one("#throughput", Sparkline).data = list(self._rates)
        elif self._last is None:
            self._second = int(now)
        self._last = (now, finished)
        self._shown = (counts, frozen)
        self.query_one("#counts", Static).update(
            counts_text(counts, frozen=frozen, compact=self._compact)
        )

    def _add(self, finished: int, second: int) -> bool:
        """Count `finished` in `second`; True when whole seconds were completed."""
        if self._second is None or second <= self._second:
            self._second = second if self._second is None else self._second
            self._pending += finished
            return False
        self._rates.append(float(self._pending))
        for _ in range(min(HISTORY, second - self._second - 1)):
            self._rates.append(0.0)
        self._second, self._pending = second, finished
        return True

    @property
    def per_second(self) -> list[float]:
        """The sparkline's bars: finished executions per completed second, oldest first."""
        return list(self._rates)


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
