"""Activities end to end on a real engine: JS components, retries, timeouts, cancel, stop."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from engine.core import events as ev
from engine.core.state import ACTIVITY_RETRY, replay
from engine.errors import Conflict, InvalidParams, NotCancellable, NotFound, UnknownFunction
from tests.engine.conftest import StartEngine
from tests.fixtures.deployments import Deployment, ParamSpec, ms

JS = """
export function ok(name) { console.log("hello", name); return `hi ${name}`; }
export function fail(msg) { throw new Error(msg); }
export function permanent() { throw "permanent-failure"; }
export function spin() { while (true) {} }
export function badReturn() { return 42; }
export function badErr() { throw { code: 1 }; }
"""


def js_activity(
    d: Deployment,
    name: str,
    export: str,
    params: list[ParamSpec],
    ret: str,
    max_retries: int | None = None,
) -> None:
    d.activity_js(
        name,
        None,  # acts.js: each test writes it
        location="acts.js",
        export=export,
        ffqn=f"test:js/acts.{name}",
        params=params,
        return_type=ret,
        max_retries=max_retries,
        retry_exp_backoff=ms(10),
        exec={"lock_expiry": ms(500), "tick_sleep": ms(20)},
    )


def deployment() -> Deployment:
    d = Deployment()
    js_activity(d, "ok", "ok", [("name", "string")], "result<string, string>")
    js_activity(d, "fail", "fail", [("msg", "string")], "result<string, string>", 2)
    js_activity(d, "permanent", "permanent", [], "result<string, string>")
    js_activity(d, "spin", "spin", [], "result<string, string>", 1)
    js_activity(d, "bad-return", "badReturn", [], "result<string, string>", 0)
    js_activity(d, "bad-err", "badErr", [], "result<string, u32>", 1)
    return d.activity_stub(
        "test:stub/approval.approve",
        params=[("order", "string")],
        return_type="result<bool, string>",
    )


DEPLOYMENT = deployment()


async def start(start_engine: StartEngine):  # type: ignore[no-untyped-def]
    return await start_engine(DEPLOYMENT, files={"acts.js": JS})


def event_types(events: list[ev.StoredEvent]) -> list[str]:
    return [e.event.__struct_config__.tag for e in events]  # type: ignore[attr-defined]


async def legal(engine, execution_id: str) -> None:  # type: ignore[no-untyped-def]
    """The log and responses replay through the state machine without an illegal append."""
    events = await engine.storage.get_events(execution_id)
    summary = replay((e.created_at, e.event) for e in events)
    assert summary.next_version == len(events)


async def test_ok_activity_finishes_with_its_value_and_logs(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    eid = await engine.submit("test:js/acts.ok", ["world"])
    result = await engine.result(eid, timeout=10)
    assert result == ev.ResultOk("hi world")
    assert event_types(await engine.storage.get_events(eid)) == ["created", "locked", "finished"]
    logs = await engine.storage.get_logs(eid)
    assert [(log.level, log.message) for log in logs] == [("info", "hello world")]
    await legal(engine, eid)


async def test_log_lines_are_stamped_when_emitted(start_engine: StartEngine) -> None:
    from engine.core.clock import SteppingClock

    # Every reading of this clock is a millisecond later than the one before.
    engine = await start_engine(
        DEPLOYMENT,
        files={
            "acts.js": JS.replace(
                'console.log("hello", name);', 'console.log("a"); console.log("b");'
            )
        },
        clock=SteppingClock(0.001),
    )
    eid = await engine.submit("test:js/acts.ok", ["world"])
    assert await engine.result(eid, timeout=10) == ev.ResultOk("hi world")
    first, second = await engine.storage.get_logs(eid)
    finished = (await engine.storage.get_events(eid))[-1]
    assert (first.message, second.message) == ("a", "b")
    assert first.created_at < second.created_at < finished.created_at


async def test_err_is_retried_with_backoff_then_finishes_err(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    eid = await engine.submit("test:js/acts.fail", ["nope"])
    result = await engine.result(eid, timeout=10)
    assert result == ev.ResultErr("nope")
    events = await engine.storage.get_events(eid)
    assert event_types(events) == [
        "created",
        "locked",
        "temporarily_failed",
        "locked",
        "temporarily_failed",
        "locked",
        "finished",
    ]
    # backoff = 10 ms × 2^(n−1) after each failure
    for n, e in enumerate(
        [e for e in events if isinstance(e.event, ev.TemporarilyFailed)], start=1
    ):
        assert isinstance(e.event, ev.TemporarilyFailed)
        assert e.event.backoff_expires_at - e.created_at == timedelta(
            milliseconds=10 * 2 ** (n - 1)
        )
    await legal(engine, eid)


async def test_permanent_err_is_not_retried(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    eid = await engine.submit("test:js/acts.permanent", [])
    assert await engine.result(eid, timeout=10) == ev.ResultErr("permanent-failure")
    assert event_types(await engine.storage.get_events(eid)) == ["created", "locked", "finished"]


async def test_spinning_activity_times_out_then_fails_timed_out(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    eid = await engine.submit("test:js/acts.spin", [])
    result = await engine.result(eid, timeout=20)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "timed_out"
    types = event_types(await engine.storage.get_events(eid))
    assert types == ["created", "locked", "temporarily_timed_out", "locked", "finished"]
    await legal(engine, eid)


async def test_invalid_return_value_is_a_failure(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    eid = await engine.submit("test:js/acts.bad-return", [])
    result = await engine.result(eid, timeout=10)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "uncategorized"
    assert "return value" in result.reason


async def test_err_value_not_of_the_declared_err_type_is_a_failure(
    start_engine: StartEngine,
) -> None:
    engine = await start(start_engine)
    eid = await engine.submit("test:js/acts.bad-err", [])
    result = await engine.result(eid, timeout=10)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "uncategorized"
    assert result.reason == "invalid error value"
    assert "error value: expected u32" in (result.detail or "")
    # Retried like any other failed attempt.
    types = event_types(await engine.storage.get_events(eid))
    assert types == ["created", "locked", "temporarily_failed", "locked", "finished"]


async def test_cancel_running_activity(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    eid = await engine.submit("test:js/acts.spin", [])
    await wait_state(engine, eid, "locked")
    await engine.cancel(eid)
    result = await engine.result(eid, timeout=10)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "cancelled"
    types = event_types(await engine.storage.get_events(eid))
    assert types[-2:] == ["cancellation_requested", "finished"]
    with pytest.raises(Conflict, match="already finished"):
        await engine.cancel(eid)


async def test_pause_unpause_pending_and_running(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    later = engine.clock.now() + timedelta(hours=1)
    eid = await engine.submit("test:js/acts.ok", ["x"], scheduled_at=later)
    await engine.pause(eid)
    assert (await engine.storage.get_row(eid)).state.__struct_config__.tag == "paused"  # type: ignore[attr-defined]
    with pytest.raises(Conflict, match="already paused"):
        await engine.pause(eid)
    await engine.unpause(eid)
    with pytest.raises(Conflict, match="not paused"):
        await engine.unpause(eid)
    running = await engine.submit("test:js/acts.spin", [])
    await wait_state(engine, running, "locked")
    with pytest.raises(Conflict, match="running activity"):
        await engine.pause(running)


async def test_stub_activity(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    eid = await engine.submit("test:stub/approval.approve", ["order-1"])
    with pytest.raises(InvalidParams):
        await engine.stub(eid, {"ok": "not a bool"})
    await engine.stub(eid, {"ok": True})
    await engine.stub(eid, {"ok": True})  # idempotent
    with pytest.raises(Conflict):
        await engine.stub(eid, {"ok": False})
    assert await engine.result(eid, timeout=1) == ev.ResultOk(True)


async def test_submit_errors_name_the_problem(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    with pytest.raises(UnknownFunction, match=r"test:js/acts.nope"):
        await engine.submit("test:js/acts.nope", [])
    with pytest.raises(InvalidParams, match="takes 1 parameter"):
        await engine.submit("test:js/acts.ok", [])
    with pytest.raises(InvalidParams, match=r"params\[0\]"):
        await engine.submit("test:js/acts.ok", [5])
    with pytest.raises(NotFound):
        await engine.pause("E_01KBF4Y3Z1N2P3Q4R5S6T7V8W9")
    eid = await engine.submit("test:js/acts.ok", ["a"], execution_id="E_01KBF4Y3Z1N2P3Q4R5S6T7V8W9")
    assert eid == "E_01KBF4Y3Z1N2P3Q4R5S6T7V8W9"
    await engine.submit("test:js/acts.ok", ["a"], execution_id=eid)  # same params: idempotent
    with pytest.raises(Conflict, match="other parameters"):
        await engine.submit("test:js/acts.ok", ["b"], execution_id=eid)


async def test_stop_releases_running_executions(start_engine: StartEngine) -> None:
    engine = await start(start_engine)
    eid = await engine.submit("test:js/acts.spin", [])
    await wait_state(engine, eid, "locked")
    for executor in engine.executors:
        await executor.stop()
    events = await engine.storage.get_events(eid)
    last = events[-1].event
    assert isinstance(last, ev.Unlocked) and last.reason == "executor closing"
    assert (await engine.storage.get_summary(eid)).temporary_event_count == 0


async def test_watcher_times_out_an_abandoned_lock(start_engine: StartEngine) -> None:
    engine = await start_engine(
        DEPLOYMENT, files={"acts.js": JS}, run_executors=False, run_watcher=False
    )
    eid = await engine.submit("test:js/acts.ok", ["x"])
    now = engine.clock.now()
    (component,) = [c for c in engine.components if c.config.name == "ok"]
    locked = await engine.storage.lock_pending(
        ffqns=["test:js/acts.ok"],
        batch_size=1,
        now=now,
        component_id=component.component_id,
        executor_id="Exr_01KBF4Y3Z1N2P3Q4R5S6T7V8W9",
        run_id="Run_01KBF4Y3Z1N2P3Q4R5S6T7V8W9",
        lock_expires_at=now + timedelta(milliseconds=1),
        retry_config=ACTIVITY_RETRY,
    )
    assert [x.execution_id for x in locked] == [eid]
    # Not yet: the watcher keeps a 500 ms leeway.
    assert await engine.watcher.tick() == 0
    engine.watcher.LEEWAY = timedelta(0)
    await asyncio.sleep(0.01)
    assert await engine.watcher.tick() == 1
    assert event_types(await engine.storage.get_events(eid))[-1] == "temporarily_timed_out"


async def test_watcher_releases_the_lock_of_a_dead_executor_at_once(
    start_engine: StartEngine,
) -> None:
    """A lock whose executor's lease file nobody holds (its process died) is handled as
    expired at the watcher's next pass, not an hour later when it expires."""
    engine = await start_engine(
        DEPLOYMENT, files={"acts.js": JS}, run_executors=False, run_watcher=False
    )
    eid = await engine.submit("test:js/acts.ok", ["x"])
    now = engine.clock.now()
    (component,) = [c for c in engine.components if c.config.name == "ok"]
    dead = "Exr_01KBF4Y3Z1N2P3Q4R5S6T7V8W9"
    locked = await engine.storage.lock_pending(
        ffqns=["test:js/acts.ok"],
        batch_size=1,
        now=now,
        component_id=component.component_id,
        executor_id=dead,
        run_id="Run_01KBF4Y3Z1N2P3Q4R5S6T7V8W9",
        lock_expires_at=now + timedelta(hours=1),
        retry_config=ACTIVITY_RETRY,
    )
    assert [x.execution_id for x in locked] == [eid]
    leases = engine.storage.leases.directory
    assert await engine.watcher.tick() == 0  # its executor is not known to be dead
    leases.mkdir(exist_ok=True)
    (leases / dead).write_text("")  # what a SIGKILLed process leaves: a file nobody locks
    assert await engine.watcher.release_dead_executors(engine.clock.now()) == 1
    assert event_types(await engine.storage.get_events(eid))[-1] == "temporarily_timed_out"
    assert (leases / dead).exists()
    # The next pass finds nothing held by it any more and forgets it.
    assert await engine.watcher.release_dead_executors(engine.clock.now()) == 0
    assert not (leases / dead).exists()


async def test_cancel_not_cancellable_is_reported(start_engine: StartEngine) -> None:
    # Only workflows can be "not cancellable"; activities always are.
    engine = await start(start_engine)
    eid = await engine.submit("test:stub/approval.approve", ["o"])
    await engine.cancel(eid)
    result = await engine.result(eid, timeout=1)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "cancelled"
    assert NotCancellable  # exercised by the storage contract suite


async def wait_state(engine, execution_id: str, state: str, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
    """Wait (on the change feed, not by sleeping) until the execution is in `state`."""
    feed = engine.storage.changes()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        gen = feed.generation
        row = await engine.storage.get_row(execution_id)
        if row.state.__struct_config__.tag == state:
            return
        if loop.time() > deadline:
            raise AssertionError(f"{execution_id} never reached {state}")
        await feed.wait_changed(gen, 0.5)
