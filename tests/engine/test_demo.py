"""The demo deployment (`demo/deployment.toml`) builds and runs: one execution of each kind.

Builds every component of `engine.build_components.COMPONENTS` the way the set-up command
does (cached by input hash), starts an `Engine` on the demo deployment and runs the
Python-built WASM activity, the WAT-built WASM activity, a JS activity, the stub, and
every demo workflow (the seed examples, sleep, fan-out, schedule, stub + cancel, child
workflows, the Python-built WASM workflow).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.build_components import COMPONENTS, REPO_ROOT, ensure_built
from engine.core import events as ev
from engine.engine import Engine
from engine.storage.contract import ExecutionRow, ListFilter
from tests.engine.test_js_activities import legal
from tests.engine.test_workflow_semantics import checked_log, state_of, wait_until
from tests.fixtures import components as fx

DEMO = REPO_ROOT / "demo" / "deployment.toml"


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Engine]:
    for name in COMPONENTS:
        built = await asyncio.to_thread(ensure_built, name)
        assert built.is_file() and built.parent == REPO_ROOT / "demo" / "build"
    engine = await Engine.start(DEMO, fx.share_compiled_cache(tmp_path / "data"))
    try:
        yield engine
    finally:
        await engine.stop()


async def logs(engine: Engine, execution_id: str) -> list[tuple[str, str, str]]:
    return [(x.level, x.stream, x.message) for x in await engine.storage.get_logs(execution_id)]


async def test_demo_components_are_all_deployed(demo: Engine) -> None:
    by_name = {c.config.name: c for c in demo.components}
    assert by_name["activity_py"].config.type == "activity_wasm"
    assert by_name["activity_wat"].config.type == "activity_wasm"
    assert by_name["activity_wat"].ffqns == [
        "myapp:demo/wat.add",
        "myapp:demo/wat.fail-until",
        "myapp:demo/wat.greet",
    ]
    assert {c.config.type for c in demo.components} >= {
        "activity_wasm",
        "activity_js",
        "activity_stub",
    }


async def test_python_built_wasm_activity(demo: Engine) -> None:
    eid = await demo.submit("myapp:demo/activity.step", [3, 0])
    assert await demo.result(eid, timeout=30) == ev.ResultOk(3)
    assert ("info", "stdout", "step 3 done") in await logs(demo, eid)
    await legal(demo, eid)


async def test_wat_built_wasm_activity(demo: Engine) -> None:
    eid = await demo.submit("myapp:demo/wat.add", [2, 40])
    assert await demo.result(eid, timeout=10) == ev.ResultOk(42)
    assert await logs(demo, eid) == [("info", "log", "add: computing a + b")]

    eid = await demo.submit("myapp:demo/wat.greet", ["demo"])
    assert await demo.result(eid, timeout=10) == ev.ResultOk("Hello, demo!")
    assert await logs(demo, eid) == [("info", "stdout", "Hello, demo!")]

    # err until the wall clock passes `until`: retried with the deployment's 100 ms backoff.
    until = int(time.time() * 1000) + 250
    eid = await demo.submit("myapp:demo/wat.fail-until", [until])
    result = await demo.result(eid, timeout=10)
    assert isinstance(result, ev.ResultOk) and result.value >= until
    events = await demo.storage.get_events(eid)
    failures = [e.event for e in events if isinstance(e.event, ev.TemporarilyFailed)]
    assert failures and {f.reason for f in failures} == {"returned err"}
    assert {f.detail for f in failures} == {'"too early, will be retried"'}
    assert ("warn", "log", "too early, will be retried") in await logs(demo, eid)
    await legal(demo, eid)


async def test_js_activity(demo: Engine) -> None:
    eid = await demo.submit("myapp:demo/greeter.greet", ["demo"])
    assert await demo.result(eid, timeout=10) == ev.ResultOk("Hello, demo!")
    assert await logs(demo, eid) == [("info", "log", "greeting demo")]


async def test_stub_activity(demo: Engine) -> None:
    eid = await demo.submit("myapp:demo/approval.approve", ["order-1"])
    await demo.stub(eid, {"ok": True})
    assert await demo.result(eid, timeout=1) == ev.ResultOk(True)


# -- workflows ---------------------------------------------------------------------------


async def children(engine: Engine, execution_id: str) -> list[ExecutionRow]:
    rows = await engine.storage.list_executions(ListFilter(id_prefix=execution_id + "."))
    return sorted((r for r in rows if r.parent_id == execution_id), key=lambda r: r.created_at)


async def test_seed_examples_return_45(demo: Engine) -> None:
    ids = [
        await demo.submit("myapp:demo/workflow.serial", []),
        await demo.submit("myapp:demo/workflow.parallel", []),
        await demo.submit("myapp:demo-py/workflow.parallel", []),  # the Python WASM one
    ]
    for eid in ids:
        assert await demo.result(eid, timeout=60) == ev.ResultOk("45")
        kids = await children(demo, eid)
        assert [k.ffqn for k in kids] == ["myapp:demo/activity.step"] * 10
        await checked_log(demo, eid)


async def test_sleep_fanout_and_child_workflows(demo: Engine) -> None:
    sleepy = await demo.submit("myapp:demo/workflow.sleepy", [1, 1])
    fanout = await demo.submit("myapp:demo/workflow.fanout", [8])
    batch = await demo.submit("myapp:demo/workflow.batch", [2])
    assert await demo.result(fanout, timeout=60) == ev.ResultOk(str(sum(range(8))))
    assert await demo.result(batch, timeout=60) == ev.ResultOk("90")
    result = await demo.result(sleepy, timeout=60)
    assert isinstance(result, ev.ResultOk) and result.value.startswith("slept 1 × 1 s")
    assert any(d.startswith("round 0: woke at") for _, _, d in await logs(demo, sleepy))
    assert [k.ffqn for k in await children(demo, batch)] == ["myapp:demo/workflow.parallel"] * 2
    for eid in (sleepy, fanout, batch):
        await checked_log(demo, eid)


async def test_welcome_schedules_the_follow_up_email(demo: Engine) -> None:
    eid = await demo.submit("myapp:demo/workflow.welcome", ["ann@example.com"])
    result = await demo.result(eid, timeout=60)
    assert isinstance(result, ev.ResultOk)
    follow_up = result.value.rsplit(" ", 1)[1]
    row = await demo.storage.get_row(follow_up)
    assert row.ffqn == "myapp:demo/activity.send-email" and row.parent_id is None
    assert row.scheduled_at is not None
    assert 290 < (row.scheduled_at - row.created_at).total_seconds() <= 300
    created = await demo.storage.get_created(follow_up)
    assert created.params == ["ann@example.com", "How is it going?"]


async def test_order_waits_for_approval_and_can_be_cancelled(demo: Engine) -> None:
    approved = await demo.submit("myapp:demo/workflow.order-cancellable", ["o-1"])
    cancelled = await demo.submit("myapp:demo/workflow.order-cancellable", ["o-2"])
    for eid in (approved, cancelled):

        async def blocked(eid: str = eid) -> bool:
            kids = await children(demo, eid)
            return bool(kids) and await state_of(demo, eid) == "blocked_by_join_set"

        await wait_until(blocked, 30, f"{eid} to wait for its approval")
    (approval,) = await children(demo, approved)
    assert approval.ffqn == "myapp:demo/approval.approve"
    await demo.stub(approval.execution_id, {"ok": True})
    assert await demo.result(approved, timeout=60) == ev.ResultOk("order o-1 shipped")

    await demo.cancel(cancelled)
    result = await demo.result(cancelled, timeout=30)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "cancelled"
    (approval,) = await children(demo, cancelled)
    child_result = await demo.result(approval.execution_id, timeout=1)
    assert isinstance(child_result, ev.ExecutionFailure) and child_result.kind == "cancelled"
    for eid in (approved, cancelled):
        await checked_log(demo, eid)
