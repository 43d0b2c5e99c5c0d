"""`StateCounts`: executions per state, coloured, and a live throughput sparkline."""

from __future__ import annotations

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Sparkline, Static

from obelisk_tui import model, palette

ORDER = ("pending_at", "locked", "blocked_by_join_set", "paused", "cancelling", "finished")

#: Columns the rate and the sparkline take, beside the counts.
RATE_WIDTH = 14
SPARKLINE_WIDTH = 34  # 32 and its margins


class StateCounts(Horizontal):
    """The counts a screen shows (`show`), and the app's throughput (`throughput`,
    sampled by the app whatever screen is shown: repainted here each second)."""

    DEFAULT_CSS = """
    StateCounts { height: 1; background: $panel; }
    StateCounts > #counts { width: 1fr; }
    StateCounts > #rate { width: 14; text-align: right; color: $text-muted; }
    StateCounts > Sparkline { width: 32; margin: 0 1; }
    """

    def __init__(self, throughput: model.Throughput | None = None, id: str | None = None) -> None:
        super().__init__(id=id)
        self.throughput = throughput or model.Throughput()
        self._shown: tuple[dict[str, int], bool] = ({}, False)  # (counts, frozen)

    def compose(self) -> ComposeResult:
        yield Static(id="counts")
        yield Static(rate_text(self.throughput), id="rate")
        yield Sparkline(self.throughput.bars, summary_function=max, id="throughput")

    def on_mount(self) -> None:
        self.set_interval(1.0, self.show_rate)

    def on_resize(self, event: events.Resize) -> None:
        self._layout()

    def show(self, counts: dict[str, int], *, frozen: bool = False) -> None:
        """New counts (the rate is the app's: see `show_rate`)."""
        self._shown = (counts, frozen)
        self.show_rate()
        self._layout()

    def show_rate(self) -> None:
        if not self.is_mounted:
            return
        self.query_one("#rate", Static).update(rate_text(self.throughput), layout=False)
        self.query_one("#throughput", Sparkline).data = self.throughput.bars

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
        self.query_one("#counts", Static).update(text, layout=False)


#: State names in the counts bar of a narrow terminal.
COMPACT_NAMES = {
    "pending_at": "pend",
    "locked": "lock",
    "blocked_by_join_set": "blkd",
    "paused": "paus",
    "cancelling": "canc",
    "finished": "fin",
}

#: The finished, split by how they ended (when the counts have them: the `F` view's).
#: (count key, colour key, label, compact label).
RESULTS = (
    ("ok", "finished", "ok", "ok"),
    ("err", "err", "err", "err"),
    ("failed", "failed", "failed", "fail"),
)


def rate_text(throughput: model.Throughput) -> str:
    return f"{throughput.rate:7.1f} fin/s"


def counts_total(counts: dict[str, int]) -> int:
    """Every execution counted: the states' counts (not the results': finished again)."""
    return sum(counts.get(name, 0) for name in ORDER)


def counts_text(counts: dict[str, int], *, frozen: bool = False, compact: bool = False) -> Text:
    text = Text(no_wrap=True)
    total = counts_total(counts)
    text.append(f" {total:,} " + ("" if compact else "executions "), "bold")
    for name in ORDER:
        if name == "finished" and "ok" in counts:
            # What ended how: failures are what an operator looks for.
            for key, colour, label, short in RESULTS:
                _append_count(text, counts.get(key, 0), short if compact else label, colour)
            continue
        label = COMPACT_NAMES[name] if compact else model.STATE_SHORT[name]
        _append_count(text, counts.get(name, 0), label, name)
    if frozen:
        text.append("  ❚❚ FROZEN (space) ", palette.badge("mark"))
    return text


def _append_count(text: Text, n: int, label: str, colour: str) -> None:
    style = model.STATE_COLOURS[colour] if n else palette.COLOURS["muted"]
    text.append(f" {label} ", style)
    text.append(f"{n:,}", ("bold " + style) if n else style)
    text.append(" ")
