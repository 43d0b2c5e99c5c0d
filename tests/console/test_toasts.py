"""Toasts never cover a dialog's buttons: Textual stacks them from the bottom right,
where a centred dialog's buttons were. Every modal screen with buttons (the confirmation,
the submit form, the stub form) is a `DialogScreen`: it keeps its toasts to the rows below
its lowest button (screens/dialog.py)."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Awaitable, Callable

import pytest
from textual.geometry import Region
from textual.pilot import Pilot
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, Label
from textual.widgets._toast import Toast

import obelisk_tui.screens
from engine.engine import Engine
from obelisk_tui.app import ObeliskApp
from obelisk_tui.screens.confirm import ConfirmScreen
from obelisk_tui.screens.dialog import DialogScreen
from obelisk_tui.screens.help import HelpScreen
from obelisk_tui.screens.stub import StubScreen
from obelisk_tui.screens.submit import SubmitScreen
from tests.console.conftest import APPROVE, ORDER, open_console, until
from tests.console.test_console import listed


def shown_regions(app: ObeliskApp, widget_type: type[Widget]) -> list[Region]:
    """The visible parts of the current screen's widgets of a type (a toast scrolled out
    of its rack shows nothing)."""
    screen = app.screen
    out = []
    for widget in screen.query(widget_type):
        try:
            geometry = screen.find_widget(widget)
        except Exception:  # not laid out: not shown
            continue
        if (visible := geometry.region.intersection(geometry.clip)).area:
            out.append(visible)
    return out


def shown_toast_text(app: ObeliskApp) -> str:
    return "\n".join(str(t.render()) for t in app.screen.query(Toast) if t.region.area)


def assert_clear(app: ObeliskApp, newest: str | None, covered: list[Region]) -> None:
    """No toast over `covered` (the buttons, the question); the newest one in sight."""
    toasts = shown_regions(app, Toast)
    for region in covered:
        assert all(not region.overlaps(t) for t in toasts), (region, toasts)
    if newest is not None:
        assert newest in shown_toast_text(app)


def buttons_and_question(app: ObeliskApp) -> list[Region]:
    covered = shown_regions(app, Button) + shown_regions(app, Label)
    assert len(covered) == 3  # yes, no, the question
    return covered


def buttons(app: ObeliskApp) -> list[Region]:
    """The form's two buttons (do it, close), which it shows whole."""
    covered = shown_regions(app, Button)
    assert covered == [button.region for button in app.screen.query(Button)]
    assert len(covered) == 2
    return covered


async def test_toasts_stay_off_a_confirmations_buttons(console_engine: Engine) -> None:
    engine = console_engine
    order = await engine.submit(ORDER, ["o-1"])
    async with open_console(engine, size=(80, 24), notifications=True) as (app, pilot):
        await until(pilot, lambda: order in listed(app), what="listed")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        for i in range(5):  # several lines each, as a batch's result is
            app.notify(
                f"notice {i}: " + " ".join(f"E_01M9{i}XYNVK.o:1-approve_{n}" for n in range(3)),
                title="batch",
                timeout=30,
            )
        await until(pilot, lambda: bool(shown_regions(app, Toast)), what="a toast shown")
        assert_clear(app, "notice 4", buttons_and_question(app))
        # A tall one (an error listing many ids) is cut, not drawn over the buttons.
        app.notify("\n".join(f"E_01M9XYNVK.o:1-approve_{n} failed" for n in range(20)), timeout=30)
        await until(pilot, lambda: "approve_0 failed" in shown_toast_text(app), what="tall")
        assert_clear(app, "approve_0 failed", buttons_and_question(app))
        await pilot.resize_terminal(60, 20)  # narrower, shorter: still clear
        await pilot.pause()
        assert_clear(app, None, buttons_and_question(app))
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="closed")


async def open_submit(app: ObeliskApp, pilot: Pilot[None], _: str) -> None:
    await pilot.press("s")
    await until(
        pilot,
        lambda: isinstance(app.screen, SubmitScreen) and bool(app.screen.functions),
        what="the submit form",
    )


async def open_stub(app: ObeliskApp, pilot: Pilot[None], approval: str) -> None:
    await pilot.press("S")  # the list's cursor is on the newest: the approval
    await until(
        pilot,
        lambda: isinstance(app.screen, StubScreen) and app.screen.return_type is not None,
        what="the stub form",
    )
    assert isinstance(app.screen, StubScreen) and app.screen.info["execution_id"] == approval


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
@pytest.mark.parametrize("open_dialog", [open_submit, open_stub], ids=["submit", "stub"])
async def test_toasts_stay_off_a_forms_buttons(
    console_engine: Engine,
    size: tuple[int, int],
    open_dialog: Callable[[ObeliskApp, Pilot[None], str], Awaitable[None]],
) -> None:
    engine = console_engine
    approval = await engine.submit(APPROVE, ["a-1"])
    async with open_console(engine, size=size, notifications=True) as (app, pilot):
        await until(pilot, lambda: approval in listed(app), what="listed")
        await open_dialog(app, pilot, approval)
        app.notify("server reachable again", title="server", timeout=30)
        await until(pilot, lambda: bool(shown_regions(app, Toast)), what="a toast shown")
        assert_clear(app, "server reachable again", buttons(app))
        for i in range(3):  # several, several lines each (a batch's result)
            app.notify(
                f"notice {i}: " + " ".join(f"E_01M9{i}XYNVK.o:1-approve_{n}" for n in range(3)),
                title="batch",
                timeout=30,
            )
        await until(pilot, lambda: "notice 2" in shown_toast_text(app), what="the newest")
        assert_clear(app, "notice 2", buttons(app))
        await pilot.resize_terminal(size[0] + 20, size[1] + 6)  # resized: still clear
        await pilot.pause()
        assert_clear(app, "notice 2", buttons(app))


def test_every_modal_with_buttons_is_a_dialog() -> None:
    """A modal screen of the console that has buttons (its module uses Textual's
    `Button`) keeps toasts off them by being a `DialogScreen`."""
    modals = []
    for module_info in pkgutil.iter_modules(obelisk_tui.screens.__path__):
        module = importlib.import_module(f"obelisk_tui.screens.{module_info.name}")
        modals += [
            (value, module)
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, ModalScreen)
            and value.__module__ == module.__name__
        ]
    with_buttons = {modal for modal, module in modals if getattr(module, "Button", None)}
    assert with_buttons == {ConfirmScreen, SubmitScreen, StubScreen, DialogScreen}
    assert all(issubclass(modal, DialogScreen) for modal in with_buttons)
    assert HelpScreen in {modal for modal, _ in modals} - with_buttons  # toasts may cover it
