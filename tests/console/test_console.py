"""The console against a real embedded engine (Pilot): every screen and key.

Actions change the real execution state in the real SQLite file; a component file edited
during a test is hot-reloaded and shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from textual.binding import Binding
from textual.widgets import DataTable, TabbedContent, TextArea

from engine.core import events as ev
from engine.core.state import state_name
from engine.engine import Engine
from engine.views import ExecutionInfo
from obelisk_tui.app import ObeliskApp
from obelisk_tui.backend import EmbeddedBackend
from obelisk_tui.list_query import ExecutionQuery
from obelisk_tui.screens.components import ComponentsScreen
from obelisk_tui.screens.confirm import ConfirmScreen
from obelisk_tui.screens.detail import ExecutionDetailScreen
from obelisk_tui.screens.executions import ExecutionsScreen
from obelisk_tui.screens.submit import SubmitScreen
from obelisk_tui.widgets.event_log import EventLog
from obelisk_tui.widgets.execution_list import ExecutionList
from tests.console.conftest import (
    APPROVE,
    FANOUT,
    ORDER,
    SPIN,
    STEP,
    engine_in,
    open_console,
    screen_text,
    until,
)


async def state_of(engine: Engine, eid: str) -> str:
    return state_name((await engine.storage.get_row(eid)).state)


def listed(app: ObeliskApp) -> list[str]:
    lst = app.screen.query_one(ExecutionList)
    return [r["execution_id"] for r in lst.rows]


def shown_state(app: ObeliskApp) -> str | None:
    selected = app.screen.query_one(ExecutionList).selected
    return None if selected is None else str(selected["state"]["type"])


def notices(app: ObeliskApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def select(app: ObeliskApp, pilot: Any, eid: str) -> None:
    """Put the list's cursor on `eid` (after it shows up)."""
    await until(pilot, lambda: eid in listed(app), what=f"{eid} in the list")
    lst = app.screen.query_one(ExecutionList)
    index = lst.index_of(eid)
    assert index is not None
    lst.move_cursor(index)
    await pilot.pause()


async def blocked_order(engine: Engine, pilot: Any, order: str = "o-1") -> tuple[str, str]:
    """An order workflow waiting for its approval child: (workflow id, child id)."""
    eid = await engine.submit(ORDER, [order])

    async def waiting() -> bool:
        return await state_of(engine, eid) == "blocked_by_join_set"

    await until(pilot, waiting, what="the order to block on its approval")
    return eid, f"{eid}.o:1-approve_1"


# -- the executions list ------------------------------------------------------------------


async def test_list_shows_executions_live_with_state_counts(console_engine: Engine) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        first = await engine.submit(STEP, [1])
        stub = await engine.submit(APPROVE, ["a"])
        await until(pilot, lambda: {first, stub} <= set(listed(app)), what="new executions")
        await engine.result(first, timeout=10)
        await until(pilot, lambda: "finished ok" in screen_text(app), what="the step to finish")
        text = screen_text(app)
        assert "2 executions" in text and "ok 1" in text and "pending 1" in text
        assert "test:console/approval.approve" in text and "test:console/activity.step" in text
        assert listed(app) == [stub, first]  # newest first


