"""`CommandLine`: the one-line `:` prompt at the bottom of a screen (like vim's, k9s's).

It only edits a line: `tab` completes (`cmdline.complete`: command names, then the listed
executions' ids, orders, filter words), `up` / `down` walk the history (`cmdline.History`,
the app's, shared by every screen), `esc` closes it and gives the focus back. `enter`
posts `Run` with the line; its screen runs it (`screens/run_command.py`) and closes the
line, or leaves it open, as typed, when the line was wrong (the error is a toast).
"""

from __future__ import annotations

from collections.abc import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input, Static

from obelisk_tui import cmdline


class CommandLine(Widget):
    BINDINGS = [
        # Checked before the screen's (the line's input is focused): `esc` closes the
        # line, not the screen; `tab` completes rather than moving the focus.
        Binding("escape", "close", "Close"),
        Binding("tab", "complete", "Complete"),
        Binding("up", "history(-1)", "History"),
        Binding("down", "history(1)", "Next", show=False),
    ]

    class Run(Message):
        """Run this line (not empty)."""

        def __init__(self, command_line: CommandLine, text: str) -> None:
            super().__init__()
            self.command_line = command_line
            self.text = text

        @property
        def control(self) -> CommandLine:
            return self.command_line

    def __init__(
        self, history: cmdline.History, listed: Callable[[], list[str]], *, id: str | None = None
    ) -> None:
        super().__init__(id=id)
        self.history = history
        #: The ids of the executions the screen shows (completion).
        self.listed = listed
        self._give_back: Widget | None = None
        #: The value this widget set (history, completion): its `Changed` is not typing.
        self._set_value: str | None = None

    def compose(self) -> ComposeResult:
        yield Static(":", id="command-prompt")
        yield Input(id="command-input", select_on_focus=False)
        yield Static(id="command-hint")

    @property
    def input(self) -> Input:
        return self.query_one("#command-input", Input)

    @property
    def is_open(self) -> bool:
        return bool(self.display)

    def open(self) -> None:
        screen = self.screen
        focused = screen.focused
        self._give_back = focused if focused is not None and focused is not self.input else None
        self.display = True
        self.history.reset()
        self._show_value("")
        self._hint("")
        screen.set_focus(self.input)  # at once: the keys typed after `:` go to the line

    def action_close(self) -> None:
        self.display = False
        self.history.reset()
        back = self._give_back
        self._give_back = None
        if back is not None and back.is_attached and back.screen is self.screen:
            self.screen.set_focus(back)
        else:
            self.screen.set_focus(None)
            self.screen.focus_next()

    @on(Input.Submitted, "#command-input")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()  # not the screen's filter box's
        text = event.value.strip()
        self.history.add(text)
        if not text.removeprefix(":").strip():
            self.action_close()
            return
        self.post_message(self.Run(self, text))

    @on(Input.Changed, "#command-input")
    def _changed(self, event: Input.Changed) -> None:
        event.stop()
        if event.value == self._set_value:
            return  # completion or history: they set the hint
        self._set_value = None
        self.history.reset()  # typed: up / down start from here again
        self._hint(usage_hint(event.value))

    def action_complete(self) -> None:
        done = cmdline.complete(self.input.value, self.listed())
        self._show_value(done.text)
        if len(done.candidates) > 1:
            self._hint("  ".join(done.candidates[:8]) + ("  …" if len(done.candidates) > 8 else ""))
        elif not done.candidates:
            self._hint("no completion")
        else:
            self._hint(usage_hint(done.text))

    def action_history(self, step: int) -> None:
        line = self.history.back(self.input.value) if step < 0 else self.history.forward()
        if line is not None:
            self._show_value(line)
            self._hint(usage_hint(line))

    def _show_value(self, value: str) -> None:
        self._set_value = value
        self.input.value = value
        self.input.cursor_position = len(value)

    def _hint(self, text: str) -> None:
        self.query_one("#command-hint", Static).update(text)


def usage_hint(line: str) -> str:
    """What the line's command takes and does, once its name is typed."""
    name = line.strip().removeprefix(":").split(" ", 1)[0]
    command = cmdline.BY_NAME.get(name.lower())
    if command is None:
        return ""
    return f":{command.name} {command.usage}".rstrip() + f" — {command.help}"
