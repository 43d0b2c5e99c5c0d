"""`ExecutionList`: the live list of executions (home screen), virtual and paged.

It never fetches anything: it shows a window of rows that its screen loads
(`show_window`) and asks for another window with `WindowWanted` when the user scrolls
past what is loaded. Rows keep their place on refresh; the cursor stays on the same
execution when newer ones arrive above it, unless the list follows its first row
(`follow`: on at start, off as soon as the operator moves the cursor or scrolls, on
again with `f`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.message import Message

from engine.views import ExecutionInfo, lock_held
from obelisk_tui import model, palette
from obelisk_tui.widgets.row_list import RowList

#: Rows loaded around the visible ones, so that scrolling a little needs no fetch.
MARGIN = 100

#: (title, width); the FFQN column takes what is left.
COLUMNS: list[tuple[str, int]] = [
    (" ", 1),
    ("EXECUTION", 34),
    ("FFQN", 0),
    ("STATE", 20),
    ("WHEN", 10),
    ("AGE", 5),
    ("EV", 4),
    ("CH", 4),
    ("LAST EVENT", 18),
]

#: Past this FFQN width, up to EXECUTION_EXTRA more columns go to the ids instead.
FFQN_ROOMY = 44
EXECUTION_EXTRA = 24

#: Columns dropped first when the terminal is narrow (by title); then the id and state
#: columns narrow (`NARROW`), then WHEN goes, AGE last.
DROP_ORDER = ["CH", "EV", "LAST EVENT"]
LATE_DROP_ORDER = ["WHEN", "AGE"]
#: Narrow widths: a top-level id whole (28), a child id's distinguishing end
#: (`model.short_id`); the longest usual state label ("paused·pending").
NARROW = {"EXECUTION": 28, "STATE": 14}
#: The FFQN column's least width before columns go.
FFQN_MIN = 24


def layout(width: int) -> list[tuple[str, int]]:
    """The columns that fit in `width`, with the FFQN column's width filled in."""

    def ffqn_room(cols: list[tuple[str, int]]) -> int:
        return width - sum(w + 1 for t, w in cols if t != "FFQN") - 1

    cols = list(COLUMNS)
    for title in DROP_ORDER:
        if ffqn_room(cols) >= FFQN_MIN:
            break
        cols = [c for c in cols if c[0] != title]
    if ffqn_room(cols) < FFQN_MIN:
        cols = [(t, NARROW.get(t, w)) for t, w in cols]
    for title in LATE_DROP_ORDER:
        if ffqn_room(cols) >= FFQN_MIN:
            break
        cols = [c for c in cols if c[0] != title]
    ffqn = max(12, ffqn_room(cols))
    # Room to spare: child ids (`E_….g:batch_12.o:1-step_3`) get it before the FFQNs.
    extra = min(EXECUTION_EXTRA, max(0, ffqn - FFQN_ROOMY))
    widths = {"EXECUTION": dict(cols)["EXECUTION"] + extra, "FFQN": ffqn - extra}
    return [(t, widths.get(t, w)) for t, w in cols]


