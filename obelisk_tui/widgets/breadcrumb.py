"""`Breadcrumb`: where a screen is in the stack, `executions › E_01JA…7XQZ › child …g:1_2`."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from obelisk_tui import model, palette

SEPARATOR = " › "


class Breadcrumb(Widget):
    """Its screen sets `trail` (screen names and execution ids, the list first); it is
    shortened to fit (`model.breadcrumb`, `model.fit_breadcrumb`), the last crumb kept."""

    trail: reactive[tuple[str, ...]] = reactive((), layout=False)

    def render(self) -> Text:
        labels = model.fit_breadcrumb(
            model.breadcrumb(list(self.trail)), max(0, self.size.width - 1), SEPARATOR
        )
        text = Text(" ", no_wrap=True, overflow="ellipsis")
        for i, label in enumerate(labels):
            if i:
                text.append(SEPARATOR, palette.COLOURS["muted"])
            text.append(label, "bold" if i == len(labels) - 1 else "")
        return text
