"""The `workflow_wasm` runtime against the in-memory `FakeHost` (tests/runtimes/fake_host.py).

The guests are the WAT workflows of `tests.fixtures.workflow_components` (one component
exporting all of them; `run(..., ffqn=…)` picks one), small components built here for load
errors and WASI, and the componentize-py demo workflow (`demo/workflow_py`).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine import wat_build
from engine.build_components import REPO_ROOT, ensure_built
from engine.runtimes.js.workflow import WfAborted, WfErr, WfOk, WfTimedOut, WfTrap
from engine.runtimes.wasm import workflow_host_functions as wr
from engine.runtimes.wasm import workflow_wit as wit
from engine.runtimes.wasm.activity import WasmEngine
from engine.runtimes.wasm.workflow import (
    WORKFLOW_SUPPORT_IFC,
    WasmWorkflowLoadError,
    WasmWorkflowRunner,
)
from engine.runtimes.wasm.workflow_run import GuestError, WorkflowRun
from engine.wat_build import REALLOC_WAT
from engine.wit.codec import json_to_wasmtime, wasmtime_to_json
from engine.wit.types import FunctionSignature, WitResult, parse_wit_type
from tests.fixtures.components import CACHE_DIR, ENGINE_COMPILED_DIR
from tests.fixtures.workflow_components import WORKFLOWS, workflow_component, workflow_ffqn
from tests.runtimes.fake_host import START_MS, FakeFunction, FakeHost

ADD = "testing:fixtures/activity.add"
ECHO = "testing:fixtures/activity.echo"
STEP = "myapp:demo/activity.step"


def add(params: list[Any]) -> dict[str, Any]:
    return {"ok": params[0] + params[1]}


def functions(add_impl: Any = add) -> dict[str, FakeFunction]:
    return {
        ADD: FakeFunction(("a", "b"), add_impl),
        ECHO: FakeFunction(("s",), lambda p: {"ok": p[0]}),
    }


def signature(params: str, result: str) -> FunctionSignature:
    return FunctionSignature(
        [(f"p{i}", parse_wit_type(t)) for i, t in enumerate(params.split(";")) if t],
        parse_wit_type(result),
    )


SIGNATURES = {
    ADD: signature("u64;u64", "result<u64, string>"),
    ECHO: signature("string", "result<string, string>"),
}


@pytest.fixture(scope="module")
def runner() -> WasmWorkflowRunner:
    engine = WasmEngine.shared()
    return WasmWorkflowRunner(engine.load_component(workflow_component()), engine)


def run(
    runner: WasmWorkflowRunner,
    name: str,
    params: list[Any],
    host: FakeHost | None = None,
    **kwargs: Any,
) -> tuple[Any, FakeHost]:
    host = host or FakeHost(functions())
    return runner.run(host, params, ffqn=workflow_ffqn(name), **kwargs), host


def calls(host: FakeHost) -> list[tuple[Any, ...]]:
    return [(c.method, *c.args) for c in host.calls]


# ---------------------------------------------------------------------------------------------
# Inspection and checks


def test_exports_and_import_kinds(runner: WasmWorkflowRunner) -> None:
    assert runner.ffqns == sorted(workflow_ffqn(name) for name in WORKFLOWS)
    kinds = runner.imported_interfaces()
    assert kinds[WORKFLOW_SUPPORT_IFC] == "support"
    assert kinds["obelisk:types/join-set@1.0.0"] == "types"
    assert kinds["obelisk:log/log@1.0.0"] == "log"
    assert kinds["testing:fixtures/activity"] == "direct"
    assert kinds["testing:fixtures-obelisk-ext/activity"] == "ext"
    assert kinds["testing:fixtures-obelisk-schedule/activity"] == "schedule"
    assert kinds["wasi:clocks/wall-clock@0.2.0"] == "wasi"


def test_check_accepts_a_matching_deployment(runner: WasmWorkflowRunner) -> None:
    runner.check(FakeHost(functions()).interfaces(), SIGNATURES)


def test_check_names_a_missing_interface(runner: WasmWorkflowRunner) -> None:
    host = FakeHost({"other:pkg/ifc.f": FakeFunction((), add)})
    with pytest.raises(WasmWorkflowLoadError) as info:
        runner.check(host.interfaces())
    message = str(info.value)
    assert "unknown interface `testing:fixtures/activity` imported" in message
    assert "unknown interface `testing:fixtures-obelisk-ext/activity` imported" in message
    assert "exports `testing:fixtures/activity`" in message
    assert "other:pkg/ifc" in message  # lists what is deployed


def test_check_names_a_missing_function(runner: WasmWorkflowRunner) -> None:
    host = FakeHost({ADD: FakeFunction(("a", "b"), add)})  # no `echo`
    with pytest.raises(WasmWorkflowLoadError) as info:
        runner.check(host.interfaces())
    assert "`testing:fixtures-obelisk-ext/activity` has no function `echo-submit`" in str(
        info.value
    )


def test_check_compares_types_with_the_deployment(runner: WasmWorkflowRunner) -> None:
    wrong = dict(SIGNATURES, **{ADD: signature("u32;u32", "result<u32, string>")})
    with pytest.raises(WasmWorkflowLoadError) as info:
        runner.check(FakeHost(functions()).interfaces(), wrong)
    message = str(info.value)
    assert (
        "testing:fixtures/activity.add: the deployed function takes (u32, u32), "
        "the import passes (u64, u64)"
    ) in message
    assert (
        "testing:fixtures-obelisk-ext/activity.add-await-next: the deployed function returns"
        in (message)
    )
    assert "testing:fixtures-obelisk-schedule/activity.add-schedule" in message


# ---------------------------------------------------------------------------------------------
# Direct calls, join sets, extension functions


def test_direct_call(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "direct", [2, 3])
    assert outcome == WfOk(6)
    assert calls(host) == [("call", ADD, [2, 3])]


def test_direct_call_child_err(runner: WasmWorkflowRunner) -> None:
    host = FakeHost(functions(lambda p: {"err": "no can do"}))
    outcome, _ = run(runner, "direct", [2, 3], host)
    assert outcome == WfErr("no can do")


def test_direct_call_child_failure_is_execution_failed(runner: WasmWorkflowRunner) -> None:
    failure = {"execution_failure": {"kind": "timed_out", "reason": "slow", "detail": None}}
    host = FakeHost(functions(lambda p: failure))
    outcome, _ = run(runner, "direct", [2, 3], host)
    assert outcome == WfErr("execution-failed")


def test_unknown_function_traps_with_the_hosts_message(runner: WasmWorkflowRunner) -> None:
    host = FakeHost({ECHO: FakeFunction(("s",), add)})
    outcome, _ = run(runner, "direct", [2, 3], host)
    assert isinstance(outcome, WfTrap)
    assert outcome.reason == f"function '{ADD}' not found"


def test_fan_out_in_a_join_set(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "fanout", [4])
    assert outcome == WfOk(0 + 2 + 4 + 6)
    assert calls(host) == [
        ("join_set_create", None),
        *[("submit", "g:1", ADD, [i, i]) for i in range(4)],
        *[("join_next", "g:1", ADD)] * 4,
        ("join_set_close", "g:1"),  # the guest dropped its handle
    ]


def test_fan_out_child_err(runner: WasmWorkflowRunner) -> None:
    def add_or_fail(p: list[Any]) -> dict[str, Any]:
        return {"err": "odd"} if p[0] % 2 else add(p)

    outcome, _ = run(runner, "fanout", [3], FakeHost(functions(add_or_fail)))
    assert outcome == WfErr("odd")


def test_dynamic_functions_and_named_join_sets(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "dynamic", [1, 2])
    assert outcome == WfOk("3")  # the child's ok value as JSON text
    assert calls(host) == [
        ("join_set_create", "adder"),
        ("submit", "n:adder", ADD, [1, 2]),
        ("join_next", "n:adder", None),
        ("join_set_close", "n:adder"),
    ]


def test_dropping_a_join_set_closes_it(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "leave", [5])
    assert outcome == WfOk(5)
    assert calls(host) == [
        ("join_set_create", None),
        ("submit", "g:1", ADD, [5, 5]),
        ("join_set_close", "g:1"),
    ]


def test_await_next_reports_a_delay_as_function_mismatch(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "mismatch", [])
    assert outcome == WfOk(1)
    assert calls(host)[1:3] == [("submit_delay", "g:1", ("in", 1)), ("join_next", "g:1", ADD)]


def test_join_set_id_and_last_id(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "ids", [4])
    assert outcome == WfOk(f"g:1 {host.execution_id}.g:1_1")


def test_await_next_with_the_childs_id(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "with-id", ["hi"])
    assert outcome == WfOk(f"{host.execution_id}.g:1_1 hi")


def test_json_api(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "json", [])
    assert outcome == WfOk("5 2")  # call-json's ok JSON, get-result-json's ok JSON
    assert calls(host) == [
        ("call", ADD, [2, 3]),
        ("join_set_create", None),
        ("submit", "g:1", ADD, [1, 1]),
        ("join_next_try", "g:1"),
        ("join_set_close", "g:1"),  # explicit close; dropping the handle adds nothing
    ]


def test_ids_and_randoms(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "ids-and-randoms", [])
    assert isinstance(outcome, WfOk)
    current, generated, text, number = outcome.value
    assert (current, generated, number) == (host.execution_id, "E_GENERATED000000000000001", 7)
    assert len(text) == 3
    assert calls(host) == [
        ("execution_id_generate",),
        ("random_string", 3, 4),
        ("random_u64", 7, 7),
    ]


def test_stub_extension_and_stub_json(runner: WasmWorkflowRunner) -> None:
    host = FakeHost(functions(), never_finish=frozenset({ECHO}))
    outcome, _ = run(runner, "stub", ["x"], host)
    assert outcome == WfOk("stubbed err")  # the second stub is refused
    child = f"{host.execution_id}.g:1_1"
    assert calls(host) == [
        ("join_set_create", None),
        ("submit", "g:1", ECHO, ["x"]),
        ("stub", child, {"ok": "stubbed"}),
        ("join_next", "g:1", ECHO),
        ("stub", child, {"ok": "again"}),
        ("join_set_close", "g:1"),
    ]


def test_schedule_extension(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "sched", [7])
    assert outcome == WfOk("E_SCHEDULED000000000000001")
    assert calls(host) == [("schedule", ADD, [7, 7], "now")]


# ---------------------------------------------------------------------------------------------
# Host API, determinism, logs


def test_sleep(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "sleep", [100])
    assert outcome == WfOk(START_MS + 100)
    assert calls(host) == [("sleep", ("in", 100), None)]


def test_cancelled_sleep(runner: WasmWorkflowRunner) -> None:
    outcome, _ = run(runner, "sleep", [100], FakeHost(functions(), cancel_delays=True))
    assert outcome == WfErr("cancelled")


def test_random_u64_is_persisted_by_the_host(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "random", [10])
    assert isinstance(outcome, WfOk) and 0 <= outcome.value < 10
    assert calls(host) == [("random_u64", 0, 9)]


def test_wasi_is_deterministic(runner: WasmWorkflowRunner) -> None:
    # wall clock (seconds, nanoseconds), get-random-u64, monotonic now, env var count
    outcome, host = run(runner, "ambient", [])
    assert outcome == WfOk([0, 0, 0, 0, 0])
    assert host.calls == []  # nothing ambient reaches the host either


def test_obelisk_log_and_stdout_are_logs(runner: WasmWorkflowRunner) -> None:
    outcome, host = run(runner, "logging", ["hello"])
    assert outcome == WfOk("hello")
    assert host.logs == [("info", "hello"), ("info", "hello")]


# ---------------------------------------------------------------------------------------------
# Results, traps, stopping


def test_err_result(runner: WasmWorkflowRunner) -> None:
    assert run(runner, "fail", ["boom"])[0] == WfErr("boom")


def test_trap(runner: WasmWorkflowRunner) -> None:
    outcome, _ = run(runner, "trap", [])
    assert isinstance(outcome, WfTrap)
    assert outcome.reason == "trap: unreachable"


def test_invalid_params(runner: WasmWorkflowRunner) -> None:
    outcome, _ = run(runner, "direct", ["two", 3])
    assert isinstance(outcome, WfTrap)
    assert outcome.reason.startswith("invalid params: parameter 'a'")
    outcome, _ = run(runner, "direct", [1])
    assert isinstance(outcome, WfTrap) and "expected 2" in outcome.reason


def test_spin_timeout(runner: WasmWorkflowRunner) -> None:
    started = time.monotonic()
    outcome, _ = run(runner, "spin", [], spin_timeout=0.2)
    assert outcome == WfTimedOut()
    assert time.monotonic() - started < 2


def test_interrupt_stops_a_spinning_guest(runner: WasmWorkflowRunner) -> None:
    result: list[Any] = []
    host = FakeHost(functions())
    thread = threading.Thread(target=lambda: result.append(run(runner, "spin", [], host)[0]))
    thread.start()
    time.sleep(0.2)
    runner.interrupt("E_someone_else")  # not this run
    time.sleep(0.1)
    assert thread.is_alive()
    started = time.monotonic()
    runner.interrupt(host.execution_id)
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 1
    assert result == [WfAborted()]


def test_run_aborted_unwinds_the_guest(runner: WasmWorkflowRunner) -> None:
    host = FakeHost(functions(), abort_after=3)  # create, submit, submit → abort
    outcome, _ = run(runner, "fanout", [5], host)
    assert outcome == WfAborted()
    assert len(host.calls) == 3
    assert host.host_calls_after_abort == 0  # the guest never reached the host again


def test_a_host_bug_is_reraised(runner: WasmWorkflowRunner) -> None:
    def buggy(p: list[Any]) -> dict[str, Any]:
        raise RuntimeError("bug in the host")

    with pytest.raises(RuntimeError, match="bug in the host"):
        run(runner, "direct", [1, 2], FakeHost(functions(buggy)))
    assert run(runner, "direct", [1, 2])[0] == WfOk(4)  # the runner is still fine


def test_which_export_runs(runner: WasmWorkflowRunner) -> None:
    host = FakeHost(functions())
    outcome = runner.run(host, [])
    assert isinstance(outcome, WfTrap) and "exports several functions" in outcome.reason
    assert isinstance(runner.run(host, [], ffqn="a:b/c.d"), WfTrap)
    host.ffqn = workflow_ffqn("fail")  # type: ignore[attr-defined]
    assert runner.run(host, ["x"]) == WfErr("x")
    engine = WasmEngine.shared()
    single = WasmWorkflowRunner(engine.load_component(workflow_component("fail")), engine)
    assert single.run(FakeHost({}), ["y"]) == WfErr("y")


def test_concurrent_runs_on_threads(runner: WasmWorkflowRunner) -> None:
    results: dict[int, Any] = {}

    def one(n: int) -> None:
        host = FakeHost(functions(), execution_id=f"E_0{n}", block_seconds=0.005)
        outcome, _ = run(runner, "fanout", [n], host)
        results[n] = (outcome, [c.args[0] for c in host.calls if c.method == "submit"])

    threads = [threading.Thread(target=one, args=(n,)) for n in range(1, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for n in range(1, 7):
        assert results[n] == (WfOk(n * (n - 1)), ["g:1"] * n)


# ---------------------------------------------------------------------------------------------
# Components with unsupported imports, WASI that is not available


def tiny_component(name: str, deps: dict[str, str], imports: list[str], wat: str) -> Path:
    """A component exporting `testing:tiny/run.go: func() -> result<string, string>`;
    `wat` holds the core imports and the body of `go` (returning `ok("")` if it ends)."""
    imports_wit = "".join(f"  import {i};\n" for i in imports)
    world = (
        "package testing:tiny;\n\ninterface run {\n  go: func() -> result<string, string>;\n}\n\n"
        f"world tiny {{\n{imports_wit}  export run;\n}}\n"
    )
    core_imports, _, body = wat.partition(";; body\n")
    module = (
        f"(module\n{core_imports}\n"
        '  (memory (export "cm32p2_memory") 1)\n'
        f"{REALLOC_WAT}\n"
        '  (func (export "cm32p2|testing:tiny/run|go") (result i32)\n'
        f"{body}\n"
        "    (i32.store8 (i32.const 16) (i32.const 0))\n"
        "    (i32.store (i32.const 20) (i32.const 0))\n"
        "    (i32.store (i32.const 24) (i32.const 0))\n"
        "    (i32.const 16))\n)\n"
    )
    return wat_build.build_component(name, {"tiny.wit": world, **deps}, module, CACHE_DIR)


def load_runner(path: Path) -> WasmWorkflowRunner:
    engine = WasmEngine.shared()
    return WasmWorkflowRunner(engine.load_component(path), engine, label=path.name)


def test_a_wrongly_typed_host_api_import_is_a_load_error() -> None:
    path = tiny_component(
        "tiny-bad-signature",
        {
            "deps/wf/wf.wit": "package obelisk:workflow@1.0.0;\n"
            "interface workflow-support {\n  random-u64: func(min: u32) -> u32;\n"
            "  now: func() -> u64;\n}\n"
        },
        [WORKFLOW_SUPPORT_IFC],
        '  (import "cm32p2|obelisk:workflow/workflow-support@1" "random-u64" '
        "(func $r (param i32) (result i32)))\n"
        '  (import "cm32p2|obelisk:workflow/workflow-support@1" "now" (func $now (result i64)))\n'
        ";; body\n    (drop (call $r (i32.const 1)))\n    (drop (call $now))\n",
    )
    with pytest.raises(WasmWorkflowLoadError) as info:
        load_runner(path)
    message = str(info.value)
    assert "tiny-bad-signature.wasm: cannot run as a workflow" in message
    assert (
        f"{WORKFLOW_SUPPORT_IFC}.random-u64: expected func(u64, u64) -> u64, "
        "the component imports func(u32) -> u32"
    ) in message
    assert f"{WORKFLOW_SUPPORT_IFC} has no function `now`" in message


def test_another_host_api_version_is_a_load_error() -> None:
    path = tiny_component(
        "tiny-other-version",
        {
            "deps/wf/wf.wit": "package obelisk:workflow@2.0.0;\n"
            "interface workflow-support {\n  random-u64: func(min: u64, max: u64) -> u64;\n}\n"
        },
        ["obelisk:workflow/workflow-support@2.0.0"],
        '  (import "cm32p2|obelisk:workflow/workflow-support@2" "random-u64" '
        "(func $r (param i64 i64) (result i64)))\n"
        ";; body\n    (drop (call $r (i64.const 1) (i64.const 2)))\n",
    )
    with pytest.raises(WasmWorkflowLoadError) as info:
        load_runner(path)
    assert (
        "unsupported import `obelisk:workflow/workflow-support@2.0.0` "
        f"(this engine provides {WORKFLOW_SUPPORT_IFC})"
    ) in str(info.value)


def test_wasi_exit_traps() -> None:
    path = tiny_component(
        "tiny-exit",
        {
            "deps/cli/cli.wit": "package wasi:cli@0.2.0;\ninterface exit {\n  exit: func(status: result);\n}\n"
        },
        ["wasi:cli/exit@0.2.0"],
        '  (import "cm32p2|wasi:cli/exit@0.2" "exit" (func $exit (param i32)))\n'
        ";; body\n    (call $exit (i32.const 1))\n",
    )
    runner = load_runner(path)
    runner.check({})
    outcome = runner.run(FakeHost({}), [])
    assert outcome == WfTrap("the workflow called wasi:cli/exit (code 1)", outcome.detail)  # type: ignore[union-attr]


def test_sockets_may_be_imported_but_trap_when_used() -> None:
    path = tiny_component(
        "tiny-sockets",
        {
            "deps/sockets/sockets.wit": "package wasi:sockets@0.2.0;\n"
            "interface instance-network {\n  resource network;\n"
            "  instance-network: func() -> network;\n}\n"
        },
        ["wasi:sockets/instance-network@0.2.0"],
        '  (import "cm32p2|wasi:sockets/instance-network@0.2" "instance-network" '
        "(func $net (result i32)))\n"
        ";; body\n    (drop (call $net))\n",
    )
    runner = load_runner(path)
    runner.check({})  # instantiates: the import is satisfied
    outcome = runner.run(FakeHost({}), [])
    assert isinstance(outcome, WfTrap)
    assert outcome.reason == (
        "wasi:sockets/instance-network@0.2.0.instance-network is not available to workflows "
        "(SPEC §7.5)"
    )


# ---------------------------------------------------------------------------------------------
# The componentize-py demo workflow


@pytest.fixture(scope="module")
def python_runner() -> WasmWorkflowRunner:
    engine = WasmEngine.shared()
    component = engine.load_component(ensure_built("workflow_py"), ENGINE_COMPILED_DIR)
    return WasmWorkflowRunner(component, engine)


def test_python_workflow_parallel(python_runner: WasmWorkflowRunner) -> None:
    assert python_runner.ffqns == ["myapp:demo-py/workflow.parallel"]
    host = FakeHost({STEP: FakeFunction(("idx", "sleep-millis"), lambda p: {"ok": p[0]})})
    python_runner.check(host.interfaces(), {STEP: signature("u64;u64", "result<u64, string>")})
    assert python_runner.run(host, []) == WfOk("45")
    assert calls(host) == [
        ("join_set_create", None),
        *[("submit", "g:1", STEP, [i, 200]) for i in range(10)],
        *[("join_next", "g:1", STEP)] * 10,
        ("join_set_close", "g:1"),
    ]
    assert host.logs == [("info", "parallel: the steps add up to 45")]


def test_python_workflow_step_err(python_runner: WasmWorkflowRunner) -> None:
    host = FakeHost({STEP: FakeFunction(("idx", "sleep-millis"), lambda p: {"err": "down"})})
    assert python_runner.run(host, []) == WfErr("step failed: down")


def test_demo_wit_is_the_engines() -> None:
    deps = REPO_ROOT / "demo" / "workflow_py" / "wit" / "deps"
    wit = REPO_ROOT / "engine" / "wit" / "obelisk"
    assert (deps / "obelisk_types" / "types.wit").read_text() == (
        wit / "types@1.0.0.wit"
    ).read_text()
    assert (deps / "obelisk_workflow" / "workflow.wit").read_text() == (
        wit / "workflow@1.0.0.wit"
    ).read_text()
    assert (deps / "obelisk_log" / "log.wit").read_text() == (wit / "log@1.0.0.wit").read_text()


# ---------------------------------------------------------------------------------------------
# Host functions' error channels and conversions, called directly


def support(name: str, host: FakeHost, *args: Any) -> Any:
    """Call a `workflow-support` host function outside wasm; its result as §9.2 JSON."""
    result_types = {
        "call-json": wit.CALL_JSON_RESULT,
        "get-result-json": wit.GET_RESULT_JSON_RESULT,
        "stub-json": wit.STUB_JSON_RESULT,
        "schedule-json": wit.DYNAMIC_ID_RESULT,
    }
    value = wr._SUPPORT[name](WorkflowRun(host, None), None, *args)
    return wasmtime_to_json(value, result_types[name])


def function(ffqn: str) -> Any:
    interface, _, name = ffqn.rpartition(".")
    return json_to_wasmtime(
        {"interface_name": interface, "function_name": name},
        parse_wit_type("record { interface-name: string, function-name: string }"),
    )


def execution_id(value: str) -> Any:
    return json_to_wasmtime({"id": value}, wit.EXECUTION_ID)


def test_dynamic_call_errors() -> None:
    host = FakeHost(functions())
    assert support("call-json", host, function(ADD), "[1, 2]") == {"ok": {"ok": "3"}}
    assert support("call-json", host, function("a:b/c.nope"), "[]") == {"err": "function-not-found"}
    bad = support("call-json", host, function("nonsense.f"), "[]")
    assert list(bad["err"]) == ["ffqn-parsing-error"]
    assert support("call-json", host, function(ADD), "{}") == {
        "err": {"type-check-error": "params must be a JSON array"}
    }
    assert "not JSON" in support("call-json", host, function(ADD), "[")["err"]["type-check-error"]
    scheduled = support(
        "schedule-json", host, wr._to_guest("now", wit.SCHEDULE_AT, "x"), function(ADD), "[1, 2]"
    )
    assert scheduled == {"ok": {"id": "E_SCHEDULED000000000000001"}}


def test_get_result_and_stub_json_errors() -> None:
    host = FakeHost(functions())
    assert support("get-result-json", host, execution_id("E_nothing")) == {
        "err": "not-found-in-processed-responses"
    }
    assert list(support("get-result-json", host, execution_id("x"))["err"]) == [
        "execution-id-parsing-error"
    ]
    assert list(support("stub-json", host, execution_id("E_x.g:1_1"), "{")["err"]) == [
        "type-check-error"
    ]
    assert support("stub-json", host, execution_id("E_x.g:1_1"), '{"ok": 1}') == {
        "err": "execution-not-found"
    }


@pytest.mark.parametrize(
    ("err_type", "expected"),
    [
        ("string", "execution-failed"),
        ("variant { execution-failed, other(string) }", "execution-failed"),
        ("variant { other, execution-failed(string) }", {"execution-failed": "slow"}),
        ("enum { other, execution-failed }", "execution-failed"),
    ],
)
def test_child_failure_in_the_err_type(err_type: str, expected: Any) -> None:
    failure = {"execution_failure": {"kind": "timed_out", "reason": "slow", "detail": None}}
    returns = parse_wit_type(f"result<u32, {err_type}>")
    assert isinstance(returns, WitResult)
    assert wr._typed_result(failure, returns, "child") == {"err": expected}
    assert wr._typed_result({"ok": 1}, returns, "child") == {"ok": 1}


def test_child_failure_that_the_err_type_cannot_hold() -> None:
    returns = parse_wit_type("result<u32, u32>")
    assert isinstance(returns, WitResult)
    failure = {"execution_failure": {"kind": "cancelled", "reason": "", "detail": None}}
    with pytest.raises(GuestError, match=r"child ended in an execution failure \(cancelled\)"):
        wr._typed_result(failure, returns, "child")
    assert wr._typed_result(failure, WitResult(ok=returns.ok), "child") == {"err": None}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("now", "now"),
        ({"at": {"seconds": 12, "nanoseconds": 345_000_000}}, ("at", 12_345)),
        ({"in": {"milliseconds": 7}}, ("in", 7)),
        ({"in": {"seconds": 2}}, ("in", 2_000)),
        ({"in": {"minutes": 5}}, ("in", 300_000)),
        ({"in": {"hours": 1}}, ("in", 3_600_000)),
        ({"in": {"days": 2}}, ("in", 172_800_000)),
    ],
)
def test_schedule_at(value: Any, expected: Any) -> None:
    assert wr._schedule_at(value) == expected
