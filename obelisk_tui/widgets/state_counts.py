"""`StateCounts`: executions per state, coloured, and a live throughput sparkline."""

from __future__ import annotations

import time
from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Sparkline, Static

from obelisk_tui import model

ORDER = ("pending_at", "locked", "blocked_by_join_set", "paused", "cancelling", "finished")

#: Seconds of throughput history in the sparkline.
HISTORY = 60


class StateCounts(Horizontal):
    DEFAULT_CSS = """
    StateCounts { height: 1; background: $panel; }
    StateCounts > #counts { width: 1fr; }
    StateCounts > #rate { width: 14; text-align: right; color: $text-muted; }
    StateCounts > Sparkline { width: 32; margin: 0 1; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self._rates: deque[float] = deque([0.0] * HISTORY, maxlen=HISTORY)
        self._last: tuple[float, int] | None = None  # (monotonic time, finished count)

    def compose(self) -> ComposeResult:
        yield Static(id="counts")
        yield Static(id="rate")
        yield Sparkline(list(self._rates), summary_function=max, id="throughput")

    def show(self, counts: dict[str, int], *, frozen: bool = False, at: float | None = None) -> None:
        """New counts; the finished count's growth since the last call is the rate."""
        now = time.monotonic() if at is None else at
        finished = counts.get("finished", 0)
        if self._last is not None and now > self._last[0]:
            rate = max(0, finished - self._last[1]) / (now - self._last[0])
            self._rates.append(rate)
            self.query_one("#throughput", Sparkline).data = list(self._rates)
            self.query_one("#rate", Static).update(f"{rate:7.1f} fin/s")
        self._last = (now, finished)
        self.query_one("#counts", Static).update(counts_text(counts, frozen=frozen))


def counts_text(counts: dict[str, int], *, frozen: bool = False) -> Text:
    text = Text(no_wrap=True)
    total = sum(counts.values())
    text.append(f" {total:,} executions ", "bold")
    for name in ORDER:
        n = counts.get(name, 0)
        style = model.STATE_COLOURS[name] if n else "grey50"
        text.append(f" {model.STATE_SHORT[name]} ", style)
        text.append(f"{n:,}", ("bold " + style) if n else style)
        text.append(" ")
    if frozen:
        text.append("  ❚❚ FROZEN (space) ", "bold black on #f0c674")
    return text
