"""The execution state machine of the seeds, drawn as text (pure: no Textual).

`draw(current, overlays, last, finished_as)` returns Rich `Text` lines: the current
state's box in its colour, an overlay (Paused, Cancelling) written on that box's border,
and the arrow of the last transition marked. A small canvas records which element owns
each cell, so styling is a lookup and the layout lives in one place (`_layout`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rich.style import Style
from rich.text import Text

from obelisk_tui.model import STATE_COLOURS, STATE_TITLES, text_on
from obelisk_tui.palette import COLOURS

#: Transitions drawn, by (from, to) underlying state; "created" has no source.
EDGES: dict[tuple[str, str], str] = {
    ("", "pending_at"): "created",
    ("pending_at", "locked"): "locked",
    ("locked", "locked"): "locked",  # an extension: the same arrow
    ("locked", "pending_at"): "released",
    ("locked", "blocked_by_join_set"): "join_next",
    ("blocked_by_join_set", "pending_at"): "response",
    ("pending_at", "finished"): "finished_pending",
    ("locked", "finished"): "finished_locked",
    ("blocked_by_join_set", "finished"): "finished_blocked",
}

WIDTH = 80
#: Blank canvas columns on the left, not drawn: the diagram is 76 columns wide, so that
#: it fits an 80-column terminal with the panel's padding.
LEFT_MARGIN = 2


@dataclass
class _Canvas:
    rows: int
    cols: int
    chars: list[list[str]] = field(init=False)
    owner: list[list[str]] = field(init=False)

    def __post_init__(self) -> None:
        self.chars = [[" "] * self.cols for _ in range(self.rows)]
        self.owner = [[""] * self.cols for _ in range(self.rows)]

    def put(self, row: int, col: int, ch: str, who: str) -> None:
        if self.chars[row][col] in "│─" and ch in "│─" and self.chars[row][col] != ch:
            ch = "┼"
        self.chars[row][col] = ch
        self.owner[row][col] = who

    def text(self, row: int, col: int, s: str, who: str) -> None:
        for i, ch in enumerate(s):
            self.put(row, col + i, ch, who)

    def box(self, who: str, top: int, left: int, width: int, label: str) -> None:
        right = left + width - 1
        self.text(top, left, "╭" + "─" * (width - 2) + "╮", who)
        self.text(top + 1, left, "│" + label.center(width - 2) + "│", who)
        self.text(top + 2, left, "╰" + "─" * (width - 2) + "╯", who)
        _ = right

    def hline(self, who: str, row: int, c0: int, c1: int, head: str | None = None) -> None:
        for c in range(c0, c1 + 1):
            self.put(row, c, "─", who)
        if head == "right":
            self.put(row, c1, "▶", who)
        elif head == "left":
            self.put(row, c0, "◀", who)

    def vline(self, who: str, col: int, r0: int, r1: int, head: str | None = None) -> None:
        for r in range(r0, r1 + 1):
            self.put(r, col, "│", who)
        if head == "down":
            self.put(r1, col, "▼", who)
        elif head == "up":
            self.put(r0, col, "▲", who)


#: Where each state's box is: (top row, left column, width).
BOXES: dict[str, tuple[int, int, int]] = {
    "pending_at": (3, 2, 17),
    "locked": (3, 46, 17),
    "blocked_by_join_set": (10, 56, 22),
    "finished": (16, 2, 76),
}


def _layout(canvas: _Canvas, finished_label: str) -> None:
    for state, (top, left, width) in BOXES.items():
        label = STATE_TITLES[state] if state != "finished" else finished_label
        canvas.box(state, top, left, width, label)
    canvas.text(0, 6, "created", "created")
    canvas.vline("created", 10, 1, 2, "down")
    canvas.text(3, 29, "locked", "locked")
    canvas.hline("locked", 4, 19, 45, "right")
    canvas.hline("released", 5, 19, 45, "left")
    canvas.text(6, 20, "unlocked · temporarily_failed", "released")
    canvas.text(7, 20, "temporarily_timed_out", "released")
    canvas.text(8, 20, "lock expired", "released")
    canvas.vline("join_next", 60, 6, 9, "down")
    canvas.text(7, 62, "join_next", "join_next")
    canvas.vline("response", 12, 6, 11, "up")
    canvas.hline("response", 11, 12, 55)
    canvas.put(11, 12, "╰", "response")
    canvas.text(10, 20, "response arrives", "response")
    canvas.vline("finished_pending", 6, 6, 15, "down")
    canvas.text(13, 8, "finished", "finished_pending")
    canvas.vline("finished_locked", 50, 6, 15, "down")
    canvas.text(13, 52, "finished", "finished_locked")
    canvas.vline("finished_blocked", 70, 13, 15, "down")
    canvas.text(14, 61, "finished", "finished_blocked")


def draw(
    current: str | None,
    overlays: list[str] | None = None,
    last: str | None = None,
    finished_as: str | None = None,
) -> list[Text]:
    """The diagram with `current` (an underlying state name) highlighted, its overlays
    ("paused", "cancelling") written on its box, and the edge `last` (a value of
    `EDGES`) marked. `finished_as`: the result kind shown in the Finished box."""
    overlays = overlays or []
    label = STATE_TITLES["finished"] + (f" · {finished_as}" if finished_as else "")
    canvas = _Canvas(20, WIDTH)
    _layout(canvas, label)
    if current in BOXES and overlays:
        top, left, width = BOXES[current]
        tag = " " + " + ".join(STATE_TITLES[o] for o in overlays) + " "
        canvas.text(top, left + 2, tag[: width - 4], "overlay")
    legend = "overlays: Paused (PendingAt, BlockedByJoinSet) · Cancelling (any unfinished)"
    canvas.text(19, 2, legend, "legend")

    dim = Style(color=COLOURS["muted"])
    box = Style(color=COLOURS["box"])
    mark = Style(color=COLOURS["mark"], bold=True)
    colour = STATE_COLOURS.get(overlays[0] if overlays else current or "", COLOURS["foreground"])
    here = Style(color=colour, bold=True)
    overlay_style = Style(color=text_on(colour), bgcolor=colour, bold=True)
    lines: list[Text] = []
    for r in range(canvas.rows):
        line = Text(no_wrap=True, overflow="crop")
        # One span per run of cells in the same style, not one per cell: ~1,200 spans
        # made each rendering of the detail screen's State tab cost ~10 ms.
        run: list[str] = []
        run_style: Style | None = None
        for c in range(LEFT_MARGIN, canvas.cols):
            who = canvas.owner[r][c]
            if who == "overlay":
                style = overlay_style
            elif who and who == current:
                style = here
            elif who and who == last:
                style = mark
            elif who in BOXES:
                style = box
            else:
                style = dim
            if style is not run_style and run:
                line.append("".join(run), run_style)
                run = []
            run_style = style
            run.append(canvas.chars[r][c])
        if run:
            line.append("".join(run), run_style)
        line.rstrip()
        lines.append(line)
    return lines


def owners(current: str | None, last: str | None) -> dict[str, set[tuple[int, int]]]:
    """The cells of each element (for tests), as positions in `draw`'s lines:
    {"locked": {(row, col), …}, …}."""
    canvas = _Canvas(20, WIDTH)
    _layout(canvas, STATE_TITLES["finished"])
    out: dict[str, set[tuple[int, int]]] = {}
    for r in range(canvas.rows):
        for c in range(canvas.cols):
            who = canvas.owner[r][c]
            if who:
                out.setdefault(who, set()).add((r, c - LEFT_MARGIN))
    return out


def edge_of(before: str | None, after: str) -> str | None:
    """The edge a transition between two underlying states takes (None: no move)."""
    return EDGES.get((before or "", after))
