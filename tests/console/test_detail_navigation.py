"""An execution's screen as an operator's everyday tool (Pilot, a real embedded engine):
delays cancelled where they show, the breadcrumb and `h`, durations, an event's raw
JSON, copying an id, re-submitting (the retry of a failed execution)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine.core import events as ev
from engine.core.state import state_name
from engine.engine import Engine
from engine.views import ExecutionInfo
from obelisk_tui import list_query, model
from obelisk_tui.app import ObeliskApp
from obelisk_tui.screens.confirm import ConfirmScreen
from obelisk_tui.screens.detail import ExecutionDetailScreen
from obelisk_tui.screens.executions import ExecutionsScreen
from obelisk_tui.widgets.children_tree import ChildrenTree
from obelisk_tui.widgets.event_log import EventLog
from obelisk_tui.widgets.execution_list import ExecutionList
from tests.console.conftest import (
    APPROVE,
    DEPLOYMENT,
    FANOUT,
    ORDER,
    open_console,
    screen_text,
    until,
)
from tests.fixtures.deployments import Deployment, ms

NAP_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";

export default function nap(seconds) {
  try {
    obelisk.sleep({ seconds });
    return "woke";
  } catch (e) {
    return e.cancelled ? "cancelled" : `other: ${e.message}`;
  }
}
"""
NAP = "test:console/workflow.nap"


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    """The console tests' deployment and a workflow that sleeps (a delay)."""
    deployment = DEPLOYMENT + Deployment().workflow_js(
        "nap",
        NAP_JS,
        ffqn=NAP,
        params=[("seconds", "u32")],
        return_type="result<string, string>",
        exec={"tick_sleep": ms(20)},
    )
    started = await Engine.start(deployment.write(tmp_path), tmp_path / "data")
    try:
        yield started
    finally:
        await started.stop()


def notices(app: ObeliskApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def state_of(engine: Engine, eid: str) -> str:
    return state_name((await engine.storage.get_row(eid)).state)


async def open_detail(app: ObeliskApp, pilot: Any, eid: str) -> ExecutionDetailScreen:
    app.open_execution(eid)
    await until(
        pilot,
        lambda: (
            isinstance(app.screen, ExecutionDetailScreen)
            and app.screen.execution_id == eid
            and app.screen.info is not None
            and bool(app.screen.events)
        ),
        what=f"the screen of {eid}",
    )
    assert isinstance(app.screen, ExecutionDetailScreen)
    return app.screen


async def asked(app: ObeliskApp, pilot: Any, start: str) -> str:
    """The question of the confirmation that is up (once it is drawn), which starts with
    `start`."""
    await until(
        pilot,
        lambda: isinstance(app.screen, ConfirmScreen) and "Yes (y)" in screen_text(app),
        what="the confirmation",
    )
    assert isinstance(app.screen, ConfirmScreen)
    assert app.screen.question.startswith(start), app.screen.question
    return app.screen.question


async def napping(engine: Engine, pilot: Any) -> tuple[str, str]:
    """A workflow asleep for an hour: (its id, its delay's id)."""
    eid = await engine.submit(NAP, [3600])

    async def blocked() -> bool:
        return await state_of(engine, eid) == "blocked_by_join_set"

    await until(pilot, blocked, what="the nap to sleep")
    delays = [
        e.event.event.request.delay_id
        for e in await engine.events(eid)
        if isinstance(e.event, ev.HistoryEvent)
        and isinstance(e.event.event, ev.JoinSetRequest)
        and isinstance(e.event.event.request, ev.DelayRequest)
    ]
    assert len(delays) == 1
    return eid, str(delays[0])


# -- 1. delays ---------------------------------------------------------------------------


async def test_c_on_a_delay_cancels_it_and_p_says_delays_do_not_pause(engine: Engine) -> None:
    async with open_console(engine) as (app, pilot):
        eid, delay = await napping(engine, pilot)
        screen = await open_detail(app, pilot, eid)

        # The Children tab lists the delay; on its row `c` cancels the delay.
        await pilot.press("3")
        tree = screen.query_one(ChildrenTree)
        await until(pilot, lambda: tree.selected_delay == delay, what="the delay's row")
        await until(pilot, lambda: "c Cancel delay" in screen_text(app), what="its footer key")
        await pilot.press("p")  # the engine has no pause of a delay: said, nothing done
        await until(
            pilot,
            lambda: any("cannot pause a delay" in n for n in notices(app)),
            what="the notice",
        )
        assert not isinstance(app.screen, ConfirmScreen)
        assert await state_of(engine, eid) == "blocked_by_join_set"
        await pilot.press("u")
        await until(
            pilot, lambda: any("cannot unpause a delay" in n for n in notices(app)), what="u"
        )

        await pilot.press("c")
        await asked(app, pilot, f"Cancel delay {delay}?")
        await pilot.press("n")  # not confirmed: nothing happens
        await until(pilot, lambda: app.screen is screen, what="back")
        assert await state_of(engine, eid) == "blocked_by_join_set"
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="asked again")
        await pilot.press("y")
        assert await engine.result(eid, timeout=15) == ev.ResultOk("cancelled")
        await until(pilot, lambda: "delay cancelled" in screen_text(app), what="shown cancelled")
        assert await state_of(engine, eid) == "finished"

        # The Events tab: the delay request's row takes `c` too; a finished delay is
        # not cancelled again, and the key says why.
        await pilot.press("2")
        log = screen.query_one(EventLog)
        row = next(
            i for i, e in enumerate(log.events) if model.requested_delay(e["event"]) == delay
        )
        log.move_cursor(row)
        await until(pilot, lambda: "c Cancel delay" in screen_text(app), what="its footer key")
        await pilot.press("c")
        await until(
            pilot,
            lambda: any(f"{delay} already cancelled" in n for n in notices(app)),
            what="the refusal",
        )
        assert not isinstance(app.screen, ConfirmScreen)
        log.move_cursor(0)  # elsewhere, `c` is the execution's (finished: says so)
        await until(pilot, lambda: "c Cancel delay" not in screen_text(app), what="footer")
        await pilot.press("c")
        await until(pilot, lambda: any("is finished" in n for n in notices(app)), what="c")