class CommitAfterTheFirstRead(EmbeddedBackend):
    """The interleaving a CI run once hit: the list's first load reads its rows, an
    execution is created and its commit counted, and only then does the change follower
    read the generation it follows from. The follower's first read waits (up to 1 s) for
    the list's first read to begin, then for that creation to be counted; the console
    reads the generation before its first load, so it waits the 1 s in vain."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, label="test", owns_engine=False)
        self.list_read = asyncio.Event()
        self.counted = asyncio.Event()
        self.created: str | None = None
        self._first_follow = True

    async def wait_changed(self, since: int, timeout: float) -> int:
        if self._first_follow:
            self._first_follow = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.list_read.wait(), 1.0)
                await asyncio.wait_for(self.counted.wait(), 5.0)
        return await super().wait_changed(since, timeout)

    async def list_executions(
        self, query: ExecutionQuery, offset: int, limit: int
    ) -> list[ExecutionInfo]:
        rows = await super().list_executions(query, offset, limit)
        if not self.list_read.is_set():
            self.list_read.set()
            before = self.engine.storage.changes().generation
            # A stub activity: pending until stubbed, nothing more is committed for it.
            self.created = await self.engine.submit(APPROVE, ["late"])
            await self.engine.wait_changed(before, 5.0)
            self.counted.set()
        return rows


async def test_an_execution_created_during_the_first_load_is_listed(
    console_engine: Engine,
) -> None:
    backend = CommitAfterTheFirstRead(console_engine)
    async with open_console(backend=backend) as (app, pilot):
        await until(pilot, lambda: backend.created is not None, what="the creation")
        assert backend.created is not None
        await until(pilot, lambda: backend.created in listed(app), what="the late one listed")


async def test_filter_order_and_clear(console_engine: Engine) -> None:
    engine = console_engine
    done = await engine.submit(STEP, [2])
    await engine.result(done, timeout=10)
    waiting = await engine.submit(APPROVE, ["b"])
    async with open_console(engine) as (app, pilot):
        await until(pilot, lambda: len(listed(app)) == 2, what="both executions")
        await pilot.press("slash")
        await pilot.press(*"state:finished")
        await pilot.press("enter")
        await until(pilot, lambda: listed(app) == [done], what="the filter to apply")
        assert "filter: state:finished" in screen_text(app)
        await pilot.press("escape")  # clears the filter
        await until(pilot, lambda: listed(app) == [waiting, done], what="the filter to clear")

        await pilot.press("o")
        await until(pilot, lambda: listed(app) == [done, waiting], what="oldest first")
        assert "oldest first" in screen_text(app)

        await pilot.press("slash")
        await pilot.press(*"state:asleep", "enter")
        await until(
            pilot,
            lambda: any("unknown state 'asleep'" in n for n in notices(app)),
            what="the filter error",
        )
        assert listed(app) == [done, waiting]  # unchanged


async def test_columns_stay_when_the_list_grows_a_scrollbar(console_engine: Engine) -> None:
    """At a width where a scrollbar's columns decide whether WHEN fits, a list that grows
    past the screen keeps the columns it had (it used to drop WHEN, and flicker)."""
    engine = console_engine
    first = await engine.submit(APPROVE, ["first"])
    async with open_console(engine, size=(160, 20)) as (app, pilot):
        lst = app.screen.query_one(ExecutionList)
        margin = app.size.width - lst.size.width
        await pilot.resize_terminal(100 + margin, 20)  # WHEN fits in 100, not in 99
        await until(pilot, lambda: listed(app) == [first], what="one row")
        # Laid out at the new width before its header is read (not the old one's).
        await until(pilot, lambda: lst.size.width == 100, what="the new width")
        await pilot.pause()
        header = next(line for line in screen_text(app).splitlines() if "EXECUTION" in line)
        for i in range(30):
            await engine.submit(APPROVE, [str(i)])
        await until(pilot, lambda: lst.total == 31, what="a list taller than the screen")
        await pilot.pause(0.1)
        assert header in screen_text(app).splitlines()


async def test_keys_typed_right_after_slash_go_to_the_filter(console_engine: Engine) -> None:
    from textual import events
    from textual.widgets import Input

    async with open_console(console_engine) as (app, pilot):
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")
        # Queued together, as a fast typist or a paste delivers them: none is a binding.
        for key, char in [("slash", "/"), ("q", "q"), ("t", "t"), ("o", "o")]:
            app.post_message(events.Key(key, char))
        await pilot.pause()
        assert app.is_running
        box = app.screen.query_one("#filter", Input)
        assert box.value.endswith("qto"), (box.value, app.screen.focused)
        await pilot.press("slash", "x")  # in the box, `/` is text (`ffqn:myapp:demo/`)
        assert box.value.endswith("qto/x")
        # A burst with a `/` inside: the box is focused by then, though its Focus event
        # may not have been handled yet.
        await pilot.press("escape")
        await pilot.pause()
        for key, char in [("slash", "/"), ("a", "a"), ("slash", "/"), ("b", "b")]:
            app.post_message(events.Key(key, char))
        await pilot.pause()
        assert box.value.endswith("a/b"), box.value


async def test_pause_unpause_and_refusals_from_the_list(console_engine: Engine) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        order, approval = await blocked_order(engine, pilot)
        # Both listed before selecting: on the top row the cursor follows the newest.
        await until(pilot, lambda: approval in listed(app), what="the approval child listed")
        await select(app, pilot, order)
        await pilot.press("p")
        await until(pilot, lambda: any(f"paused {order}" in n for n in notices(app)), what="paused")
        assert await state_of(engine, order) == "paused"
        await until(
            pilot, lambda: shown_state(app) == "paused", what=f"the row paused {shown_state(app)}"
        )
        await pilot.press("p")  # again: the footer has it disabled, the key says why
        await until(pilot, lambda: any("already paused" in n for n in notices(app)), what="refusal")
        await pilot.press("u")
        await until(
            pilot,
            lambda: any(f"unpaused {order}" in n for n in notices(app)),
            what=f"unpaused {notices(app)}",
        )
        assert await state_of(engine, order) == "blocked_by_join_set"

        running = await engine.submit(SPIN, [60_000])

        async def locked() -> bool:
            return await state_of(engine, running) == "locked"

        await until(pilot, locked, what="the spinning activity to run")
        await select(app, pilot, running)
        await until(
            pilot,
            lambda: (
                app.screen.query_one(ExecutionList).selected is not None
                and app.screen.query_one(ExecutionList).selected["state"]["type"] == "locked"
            ),  # type: ignore[index]
            what="the list to show it locked",
        )
        await pilot.press("p")
        await until(
            pilot,
            lambda: any("a running activity cannot be paused" in n for n in notices(app)),
            what="the pause refusal",
        )
        assert await state_of(engine, running) == "locked"

        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        await pilot.press("y")
        result = await engine.result(running, timeout=20)
        assert isinstance(result, ev.ExecutionFailure) and result.kind == "cancelled"


async def test_cancel_asks_first_and_marks_act_on_many(console_engine: Engine) -> None:
    engine = console_engine
    a = await engine.submit(APPROVE, ["a"])
    b = await engine.submit(APPROVE, ["b"])
    c = await engine.submit(APPROVE, ["c"])
    async with open_console(engine) as (app, pilot):
        await select(app, pilot, a)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="back")
        assert await state_of(engine, a) == "pending_at"

        await select(app, pilot, c)
        await pilot.press("m", "m")  # marks c, then b (the cursor moves down)
        assert app.screen.query_one(ExecutionList).marked == {b, c}
        assert "2 marked" in screen_text(app)
        await pilot.press("p")
        await until(
            pilot,
            lambda: any("paused 2 executions" in n for n in notices(app)),
            what="the bulk pause",
        )
        assert [await state_of(engine, x) for x in (a, b, c)] == ["pending_at", "paused", "paused"]
        assert app.screen.query_one(ExecutionList).marked == set()  # cleared after the action

        # A marked execution the action does not apply to is named with the reason.
        await select(app, pilot, b)
        await pilot.press("m", "m")  # b (paused), then a (pending)
        await pilot.press("u")
        await until(
            pilot,
            lambda: any(f"unpaused {b}\nskipped: {a} is not paused" in n for n in notices(app)),
            what="the skip named",
        )

        await select(app, pilot, a)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        await pilot.press("y")
        result = await engine.result(a, timeout=10)
        assert isinstance(result, ev.ExecutionFailure) and result.kind == "cancelled"


async def test_space_freezes_the_live_refresh(console_engine: Engine) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        await pilot.press("space")
        assert app.frozen
        await until(pilot, lambda: "FROZEN" in screen_text(app), what="the frozen mark")
        frozen = await engine.submit(APPROVE, ["x"])
        await pilot.pause(0.8)  # longer than a refresh period: nothing may change
        assert frozen not in listed(app)
        await pilot.press("r")  # a manual refresh still works
        await until(pilot, lambda: frozen in listed(app), what="the manual refresh")
        await pilot.press("space")
        assert not app.frozen
        later = await engine.submit(APPROVE, ["y"])
        await until(pilot, lambda: later in listed(app), what="live again")


# -- the detail screen --------------------------------------------------------------------


async def test_detail_tabs_backtrace_time_travel_children_logs_result(
    console_engine: Engine, tmp_path: Path
) -> None:
    engine = console_engine
    eid = await engine.submit(FANOUT, [3])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("30")
    async with open_console(engine) as (app, pilot):
        await select(app, pilot, eid)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        screen = app.screen
        assert isinstance(screen, ExecutionDetailScreen)
        await until(pilot, lambda: screen.info is not None, what="the execution to load")
        await until(pilot, lambda: "Finished · ok" in screen_text(app), what="the state drawn")
        text = screen_text(app)
        assert eid in text and "PendingAt" in text and "BlockedByJoinSet" in text
        assert "live" in text

        # Events: one row per version; a submit shows its source line.
        await pilot.press("2")
        log = screen.query_one(EventLog)
        await until(pilot, lambda: len(log.events) == screen.info["next_version"], what="events")  # type: ignore[index]
        submit_version = next(
            e["version"]
            for e in log.events
            if e["event"].get("type") == "history_event"
            and e["event"]["event"]["type"] == "join_set_request"
        )
        assert log.events[submit_version].get("backtrace_id") is not None
        log.move_cursor(submit_version)
        await until(pilot, lambda: "the submitting line" in screen_text(app), what="the source")
        assert "fanout.js:" in screen_text(app)
        log.focus()
        await pilot.press("enter")  # on the child request: open the child
        await until(
            pilot,
            lambda: isinstance(app.screen, ExecutionDetailScreen) and app.screen is not screen,
            what="the requested child",
        )
        requested = log.events[submit_version]["event"]["event"]["request"]["child_execution_id"]
        assert app.screen.execution_id == requested  # type: ignore[attr-defined]
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is screen, what="back")

        # Time travel: the diagram goes back to the version under the cursor.
        await until(pilot, lambda: screen.travel == submit_version, what="travel")
        await pilot.press("1")
        await until(
            pilot,
            lambda: f"at version {submit_version} of" in screen_text(app),
            what="the diagram at that version",
        )
        assert "time travel" in screen_text(app)
        await pilot.press("left_square_bracket")
        await until(pilot, lambda: screen.travel == submit_version - 1, what="one version back")
        for _ in range(40):
            await pilot.press("right_square_bracket")
        await until(pilot, lambda: screen.travel is None, what="back to live")
        await until(pilot, lambda: "live" in screen_text(app), what="live again")

        # Children: the three steps; enter opens one, P its parent.
        await pilot.press("3")
        await until(
            pilot,
            lambda: screen_text(app).count("test:console/activity.step") == 3,
            what="the children",
        )
        tree = screen.query_one("#children-tree")
        tree.focus()
        await pilot.press("enter")  # the cursor starts on the first child
        await until(
            pilot,
            lambda: isinstance(app.screen, ExecutionDetailScreen) and app.screen is not screen,
            what="the child's detail",
        )
        child = app.screen
        assert isinstance(child, ExecutionDetailScreen) and child.execution_id.startswith(eid + ".")
        await until(pilot, lambda: child.info is not None, what="the child to load")
        await pilot.press("P")
        await until(
            pilot,
            lambda: (
                isinstance(app.screen, ExecutionDetailScreen)
                and app.screen.execution_id == eid
                and app.screen is not screen
            ),
            what="the parent",
        )
        await pilot.press("P")  # the top-level parent has no parent: say so
        await until(
            pilot,
            lambda: any("is a top-level execution" in n for n in notices(app)),
            what="the explanation",
        )
        await pilot.press("escape", "escape")
        await until(pilot, lambda: app.screen is screen, what="back to the first screen")

        # Logs and result.
        await pilot.press("4")
        await until(pilot, lambda: "fan-out of 3 adds up to 30" in screen_text(app), what="logs")
        await pilot.press("5")
        await until(
            pilot,
            lambda: "'30'" in screen_text(app) or '"30"' in screen_text(app),
            what="the result",
        )
        assert screen.query_one(TabbedContent).active == "result"
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")


async def open_detail(app: ObeliskApp, pilot: Any, eid: str) -> None:
    """Open the execution's screen and wait until it shows the execution."""
    app.open_execution(eid)
    await until(
        pilot,
        lambda: (
            isinstance(app.screen, ExecutionDetailScreen)
            and app.screen.execution_id == eid
            and app.screen.info is not None
        ),
        what=f"the screen of {eid}",
    )


