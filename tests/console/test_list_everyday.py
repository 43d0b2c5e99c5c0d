"""The executions list as an operator's everyday tool: a true throughput, the cursor that
stays on its execution, failures found in one key (Pilot, a real embedded engine)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from textual.widgets import Static

from engine.engine import Engine
from engine.views import STATE_NAMES
from obelisk_tui import list_query
from obelisk_tui.app import ObeliskApp
from obelisk_tui.backend import EmbeddedBackend
from obelisk_tui.screens.confirm import ConfirmScreen
from obelisk_tui.screens.detail import ExecutionDetailScreen
from obelisk_tui.screens.executions import ExecutionsScreen
from obelisk_tui.screens.stub import StubScreen
from obelisk_tui.widgets.execution_list import ExecutionList
from obelisk_tui.widgets.state_counts import StateCounts, counts_total
from tests.console.conftest import APPROVE, STEP, open_console, screen_text, until


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
    await console_engine.result(eid, timeout=20)  # finished before the baseline
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


# -- 2. actions on the chosen row ------------------------------------------------------------


def listed(app: ObeliskApp) -> list[str]:
    return [r["execution_id"] for r in app.screen.query_one(ExecutionList).rows]


def notices(app: ObeliskApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_keys_act_on_the_chosen_row_when_new_executions_arrive(
    console_engine: Engine,
) -> None:
    engine = console_engine
    older = await engine.submit(APPROVE, ["older"])
    second = await engine.submit(APPROVE, ["second"])
    async with open_console(engine) as (app, pilot):
        await until(pilot, lambda: listed(app)[:2] == [second, older], what="both listed")
        lst = app.screen.query_one(ExecutionList)
        assert lst.follow  # at start, on the top row: following the newest
        # The operator chooses the top row (down and back up): no longer following.
        await pilot.press("j", "k")
        assert lst.selected is not None and lst.selected["execution_id"] == second
        assert not lst.follow
        newer = [await engine.submit(APPROVE, [f"new-{i}"]) for i in range(3)]
        await until(pilot, lambda: listed(app)[0] == newer[-1], what="the new ones listed")
        assert lst.selected is not None and lst.selected["execution_id"] == second
        await pilot.press("p")
        await until(pilot, lambda: any(f"paused {second}" in n for n in notices(app)), what="p")
        assert await state_of(engine, second) == "paused"
        assert [await state_of(engine, e) for e in newer] == ["pending_at"] * 3
        await until(
            pilot,
            lambda: lst.selected is not None and lst.selected["state"]["type"] == "paused",
            what="the row shown paused",
        )
        await pilot.press("u")
        await until(pilot, lambda: any(f"unpaused {second}" in n for n in notices(app)), what="u")

        await pilot.press("S")
        await until(pilot, lambda: isinstance(app.screen, StubScreen), what="the stub form")
        assert cast(StubScreen, app.screen).info["execution_id"] == second
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="back")

        newest = await engine.submit(APPROVE, ["newest"])
        await until(pilot, lambda: listed(app)[0] == newest, what="the newest listed")
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        assert cast(ConfirmScreen, app.screen).question == f"Cancel {second}?"
        await pilot.press("n")

        # `f`: the cursor follows the newest again.
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="back")
        await pilot.press("f")
        assert lst.follow and "follows the top row" in screen_text(app)
        latest = await engine.submit(APPROVE, ["latest"])
        await until(
            pilot,
            lambda: lst.selected is not None and lst.selected["execution_id"] == latest,
            what="the cursor on the newest",
        )


async def state_of(engine: Engine, eid: str) -> str:
    return str((await engine.status(eid)).state.__struct_config__.tag)


class _CreatesBetweenReads(EmbeddedBackend):
    """An execution is created just after the counts are read, before the list's other
    reads (as traffic does at any moment): `armed` once."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, label="test", owns_engine=False)
        self.armed = False
        self._counted = asyncio.Event()
        self._counted.set()

    async def counts_by_state(self, *, results: bool = False) -> dict[str, int]:
        armed, self.armed = self.armed, False
        if armed:
            self._counted.clear()
        counts = await super().counts_by_state(results=results)
        if armed:
            await self.engine.submit(APPROVE, ["between the reads"])
            self._counted.set()
        return counts

    async def count_executions(self, query: list_query.ExecutionQuery) -> int:
        await self._counted.wait()
        return await super().count_executions(query)

    async def list_executions(self, query: list_query.ExecutionQuery, *args: Any) -> Any:
        await self._counted.wait()
        return await super().list_executions(query, *args)