async def test_c_on_a_delay_in_the_events_tab_cancels_it(engine: Engine) -> None:
    async with open_console(engine) as (app, pilot):
        eid, delay = await napping(engine, pilot)
        screen = await open_detail(app, pilot, eid)
        await pilot.press("2")
        log = screen.query_one(EventLog)
        await until(
            pilot,
            lambda: any(model.requested_delay(e["event"]) == delay for e in log.events),
            what="the delay request",
        )
        log.move_cursor(
            next(i for i, e in enumerate(log.events) if model.requested_delay(e["event"]))
        )
        await pilot.press("p")
        await until(pilot, lambda: any("cannot pause a delay" in n for n in notices(app)), what="p")
        await pilot.press("c")
        await asked(app, pilot, f"Cancel delay {delay}?")
        await pilot.press("y")
        assert await engine.result(eid, timeout=15) == ev.ResultOk("cancelled")


# -- 2. navigation -----------------------------------------------------------------------


async def test_the_breadcrumb_shows_the_stack_and_h_returns_to_the_list(
    console_engine: Engine,
) -> None:
    engine = console_engine
    eid = await engine.submit(FANOUT, [3])
    await engine.result(eid, timeout=30)
    async with open_console(engine) as (app, pilot):
        assert "h List" not in screen_text(app)  # on the list itself: nowhere to return
        screen = await open_detail(app, pilot, eid)
        crumbs = f"executions › {model.short_id(eid)}"
        await until(pilot, lambda: crumbs in screen_text(app), what="the breadcrumb")
        assert screen_text(app).splitlines()[1].strip() == crumbs
        await until(pilot, lambda: "h List" in screen_text(app), what="the key in the footer")
        await pilot.press("3")
        tree = screen.query_one(ChildrenTree)
        await until(pilot, lambda: bool(tree.cursor_node and tree.cursor_node.data), what="kids")
        await pilot.press("enter")
        await until(pilot, lambda: app.screen is not screen, what="the child")
        child = app.screen
        assert isinstance(child, ExecutionDetailScreen)
        tail = child.execution_id[len(eid) + 1 :]  # `g:1_1`
        await until(
            pilot,
            lambda: f"{crumbs} › child …{tail}" in screen_text(app),
            what="the child's crumb",
        )
        await pilot.press("P")  # its parent again, on top: a crumb of its own
        await until(pilot, lambda: len(app.screen_stack) == 5, what="the parent")
        await until(
            pilot,
            lambda: f"child …{tail} › {model.short_id(eid)}" in screen_text(app),
            what="the third crumb",
        )
        await pilot.press("C")  # the components screen has it too
        await until(pilot, lambda: "› components" in screen_text(app), what="components")
        await pilot.press("h")  # from any depth, back to the list
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")
        assert len(app.screen_stack) == 2  # Textual's default screen and the list