async def test_detail_actions_on_a_waiting_workflow(console_engine: Engine) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        order, approval = await blocked_order(engine, pilot)
        await open_detail(app, pilot, order)
        await pilot.press("p")
        await until(pilot, lambda: "paused" in screen_text(app).split("\n")[2], what="paused title")
        assert await state_of(engine, order) == "paused"
        await pilot.press("u")
        await until(pilot, lambda: "blocked" in screen_text(app).split("\n")[2], what="unpaused")
        await pilot.press("2")  # the Events tab follows the log as it grows
        log = app.screen.query_one(EventLog)
        await until(pilot, lambda: bool(log.events), what="the events")
        assert log.cursor == len(log.events) - 1
        await engine.stub(approval, {"ok": True})
        await until(
            pilot,
            lambda: "finished ok" in screen_text(app).split("\n")[2],
            what="the workflow to finish live",
        )
        await until(pilot, lambda: log.events[-1]["event"]["type"] == "finished", what="finished")
        assert log.cursor == len(log.events) - 1
        await pilot.press("c")  # finished: nothing to cancel, and the key says so
        await until(pilot, lambda: any("is finished" in n for n in notices(app)), what="refusal")
        assert not isinstance(app.screen, ConfirmScreen)


async def test_stub_from_the_console(console_engine: Engine) -> None:
    from obelisk_tui.screens.stub import StubScreen

    engine = console_engine
    async with open_console(engine) as (app, pilot):
        order, approval = await blocked_order(engine, pilot)
        await open_detail(app, pilot, order)
        await pilot.press("S")  # a workflow: not stubbed, and the key says why
        await until(
            pilot, lambda: any("is not a stub activity" in n for n in notices(app)), what="refusal"
        )
        await open_detail(app, pilot, approval)
        await pilot.press("S")
        await until(
            pilot,
            lambda: isinstance(app.screen, StubScreen) and app.screen.return_type is not None,
            what="the stub dialog",
        )
        dialog = app.screen
        area = dialog.query_one(TextArea)
        assert area.text == '{"ok": false}'  # the template of result<bool, string>
        area.text = '{"ok": "yes"}'
        await until(pilot, lambda: "expected bool" in screen_text(app), what="the type error")
        await pilot.press("ctrl+s")  # refused here: nothing is sent
        assert isinstance(app.screen, StubScreen)
        area.text = '{"ok": true}'
        await until(pilot, lambda: "matches the return type" in screen_text(app), what="ok")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: not isinstance(app.screen, StubScreen), what="dismissed")
        assert await engine.result(order, timeout=10) == ev.ResultOk("order o-1 approved")


