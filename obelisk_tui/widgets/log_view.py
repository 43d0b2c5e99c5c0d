"""`LogView`: an execution's stored log lines and stdout/stderr, following new ones."""

from __future__ import annotations

from rich.text import Text

from engine.views import LogEntry
from obelisk_tui import model
from obelisk_tui.widgets.row_list import RowList

LEVEL_COLOURS = {
    "error": "#e0606a",
    "warn": "#e08a3c",
    "info": "",
    "debug": "dim",
    "trace": "dim",
}


class LogView(RowList):
    def __init__(self, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines: list[LogEntry] = []

    @property
    def last_id(self) -> int:
        return self.lines[-1]["id"] if self.lines else 0

    def clear(self) -> None:
        self.lines = []
        self.rows_changed()

    def extend(self, lines: list[LogEntry]) -> None:
        if not lines:
            return
        follow = not self.lines or self.cursor >= len(self.lines) - 1
        self.lines.extend(lines)
        self.rows_changed()
        if follow:
            self.move_cursor(len(self.lines) - 1)

    def row_count(self) -> int:
        return len(self.lines)

    def render_header(self, width: int) -> Text:
        return Text(f"{'TIME (UTC)':<12}  {'LEVEL':<5}  {'STREAM':<6}  MESSAGE")

    def render_row(self, index: int, width: int) -> Text | None:
        line = self.lines[index]
        text = Text(no_wrap=True)
        text.append(f"{model.clock_time(model.parse_ts(line['created_at'])):<12}  ", "dim")
        level = line["level"]
        text.append(f"{level:<5}  ", LEVEL_COLOURS.get(level, ""))
        text.append(f"{line['stream']:<6}  ", "dim")
        text.append(line["message"].replace("\n", "⏎"), LEVEL_COLOURS.get(level, ""))
        return text
