"""The console survives what an operator's fingers and its own bugs do: a screen closed
while its workers still load, an exception in a screen, reads slower than the engine's
changes. The embedded engine keeps running
whatever happens to a screen (it lives in the app's process)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from textual.screen import Screen
from textual.widgets import TabbedContent

from engine.core.events import ResultOk
from engine.engine import Engine
from obelisk_tui.backend import EmbeddedBackend
from obelisk_tui.screens.detail import ExecutionDetailScreen
from obelisk_tui.screens.executions import ExecutionsScreen
from obelisk_tui.widgets.command_line import CommandLine
from obelisk_tui.widgets.event_log import EventLog
from tests.console.conftest import (
    SPIN,
    STEP,
    GatedBackend,
    open_console,
    screen_text,
    until,
)
from tests.console.test_console import listed, select


class _BrokenScreen(Screen[None]):
    BINDINGS = [("x", "explode", "Explode")]

    def on_mount(self) -> None:
        self.set_timer(0.01, self._later)

    def _later(self) -> None:
        raise RuntimeError("a bug in a timer of a screen")

    def action_explode(self) -> None:
        raise RuntimeError("a bug in an action of a screen")


async def test_an_exception_in_a_screen_is_shown_and_the_engine_keeps_running(
    console_engine: Engine,
) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        await app.push_screen(_BrokenScreen())
        await until(pilot, lambda: len(app.screen_errors) >= 1, what="the timer's error")
        # Shown to the operator (a toast), not only logged.
        await until(
            pilot,
            lambda: any("a bug in a timer" in str(n.message) for n in app._notifications),
            what="the error's toast",
        )
        if isinstance(app.screen, _BrokenScreen):
            await pilot.press("x")
            await until(pilot, lambda: len(app.screen_errors) >= 2, what="the action's error")
        assert app.is_running
        assert any("a bug in" in str(e) for e in app.screen_errors)
        # Still usable: back on the list, a detail opens, the engine runs.
        app.action_executions()
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")
        eid = await engine.submit(STEP, [2])
        assert await engine.result(eid, timeout=10) == ResultOk(20)
        await until(pilot, lambda: eid in listed(app), what="the new execution")
        await select(app, pilot, eid)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="the detail")
        app.screen_errors.clear()


@pytest.mark.parametrize("N", range(8))
async def test_a_detail_screen_closed_during_its_load_does_not_crash(
    console_engine: Engine, N: int
) -> None:
    engine = console_engine
    eid = await engine.submit(STEP, [3])
    await engine.result(eid, timeout=10)
    backend = GatedBackend(engine)
    async with open_console(backend=backend) as (app, pilot):
        await select(app, pilot, eid)
        backend.gate.clear()
        await pilot.press("enter")
        await until(pilot, lambda: backend.waiting > 0, what="the detail's load to start")
        assert isinstance(app.screen, ExecutionDetailScreen)
        # The load's reads come back while the screen is being torn down.
        app.pop_screen()
        for _ in range(N):
            await asyncio.sleep(0)
        backend.gate.set()
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")
        await until(pilot, lambda: backend.waiting == 0, what="the reads to return")
        await pilot.pause(0.1)
        assert app.is_running
        assert app.screen_errors == []


async def test_a_key_for_a_screen_being_closed_acts_on_nothing(console_engine: Engine) -> None:
    """`esc` and a tab key at once (the monkey test's find): the key's action reached the
    execution's screen while its widgets were being removed (NoMatches, survived)."""
    engine = console_engine
    eid = await engine.submit(STEP, [3])
    await engine.result(eid, timeout=10)
    async with open_console(engine) as (app, pilot):
        await select(app, pilot, eid)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        screen = app.screen
        await until(pilot, lambda: bool(screen.query(TabbedContent)), what="its tabs")
        app.pop_screen()
        # The moment its tabs are gone but the screen is still attached.
        for _ in range(1000):
            await asyncio.sleep(0)
            if not screen.query(TabbedContent):
                break
        assert screen.is_attached and not screen.query(TabbedContent), "no such moment"
        await app.run_action("tab('events')", screen)
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")
        assert app.screen_errors == []


@pytest.mark.parametrize("action", ["tab('events')", "command_line"])
async def test_a_key_before_the_screen_is_composed_acts_once_it_is(
    console_engine: Engine, action: str
) -> None:
    """`enter` then `2`, or `enter` then `:`, at once (the monkey test's finds, seeds 303
    and 1555444897): the key reached the new execution screen before its widgets existed
    (NoMatches, survived). Any action of such a screen waits for them
    (`ObeliskApp._dispatch_action`)."""
    engine = console_engine
    eid = await engine.submit(STEP, [3])
    await engine.result(eid, timeout=10)
    async with open_console(engine) as (app, pilot):
        app.open_execution(eid)
        screen = app.screen
        assert isinstance(screen, ExecutionDetailScreen) and not screen.query(TabbedContent)
        await app.run_action(action, screen)
        await until(pilot, lambda: bool(screen.query(TabbedContent)), what="its tabs")
        if action == "command_line":
            await until(pilot, lambda: screen.query_one(CommandLine).display, what="it open")
        else:
            await until(pilot, lambda: screen.active_tab == "events", what="the Events tab")
            await until(
                pilot,
                lambda: (
                    screen.info is not None
                    and bool(logs := screen.query(EventLog))
                    and len(logs.first().events) == screen.info["next_version"]
                ),
                what="its events shown",
            )
        assert app.screen_errors == []


async def test_the_palettes_keys_opens_the_one_help(console_engine: Engine) -> None:
    """The command palette's "Keys" showed Textual's panel, which lists other words than
    the console's help: it opens the help."""
    from obelisk_tui.screens.help import HelpScreen

    async with open_console(console_engine) as (app, pilot):
        await pilot.press("ctrl+p")
        await pilot.press(*"Keys")
        await until(pilot, lambda: "Keys" in screen_text(app), what="the Keys command")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        assert "Filter" in screen_text(app) and "Everywhere" in screen_text(app)
        assert not app.screen.query("HelpPanel")


async def test_the_once_a_second_tick_after_the_screens_are_gone_does_nothing(
    console_engine: Engine,
) -> None:
    """The tick interval may fire once more while the console exits, after its last
    screen is gone (seen once in a full test run: `ScreenStackError` from the timer)."""
    async with open_console(console_engine) as (app, pilot):
        await pilot.pause()
    assert not app.screen_stack
    app._tick()  # raised ScreenStackError before


class _SlowReads(EmbeddedBackend):
    """The embedded backend with reads as slow as a large database or a distant server
    makes them: slower than the half second between two refreshes of a busy engine."""

    delay = 0.0

    async def list_executions(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(self.delay)
        return await super().list_executions(*args, **kwargs)

    async def status(self, execution_id: str) -> Any:
        await asyncio.sleep(self.delay)
        return await super().status(execution_id)


@asynccontextmanager
async def _busy(engine: Engine) -> AsyncIterator[None]:
    """Executions submitted ten times a second: a change for every refresh."""

    async def submit() -> None:
        while True:
            await engine.submit(STEP, [2])
            await asyncio.sleep(0.1)

    task = asyncio.create_task(submit())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_list_shows_new_executions_when_its_reads_are_slower_than_the_changes(
    console_engine: Engine,
) -> None:
    """Each refresh cancelled the read before it (an exclusive worker): with reads slower
    than the refreshes, none ever ended and the list stood still while the engine was
    busy."""
    engine = console_engine
    backend = _SlowReads(engine, label="test", owns_engine=False)
    async with open_console(backend=backend) as (app, pilot):
        first = await engine.submit(STEP, [1])
        await until(pilot, lambda: first in listed(app), what="the first execution")
        backend.delay = 0.8
        async with _busy(engine):
            new = await engine.submit(STEP, [3])
            await until(pilot, lambda: new in listed(app), timeout=10, what="the new execution")


async def test_the_detail_shows_the_end_when_its_reads_are_slower_than_the_changes(
    console_engine: Engine,
) -> None:
    engine = console_engine
    backend = _SlowReads(engine, label="test", owns_engine=False)
    async with open_console(backend=backend) as (app, pilot):
        eid = await engine.submit(SPIN, [1500])
        app.open_execution(eid)
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        detail = app.screen
        assert isinstance(detail, ExecutionDetailScreen)
        await until(pilot, lambda: detail.info is not None, what="the first read")
        backend.delay = 0.8
        async with _busy(engine):
            assert await engine.result(eid, timeout=30) == ResultOk(1500)
            await until(
                pilot,
                lambda: detail.info is not None and detail.info["state"]["type"] == "finished",
                timeout=10,
                what="the end shown",
            )