async def test_a_screen_shows_what_changed_while_another_was_on_top(
    console_engine: Engine,
) -> None:
    """Changes are announced to the top screen: one uncovered again reloads."""
    from obelisk_tui.screens.stub import StubScreen

    engine = console_engine
    async with open_console(engine) as (app, pilot):
        order, approval = await blocked_order(engine, pilot)
        await open_detail(app, pilot, order)
        order_screen = app.screen
        await open_detail(app, pilot, approval)
        approval_screen = app.screen
        await pilot.press("S")
        await until(pilot, lambda: isinstance(app.screen, StubScreen), what="the stub dialog")
        # Written elsewhere (the CLI, another console) while the dialog is open: the last
        # commits of both executions happen now. The live refresh is frozen, so that no
        # announcement of them comes late to the uncovered screens: they load anyway.
        app.frozen = True
        await engine.stub(approval, {"ok": True})
        assert await engine.result(order, timeout=10) == ev.ResultOk("order o-1 approved")

        def finished(screen: Any) -> bool:
            return screen.info is not None and screen.info["state"]["type"] == "finished"

        await pilot.press("escape")
        await until(pilot, lambda: app.screen is approval_screen, what="the dialog closed")
        await until(pilot, lambda: finished(approval_screen), what="the approval finished")
        await pilot.press("escape")
        await until(pilot, lambda: app.screen is order_screen, what="the order's screen")
        await until(pilot, lambda: finished(order_screen), what="the order finished")