class ExecutionList(RowList):
    BINDINGS = [
        Binding("m", "toggle_mark", "Mark", show=False),
        Binding("M", "clear_marks", "Unmark all", show=False),
    ]

    class WindowWanted(Message):
        """Load rows [offset, offset + limit) of the list, please."""

        def __init__(self, offset: int, limit: int) -> None:
            super().__init__()
            self.first = offset
            self.limit = limit

    class FollowChanged(Message):
        def __init__(self, follow: bool) -> None:
            super().__init__()
            self.follow = follow

    class MarksChanged(Message):
        def __init__(self, marked: frozenset[str]) -> None:
            super().__init__()
            self.marked = marked

    def __init__(
        self,
        *,
        now: Callable[[], datetime] | None = None,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        self.total = 0
        self.start = 0
        self.rows: list[ExecutionInfo] = []
        self.marked: set[str] = set()
        self.now = now or (lambda: datetime.now(UTC))
        self._wanted: tuple[int, int] | None = None
        #: The cursor follows the first row (the newest, newest first): a live tail. Only
        #: until the operator moves the cursor (or scrolls): from then on a key acts on
        #: the execution they chose, whatever arrives (`set_follow` turns it back on).
        self.follow = True
        #: When a window was last shown (monotonic seconds): it drew every visible row.
        self._shown_at = 0.0

    def tick(self) -> None:
        """The one-second tick: the rows again, for their relative times ("4s"), unless
        a window shown less than a second ago drew them (2 a second while executions
        flow: a third full redraw a second was ~1/3 of the console's CPU then)."""
        if time.monotonic() - self._shown_at >= 0.9:
            self.refresh()

    # -- following -----------------------------------------------------------------------
    def set_follow(self, follow: bool) -> None:
        self.follow = follow
        if follow and self.total:
            self.scroll_to(y=0, animate=False)
            self.cursor = 0
        self.post_message(self.FollowChanged(follow))

    def move_cursor(self, index: int) -> None:
        """The operator moved the cursor (keys, marks): it stays where they put it."""
        self._unfollow()
        super().move_cursor(index)

    def on_click(self, event: object) -> None:
        self._unfollow()
        super().on_click(event)

    def on_mouse_scroll_down(self, _: events.MouseScrollDown) -> None:
        self._unfollow()

    def on_mouse_scroll_up(self, _: events.MouseScrollUp) -> None:
        self._unfollow()

    def _unfollow(self) -> None:
        if self.follow:
            self.follow = False
            self.post_message(self.FollowChanged(False))

    # -- data in -------------------------------------------------------------------------
    def show_window(self, total: int, offset: int, rows: list[ExecutionInfo]) -> None:
        """Rows [offset, offset + len(rows)) of a list of `total` rows.

        Following (`follow`), the cursor stays on the first row, in sight: the newest
        execution. Otherwise it stays on the execution it was on, so that a key pressed
        just after a refresh acts on what was highlighted; at the top the view stays
        there, so that new executions come into sight, elsewhere it moves with the rows."""
        selected = self.selected
        at_top = self.first_visible == 0
        self.total, self.start, self.rows = total, offset, rows
        self._shown_at = time.monotonic()
        self._wanted = None
        self.rows_changed()
        if self.follow:
            if self.cursor != 0 or not at_top:
                self.scroll_to(y=0, animate=False)
                self.set_reactive(ExecutionList.cursor, 0)
                self.refresh()
        elif selected is not None:
            index = self.index_of(selected["execution_id"])
            if index is not None and index != self.cursor:
                if not at_top:
                    self.scroll_to(y=self.scroll_y + index - self.cursor, animate=False)
                self.set_reactive(ExecutionList.cursor, index)
                self._scroll_to_cursor()
                self.refresh()
        self.post_message(self.CursorMoved(self, self.cursor))
        self._want_visible()

    def index_of(self, execution_id: str) -> int | None:
        for i, row in enumerate(self.rows):
            if row["execution_id"] == execution_id:
                return self.start + i
        return None

    def row(self, index: int) -> ExecutionInfo | None:
        i = index - self.start
        return self.rows[i] if 0 <= i < len(self.rows) else None

    @property
    def selected(self) -> ExecutionInfo | None:
        return self.row(self.cursor) if self.total else None

    def targets(self) -> list[ExecutionInfo]:
        """What an action applies to: the marked rows that are loaded, else the cursor's."""
        if self.marked:
            return [r for r in self.rows if r["execution_id"] in self.marked]
        selected = self.selected
        return [] if selected is None else [selected]

    def window(self) -> tuple[int, int]:
        """The window worth loading for what is visible now."""
        first = max(0, self.first_visible - MARGIN)
        return first, self.page_rows + 2 * MARGIN

    # -- scrolling asks for rows ---------------------------------------------------------
    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self._want_visible()

    def on_resize(self) -> None:
        self._want_visible()

    def _want_visible(self) -> None:
        visible = self.visible_range()
        loaded = range(self.start, self.start + len(self.rows))
        if not visible or (visible.start in loaded and visible.stop - 1 in loaded):
            return
        wanted = self.window()
        if wanted != self._wanted:
            self._wanted = wanted
            self.post_message(self.WindowWanted(*wanted))

    # -- marks ---------------------------------------------------------------------------
    def action_toggle_mark(self) -> None:
        selected = self.selected
        if selected is None:
            return
        eid = selected["execution_id"]
        self.marked.symmetric_difference_update({eid})
        self.refresh_line_of(self.cursor)
        self.post_message(self.MarksChanged(frozenset(self.marked)))
        self.action_cursor_down()

    def action_clear_marks(self) -> None:
        self.marked.clear()
        self.refresh()
        self.post_message(self.MarksChanged(frozenset()))

    # -- rendering -----------------------------------------------------------------------
    def row_count(self) -> int:
        return self.total

    def _columns(self, width: int) -> list[tuple[str, int]]:
        # Laid out as if the scrollbar were always there: a list that grows past the
        # screen's height does not drop (and a shrinking one bring back) a column.
        return layout(min(width, self.size.width - self.styles.scrollbar_size_vertical))

    def render_header(self, width: int) -> Text:
        text = Text()
        for title, w in self._columns(width):
            text.append(model.cut_words(title, w).ljust(w) + " ")
        return text

    def render_row(self, index: int, width: int) -> Text | None:
        info = self.row(index)
        if info is None:
            return None
        return render_execution(
            info, self._columns(width), self.now(), info["execution_id"] in self.marked
        )


def render_execution(
    info: ExecutionInfo, cols: list[tuple[str, int]], now: datetime, marked: bool
) -> Text:
    label, colour = model.state_label(info)
    state = info["state"]
    under = model.state_name(model.underlying(state))
    # A blocked workflow's lock only while a warm run holds it ("5m ago" would read as
    # something overdue).
    held = under in ("locked", "blocked_by_join_set") and lock_held(info, now)
    when_at = info.get("lock_expires_at") if held else None
    when_at = when_at or (info.get("scheduled_at") if under == "pending_at" else None)
    created = model.parse_ts(info["created_at"])
    cells: dict[str, tuple[str, str]] = {
        " ": ("●" if marked else " ", "bold " + palette.COLOURS["mark"]),
        "EXECUTION": (
            info["execution_id"],
            "" if info["parent_id"] is None else palette.COLOURS["muted"],
        ),
        "FFQN": (info["ffqn"], ""),
        "STATE": (label, colour),
        "WHEN": (model.relative(model.parse_ts(when_at), now), palette.COLOURS["muted"]),
        "AGE": (
            model.span((now - created).total_seconds()) if created else "",
            palette.COLOURS["muted"],
        ),
        "EV": (str(info["next_version"]), palette.COLOURS["muted"]),
        "CH": (
            str(info.get("children", "")) if info.get("children") else "",
            palette.COLOURS["muted"],
        ),
        "LAST EVENT": (info.get("last_event") or "", ""),
    }
    text = Text(no_wrap=True)
    for title, w in cols:
        value, style = cells[title]
        if title == "EXECUTION":
            value = model.short_id(value, w)
        elif title == "FFQN":
            value = model.short_end(value, w)
        value = model.cut_words(value, w)
        text.append(value.ljust(w), style)
        text.append(" ")
    return text
