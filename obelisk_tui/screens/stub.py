"""Stub an `activity_stub` execution: write its return value (checked against the
function's return type as you type), the way `obelisk execution stub` does."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Label, Static, TextArea

from engine.client import ApiError
from engine.views import ExecutionInfo
from obelisk_tui import palette, submitting
from obelisk_tui.messages import Restyled
from obelisk_tui.screens.base import ObeliskScreenMixin
from obelisk_tui.screens.dialog import DialogScreen
from obelisk_tui.widgets.key_footer import KeyFooter

#: The return value shown until the function's return type is known.
PLACEHOLDER = '{"ok": null}'


class StubScreen(ObeliskScreenMixin, DialogScreen[bool]):
    """Dismissed with True once the stub was written."""

    BINDINGS = [
        Binding("escape", "close", "Close"),
        Binding("ctrl+s", "stub", "Stub"),
    ]

    def __init__(self, info: ExecutionInfo) -> None:
        super().__init__()
        self.info = info
        #: The function's declared return type, once the deployment is read.
        self.return_type: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="stub"):
            yield Label(f"Stub {self.info['execution_id']}", id="stub-title")
            yield Static(self.info["ffqn"], id="stub-signature")
            yield Label('return value ({"ok": …} or {"err": …}):')
            yield TextArea(PLACEHOLDER, language="json", id="stub-value")
            yield Static(id="stub-error")
            with Horizontal(id="stub-buttons"):
                yield Button("Stub (ctrl+s)", variant="primary", id="do-stub")
                yield Button("Close (esc)", id="stub-close")
        yield KeyFooter()  # this dialog's keys, not those of the screen beneath

    def on_mount(self) -> None:
        self.query_one(TextArea).focus()
        self.load()

    @work
    async def load(self) -> None:
        try:
            deployment = await self.obelisk.backend.deployment()
        except ApiError as e:
            self.obelisk.report_error(e)
            return
        if not self.is_live:  # closed while we waited
            return
        ffqn = self.info["ffqn"]
        for fn in submitting.exported_functions(deployment):
            if fn["ffqn"] == ffqn:
                self.return_type = fn["return_type"]
        self._show_signature()
        area = self.query_one(TextArea)
        if area.text == PLACEHOLDER:  # not what was typed meanwhile
            area.text = submitting.stub_template(self.return_type)
        self._check()

    def _show_signature(self) -> None:
        signature = Text(self.info["ffqn"], "bold")
        if self.return_type:
            signature.append(" -> ")
            signature.append(self.return_type, palette.COLOURS["type"])
        self.query_one("#stub-signature", Static).update(signature)

    def on_restyled(self, _: Restyled) -> None:
        """Drawn again in the new theme's colours (what was typed stays)."""
        self._show_signature()
        self._check()

    @on(TextArea.Changed)
    def _edited(self) -> None:
        self._check()

    def _check(self) -> Any | None:
        value, error = submitting.check_stub(self.return_type, self.query_one(TextArea).text)
        box = self.query_one("#stub-error", Static)
        if error:
            box.update(Text("✗ " + error, palette.COLOURS["error"]))
            return None
        box.update(Text("✓ matches the return type", palette.COLOURS["ok"]))
        return value

    @on(Button.Pressed, "#do-stub")
    def _pressed(self) -> None:
        self.action_stub()

    @on(Button.Pressed, "#stub-close")
    def action_close(self) -> None:
        self.dismiss(False)

    @work(exclusive=True, group="stub")
    async def action_stub(self) -> None:
        value = self._check()
        if value is None:
            return
        eid = self.info["execution_id"]
        try:
            await self.obelisk.backend.stub(eid, value)
        except ApiError as e:
            # Kept open with the answer (a conflict, a type the server refused).
            if self.is_live:
                box = self.query_one("#stub-error", Static)
                box.update(Text("✗ " + e.message, palette.COLOURS["error"]))
            return
        self.notify(f"stubbed {eid}", title="stub")
        self.obelisk.request_refresh()
        if self.is_live:
            self.dismiss(True)