async def test_keys_scroll_the_state_tab_and_move_in_the_children_tab(
    console_engine: Engine,
) -> None:
    from textual.widgets import Tree

    from obelisk_tui.widgets.key_scroll import KeyScroll

    engine = console_engine
    async with open_console(engine, size=(80, 24)) as (app, pilot):
        eid = await engine.submit(FANOUT, [3])
        await engine.result(eid, timeout=20)
        await open_detail(app, pilot, eid)
        scroll = app.screen.query_one("#state-scroll", KeyScroll)
        await until(pilot, lambda: scroll.max_scroll_y > 0, what="a State tab taller than 24 rows")
        assert app.focused is scroll  # the tab's content, not the tab bar
        await pilot.press("j", "j")
        await until(pilot, lambda: scroll.scroll_y == 2, what="j scrolling")
        scroll.action_scroll_down()  # two keys between two refreshes: neither lost
        scroll.action_scroll_down()
        await until(pilot, lambda: scroll.scroll_y == 4, what="both")
        await pilot.press("end")
        await until(pilot, lambda: scroll.scroll_y == scroll.max_scroll_y, what="end")
        await pilot.press("g")
        await until(pilot, lambda: scroll.scroll_y == 0, what="g: the top")
        await pilot.press("G")
        await until(pilot, lambda: scroll.scroll_y == scroll.max_scroll_y, what="G: the bottom")
        await pilot.press("3")
        tree = app.screen.query_one(Tree)
        await until(pilot, lambda: len(tree.root.children) == 3, what="the three children")
        await until(pilot, lambda: app.focused is tree, what="the tree focused")
        start = tree.cursor_line
        await pilot.press("j", "j")
        await until(pilot, lambda: tree.cursor_line == start + 2, what="j moving the cursor")
        await pilot.press("k")
        await until(pilot, lambda: tree.cursor_line == start + 1, what="k moving it back")
        await pilot.press("G")
        await until(pilot, lambda: tree.cursor_line == tree.last_line, what="G: the last")
        await pilot.press("g")
        await until(pilot, lambda: tree.cursor_line == 0, what="g: the first")


async def test_the_events_tab_shows_the_version_travelled_to(console_engine: Engine) -> None:
    engine = console_engine
    async with open_console(engine, size=(100, 30)) as (app, pilot):
        eid = await engine.submit(FANOUT, [20])
        await engine.result(eid, timeout=20)
        await open_detail(app, pilot, eid)
        screen = app.screen
        assert isinstance(screen, ExecutionDetailScreen)
        await until(pilot, lambda: len(screen.steps) >= 45, what="the whole log")
        await pilot.press(*["left_square_bracket"] * 3)  # from the State tab
        await until(pilot, lambda: screen.travel == len(screen.steps) - 4, what="travelled")
        await pilot.press("2")
        log = screen.query_one(EventLog)
        await until(
            pilot,
            lambda: log.size.height > 0 and log.cursor in log.visible_range(),
            what="the travelled-to version in view",
        )
        assert log.cursor == screen.travel


async def test_cancel_of_a_waiting_cancellable_workflow(console_engine: Engine) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        order, approval = await blocked_order(engine, pilot, "o-2")
        await open_detail(app, pilot, order)
        await pilot.press("c")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the confirmation")
        await pilot.press("y")
        result = await engine.result(order, timeout=20)
        assert isinstance(result, ev.ExecutionFailure) and result.kind == "cancelled"
        child = await engine.result(approval, timeout=5)
        assert isinstance(child, ev.ExecutionFailure) and child.kind == "cancelled"
        await until(pilot, lambda: "failed cancelled" in screen_text(app), what="shown cancelled")


# -- components, hot reload, submit, palette, help ----------------------------------------


async def test_the_components_table_is_wide_enough_before_it_goes_idle(
    console_engine: Engine,
) -> None:
    """The columns fit their cells as soon as the table is filled. (Auto-width columns
    are measured only when the table next goes idle: until then each was as wide as its
    title, "fano" for "fanout", which under load lasted long enough to fail a test.)"""
    async with open_console(console_engine) as (app, pilot):
        await pilot.press("C")
        await until(
            pilot,
            lambda: getattr(app.screen, "deployment", None) is not None,
            what="the deployment",
        )
        screen = app.screen
        assert isinstance(screen, ComponentsScreen) and screen.deployment is not None
        table = screen.query_one("#components", DataTable)
        table.clear(columns=True)  # as on its first mount: nothing measured yet
        table.add_columns("name", "type", "exports", "digest", "file")
        screen.show(screen.deployment)  # and no pause: the table has not gone idle
        widths = {str(c.label): c.get_render_width(table) - 2 for c in table.ordered_columns}
        components = screen.deployment["components"]
        assert widths["name"] >= max(len(c["name"]) for c in components) >= len("fanout")
        assert widths["digest"] >= max(len(c["digest"][:19]) + 1 for c in components)
        assert widths["file"] > len("file")


