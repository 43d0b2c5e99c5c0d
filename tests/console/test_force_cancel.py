"""The console's forced cancel (`X` on an execution's screen): offered only for a workflow
that is not -cancellable, and only after a confirmation that says so."""

from __future__ import annotations

from datetime import timedelta

from engine.core import events as ev
from engine.engine import Engine
from obelisk_tui.screens.confirm import ConfirmScreen
from obelisk_tui.screens.detail import ExecutionDetailScreen
from tests.console.conftest import FANOUT, ORDER, open_console, screen_text, until
from tests.console.test_console import notices, open_detail, state_of


async def test_force_cancel_asks_and_ends_a_workflow_that_is_not_cancellable(
    console_engine: Engine,
) -> None:
    engine = console_engine
    # Not -cancellable, and pending for a day: only a forced cancel ends it now.
    eid = await engine.submit(FANOUT, [1], scheduled_at=engine.clock.now() + timedelta(days=1))
    async with open_console(engine) as (app, pilot):
        await open_detail(app, pilot, eid)
        await pilot.press("c")  # a plain cancel is refused, as before
        await until(pilot, lambda: any("not cancellable" in n for n in notices(app)), what="why")
        assert not isinstance(app.screen, ConfirmScreen)
        assert "Force cancel" not in screen_text(app)  # a last resort: not in the footer

        await pilot.press("X")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        assert isinstance(app.screen, ConfirmScreen)
        assert "is not cancellable. End it by force?" in app.screen.question
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="back")
        assert await state_of(engine, eid) == "pending_at"

        await pilot.press("X")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        await pilot.press("y")
        assert await engine.result(eid, timeout=10) == ev.ExecutionFailure(
            "cancelled", "cancellation requested"
        )
        events = [e.event for e in await engine.storage.get_events(eid)]
        assert ev.CancellationRequested(forced=True) in events
        await until(
            pilot,
            lambda: any(f"forced cancellation requested for {eid}" in n for n in notices(app)),
            what="the outcome",
        )


async def test_force_cancel_is_not_offered_for_what_cancel_ends(console_engine: Engine) -> None:
    engine = console_engine
    eid = await engine.submit(ORDER, ["x"])
    async with open_console(engine) as (app, pilot):
        await open_detail(app, pilot, eid)
        await until(pilot, lambda: "c Cancel" in screen_text(app), what="the footer")
        await pilot.press("X")
        await until(pilot, lambda: any("without force" in n for n in notices(app)), what="why")
        assert not isinstance(app.screen, ConfirmScreen)