async def test_the_unfiltered_lists_total_is_the_counts_total(console_engine: Engine) -> None:
    """The title's total and the counts' agree although an execution was created between
    the list's reads; frozen, nothing reads them again (the tmux test's flake)."""
    engine = console_engine
    await engine.submit(APPROVE, ["first"])
    backend = _CreatesBetweenReads(engine)
    async with open_console(backend=backend) as (app, pilot):
        home = app.screen
        assert isinstance(home, ExecutionsScreen)
        lst = home.query_one(ExecutionList)
        await until(pilot, lambda: lst.total == 1, what="the first execution listed")
        await pilot.press("space")  # frozen: the next read is the last
        assert app.frozen
        backend.armed = True
        await home.load().wait()
        assert not backend.armed
        counts, _ = home.query_one(StateCounts)._shown
        assert counts_total(counts) == 1
        assert lst.total == 1, "the title's total is not the counts' (1)"
        assert await engine.count_executions(list_query.ExecutionQuery().to_filter()) == 2


# -- 3. failures found ---------------------------------------------------------------------


def test_result_filters_parse_and_name_a_bad_value() -> None:
    q = list_query.parse_filter("result:err,failed state:finished")
    assert q.results == ("err", "failed") and q.is_filtered
    assert list_query.parse_filter(list_query.format_filter(q)) == q
    assert list_query.parse_filter("r:OK").results == ("ok",)
    with pytest.raises(ValueError, match=r"unknown result 'oops' \(one of: ok, err, failed\)"):
        list_query.parse_filter("result:ok,oops")
    with pytest.raises(ValueError, match="needs a result"):
        list_query.parse_filter("result:")
    flt = list_query.ExecutionQuery(results=("err",)).to_filter()
    assert flt.results == ("err",)
    assert ("result", "err") in list_query.ExecutionQuery(results=("err",)).to_query()
    # The failures view: toggled, other filters kept.
    on = list_query.toggle_failures(list_query.ExecutionQuery(ffqn_prefix="x"))
    assert on.results == ("err", "failed") and on.ffqn_prefix == "x"
    assert list_query.toggle_failures(on) == list_query.ExecutionQuery(ffqn_prefix="x")


async def ended_each_way(engine: Engine) -> tuple[str, str, str]:
    """(ok, err, failed): a step that returned, a stub answered with an error, a stub
    cancelled (an execution failure)."""
    ok = await engine.submit(STEP, [1])
    err = await engine.submit(APPROVE, ["err"])
    failed = await engine.submit(APPROVE, ["failed"])
    await engine.stub(err, {"err": "rejected"})
    await engine.cancel(failed)
    for eid in (ok, err, failed):
        await engine.result(eid, timeout=20)
    return ok, err, failed


async def test_the_counts_split_the_finished_and_f_shows_the_failures(
    console_engine: Engine,
) -> None:
    engine = console_engine
    ok, err, failed = await ended_each_way(engine)
    pending = await engine.submit(APPROVE, ["pending"])
    assert await engine.counts_by_state(results=True) == {
        **dict.fromkeys(STATE_NAMES, 0),
        "pending_at": 1,
        "finished": 3,
        "ok": 1,
        "err": 1,
        "failed": 1,
    }
    async with open_console(engine) as (app, pilot):
        await until(pilot, lambda: "ok 1  err 1  failed 1" in screen_text(app), what="the split")
        assert "finished 3" not in screen_text(app)
        await pilot.press("F")
        await until(pilot, lambda: sorted(listed(app)) == sorted([err, failed]), what="failures")
        assert "filter: result:err,failed" in screen_text(app)
        await pilot.press("F")  # off again
        await until(pilot, lambda: len(listed(app)) == 4, what="all again")
        assert pending in listed(app)
        await pilot.press("slash", *"result:ok", "enter")
        await until(pilot, lambda: listed(app) == [ok], what="the ok ones")
        await pilot.press("slash", "ctrl+u", *"result:nope", "enter")
        await until(
            pilot, lambda: any("unknown result 'nope'" in n for n in notices(app)), what="error"
        )
