"""One event of an execution's log as its raw JSON (pretty, scrollable): what the API
returns for it (`GET /v1/executions/{id}/events`), for when the one-line summary of the
Events tab leaves out what an operator needs. Drawn in the theme's JSON colours
(`palette.json_text`), again when the theme changes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from engine.views import EventEntry
from obelisk_tui import model, palette
from obelisk_tui.messages import Restyled
from obelisk_tui.widgets.key_footer import KeyFooter
from obelisk_tui.widgets.key_scroll import KeyScroll


class EventJsonScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,J", "dismiss", "Close")]

    def __init__(self, execution_id: str, entry: EventEntry) -> None:
        super().__init__()
        self.execution_id = execution_id
        self.entry = entry

    def compose(self) -> ComposeResult:
        name = model.event_name(self.entry["event"])
        title = f"{self.execution_id} · version {self.entry['version']} · {name}"
        with Vertical(id="event-json"):
            yield Label(title, id="event-json-title")
            with KeyScroll(id="event-json-scroll"):
                yield Static(self._json(), id="event-json-text")
        yield KeyFooter()

    def _json(self) -> Text:
        # Everything the entry has (version, time, backtrace id, the event), not only
        # the event: what the API returns, sorted keys aside.
        return palette.json_text(self.entry)

    def on_restyled(self, _: Restyled) -> None:
        self.query_one("#event-json-text", Static).update(self._json())

    def on_mount(self) -> None:
        self.query_one(KeyScroll).focus()
