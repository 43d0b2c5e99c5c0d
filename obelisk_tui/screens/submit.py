"""Submit an execution: pick an exported function, edit its params as JSON (checked
against the WIT types as you type), then open the new execution."""

from __future__ import annotations

import asyncio

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Input, Label, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from engine.client import ApiError
from engine.views import FunctionExport
from obelisk_tui import palette, submitting
from obelisk_tui.messages import Restyled
from obelisk_tui.screens.base import ObeliskScreenMixin
from obelisk_tui.screens.dialog import DialogScreen
from obelisk_tui.widgets.key_footer import KeyFooter


def signature(fn: FunctionExport) -> Text:
    text = Text()
    text.append(fn["ffqn"], "bold")
    text.append("(")
    for i, p in enumerate(fn["params"]):
        if i:
            text.append(", ")
        text.append(p["name"], palette.COLOURS["label"])
        text.append(": ")
        text.append(p["type"], palette.COLOURS["type"])
    text.append(")")
    if fn["return_type"]:
        text.append(" -> ")
        text.append(fn["return_type"], palette.COLOURS["type"])
    return text


#: Seconds between attempts to read the deployment while the server does not answer.
RETRY_SECONDS = 2.0


def function_prompt(ffqn: str) -> Text:
    """The function's name first, then its interface: one line that a narrow dialog
    cuts at the end, where the shared namespace is, not in the middle of the name."""
    interface, _, function = ffqn.rpartition(".")
    return Text.assemble(
        (function, "bold"),
        "  ",
        (interface, palette.COLOURS["muted"]),
        no_wrap=True,
        overflow="ellipsis",
    )


class SubmitScreen(ObeliskScreenMixin, DialogScreen[str | None]):
    """Dismissed with the new execution's id, or None."""

    BINDINGS = [
        Binding("escape", "dismiss_none", "Close"),
        Binding("ctrl+s", "submit", "Submit"),
    ]

    def __init__(self, preselect: str | None = None) -> None:
        super().__init__()
        self.functions: list[FunctionExport] = []
        self.preselect = preselect
        self.chosen: FunctionExport | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="submit"):
            yield Label("Submit an execution", id="submit-title")
            with Horizontal(id="submit-columns"):
                with Vertical(id="submit-functions"):
                    yield Input(placeholder="type to filter functions", id="function-filter")
                    yield OptionList(id="function-list")
                with Vertical(id="submit-form"):
                    yield Static("pick a function", id="signature")
                    yield Label("params (a JSON array, in declared order):")
                    yield TextArea("[]", language="json", id="params")
                    yield Static(id="params-error")
            # Under both columns: whole beside a narrow form (60 columns)
            with Horizontal(id="submit-buttons"):
                yield Button("Submit (ctrl+s)", variant="primary", id="do-submit")
                yield Button("Close (esc)", id="close")
        yield KeyFooter()  # this dialog's keys, not those of the screen beneath

    def on_mount(self) -> None:
        self.load()

    @work(exclusive=True, group="submit-load")
    async def load(self) -> None:
        while True:  # until the server answers: the dialog may be open when it is back
            try:
                deployment = await self.obelisk.backend.deployment()
                break
            except ApiError as e:
                self.obelisk.report_error(e)
                if not self.is_live:
                    return
                self.query_one("#signature", Static).update(
                    Text(
                        f"cannot list the functions: {e.message} (retrying)",
                        palette.COLOURS["error"],
                    )
                )
                await asyncio.sleep(RETRY_SECONDS)
        if not self.is_live:  # closed while we waited
            return
        self.query_one("#signature", Static).update("pick a function")
        self.functions = submitting.exported_functions(deployment)
        self._fill(self.query_one("#function-filter", Input).value)  # typed meanwhile
        if self.preselect:
            self._choose(self.preselect)
        self.query_one("#function-filter", Input).focus()

    def _fill(self, needle: str) -> None:
        options = self.query_one(OptionList)
        options.clear_options()
        for f in self.functions:
            if needle.lower() in f["ffqn"].lower():
                options.add_option(Option(function_prompt(f["ffqn"]), id=f["ffqn"]))
        if options.option_count:
            options.highlighted = 0

    @on(Input.Changed, "#function-filter")
    def _filter(self, event: Input.Changed) -> None:
        self._fill(event.value)

    @on(Input.Submitted, "#function-filter")
    def _filter_done(self) -> None:
        options = self.query_one(OptionList)
        if options.highlighted is not None:
            option = options.get_option_at_index(options.highlighted)
            self._choose(str(option.id))
            self.query_one(TextArea).focus()

    @on(OptionList.OptionHighlighted)
    @on(OptionList.OptionSelected)
    def _option(self, event: OptionList.OptionHighlighted | OptionList.OptionSelected) -> None:
        self._choose(str(event.option.id))
        if isinstance(event, OptionList.OptionSelected):
            self.query_one(TextArea).focus()

    def on_restyled(self, _: Restyled) -> None:
        """Drawn again in the new theme's colours (what was typed stays)."""
        if self.chosen is not None:
            self.query_one("#signature", Static).update(signature(self.chosen))
            self._check()

    def _choose(self, ffqn: str) -> None:
        fn = next((f for f in self.functions if f["ffqn"] == ffqn), None)
        if fn is None or fn is self.chosen:
            return
        self.chosen = fn
        self.query_one("#signature", Static).update(signature(fn))
        self.query_one(TextArea).text = submitting.params_template(fn["params"])
        self._check()

    @on(TextArea.Changed)
    def _edited(self) -> None:
        self._check()

    def _check(self) -> list[object] | None:
        error_box = self.query_one("#params-error", Static)
        if self.chosen is None:
            error_box.update(Text("pick a function first", palette.COLOURS["error"]))
            return None
        params, error = submitting.check_params(
            self.chosen["ffqn"], self.chosen["params"], self.query_one(TextArea).text
        )
        if error:
            error_box.update(Text("✗ " + error, palette.COLOURS["error"]))
            return None
        error_box.update(Text("✓ params match the types", palette.COLOURS["ok"]))
        return params

    @on(Button.Pressed, "#do-submit")
    def _pressed(self) -> None:
        self.action_submit()

    @on(Button.Pressed, "#close")
    def action_dismiss_none(self) -> None:
        self.dismiss(None)

    @work(exclusive=True, group="submit")
    async def action_submit(self) -> None:
        params = self._check()
        if params is None or self.chosen is None:
            return
        try:
            eid = await self.obelisk.backend.submit(self.chosen["ffqn"], list(params))
        except ApiError as e:
            if self.is_live:
                box = self.query_one("#params-error", Static)
                box.update(Text("✗ " + e.message, palette.COLOURS["error"]))
            return
        if self.is_live:
            self.dismiss(eid)