async def test_a_deep_breadcrumb_keeps_its_start_and_end_at_80_columns(
    console_engine: Engine,
) -> None:
    engine = console_engine
    eid = await engine.submit(FANOUT, [2])
    await engine.result(eid, timeout=30)
    children = [d.execution_id for d in await engine.descendants(eid)]
    async with open_console(engine, size=(80, 24)) as (app, pilot):
        for target in [eid, children[0], eid, children[1], eid, children[0]]:
            await open_detail(app, pilot, target)
        line = screen_text(app).splitlines()[1].rstrip()
        assert line.startswith(" executions › … › ") and len(line) <= 80, line
        assert line.endswith("child …" + children[0][len(eid) + 1 :]), line


def test_breadcrumb_labels_and_fitting() -> None:
    top = "E_01JABCDEFGHJKMNPQRSTVWXYZ"
    assert model.short_id(top) == "E_01JA…WXYZ"
    assert model.short_id("E_short") == "E_short"
    trail = ["executions", top, f"{top}.g:1_2", f"{top}.g:1_2.o:1-approve_1", "components"]
    assert model.breadcrumb(trail) == [
        "executions",
        "E_01JA…WXYZ",
        "child …g:1_2",
        "child …o:1-approve_1",
        "components",
    ]
    long_child = f"{top}.{'x' * 40}_1"
    assert model.breadcrumb([top, long_child])[1] == "child …" + long_child[-20:]
    labels = ["executions", "E_01JA…WXYZ", "child …g:1_2", "E_01JB…ABCD"]
    assert model.fit_breadcrumb(labels, 200) == labels
    assert model.fit_breadcrumb(labels, 45) == ["executions", "…", "child …g:1_2", "E_01JB…ABCD"]
    assert model.fit_breadcrumb(labels, 10) == ["executions", "…", "E_01JB…ABCD"]


# -- 3. durations ------------------------------------------------------------------------


def test_durations_keep_their_second_unit() -> None:
    assert model.duration_text(0.85) == "850ms"
    assert model.duration_text(3.21) == "3.2s"
    assert model.duration_text(42.4) == "42s"
    assert model.duration_text(303) == "5m 03s"
    assert model.duration_text(3 * 3600 + 5 * 60 + 7) == "3h 05m"
    assert model.duration_text(2 * 86400 + 3 * 3600) == "2d 03h"
    assert model.duration_text(-1) == "0ms"  # clocks of two machines
    created = datetime(2025, 1, 1, tzinfo=UTC)
    info: Any = {
        "created_at": created.isoformat(),
        "updated_at": (created + timedelta(seconds=90)).isoformat(),
        "state": {"type": "finished"},
    }
    now = created + timedelta(hours=1)
    assert model.duration(info, now) == "1m 30s"  # its last change stands for the finish
    assert model.duration(info, now, created + timedelta(seconds=2)) == "2.0s"
    running: ExecutionInfo = {**info, "state": {"type": "locked"}}
    assert model.duration(running, now) == "1h 00m so far"


