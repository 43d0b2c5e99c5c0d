"""One event of an execution's log as its raw JSON (pretty, scrollable): what the API
returns for it (`GET /v1/executions/{id}/events`), for when the one-line summary of the
Events tab leaves out what an operator needs."""

from __future__ import annotations

import json

from rich.json import JSON
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from engine.views import EventEntry
from obelisk_tui import model
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
        # Everything the entry has (version, time, backtrace id, the event), not only
        # the event: what the API returns, sorted keys aside.
        text = json.dumps(self.entry, ensure_ascii=False, default=str)
        with Vertical(id="event-json"):
            yield Label(title, id="event-json-title")
            with KeyScroll(id="event-json-scroll"):
                yield Static(JSON(text, indent=2), id="event-json-text")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one(KeyScroll).focus()
