"""`EventLog`: one row per version of an execution's log (line API: long logs are cheap).

`J` asks for the raw JSON of the event under the cursor (`RawWanted`); `c` / `p` / `u`
on a delay request's row go to the screen as `DelayKey`."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.message import Message

from engine.views import EventEntry
from obelisk_tui import model, palette
from obelisk_tui.messages import DelayKey
from obelisk_tui.widgets.row_list import RowList

#: Colour of each event name: a role of the palette, or the state whose colour it
#: takes, looked up when drawn (`palette.COLOURS` and `model.STATE_COLOURS` follow the
#: theme).
EVENT_COLOURS: dict[str, str] = {
    "created": "label",
    "temporarily_failed": "error",
    "temporarily_timed_out": "error",
    "join_set_request": "type",
}
EVENT_STATES: dict[str, str] = {
    "locked": "locked",
    "unlocked": "pending_at",
    "finished": "finished",
    "paused": "paused",
    "unpaused": "paused",
    "cancellation_requested": "cancelling",
    "join_next": "blocked_by_join_set",
}


def event_colour(name: str) -> str:
    state = EVENT_STATES.get(name)
    if state is not None:
        return model.STATE_COLOURS[state]
    role = EVENT_COLOURS.get(name)
    return palette.COLOURS[role] if role is not None else ""


#: Wide enough for every event name but `component_upgrade_finished`.
NAME_WIDTH = 23


class EventLog(RowList):
    DEFAULT_CSS = """
    EventLog { height: 1fr; }
    """

    BINDINGS = [
        Binding("J", "raw", "JSON"),
        # Only on a delay request's row (`check_action`); elsewhere the screen's keys act
        # on the execution.
        Binding("c", "delay('cancel')", "Cancel delay"),
        Binding("p", "delay('pause')", show=False),
        Binding("u", "delay('unpause')", show=False),
    ]

    class RawWanted(Message):
        """Show the raw JSON of row `index`."""

        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.events: list[EventEntry] = []
        #: The EVENT column: its usual width, wider when a longer name is in the log.
        self._name_width = NAME_WIDTH
        self._on_delay = False

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

    @property
    def selected_delay(self) -> str | None:
        """The delay that the row under the cursor requested, if it requested one."""
        if not 0 <= self.cursor < len(self.events):
            return None
        return model.requested_delay(self.events[self.cursor]["event"])

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "delay":
            return self.selected_delay is not None
        if action == "raw":
            return bool(self.events)
        return True

    def watch_cursor(self, old: int, new: int) -> None:
        super().watch_cursor(old, new)
        # `c` cancels a delay on its row, the execution elsewhere: the footer says which
        # (rebuilt only when that changes: Textual rebuilds the whole footer).
        on_delay = self.selected_delay is not None
        if on_delay != self._on_delay:
            self._on_delay = on_delay
            self.refresh_bindings()

    def action_delay(self, action: str) -> None:
        if (delay := self.selected_delay) is not None:
            self.post_message(DelayKey(delay, action))

    def action_raw(self) -> None:
        if self.events:
            self.post_message(self.RawWanted(self.cursor))

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
        colour = event_colour(name)
        if finished:
            kind = model.result_kind(model.normal_result(event.get("result") or {}))
            colour = model.STATE_COLOURS["finished" if kind == "ok" else "err"]
        text = Text(no_wrap=True)
        text.append(f"{entry['version']:>4}  ", palette.COLOURS["muted"])
        text.append(
            f"{model.clock_time(model.parse_ts(entry['created_at'])):<12}  ",
            palette.COLOURS["muted"],
        )
        marker = "◆" if entry.get("backtrace_id") is not None else " "
        text.append(marker, palette.COLOURS["mark"])
        text.append(f"{name.ljust(self._name_width)}  ", colour)
        text.append(model.event_summary(event))
        return text
