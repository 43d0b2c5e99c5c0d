"""`LogView`: an execution's stored log lines and stdout/stderr, following new ones."""

from __future__ import annotations

from rich.text import Text

from engine.views import LogEntry
from obelisk_tui import model, palette
from obelisk_tui.widgets.row_list import RowList

#: Each level's colour: a role of the palette (looked up when drawn: it follows the
#: theme); the others in the text's colour.
LEVEL_ROLES = {"error": "error", "warn": "warning", "debug": "muted", "trace": "muted"}


def level_style(level: str) -> str:
    role = LEVEL_ROLES.get(level)
    return palette.COLOURS[role] if role is not None else ""


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
        text.append(
            f"{model.clock_time(model.parse_ts(line['created_at'])):<12}  ",
            palette.COLOURS["muted"],
        )
        level = line["level"]
        style = level_style(level)
        text.append(f"{level:<5}  ", style)
        text.append(f"{line['stream']:<6}  ", palette.COLOURS["muted"])
        text.append(line["message"].replace("\n", "⏎"), style)
        return text
