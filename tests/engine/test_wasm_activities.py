"""WASM activities end to end on a real engine, with the WAT-built fixture component.

Every test writes a deployment.toml whose `[[activity_wasm]]` points at
`tests.fixtures.components.activity_component()` (interface `testing:fixtures/activity`),
starts an `Engine` on it and drives executions through submit → executor → storage.
One test runs the componentize-py demo component (`myapp:demo/activity`) the same way.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from engine.build_components import ensure_built
from engine.core import events as ev
from engine.engine import Engine
from engine.errors import DeploymentError, InvalidParams, UnknownFunction
from engine.executors.base import RunEnded
from engine.storage.contract import ListFilter
from tests.engine.conftest import StartEngine
from tests.engine.test_js_activities import event_types, legal, wait_state
from tests.fixtures import components as fx
from tests.fixtures.deployments import Deployment, TomlValue, ms

LOG_LEVELS = ("trace", "debug", "info", "warn", "error")


def wasm_section(
    name: str = "fixtures",
    location: Path | None = None,
    *,
    max_retries: int = 2,
    backoff_ms: int = 10,
    lock_ms: int = 500,
    env_vars: list[TomlValue] | None = None,
) -> Deployment:
    """One `[[activity_wasm]]` table (the fixture component unless `location` is given)."""
    return Deployment().activity_wasm(
        name,
        location or fx.activity_component(),
        max_retries=max_retries,
        retry_exp_backoff=ms(backoff_ms),
        exec={"lock_expiry": ms(lock_ms), "tick_sleep": ms(20)},
        env_vars=env_vars,
    )


async def start(start_engine: StartEngine, tmp_path: Path, toml: Deployment) -> Engine:
    """Start an engine on `toml`, with compiled components cached across tests."""
    fx.share_compiled_cache(tmp_path / "data")  # the data dir `start_engine` uses
    return await start_engine(toml)


async def run(engine: Engine, function: str, params: list[Any], timeout: float = 10) -> Any:
    """Submit `testing:fixtures/activity.<function>` and wait for its result."""
    eid = await engine.submit(fx.ffqn(function), params)
    return eid, await engine.result(eid, timeout=timeout)


async def start_error(start_engine: StartEngine, tmp_path: Path, toml: Deployment) -> str:
    with pytest.raises(DeploymentError) as info:
        await start(start_engine, tmp_path, toml)
    message = str(info.value)
    assert str(tmp_path / "deployment.toml") in message  # names the deployment file
    return message


# ---------------------------------------------------------------------------------------------
# Results, retries, timeouts, cancellation


async def test_ok_result(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, wasm_section())
    eid, result = await run(engine, "add", [2, 40])
    assert result == ev.ResultOk(42)
    events = await engine.storage.get_events(eid)
    assert event_types(events) == ["created", "locked", "finished"]
    locked = events[1].event
    assert isinstance(locked, ev.Locked)
    assert locked.component_id.type == "activity_wasm" and locked.component_id.name == "fixtures"
    assert locked.retry_config == ev.RetryConfig(2, 10)
    await legal(engine, eid)
    _, result = await run(engine, "echo", ["héllo, wörld ✓"])
    assert result == ev.ResultOk("héllo, wörld ✓")
    _, result = await run(engine, "add", [2**64 - 1, 2])  # u64 arithmetic wraps in the guest
    assert result == ev.ResultOk(1)


@pytest.mark.parametrize(
    ("function", "err"),
    [("fail", "nope"), ("fail-temporary", {"temporary": "nope"})],
)
async def test_temporary_err_is_retried_with_backoff_then_finishes_err(
    start_engine: StartEngine, tmp_path: Path, function: str, err: Any
) -> None:
    engine = await start(start_engine, tmp_path, wasm_section(max_retries=2, backoff_ms=10))
    eid, result = await run(engine, function, ["nope"])
    assert result == ev.ResultErr(err)
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
    failures = [(i, e) for i, e in enumerate(events) if isinstance(e.event, ev.TemporarilyFailed)]
    for n, (i, stored) in enumerate(failures, start=1):
        failed = stored.event
        assert isinstance(failed, ev.TemporarilyFailed)
        assert failed.reason == "returned err"
        # SPEC §5.2: pending again at now + backoff × 2^(temporary_event_count − 1) ...
        assert failed.backoff_expires_at - stored.created_at == timedelta(
            milliseconds=10 * 2 ** (n - 1)
        )
        # ... and not locked again before that.
        assert events[i + 1].created_at >= failed.backoff_expires_at
    summary = await engine.storage.get_summary(eid)
    assert summary.temporary_event_count == 2
    await legal(engine, eid)


async def test_permanent_err_variant_finishes_at_once(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start(start_engine, tmp_path, wasm_section(max_retries=5))
    eid, result = await run(engine, "fail-permanent", ["broken"])
    assert result == ev.ResultErr({"permanent-failure": "broken"})
    assert event_types(await engine.storage.get_events(eid)) == ["created", "locked", "finished"]


async def test_trap_is_retried_then_fails_uncategorized(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start(start_engine, tmp_path, wasm_section(max_retries=2, backoff_ms=10))
    eid, result = await run(engine, "trap", [])
    assert isinstance(result, ev.ExecutionFailure)
    assert result.kind == "uncategorized"
    assert "unreachable" in result.reason
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
    reasons = [e.event.reason for e in events if isinstance(e.event, ev.TemporarilyFailed)]
    assert reasons == ["trap: unreachable"] * 2
    await legal(engine, eid)


async def test_trap_until_eventually_succeeds(start_engine: StartEngine, tmp_path: Path) -> None:
    # Backoff 10, 20, 40, 80, 160, 320 ms: the retries outlast 500 ms of traps.
    engine = await start(start_engine, tmp_path, wasm_section(max_retries=10, backoff_ms=10))
    until = int(time.time() * 1000) + 500
    eid, result = await run(engine, "trap-until", [until])
    assert isinstance(result, ev.ResultOk) and result.value >= until
    events = await engine.storage.get_events(eid)
    failures = [e.event for e in events if isinstance(e.event, ev.TemporarilyFailed)]
    assert 1 <= len(failures) <= 10
    assert {f.reason for f in failures} == {"trap: unreachable"}
    assert event_types(events)[-2:] == ["locked", "finished"]
    await legal(engine, eid)


async def test_spin_times_out_at_lock_expiry_then_fails_timed_out(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start(
        start_engine, tmp_path, wasm_section(max_retries=1, backoff_ms=10, lock_ms=300)
    )
    eid, result = await run(engine, "spin", [], timeout=20)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "timed_out"
    events = await engine.storage.get_events(eid)
    assert event_types(events) == [
        "created",
        "locked",
        "temporarily_timed_out",
        "locked",
        "finished",
    ]
    locked, timed_out = events[1], events[2]
    assert isinstance(locked.event, ev.Locked) and isinstance(
        timed_out.event, ev.TemporarilyTimedOut
    )
    assert locked.event.lock_expires_at - locked.created_at == timedelta(milliseconds=300)
    # Interrupted at the lock's expiry (SPEC §5.3), not earlier and not much later.
    slack = timedelta(milliseconds=20)
    assert timed_out.created_at >= locked.event.lock_expires_at - slack
    assert timed_out.created_at < locked.event.lock_expires_at + timedelta(seconds=1)
    assert timed_out.event.backoff_expires_at - timed_out.created_at == timedelta(milliseconds=10)
    await legal(engine, eid)


async def test_cancel_running_spin(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, wasm_section(lock_ms=30_000))
    eid = await engine.submit(fx.ffqn("spin"), [])
    await wait_state(engine, eid, "locked")
    started = time.monotonic()
    await engine.cancel(eid)
    result = await engine.result(eid, timeout=10)
    assert time.monotonic() - started < 5  # interrupted, not left to time out after 30 s
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "cancelled"
    types = event_types(await engine.storage.get_events(eid))
    assert types == ["created", "locked", "cancellation_requested", "finished"]
    await legal(engine, eid)


#: Long enough to outlast the checks below, short enough to wait for at the end: a run
#: left behind keeps a slot of the process-wide pooled engine until its sleep ends.
SLEEP_MS = 8_000


def asleep_run(engine: Engine, eid: str) -> asyncio.Future[None]:
    """Resolved when the run of `eid` (in progress) has ended."""
    executor = next(e for e in engine.executors if eid in e._inflight)
    ended = executor._inflight[eid][0]
    assert isinstance(ended, RunEnded)
    return asyncio.wrap_future(ended.future())


async def test_cancel_of_a_run_blocked_in_a_wasi_sleep_does_not_wait_for_it(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    path = await asyncio.to_thread(ensure_built, "activity_py")
    engine = await start(
        start_engine, tmp_path, wasm_section("activity_py", path, max_retries=0, lock_ms=120_000)
    )
    eid = await engine.submit("myapp:demo/activity.step", [1, SLEEP_MS])
    await wait_state(engine, eid, "locked")
    run_ended = asleep_run(engine, eid)
    # Nothing marks the moment the guest enters its sleep (a blocking WASI call that
    # epoch interruption cannot reach); it is there well within this.
    await asyncio.sleep(1.0)
    started = time.monotonic()
    await engine.cancel(eid)
    result = await engine.result(eid, timeout=10)
    assert time.monotonic() - started < 5
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "cancelled"
    types = event_types(await engine.storage.get_events(eid))
    assert types == ["created", "locked", "cancellation_requested", "finished"]
    # Finished without its run, which is still asleep (it takes its slot until then).
    executor = next(e for e in engine.executors if "myapp:demo/activity.step" in e.ffqns)
    assert eid in executor._inflight
    await legal(engine, eid)
    await asyncio.wait_for(run_ended, 20)  # its pooled slot is free for the next tests


async def test_stop_does_not_wait_for_a_run_blocked_in_a_wasi_sleep(tmp_path: Path) -> None:
    from engine.executors.base import STOP_GRACE_SECONDS
    from engine.storage.sqlite import SqliteStorage

    path = await asyncio.to_thread(ensure_built, "activity_py")
    fx.share_compiled_cache(tmp_path / "data")
    deployment = wasm_section("activity_py", path, max_retries=0, lock_ms=120_000).write(tmp_path)
    engine = await Engine.start(deployment, tmp_path / "data", watch=False)
    eid = await engine.submit("myapp:demo/activity.step", [1, SLEEP_MS])
    await wait_state(engine, eid, "locked")
    run_ended = asleep_run(engine, eid)
    await asyncio.sleep(1.0)  # into its sleep (see the test above)
    started = time.monotonic()
    await engine.stop()
    assert time.monotonic() - started < STOP_GRACE_SECONDS + 3
    storage = await SqliteStorage.open(tmp_path / "data" / "obelisk.sqlite")
    try:
        last = (await storage.get_events(eid))[-1].event
        assert last == ev.Unlocked(last.backoff_expires_at, "executor closing")  # type: ignore[union-attr]
    finally:
        await storage.close()
    await asyncio.wait_for(run_ended, 20)  # its pooled slot is free for the next tests


# ---------------------------------------------------------------------------------------------
# Environment and output


async def test_only_declared_env_vars_are_visible(
    start_engine: StartEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OBELISK_TEST_PASSED", "from the server")
    monkeypatch.setenv("OBELISK_TEST_SECRET", "must not leak")
    monkeypatch.delenv("OBELISK_TEST_UNSET", raising=False)
    env: list[TomlValue] = [
        "OBELISK_TEST_PASSED",
        {"key": "MODE", "value": "test"},
        "OBELISK_TEST_UNSET",
    ]
    engine = await start(start_engine, tmp_path, wasm_section(env_vars=env))
    _, result = await run(engine, "env-vars", [])
    assert isinstance(result, ev.ResultOk)
    pairs = [tuple(pair) for pair in result.value]
    assert sorted(pairs) == [("MODE", "test"), ("OBELISK_TEST_PASSED", "from the server")]


async def test_stdout_stderr_and_log_lines_are_stored(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start(start_engine, tmp_path, wasm_section())

    async def logs_of(function: str, message: str) -> list[tuple[str, str, str]]:
        eid, result = await run(engine, function, [message])
        assert result == ev.ResultOk(None)
        events = await engine.storage.get_events(eid)
        locked = events[1].event
        assert isinstance(locked, ev.Locked)
        logs = await engine.storage.get_logs(eid)
        assert {log.run_id for log in logs} == {locked.run_id}
        assert all(log.execution_id == eid for log in logs)
        return [(log.level, log.stream, log.message) for log in logs]

    assert await logs_of("print", "to stdout") == [("info", "stdout", "to stdout")]
    assert await logs_of("print-err", "to stderr") == [("error", "stderr", "to stderr")]
    assert await logs_of("print", "line 1\nline 2\n") == [
        ("info", "stdout", "line 1"),
        ("info", "stdout", "line 2"),
    ]
    assert await logs_of("print", "no newline") == [("info", "stdout", "no newline")]
    assert await logs_of("log-info", "hello log") == [("info", "log", "hello log")]
    assert await logs_of("log-levels", "lvl") == [(level, "log", "lvl") for level in LOG_LEVELS]


# ---------------------------------------------------------------------------------------------
# Deployment errors


@pytest.mark.parametrize("kind", ["core module", "garbage", "empty"])
async def test_wasm_that_is_not_a_component(
    start_engine: StartEngine, tmp_path: Path, kind: str
) -> None:
    if kind == "core module":
        path, reason = fx.core_module_file(), "core WebAssembly module"
    else:
        path = tmp_path / f"{kind}.wasm"
        path.write_bytes(b"" if kind == "empty" else b"definitely not wasm")
        reason = "empty" if kind == "empty" else "bad magic number"
    message = await start_error(start_engine, tmp_path, wasm_section("bad", path))
    assert '[[activity_wasm]] #1 "bad"' in message
    assert "key `location`" in message
    assert str(path) in message
    assert "not a WebAssembly component" in message and reason in message


async def test_allowed_host_is_refused_not_ignored(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    """A WASM guest's outgoing HTTP cannot be checked against host patterns (wasmtime's
    `wasi:http` sends it): a deployment that asks for that does not load."""
    toml = Deployment().activity_wasm(
        "net", fx.activity_component(), allowed_host=["api.example.com"]
    )
    message = await start_error(start_engine, tmp_path, toml)
    assert '[[activity_wasm]] #1 "net"' in message
    assert "key `allowed_host`: not supported for WASM activities" in message


async def test_two_components_exporting_one_ffqn(start_engine: StartEngine, tmp_path: Path) -> None:
    toml = wasm_section("first") + wasm_section("second")
    message = await start_error(start_engine, tmp_path, toml)
    assert '[[activity_wasm]] #1 "first"' in message
    assert '[[activity_wasm]] #2 "second"' in message
    assert fx.ACTIVITY_IFC + "." in message


NO_RESULT = {
    "returns u64": (
        "plain: func(a: u64) -> u64;",
        '(func (export "cm32p2|testing:noresult/api|plain") (param i64) (result i64) local.get 0)',
        "testing:noresult/api.plain",
    ),
    "returns nothing": (
        "nothing: func();",
        '(func (export "cm32p2|testing:noresult/api|nothing"))',
        "testing:noresult/api.nothing",
    ),
}


@pytest.mark.parametrize("case", list(NO_RESULT))
async def test_function_that_does_not_return_a_result_is_rejected(
    start_engine: StartEngine, tmp_path: Path, case: str
) -> None:
    decl, func, ffqn = NO_RESULT[case]
    wit = f"package testing:noresult;\ninterface api {{ {decl} }}\nworld w {{ export api; }}\n"
    wat = f'(module (memory (export "cm32p2_memory") 1) {func})'
    path = fx.build_component(f"no-result-{case.replace(' ', '-')}", {"w.wit": wit}, wat)
    message = await start_error(start_engine, tmp_path, wasm_section("plain", path))
    assert '[[activity_wasm]] #1 "plain"' in message
    assert ffqn in message and "must return a result" in message


# ---------------------------------------------------------------------------------------------
# Submission errors


@pytest.mark.parametrize(
    ("function", "params", "fragments"),
    [
        ("add", ["1", 2], [r"params[0] (a)", "u64"]),
        ("add", [1, -2], [r"params[1] (b)"]),
        ("add", [1, 2**64], [r"params[1] (b)"]),
        ("add", [1.5, 2], [r"params[0] (a)"]),
        ("echo", [None], [r"params[0] (s)", "string"]),
        ("trap-until", [True], [r"params[0] (unix-ms)"]),
        ("add", [1], ["takes 2 parameter(s)", "a: u64, b: u64", "got 1"]),
        ("add", [1, 2, 3], ["takes 2 parameter(s)", "got 3"]),
        ("trap", ["x"], ["takes 0 parameter(s)", "got 1"]),
        ("add", {"a": 1, "b": 2}, ["must be a JSON array"]),
    ],
)
async def test_wrong_params_are_rejected_naming_the_parameter(
    start_engine: StartEngine, tmp_path: Path, function: str, params: Any, fragments: list[str]
) -> None:
    engine = await start(start_engine, tmp_path, wasm_section())
    with pytest.raises(InvalidParams) as info:
        await engine.submit(fx.ffqn(function), params)
    message = str(info.value)
    assert fx.ffqn(function) in message
    for fragment in fragments:
        assert fragment in message
    assert await engine.storage.list_executions(ListFilter()) == []  # nothing was created


async def test_unknown_function(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start(start_engine, tmp_path, wasm_section())
    with pytest.raises(UnknownFunction, match=r"testing:fixtures/activity\.nope"):
        await engine.submit(fx.ffqn("nope"), [])


# ---------------------------------------------------------------------------------------------
# The componentize-py demo component


async def test_python_built_component(start_engine: StartEngine, tmp_path: Path) -> None:
    path = await asyncio.to_thread(ensure_built, "activity_py")
    engine = await start(
        start_engine, tmp_path, wasm_section("activity_py", path, max_retries=0, lock_ms=10_000)
    )
    eid = await engine.submit("myapp:demo/activity.step", [7, 0])
    assert await engine.result(eid, timeout=30) == ev.ResultOk(7)
    logs = [(x.level, x.stream, x.message) for x in await engine.storage.get_logs(eid)]
    assert logs == [
        ("info", "log", "step 7 started, sleeping 0 ms"),
        ("info", "stdout", "step 7 done"),
    ]
    await legal(engine, eid)
    eid = await engine.submit("myapp:demo/activity.send-email", ["nobody", "hi"])
    assert await engine.result(eid, timeout=30) == ev.ResultErr("invalid address: nobody")
    with pytest.raises(InvalidParams, match=r"params\[1\] \(sleep-millis\)"):
        await engine.submit("myapp:demo/activity.step", [1, "slow"])