async def test_components_screen_and_hot_reload(console_engine: Engine, tmp_path: Path) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        await pilot.press("C")
        await until(pilot, lambda: isinstance(app.screen, ComponentsScreen), what="components")
        screen = app.screen

        def why() -> str:  # this wait timed out in 2 of ~6 full runs under load (2026-12)
            loads = [(w.group, w.state.name) for w in app.workers if w.node is screen]
            start = engine.reloader._start_task
            return (
                f"deployment read: {getattr(screen, 'deployment', None) is not None}, "
                f"the screen's workers: {loads}, deferred start done: "
                f"{start is None or start.done()}, the screen: {screen_text(app)!r}"
            )

        await until(pilot, lambda: "fanout" in screen_text(app), what="the table", explain=why)
        table = app.screen.query_one("#components")
        await pilot.press("j", "j")
        await until(pilot, lambda: table.cursor_row == 2, what="j moves down")  # type: ignore[attr-defined]
        await pilot.press("k")
        await until(pilot, lambda: table.cursor_row == 1, what="k moves up")  # type: ignore[attr-defined]
        await pilot.press("G")
        last = table.row_count - 1  # type: ignore[attr-defined]
        await until(pilot, lambda: table.cursor_row == last, what="G to the end")  # type: ignore[attr-defined]
        await pilot.press("g")
        await until(pilot, lambda: table.cursor_row == 0, what="g to the top")  # type: ignore[attr-defined]
        text = screen_text(app)
        for name in ("step", "spin", "approval", "order"):
            assert name in text
        before = next(c for c in engine.components if c.config.name == "step").component_id.digest
        (tmp_path / "step.js").write_text(
            "export default function step(idx) { return idx * 100; }\n"
        )

        def reloaded() -> bool:
            return any("reloaded" in n for n in notices(app))

        await until(pilot, reloaded, timeout=20, what="the reload toast")
        after = next(c for c in engine.components if c.config.name == "step").component_id.digest
        assert after != before
        await until(pilot, lambda: after[:19] in screen_text(app), what="the new digest")
        assert "1 component change(s)" in screen_text(app)

        (tmp_path / "step.js").write_text("export default function step(idx) { return idx * ; }\n")
        await until(
            pilot,
            lambda: any("step.js" in n for n in notices(app) if "reloaded" not in n),
            timeout=20,
            what="the error toast",
        )
        await until(pilot, lambda: "reload FAILED" in screen_text(app), what="the failure shown")
        assert (
            next(c for c in engine.components if c.config.name == "step").component_id.digest
            == after
        )
        await pilot.press("escape")
        assert isinstance(app.screen, ExecutionsScreen)


async def test_components_file_paths_keep_their_end_at_80_columns() -> None:
    from obelisk_tui.screens.components import elide_left

    assert elide_left("/a/b/step.js", 20) == "/a/b/step.js"
    assert elide_left("/a/b/step.js", 8) == "…step.js" and elide_left("abc", 1) == "…"
    # A directory of known length (pytest's own are longer under pytest-xdist, and a
    # path longer than the detail's width wraps there): elided in the table at 80
    # columns, whole in the detail below it.
    with tempfile.TemporaryDirectory(prefix="obelisk-console-") as short:
        directory = Path(short)
        assert len(str(directory / "step.js")) < 60
        async with (
            engine_in(directory) as engine,
            open_console(engine, size=(80, 24)) as (
                app,
                pilot,
            ),
        ):
            await pilot.press("C")
            await until(pilot, lambda: "fanout" in screen_text(app), what="the table")
            row = next(line for line in screen_text(app).splitlines() if " step " in line)
            assert "…" in row and "step.js" in row, row  # the path's end, not its start
            await until(
                pilot,
                lambda: str(directory / "step.js") in screen_text(app),
                what="the whole path in the detail",
            )
            await pilot.resize_terminal(200, 24)
            await until(
                pilot,
                lambda: any(
                    str(directory / "step.js") in line and " step " in line
                    for line in screen_text(app).splitlines()
                ),
                what="the whole path in the table",
            )


async def test_submit_form_checks_params_and_opens_the_new_execution(
    console_engine: Engine,
) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        await pilot.press("s")
        await until(pilot, lambda: isinstance(app.screen, SubmitScreen), what="the form")
        form = app.screen
        assert isinstance(form, SubmitScreen)
        await until(pilot, lambda: bool(form.functions), what="the functions")
        await pilot.press(*"fanout", "enter")
        await until(
            pilot,
            lambda: form.chosen is not None and form.chosen["ffqn"] == FANOUT,
            what="fanout chosen",
        )
        area = form.query_one(TextArea)
        assert area.text == "[0]"
        assert "n: u32" in screen_text(app)
        # Highlighted as JSON (tree-sitter): the number drawn in another style than "[".
        assert area.is_syntax_aware and area.language == "json"
        spans = area._highlights.get(0, [])  # (Textual's, per line: start, end, name)
        assert any(start <= 1 < end for start, end, _ in spans), spans
        area.text = "[-1]"
        await until(
            pilot,
            lambda: "params[0] (n): expected u32" in screen_text(app),
            what="the inline error",
        )
        area.text = "[1, 2"
        await until(pilot, lambda: "not JSON" in screen_text(app), what="the JSON error")
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, SubmitScreen)  # refused, still here
        area.text = "[2]"
        await until(pilot, lambda: "params match the types" in screen_text(app), what="valid")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        detail = app.screen
        assert isinstance(detail, ExecutionDetailScreen)
        created = await engine.storage.get_created(detail.execution_id)
        assert created.ffqn == FANOUT and created.params == [2]
        assert await engine.result(detail.execution_id, timeout=30) == ev.ResultOk("10")


