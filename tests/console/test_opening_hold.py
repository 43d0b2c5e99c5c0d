"""While an execution's screen opens, the console holds the cyclic collector off and
shortens the GIL's switch interval, and puts both back once the screen is drawn filled,
when it is closed first, or after `MAX_HOLD` at the latest (`obelisk_tui.opening_hold`).
Both are process-wide: every test leaves them as they were."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from engine.engine import Engine
from obelisk_tui.opening_hold import OPENING_SWITCH_INTERVAL, OpeningHold
from obelisk_tui.screens.detail import ExecutionDetailScreen
from obelisk_tui.screens.executions import ExecutionsScreen
from tests.console.conftest import STEP, GatedBackend, open_console, until
from tests.console.test_console import select


@pytest.fixture(autouse=True)
def _process_wide_settings_restored() -> Iterator[None]:
    assert gc.isenabled()
    interval = sys.getswitchinterval()
    yield
    gc.enable()
    sys.setswitchinterval(interval)


async def test_an_opening_holds_until_the_screen_is_drawn_filled(
    console_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = console_engine
    eid = await engine.submit(STEP, [3])
    await engine.result(eid, timeout=10)
    enabled_while_filling: list[bool] = []
    interval_while_filling: list[float] = []
    show = ExecutionDetailScreen._show

    def spy(screen: ExecutionDetailScreen) -> None:
        enabled_while_filling.append(gc.isenabled())
        interval_while_filling.append(sys.getswitchinterval())
        show(screen)

    monkeypatch.setattr(ExecutionDetailScreen, "_show", spy)
    async with open_console(engine) as (app, pilot):
        # (A limit the test never reaches: what resumes it is the screen.)
        app.opening = OpeningHold(enabled=True, max_hold=600)
        interval = sys.getswitchinterval()
        await select(app, pilot, eid)
        await pilot.press("enter")
        await until(pilot, lambda: bool(enabled_while_filling), what="the screen filled")
        assert enabled_while_filling[0] is False
        assert interval_while_filling[0] == OPENING_SWITCH_INTERVAL
        await until(pilot, gc.isenabled, what="the collector resumed after the frame")
        assert not app.opening.held and sys.getswitchinterval() == interval
        assert isinstance(app.screen, ExecutionDetailScreen)


async def test_a_screen_closed_before_it_filled_resumes_the_collector(
    console_engine: Engine,
) -> None:
    engine = console_engine
    eid = await engine.submit(STEP, [3])
    await engine.result(eid, timeout=10)
    backend = GatedBackend(engine)
    async with open_console(backend=backend) as (app, pilot):
        # (A limit the test never reaches: what resumes it is the screen.)
        app.opening = OpeningHold(enabled=True, max_hold=600)
        await select(app, pilot, eid)
        backend.gate.clear()  # its reads wait: it never fills
        await pilot.press("enter")
        await until(pilot, lambda: backend.waiting > 0, what="the detail's load to start")
        assert not gc.isenabled()
        app.pop_screen()
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")
        await until(pilot, gc.isenabled, what="the collector resumed")
        backend.gate.set()
        await until(pilot, lambda: backend.waiting == 0, what="the reads to return")
        assert app.screen_errors == []


async def test_a_hold_ends_by_itself_at_its_limit() -> None:
    import asyncio

    interval = sys.getswitchinterval()
    hold = OpeningHold(enabled=True, max_hold=0.05)
    hold.hold()
    assert not gc.isenabled() and hold.held and sys.getswitchinterval() != interval
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while not gc.isenabled() and loop.time() < deadline:
        await asyncio.sleep(0.01)  # (a poll for the limit's own timer, not a sync)
    assert gc.isenabled() and not hold.held and sys.getswitchinterval() == interval


async def test_a_hold_leaves_the_collector_alone_when_disabled_or_held_elsewhere() -> None:
    interval = sys.getswitchinterval()
    OpeningHold(enabled=False).hold()  # a console embedded in another program
    assert gc.isenabled() and sys.getswitchinterval() == interval
    gc.disable()  # someone else's pause: a release must not end it
    hold = OpeningHold(enabled=True)
    hold.hold()
    hold.release()
    assert not gc.isenabled() and not hold.held
