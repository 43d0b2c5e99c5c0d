"""The executions list as an operator's everyday tool: a true throughput, the cursor that
stays on its execution, failures found in one key (Pilot, a real embedded engine)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from textual.widgets import Static

from engine.engine import Engine
from obelisk_tui.app import ObeliskApp
from obelisk_tui.screens.detail import ExecutionDetailScreen
from obelisk_tui.screens.executions import ExecutionsScreen
from obelisk_tui.widgets.state_counts import StateCounts
from tests.console.conftest import STEP, open_console, until


class Clock:
    """The app's `now`, moved by the test: the throughput's time is the test's."""

    def __init__(self) -> None:
        self.at = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


def rate_shown(app: ObeliskApp) -> str:
    return str(app.screen.query_one(StateCounts).query_one("#rate", Static).render()).strip()


async def finish(engine: Engine, pilot: Any, n: int) -> None:
    """`n` more executions finished (the engine's count says so)."""
    before = (await engine.counts_by_state())["finished"]
    for i in range(n):
        await engine.submit(STEP, [i])

    async def done() -> bool:
        return (await engine.counts_by_state())["finished"] >= before + n

    await until(pilot, done, what=f"{n} executions to finish")


async def sampled(app: ObeliskApp, pilot: Any) -> None:
    """The app took a throughput sample after this point."""
    start = app.throughput.samples
    await until(pilot, lambda: app.throughput.samples > start, what="a throughput sample")


# -- 1. the throughput ---------------------------------------------------------------------


async def test_a_frozen_list_still_shows_the_true_rate(console_engine: Engine) -> None:
    clock = Clock()
    async with open_console(console_engine, now=clock) as (app, pilot):
        await sampled(app, pilot)  # the baseline, at the clock's start
        await pilot.press("space")
        assert app.frozen
        await finish(console_engine, pilot, 10)
        clock.advance(2.0)
        await until(pilot, lambda: rate_shown(app) == "5.0 fin/s", what=f"5/s: {rate_shown(app)}")
        assert app.frozen


async def test_the_rate_after_a_stay_in_a_detail_screen_is_no_spike(
    console_engine: Engine,
) -> None:
    clock = Clock()
    eid = await console_engine.submit(STEP, [1])
    async with open_console(console_engine, now=clock) as (app, pilot):
        await sampled(app, pilot)
        app.open_execution(eid)
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        # Twenty finish during a hundred seconds away: 0.2 a second, each second.
        await finish(console_engine, pilot, 20)
        clock.advance(100.0)
        await sampled(app, pilot)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="back")
        await until(pilot, lambda: rate_shown(app) == "0.2 fin/s", what=f"0.2/s: {rate_shown(app)}")
        bars = app.screen.query_one(StateCounts).query_one("#throughput").data  # type: ignore[attr-defined]
        assert max(bars) <= 0.2 + 1e-9, bars
