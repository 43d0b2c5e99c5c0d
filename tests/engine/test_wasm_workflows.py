"""WASM workflows end to end on a real engine: WAT workflows and the componentize-py demo
workflow calling real activities (the WAT fixture activity, the Python demo activity).

Each deployment section gets a single-export component (`workflow_component(<interface>)`),
since a `[[workflow_wasm]]` runner picks its export by itself when it has only one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from engine.build_components import ensure_built
from engine.core import events as ev
from engine.core.state import replay_stored
from engine.engine import Engine
from engine.errors import DeploymentError
from tests.engine.conftest import StartEngine
from tests.engine.test_js_activities import wait_state
from tests.fixtures import components as fx
from tests.fixtures.deployments import Deployment, ms, seconds
from tests.fixtures.workflow_components import workflow_component, workflow_ffqn

ADD = "testing:fixtures/activity.add"


def activity_section() -> Deployment:
    return Deployment().activity_wasm(
        "fixtures",
        fx.activity_component(),
        max_retries=2,
        retry_exp_backoff=ms(10),
        exec={"tick_sleep": ms(20)},
    )


def workflow_section(
    interface: str, strategy: str = "await", location: Path | None = None
) -> Deployment:
    return Deployment().workflow_wasm(
        f"wf-{interface}",
        location or workflow_component(interface),
        blocking_strategy=strategy,
        exec={"lock_expiry": seconds(2), "tick_sleep": ms(20)},
    )


async def start(
    start_engine: StartEngine, tmp_path: Path, *interfaces: str, strategy: str = "await"
) -> Engine:
    fx.share_compiled_cache(tmp_path / "data")  # the data dir `start_engine` uses
    toml = activity_section()
    for interface in interfaces:
        toml += workflow_section(interface, strategy)
    return await start_engine(toml)


async def legal(engine: Engine, execution_id: str) -> list[ev.StoredEvent]:
    """The log and responses replay through the state machine to the stored projection."""
    events = await engine.storage.get_events(execution_id)
    responses = await engine.storage.get_responses(execution_id)
    assert replay_stored(events, responses) == await engine.storage.get_summary(execution_id)
    return events


def history(events: list[ev.StoredEvent]) -> list[Any]:
    return [e.event.event for e in events if isinstance(e.event, ev.HistoryEvent)]


def children(events: list[ev.StoredEvent]) -> list[str]:
    return [
        h.request.child_execution_id
        for h in history(events)
        if isinstance(h, ev.JoinSetRequest) and isinstance(h.request, ev.ChildExecutionRequest)
    ]


async def run(engine: Engine, interface: str, params: list[Any]) -> tuple[str, Any]:
    eid = await engine.submit(workflow_ffqn(interface), params)
    return eid, await engine.result(eid, timeout=30)


# ---------------------------------------------------------------------------------------------
# WAT workflows


async def test_direct_call_of_an_activity(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, "direct")
    component = next(c for c in engine.components if c.config.type == "workflow_wasm")
    assert component.ffqns == [workflow_ffqn("direct")]
    assert component.component_id.type == "workflow_wasm"
    eid, result = await run(engine, "direct", [2, 3])
    assert result == ev.ResultOk(6)
    events = await legal(engine, eid)
    (child,) = children(events)
    assert child == f"{eid}.o:1-add_1"
    assert (await engine.storage.get_row(child)).parent_id == eid
    assert await engine.result(child) == ev.ResultOk(5)
    await legal(engine, child)


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_fan_out_in_a_join_set(
    start_engine: StartEngine, tmp_path: Path, strategy: str
) -> None:
    engine = await start(start_engine, tmp_path, "fanout", strategy=strategy)
    eid, result = await run(engine, "fanout", [5])
    assert result == ev.ResultOk(sum(2 * i for i in range(5)))
    events = await legal(engine, eid)
    kids = children(events)
    assert kids == [f"{eid}.g:1_{n}" for n in range(1, 6)]
    for n, child in enumerate(kids):
        assert (await engine.storage.get_row(child)).parent_id == eid
        assert await engine.result(child) == ev.ResultOk(2 * n)
    joins = [h for h in history(events) if isinstance(h, ev.JoinNext)]
    assert [(j.join_set_id, j.requested_ffqn, j.closing) for j in joins] == [
        ("g:1", ADD, False)
    ] * 5


async def test_wasi_is_deterministic(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, "ambient")
    # wall clock (seconds, nanoseconds) at the epoch, random u64, monotonic now, env vars
    eid, result = await run(engine, "ambient", [])
    assert result == ev.ResultOk([0, 0, 0, 0, 0])
    assert history(await legal(engine, eid)) == []


async def test_persistent_sleep(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, "sleep")
    before = int(time.time() * 1000)
    eid, result = await run(engine, "sleep", [50])
    assert isinstance(result, ev.ResultOk)
    assert before + 50 <= result.value <= int(time.time() * 1000)
    (create, request, join) = history(await legal(engine, eid))
    assert create == ev.JoinSetCreate("o:1-sleep")
    assert isinstance(request.request, ev.DelayRequest)
    assert isinstance(join, ev.JoinNext)


async def test_err_and_trap(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, "fail", "trap")
    eid, result = await run(engine, "fail", ["boom"])
    assert result == ev.ResultErr("boom")
    await legal(engine, eid)
    eid, result = await run(engine, "trap", [])
    assert isinstance(result, ev.ExecutionFailure)
    assert (result.kind, result.reason) == ("uncategorized", "trap: unreachable")
    await legal(engine, eid)


async def test_a_child_left_in_a_join_set_is_dealt_with(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start(start_engine, tmp_path, "leave")
    eid, result = await run(engine, "leave", [5])
    assert result == ev.ResultOk(5)
    events = await legal(engine, eid)
    (child,) = children(events)
    closing = [h for h in history(events) if isinstance(h, ev.JoinNext) and h.closing]
    assert [j.join_set_id for j in closing] == ["g:1"]
    # The activity was cancelled, or had already finished when the join set was closed.
    child_result = await engine.result(child, timeout=10)
    assert child_result == ev.ResultOk(10) or (
        isinstance(child_result, ev.ExecutionFailure) and child_result.kind == "cancelled"
    )
    await legal(engine, child)


async def test_logs_and_stdout_are_stored(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, "logging")
    eid, result = await run(engine, "logging", ["hello"])
    assert result == ev.ResultOk("hello")
    logs = await engine.storage.get_logs(eid)
    assert [(log.level, log.message) for log in logs] == [("info", "hello"), ("info", "hello")]


async def test_schedule_extension(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, "sched")
    eid, result = await run(engine, "sched", [7])
    assert isinstance(result, ev.ResultOk)
    scheduled = result.value
    assert scheduled.startswith("E_") and "." not in scheduled  # a top-level execution
    assert await engine.result(scheduled, timeout=10) == ev.ResultOk(14)
    (schedule,) = history(await legal(engine, eid))[1:]  # after the persisted id
    assert schedule == ev.Schedule(scheduled, ev.ScheduleAtNow(), ADD)


async def test_dynamic_submit_and_join_next(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, "dynamic", "ids")
    eid, result = await run(engine, "dynamic", [1, 2])
    assert result == ev.ResultOk("3")
    assert children(await legal(engine, eid)) == [f"{eid}.n:adder_1"]
    eid, result = await run(engine, "ids", [4])
    assert result == ev.ResultOk(f"g:1 {eid}.g:1_1")
    await legal(engine, eid)


# ---------------------------------------------------------------------------------------------
# The componentize-py demo workflow with the componentize-py demo activity


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_python_workflow_parallel_returns_45(
    start_engine: StartEngine, tmp_path: Path, strategy: str
) -> None:
    fx.share_compiled_cache(tmp_path / "data")
    exec_ = {"lock_expiry": seconds(5), "tick_sleep": ms(20)}
    toml = (
        Deployment()
        .activity_wasm("activity_py", ensure_built("activity_py"), exec=exec_)
        .workflow_wasm(
            "workflow_py", ensure_built("workflow_py"), blocking_strategy=strategy, exec=exec_
        )
    )
    engine = await start_engine(toml)
    eid = await engine.submit("myapp:demo-py/workflow.parallel", [])
    assert await engine.result(eid, timeout=60) == ev.ResultOk("45")
    events = await legal(engine, eid)
    kids = children(events)
    assert len(kids) == len(set(kids)) == 10
    for child in kids:
        assert (await engine.storage.get_row(child)).parent_id == eid
        await legal(engine, child)
    logs = [log.message for log in await engine.storage.get_logs(eid)]
    assert "parallel: the steps add up to 45" in logs


# ---------------------------------------------------------------------------------------------
# Deployment errors


async def test_an_import_nobody_exports_is_a_deployment_error(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    with pytest.raises(DeploymentError) as info:
        await start_engine(workflow_section("direct"))
    message = str(info.value)
    assert str(tmp_path / "deployment.toml") in message
    assert '[[workflow_wasm]] #1 "wf-direct"' in message
    assert "unknown interface `testing:fixtures/activity` imported" in message


async def test_an_import_of_other_types_is_a_deployment_error(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    toml = Deployment().activity_js(
        "add",
        "export default function add(a, b) { return a + b; }\n",
        ffqn="testing:fixtures/activity.add",
        params=[("a", "u32"), ("b", "u32")],
        return_type="result<u32, string>",
    ) + workflow_section("direct")
    with pytest.raises(DeploymentError) as info:
        await start_engine(toml)
    assert (
        "testing:fixtures/activity.add: the deployed function takes (u32, u32), "
        "the import passes (u64, u64)"
    ) in str(info.value)


async def test_a_workflow_declared_as_an_activity_is_a_deployment_error(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    location = workflow_component("direct")
    with pytest.raises(DeploymentError) as info:
        await start_engine(activity_section().activity_wasm("misplaced", location))
    message = str(info.value)
    assert '[[activity_wasm]] #2 "misplaced", key `location`' in message, message
    assert f"{location} imports " in message
    assert "a workflow component belongs in a [[workflow_wasm]] section" in message


async def test_a_core_module_is_a_deployment_error(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    with pytest.raises(DeploymentError) as info:
        await start_engine(workflow_section("direct", location=fx.core_module_file()))
    assert "key `location`" in str(info.value)
    assert "core WebAssembly module" in str(info.value)


async def test_an_old_version_is_rebuilt_from_the_compiled_cache(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    """Executions pinned to a WASM workflow version whose file changed run on its
    compiled code from the cache (`engine.old_versions`)."""
    from engine.old_versions import rebuild_old_version

    engine = await start(start_engine, tmp_path, "direct")
    ffqn = workflow_ffqn("direct")
    deployed = engine.registry.function(ffqn)[1]
    digest = deployed.component_id.digest
    rebuilt = await rebuild_old_version(engine.load_context, digest, ffqn, engine.registry)
    assert rebuilt is not None and rebuilt is not deployed
    assert rebuilt.component_id == deployed.component_id
    assert rebuilt.ffqns == [ffqn] and rebuilt.config is deployed.config
    # Not in the cache (another data dir, a cleared cache): nothing to run it with.
    missing = "sha256:" + "0" * 64
    assert await rebuild_old_version(engine.load_context, missing, ffqn, engine.registry) is None
    # No deployed workflow exports the function any more: no settings to run it with.
    assert await rebuild_old_version(engine.load_context, digest, ADD, engine.registry) is None


def sleepy_variant(name: str, old: str, new: str) -> Path:
    """The `sleep` WAT workflow with one edit: another version of `sleepy`."""
    import dataclasses

    from engine import wat_build
    from tests.fixtures import workflow_components as wc

    base = wc.WORKFLOWS["sleep"]
    assert old in base.wat
    edited = dataclasses.replace(base, wat=base.wat.replace(old, new))
    return wat_build.build_component(
        f"workflow-sleep-{name}",
        wc._wit_files([edited], "wf-sleep"),
        wc._wat([edited]),
        wc.CACHE_DIR,
        world="wf-sleep",
    )


@pytest.mark.parametrize("compatible", [True, False], ids=["compatible", "incompatible"])
async def test_a_wasm_workflow_replaced_while_stopped(
    start_engine: StartEngine, tmp_path: Path, compatible: bool
) -> None:
    """The component file changed while no engine ran: the first lock checks the
    history against the new code; an incompatible execution runs on its old version,
    rebuilt from the compiled cache."""
    import shutil

    if compatible:  # the same sleep, another result
        edited = sleepy_variant("plus-one", "(i64.const 1000))", "(i64.const 1001))")
    else:  # sleeps for another duration: the delay request differs
        edited = sleepy_variant(
            "longer",
            "(i64.const 0) (local.get $ms)",
            "(i64.const 0) (i64.add (local.get $ms) (i64.const 1))",
        )
    location = tmp_path / "sleepy.wasm"
    shutil.copyfile(workflow_component("sleep"), location)
    fx.share_compiled_cache(tmp_path / "data")
    engine = await start_engine(activity_section() + workflow_section("sleep", location=location))
    old_digest = engine.registry.function(workflow_ffqn("sleep"))[1].component_id.digest
    eid = await engine.submit(workflow_ffqn("sleep"), [1500])
    await wait_state(engine, eid, "blocked_by_join_set")  # waits for its delay
    await engine.stop()

    shutil.copyfile(edited, location)
    again = await Engine.start(tmp_path / "deployment.toml", tmp_path / "data", watch=False)
    try:
        result = await again.result(eid, timeout=20)
        assert isinstance(result, ev.ResultOk), result
        events = await legal(again, eid)
        [upgrade] = [e.event for e in events if isinstance(e.event, ev.ComponentUpgradeFinished)]
        locks = [e.event for e in events if isinstance(e.event, ev.Locked)]
        if compatible:
            assert upgrade.outcome == ev.UpgradeSuccess()
            assert locks[-1].component_id.digest != old_digest
        else:
            assert isinstance(upgrade.outcome, ev.UpgradeFailed), upgrade
            assert "1500" in upgrade.outcome.reason and "1501" in upgrade.outcome.reason
            assert locks[-1].component_id.digest == old_digest  # the rebuilt version
    finally:
        await again.stop()