async def test_the_submit_dialog_lists_one_function_per_line_at_80_columns(
    console_engine: Engine,
) -> None:
    async with open_console(console_engine, size=(80, 24)) as (app, pilot):
        await pilot.press("s")
        await until(
            pilot,
            lambda: isinstance(app.screen, SubmitScreen) and bool(app.screen.functions),
            what="the functions",
        )
        await until(pilot, lambda: "▊ order-cancellable  tes" in screen_text(app), what="names")
        lines = screen_text(app).splitlines()
        assert not any(line.strip(" █▊▎").startswith("test:console/") for line in lines)


async def test_footers_at_80_columns_show_whole_keys_and_help(console_engine: Engine) -> None:
    """Keys that do not fit are left out whole, the least needed first; `? Help` stays."""
    eid = await console_engine.submit(APPROVE, ["footer"])
    async with open_console(console_engine, size=(80, 24)) as (app, pilot):
        await until(pilot, lambda: "Unpause" in screen_text(app), what="the footer")
        footer = screen_text(app).splitlines()[-1]
        assert "? Help" in footer and "c Cancel" in footer, footer
        assert "Components" not in footer and footer.endswith("  "), footer  # nothing cut
        app.open_execution(eid)
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        await until(pilot, lambda: "esc Back" in screen_text(app), what="its footer")
        footer = screen_text(app).splitlines()[-1]
        assert "? Help" in footer and "c Cancel" in footer and "] version ▶" in footer, footer
        await pilot.resize_terminal(160, 30)
        await until(pilot, lambda: "C Components" in screen_text(app), what="all keys at 160")
        assert "^p palette" in screen_text(app).splitlines()[-1]


def test_the_footer_leaves_out_the_least_needed_keys_first() -> None:
    from obelisk_tui.widgets.key_footer import PALETTE, fitting, key_width

    items = [
        ("back", key_width("esc", "Back")),
        ("cancel", key_width("c", "Cancel")),
        ("quit", key_width("q", "Quit")),
        ("help", key_width("?", "Help")),
        ("freeze", key_width("space", "Freeze")),
        (PALETTE, key_width("^p", "palette") + 1),
    ]
    assert [c for _, c in items] == [10, 10, 8, 8, 14, 13]
    assert fitting(items, 100) == set()
    assert fitting(items, 50) == {4}  # freeze first
    assert fitting(items, 36) == {4, 5}  # then the palette
    assert fitting(items, 28) == {4, 5, 2}  # then quit
    assert fitting(items, 10) == {4, 5, 2, 1, 0}  # then from the right; never help
    assert fitting(items, 0) == {4, 5, 2, 1, 0}


async def test_command_palette_opens_an_execution_by_id(console_engine: Engine) -> None:
    engine = console_engine
    eid = await engine.submit(APPROVE, ["p"])
    async with open_console(engine) as (app, pilot):
        await pilot.press("ctrl+p")
        await pilot.press(*eid[:12])
        await until(pilot, lambda: f"Open execution {eid}" in screen_text(app), what="the hit")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        assert app.screen.execution_id == eid  # type: ignore[attr-defined]


async def test_command_palette_puts_the_exact_id_first(console_engine: Engine) -> None:
    """A workflow's id is a prefix of its children's: typed whole, it is the first hit."""
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        order, approval = await blocked_order(engine, pilot)
        await pilot.press("ctrl+p")
        await pilot.press(*order)
        await until(
            pilot,
            lambda: (
                f"Open execution {approval}" in screen_text(app)
                and f"Open execution {order}" in screen_text(app)
            ),
            what="both hits",
        )
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        assert app.screen.execution_id == order  # type: ignore[attr-defined]
        # More children (newer, with its id as their prefix) than a page of hits.
        fanout = await engine.submit(FANOUT, [20])
        await engine.result(fanout, timeout=20)
        await pilot.press("escape")
        await pilot.press("ctrl+p")
        await pilot.press(*fanout)
        await until(pilot, lambda: f"Open execution {fanout}" in screen_text(app), what="it")
        await pilot.press("enter")
        await until(
            pilot,
            lambda: getattr(app.screen, "execution_id", None) == fanout,
            what="the fan-out's screen",
        )


