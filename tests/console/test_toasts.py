"""Toasts never cover a confirmation's buttons: Textual stacks them from the bottom
right, where a centred dialog's buttons were; the confirmation sits at the top and keeps
its toasts to the rows below it."""

from __future__ import annotations

from textual.geometry import Region
from textual.widgets import Button, Label
from textual.widgets._toast import Toast

from engine.engine import Engine
from obelisk_tui.app import ObeliskApp
from obelisk_tui.screens.confirm import ConfirmScreen
from tests.console.conftest import ORDER, open_console, until
from tests.console.test_console import listed


def shown_regions(app: ObeliskApp, widget_type: type) -> list[Region]:
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


def assert_clear(app: ObeliskApp, newest: str | None) -> None:
    """No toast over the buttons or the question; the newest one in sight."""
    toasts = shown_regions(app, Toast)
    covered = shown_regions(app, Button) + shown_regions(app, Label)
    assert len(covered) == 3  # yes, no, the question
    for region in covered:
        assert all(not region.overlaps(t) for t in toasts), (region, toasts)
    if newest is not None:
        assert newest in shown_toast_text(app)


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
        assert_clear(app, "notice 4")
        # A tall one (an error listing many ids) is cut, not drawn over the buttons.
        app.notify("\n".join(f"E_01M9XYNVK.o:1-approve_{n} failed" for n in range(20)), timeout=30)
        await until(pilot, lambda: "approve_0 failed" in shown_toast_text(app), what="tall")
        assert_clear(app, "approve_0 failed")
        await pilot.resize_terminal(60, 20)  # narrower, shorter: still clear
        await pilot.pause()
        assert_clear(app, None)
        await pilot.press("n")
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), what="closed")
