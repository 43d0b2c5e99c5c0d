"""`StateCounts`: executions per state, coloured, and a live throughput sparkline."""

from __future__ import annotations

from typing import Literal

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
        if not self.is_mounted:
            return
        counts, frozen = self._shown
        text, rate, sparkline = fit_counts(counts, self.size.width, frozen=frozen)
        self.query_one("#rate", Static).display = rate
        self.query_one("#throughput", Sparkline).display = sparkline
        self.query_one("#counts", Static).update(text, layout=False)


#: How the counts are written (`counts_text`): widest first.
CountsForm = Literal["full", "compact", "tight"]

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


def fit_counts(
    counts: dict[str, int], width: int, *, frozen: bool = False
) -> tuple[Text, bool, bool]:
    """The counts' text for `width` columns, and whether the rate and the sparkline are
    shown beside it. The counts come first: in full with the rate and the sparkline when
    they fit, then without the sparkline, then short names, then short numbers (`12.3k`),
    then without the rate; never cut but with an ellipsis."""
    # Each form of the text, with the (rate, sparkline) beside it to try, most shown first.
    forms: tuple[tuple[CountsForm, tuple[tuple[bool, bool], ...]], ...] = (
        ("full", ((True, True), (True, False))),
        ("compact", ((True, True), (True, False))),
        ("tight", ((True, False), (False, False))),
    )
    for form, besides in forms:
        text = counts_text(counts, frozen=frozen, form=form)
        for rate, sparkline in besides:
            if text.cell_len + RATE_WIDTH * rate + SPARKLINE_WIDTH * sparkline <= width:
                return text, rate, sparkline
    text.overflow = "ellipsis"
    return text, False, False


def short_number(n: int) -> str:
    """`n` in at most 4 characters: 999, 1.2k, 12k, 123k, 1.2M, 12M."""
    if n < 1000:
        return str(n)
    for divisor, unit in ((1000, "k"), (1_000_000, "M"), (1_000_000_000, "G")):
        value = n / divisor
        shown = f"{value:.1f}" if value < 9.95 else f"{value:.0f}"
        if float(shown) < 1000:
            return shown + unit
    return f"{n / 1e12:.0f}T"


def counts_text(counts: dict[str, int], *, frozen: bool = False, form: CountsForm = "full") -> Text:
    """`form`: "full" (state names, `1,234`), "compact" (short names), "tight" (short
    names, short numbers, one space apart)."""
    compact = form != "full"
    number = short_number if form == "tight" else "{:,}".format
    lead = "" if form == "tight" else " "  # (each count ends with a space)
    text = Text(no_wrap=True)
    total = counts_total(counts)
    text.append(f" {number(total)} " + ("" if compact else "executions "), "bold")

    def append(n: int, label: str, colour: str) -> None:
        style = model.STATE_COLOURS[colour] if n else palette.COLOURS["muted"]
        text.append(f"{lead}{label} ", style)
        text.append(number(n), ("bold " + style) if n else style)
        text.append(" ")

    for name in ORDER:
        if name == "finished" and "ok" in counts:
            # What ended how: failures are what an operator looks for.
            for key, colour, label, short in RESULTS:
                append(counts.get(key, 0), short if compact else label, colour)
            continue
        append(
            counts.get(name, 0), COMPACT_NAMES[name] if compact else model.STATE_SHORT[name], name
        )
    if frozen:
        text.append("  ❚❚ FROZEN (space) " if form != "tight" else " ❚❚ ", palette.badge("mark"))
    return text