async def test_durations_on_the_title_the_state_tab_and_the_children(
    console_engine: Engine,
) -> None:
    engine = console_engine
    fanout = await engine.submit(FANOUT, [3])
    await engine.result(fanout, timeout=30)
    async with open_console(engine) as (app, pilot):
        screen = await open_detail(app, pilot, fanout)
        finished = model.finished_at(screen.events)
        created = model.parse_ts(screen.info["created_at"])  # type: ignore[index]
        assert finished is not None and created is not None
        took = model.duration_text((finished - created).total_seconds())
        await until(pilot, lambda: f" {took} " in screen_text(app).splitlines()[2], what="title")
        await until(
            pilot,
            lambda: bool(
                re.search(
                    rf"duration\s+{re.escape(took)}\s+\(created → finished\)", screen_text(app)
                )
            ),
            what="the State tab's duration",
        )
        await pilot.press("3")
        await until(
            pilot,
            lambda: screen_text(app).count("test:console/activity.step") == 3,
            what="the children",
        )
        steps = [line for line in screen_text(app).splitlines() if "activity.step" in line]
        assert all(re.search(r"finished ok\s+\d+(\.\d)?(ms|s)\s+\.g:1_\d", s) for s in steps), steps

        # Running: "so far", growing with the clock.
        order = await engine.submit(ORDER, ["d-1"])
        screen = await open_detail(app, pilot, order)
        await until(pilot, lambda: "so far" in screen_text(app).splitlines()[2], what="running")
        # (The title is repainted without a layout, the State tab with one: a frame apart.)
        await until(
            pilot,
            lambda: bool(re.search(r"duration\s+\S+ so far\s+\(created → now\)", screen_text(app))),
            what="the State tab's duration so far",
        )
        await pilot.press("3")
        await until(
            pilot,
            lambda: (
                re.search(
                    r"(pending|blocked|locked)\S*\s+\S+ so far\s+\.?o:1-approve_1", screen_text(app)
                )
                is not None
            ),
            what="the waiting child's duration",
        )
        before = screen_text(app).splitlines()[2]
        app.now = lambda: datetime.now(UTC) + timedelta(minutes=5)  # the clock moves on
        await until(
            pilot,
            lambda: screen_text(app).splitlines()[2] != before and "5m" in screen_text(app),
            what="the durations to grow with the tick",
        )


# -- 4. an event's raw JSON --------------------------------------------------------------


async def test_j_and_enter_show_an_events_raw_json(console_engine: Engine) -> None:
    from obelisk_tui.screens.event_json import EventJsonScreen

    engine = console_engine
    eid = await engine.submit(FANOUT, [2])
    await engine.result(eid, timeout=30)
    async with open_console(engine) as (app, pilot):
        screen = await open_detail(app, pilot, eid)
        await pilot.press("2")
        log = screen.query_one(EventLog)
        await until(pilot, lambda: len(log.events) > 3, what="the events")
        log.move_cursor(0)
        await pilot.pause()
        await pilot.press("J")
        await until(pilot, lambda: isinstance(app.screen, EventJsonScreen), what="the JSON")
        text = screen_text(app)
        assert f"{eid} · version 0 · created" in text
        assert '"type": "created"' in text and '"ffqn": "test:console/workflow.fanout"' in text
        assert '"params": [' in text
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, what="closed")
        # `enter` on a row that names no child: its JSON too (on one that does: the child).
        last = len(log.events) - 1
        log.move_cursor(last)
        await pilot.pause()
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, EventJsonScreen), what="JSON again")
        assert f"version {last} · finished" in screen_text(app)
        assert '"10"' in screen_text(app)  # its result: 0 + 10
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, what="closed again")


# -- 5. copying an id --------------------------------------------------------------------


