"""`SourceView`: a backtrace as a source excerpt, the submitting line highlighted."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text
from textual.widgets import Static

from engine.views import BacktraceInfo, ComponentSourceInfo
from obelisk_tui import palette

#: Lines shown around the highlighted one.
CONTEXT = 4


def excerpt(
    backtrace: BacktraceInfo, source: ComponentSourceInfo | None, *, theme: str = "ansi_dark"
) -> RenderableType:
    """The innermost frame's line in its source (or just the stack when the source is
    not known), then the rest of the stack."""
    frames = backtrace["frames"]
    if not frames:
        return Text("(empty backtrace)", style=palette.COLOURS["muted"])
    top = frames[0]
    parts: list[RenderableType] = []
    title = Text()
    title.append(f"{top['file']}:{top['line']}:{top['column']}", "bold")
    if top["function"]:
        title.append(f" in {top['function']}", palette.COLOURS["muted"])
    title.append(f"   version {backtrace['version']}", palette.COLOURS["muted"])
    parts.append(title)
    if source is not None:
        lines = source["source"].splitlines()
        line = top["line"]
        first = max(1, line - CONTEXT)
        last = min(len(lines), line + CONTEXT)
        parts.append(
            Syntax(
                source["source"],
                "javascript",
                theme=theme,
                line_numbers=True,
                line_range=(first, last),
                highlight_lines={line},
                word_wrap=False,
            )
        )
    else:
        parts.append(
            Text(
                "(the source of this component version is not available)", palette.COLOURS["muted"]
            )
        )
    for frame in frames[1:]:
        parts.append(
            Text(
                f"  at {frame['function'] or '<anonymous>'} ({frame['file']}:{frame['line']}:{frame['column']})",
                palette.COLOURS["muted"],
            )
        )
    return Group(*parts)


class SourceView(Static):
    DEFAULT_CSS = """
    SourceView { height: auto; max-height: 16; border-top: solid $panel-lighten-2; padding: 0 1; }
    """

    def show_backtrace(
        self, backtrace: BacktraceInfo | None, source: ComponentSourceInfo | None
    ) -> None:
        if backtrace is None:
            self.update(
                Text(
                    "No backtrace for this event (only workflow calls that write history have one).",
                    palette.COLOURS["muted"],
                )
            )
            return
        # Rich's ANSI syntax themes: the light one on a light theme (the dark one's
        # colours are for a dark background).
        syntax = "ansi_dark" if self.app.current_theme.dark else "ansi_light"
        self.update(excerpt(backtrace, source, theme=syntax))