async def test_help_and_quit(console_engine: Engine) -> None:
    from obelisk_tui.screens.help import HelpScreen

    async with open_console(console_engine, size=(100, 40)) as (app, pilot):
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        await until(
            pilot,
            lambda: (
                "mark the selected" in screen_text(app)
                and "state:locked,paused" in screen_text(app)
            ),
            what="the list's keys and the filter syntax",
        )
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="help closed")
        # On an execution's screen: its own keys; `esc` closes the help, and only that.
        eid = await console_engine.submit(APPROVE, ["help"])
        app.open_execution(eid)
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        await pilot.press("question_mark")
        await until(pilot, lambda: "time travel: the state" in screen_text(app), what="its keys")
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="closed")
        await pilot.press("escape")  # and now: back
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")
        await pilot.press("q")
        await until(pilot, lambda: app._exit, what="the app to quit")  # type: ignore[attr-defined]


def test_the_help_names_every_key_of_each_screen() -> None:
    """The written guide keeps up with the bindings, both ways: every key a screen, its
    widgets or the app bind is explained, and every key explained is bound."""
    from obelisk_tui.app import ObeliskApp
    from obelisk_tui.screens import help as guide
    from obelisk_tui.screens.run_command import CommandLineHost
    from obelisk_tui.widgets.children_tree import ChildrenTree
    from obelisk_tui.widgets.command_line import CommandLine
    from obelisk_tui.widgets.key_scroll import KeyScroll
    from obelisk_tui.widgets.row_list import RowList

    def keys_of(rows: list[tuple[str, str]]) -> set[str]:
        keys = {k for keys, _ in rows for k in keys.replace("…", " ").split()}
        return keys | ({"2", "3", "4"} if {"1", "5"} <= keys else set())  # "1 … 5"

    names = {"question_mark": "?", "slash": "/", "left_square_bracket": "[",
             "right_square_bracket": "]", "escape": "esc", "up": "↑", "down": "↓",
             "pageup": "pgup", "pagedown": "pgdn", "colon": ":"}  # fmt: skip

    def bound(*classes: type) -> set[str]:
        out = set()
        for cls in classes:
            for binding in cls._merge_bindings().key_to_bindings:  # type: ignore[attr-defined]
                out.add(names.get(binding, binding))
        return out

    def declared(*classes: type) -> set[str]:
        """The keys the console's own classes bind (not Textual's base classes)."""
        out = set()
        for cls in classes:
            for binding in vars(cls).get("BINDINGS", []):
                assert isinstance(binding, Binding)
                if not binding.system:  # kept out of help panels on purpose
                    out |= {names.get(k, k) for k in binding.key.split(",")}
        return out

    # The command line's own keys (its commands are words, not keys).
    line_keys = guide.COMMAND_LINE[-1:]
    line = [CommandLineHost, CommandLine]
    screens = [
        (
            ExecutionsScreen,
            guide.MOVING + guide.EXECUTIONS + line_keys,
            [ExecutionList, RowList, *line],
        ),
        (
            ExecutionDetailScreen,
            guide.MOVING + guide.DETAIL + line_keys,
            [EventLog, RowList, ChildrenTree, KeyScroll, *line],
        ),
        (ComponentsScreen, guide.COMPONENTS, []),
        (ObeliskApp, guide.EVERYWHERE, []),
    ]
    app_keys = declared(ObeliskApp) | {"ctrl+p"}
    for screen, rows, widgets in screens:
        documented = keys_of(rows)
        undocumented = declared(screen, *widgets) - documented
        assert not undocumented, f"{screen.__name__}: {sorted(undocumented)} not in the help"
        unbound = documented - bound(screen, *widgets) - app_keys
        if screen is ComponentsScreen:  # a DataTable: Textual's own keys
            from textual.widgets import DataTable

            unbound -= bound(DataTable)
        assert not unbound, f"{screen.__name__}: the help names {sorted(unbound)}, unbound"


async def test_the_cursor_stays_on_its_execution_when_new_ones_arrive(
    console_engine: Engine,
) -> None:
    engine = console_engine
    older = [await engine.submit(APPROVE, [str(i)]) for i in range(2)]
    async with open_console(engine) as (app, pilot):
        lst = app.screen.query_one(ExecutionList)
        await until(pilot, lambda: listed(app) == older[::-1], what="the first two")
        await pilot.press("j")  # on the older one: it stays selected
        assert lst.selected is not None and lst.selected["execution_id"] == older[0]
        newer = [await engine.submit(APPROVE, [f"n{i}"]) for i in range(3)]
        await until(pilot, lambda: len(listed(app)) == 5, what="the newer ones")
        assert lst.selected["execution_id"] == older[0] and lst.cursor == 4  # type: ignore[index]
        assert lst.first_visible == 0 and listed(app)[0] == newer[-1]  # the view stays on top
        await pilot.press("p")
        await until(
            pilot, lambda: any(f"paused {older[0]}" in n for n in notices(app)), what="paused"
        )
        assert await state_of(engine, older[0]) == "paused"
        assert {await state_of(engine, x) for x in newer} == {"pending_at"}

        await pilot.press("g")  # the first row, chosen: it stays chosen
        assert not lst.follow
        await pilot.press("f")  # following the top row: the newest
        latest = await engine.submit(APPROVE, ["latest"])
        await until(pilot, lambda: listed(app)[:1] == [latest], what="the latest")
        assert lst.cursor == 0 and lst.selected["execution_id"] == latest  # type: ignore[index]