async def test_y_copies_the_execution_id_on_the_list_and_its_screen(
    console_engine: Engine,
) -> None:
    engine = console_engine
    first = await engine.submit(APPROVE, ["y-1"])
    second = await engine.submit(APPROVE, ["y-2"])
    async with open_console(engine) as (app, pilot):
        lst = app.screen.query_one(ExecutionList)
        await until(pilot, lambda: lst.index_of(first) is not None, what="the rows")
        index = lst.index_of(first)
        assert index is not None
        lst.move_cursor(index)
        await pilot.pause()
        await pilot.press("y")
        assert app.clipboard == first
        await until(pilot, lambda: any(first in n for n in notices(app)), what="the notice")
        await open_detail(app, pilot, second)
        await pilot.press("y")
        assert app.clipboard == second


# -- 6. re-submit, and the retry of a failed execution -----------------------------------


async def test_r_resubmits_with_the_same_params_and_retries_a_failed_one(
    console_engine: Engine,
) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        failed = await engine.submit(APPROVE, ["r-1"])
        await engine.stub(failed, {"err": "rejected"})
        screen = await open_detail(app, pilot, failed)
        await until(pilot, lambda: "R Re-submit" in screen_text(app), what="the key")
        await pilot.press("R")
        question = await asked(app, pilot, "Retry ")
        assert 'test:console/approval.approve ["r-1"]' in question
        assert "no retry of a finished execution" in question
        await pilot.press("n")
        await until(pilot, lambda: app.screen is screen, what="not confirmed")
        assert await engine.count_executions(list_query.ExecutionQuery().to_filter()) == 1
        await pilot.press("R")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="asked again")
        await pilot.press("y")
        await until(
            pilot,
            lambda: isinstance(app.screen, ExecutionDetailScreen) and app.screen is not screen,
            what="the new execution's screen",
        )
        new = app.screen.execution_id  # type: ignore[attr-defined]
        assert new != failed
        status = await engine.status(new)
        assert status.ffqn == APPROVE and status.parent_id is None
        created = (await engine.events(new))[0].event
        assert isinstance(created, ev.Created) and list(created.params) == ["r-1"]
        assert any(f"retried {failed} as {new}" in n for n in notices(app))

        # A child: re-submitted as a new top-level execution, with the child's params.
        order = await engine.submit(ORDER, ["r-2"])

        async def blocked() -> bool:
            return await state_of(engine, order) == "blocked_by_join_set"

        await until(pilot, blocked, what="the order to wait")
        child = f"{order}.o:1-approve_1"
        screen = await open_detail(app, pilot, child)
        await pilot.press("R")
        assert "as a new top-level execution" in await asked(app, pilot, "Re-submit ")
        await pilot.press("y")
        await until(
            pilot,
            lambda: isinstance(app.screen, ExecutionDetailScreen) and app.screen is not screen,
            what="the copy's screen",
        )
        copy = app.screen.execution_id  # type: ignore[attr-defined]
        assert "." not in copy
        created = (await engine.events(copy))[0].event
        assert isinstance(created, ev.Created) and list(created.params) == ["r-2"]
        assert any(f"re-submitted {child} as {copy}" in n for n in notices(app))


async def test_the_logs_tab_rows_are_not_events(engine: Engine) -> None:
    """The Logs tab's list sends the same row messages as the Events tab's (both are
    `RowList`s): its `enter` and cursor moves opened an event's JSON and time-travelled
    the State tab to the log line's index; with the Events tab not shown yet (its log
    mounted when first shown), they broke the screen."""
    from obelisk_tui.widgets.log_view import LogView

    eid = await engine.submit(FANOUT, [2])
    await engine.result(eid, timeout=30)
    async with open_console(engine) as (app, pilot):
        screen = await open_detail(app, pilot, eid)
        assert len(screen.steps) > 2
        await pilot.press("4")
        await until(pilot, lambda: bool(screen.query(LogView)), what="the Logs tab")
        view = screen.query_one(LogView)
        # What its `enter` and cursor keys send (it has no lines to move on here).
        view.post_message(LogView.CursorMoved(view, 0))
        view.post_message(LogView.Activated(view, 1))
        for _ in range(5):
            await pilot.pause()
        assert app.screen is screen and screen.travel is None
        await pilot.press("1")
        await until(pilot, lambda: " live " in screen_text(app), what="the State tab, live")
