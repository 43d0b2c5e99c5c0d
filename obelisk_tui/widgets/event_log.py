"""`EventLog`: one row per version of an execution's log (line API: long logs are cheap)."""

from __future__ import annotations

from rich.text import Text

from engine.views import EventEntry
from obelisk_tui import model
from obelisk_tui.widgets.row_list import RowList

#: Colour of each event name.
EVENT_COLOURS: dict[str, str] = {
    "created": "#8abeb7",
    "locked": model.STATE_COLOURS["locked"],
    "unlocked": model.STATE_COLOURS["pending_at"],
    "temporarily_failed": "#e0606a",
    "temporarily_timed_out": "#e0606a",
    "finished": model.STATE_COLOURS["finished"],
    "paused": model.STATE_COLOURS["paused"],
    "unpaused": model.STATE_COLOURS["paused"],
    "cancellation_requested": model.STATE_COLOURS["cancelling"],
    "join_next": model.STATE_COLOURS["blocked_by_join_set"],
    "join_set_request": "#b5bd68",
}


#: Wide enough for every event name but `component_upgrade_finished`.
NAME_WIDTH = 23


class EventLog(RowList):
    DEFAULT_CSS = """
    EventLog { height: 1fr; }
    """

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.events: list[EventEntry] = []
        #: The EVENT column: its usual width, wider when a longer name is in the log.
        self._name_width = NAME_WIDTH

    def set_events(self, events: list[EventEntry]) -> None:
        """Show `events` (the whole log so far); the cursor follows new ones while it is
        on the last row."""
        shown = len(self.events)
        follow = shown == 0 or self.cursor == shown - 1
        self.events = list(events)
        if len(events) == shown:
            return
        longest = max((len(model.event_name(e["event"])) for e in events[shown:]), default=0)
        self._name_width = max(self._name_width, longest)
        self.rows_changed()
        if follow and events:
            if self.cursor == len(events) - 1:  # no move, but what it is on is new
                self.post_message(self.CursorMoved(self, self.cursor))
            self.move_cursor(len(events) - 1)

    def row_count(self) -> int:
        return len(self.events)

    def render_header(self, width: int) -> Text:
        event = "EVENT".ljust(self._name_width + 1)
        return Text(f"{'VER':>4}  {'TIME (UTC)':<12}  {event}  DETAIL     ◆ = backtrace")

    def render_row(self, index: int, width: int) -> Text | None:
        entry = self.events[index]
        event = entry["event"]
        name = model.event_name(event)
        finished = name == "finished"
        colour = EVENT_COLOURS.get(name, "")
        if finished:
            kind = model.result_kind(model.normal_result(event.get("result") or {}))
            colour = model.STATE_COLOURS["finished" if kind == "ok" else "err"]
        text = Text(no_wrap=True)
        text.append(f"{entry['version']:>4}  ", "dim")
        text.append(f"{model.clock_time(model.parse_ts(entry['created_at'])):<12}  ", "dim")
        marker = "◆" if entry.get("backtrace_id") is not None else " "
        text.append(marker, "#f0c674")
        text.append(f"{name.ljust(self._name_width)}  ", colour)
        text.append(model.event_summary(event))
        return text
