"""Tests for the workflow_js runtime (real JS in quickjs-rs against an in-memory host)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from quickjs_rs._engine import QuickJSError as GuestMemoryError

from engine.core.records import Frame
from engine.runtimes.js import workflow as js_runtime
from engine.runtimes.js.workflow import (
    JsWorkflowLoadError,
    JsWorkflowRunner,
    WfAborted,
    WfErr,
    WfOk,
    WfTimedOut,
    WfTrap,
    WorkflowOutcome,
    camel_case,
    parse_js_stack,
    warm_up,
)
from engine.runtimes.workflow_host import WorkflowCallError
from tests.runtimes.fake_host import START_MS, FakeFunction, FakeHost

STEP = "myapp:demo/activity.step"


def _step(params: list[Any]) -> dict[str, Any]:
    return {"ok": params[0]}


def _fail(params: list[Any]) -> dict[str, Any]:
    return {"err": f"failed {params[0]}"}


def _crash(_params: list[Any]) -> dict[str, Any]:
    return {"execution_failure": {"kind": "timed_out", "reason": "too slow", "detail": ""}}


FUNCTIONS: dict[str, FakeFunction] = {
    STEP: FakeFunction(("idx", "sleep-millis"), _step),
    "myapp:demo/activity.fail": FakeFunction(("idx",), _fail),
    "myapp:demo/activity.crash": FakeFunction(("idx",), _crash),
    "myapp:demo/activity.do-the-thing": FakeFunction(("some-arg",), lambda p: {"ok": p[0] * 2}),
    "myapp:demo/email.send-email": FakeFunction(("to",), lambda p: {"ok": None}),
    "myapp:demo/approval.approve": FakeFunction(("order",), lambda p: {"ok": True}),
    "myapp:other/child.child-workflow": FakeFunction(
        ("n",), lambda p: {"ok": p[0] + 1}, is_workflow=True
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    warm_up()


def make_host(**kwargs: Any) -> FakeHost:
    return FakeHost(dict(FUNCTIONS), **kwargs)


def run_js(
    source: str,
    params: list[Any] | None = None,
    *,
    host: FakeHost | None = None,
    export: str | None = None,
    filename: str = "wf.js",
    **run_kwargs: Any,
) -> tuple[WorkflowOutcome, FakeHost]:
    host = host if host is not None else make_host()
    runner = JsWorkflowRunner(source, filename, export)
    runner.check(host.interfaces())
    return runner.run(host, params or [], **run_kwargs), host


# ---------------------------------------------------------------------------
# The seed's examples
# ---------------------------------------------------------------------------

SERIAL = """\
// myapp:demo/workflow.serial: func() -> result<string, string>
import { step } from "myapp:demo/activity";

export default function serial() {
  let acc = 0;
  for (let i = 0; i < 10; i++) {
    // Pauses the workflow, submits the activity and waits for its result.
    acc += Number(step(i, 200));
  }
  return String(acc);
}
"""

PARALLEL = """\
// myapp:demo/workflow.parallel: func() -> result<string, string>
import { stepSubmit, stepAwaitNext } from "myapp:demo-obelisk-ext/activity";
import * as obelisk from "obelisk:workflow@1.0.0";

export default function parallel() {
  const js = obelisk.createJoinSet();
  for (let i = 0; i < 10; i++) {
    stepSubmit(js, i, 200); // does not block
  }
  let acc = 0;
  for (let i = 0; i < 10; i++) {
    acc += Number(stepAwaitNext(js)); // in completion order
  }
  return String(acc);
}
"""


def test_seed_serial() -> None:
    outcome, host = run_js(SERIAL, filename="workflow/serial.js")
    assert outcome == WfOk("45")
    calls = host.history("call")
    assert [c.args for c in calls] == [(STEP, [i, 200]) for i in range(10)]
    # The backtrace points at the `step(i, 200)` line of the workflow's own file.
    for c in calls:
        assert c.stack is not None and c.stack[0].file == "workflow/serial.js"
        assert (c.stack[0].line, c.stack[0].function) == (8, "serial")


def test_seed_parallel() -> None:
    outcome, host = run_js(PARALLEL, filename="workflow/parallel.js")
    assert outcome == WfOk("45")
    assert [c.method for c in host.calls] == ["join_set_create"] + ["submit"] * 10 + [
        "join_next"
    ] * 10
    assert host.history("submit")[3].args == ("g:1", STEP, [3, 200])
    assert all(c.args == ("g:1", STEP) for c in host.history("join_next"))
    assert host.history("submit")[0].stack == [Frame("workflow/parallel.js", 8, 16, "parallel")]


def test_check_validates_seed_examples_against_interfaces() -> None:
    interfaces = make_host().interfaces()
    JsWorkflowRunner(SERIAL, "serial.js").check(interfaces)
    JsWorkflowRunner(PARALLEL, "parallel.js").check(interfaces)


# ---------------------------------------------------------------------------
# Imports
# ---------------------------------------------------------------------------


def test_camel_case() -> None:
    assert camel_case("step") == "step"
    assert camel_case("sleep-millis") == "sleepMillis"
    assert camel_case("do-the-thing") == "doTheThing"
    assert camel_case("get-v2") == "getV2"
    assert camel_case("%interface") == "interface"


def test_kebab_case_functions_become_camel_case() -> None:
    src = """
import { doTheThing } from "myapp:demo/activity";
import { doTheThingSubmit, doTheThingAwaitNext, doTheThingGet } from "myapp:demo-obelisk-ext/activity";
import { sendEmailSchedule } from "myapp:demo-obelisk-schedule/email";
import { childWorkflow } from "myapp:other/child";
export default function () {
  const a = doTheThing(21);
  const js = obelisk.createJoinSet();
  const id = doTheThingSubmit(js, 5);
  const b = doTheThingAwaitNext(js);
  const c = doTheThingGet(id);
  const e = sendEmailSchedule({ minutes: 5 }, "user@example.com");
  return [a, b, c, childWorkflow(1), e, id, js.lastId];
}
"""
    outcome, host = run_js(src)
    child = f"{host.execution_id}.g:1_1"
    assert outcome == WfOk([42, 10, 10, 2, "E_SCHEDULED000000000000001", child, child])
    assert host.history("call")[0].args == ("myapp:demo/activity.do-the-thing", [21])
    assert host.history("schedule")[0].args == (
        "myapp:demo/email.send-email",
        ["user@example.com"],
        ("in", 300_000),
    )


def test_unknown_interface_is_a_load_error_naming_it() -> None:
    src = 'const x = 1;\n\nimport { step } from "myapp:nope/activity";\nexport default function () {}\n'
    runner = JsWorkflowRunner(src, "wf/bad.js")
    with pytest.raises(JsWorkflowLoadError) as info:
        runner.check(make_host().interfaces())
    message = str(info.value)
    assert "myapp:nope/activity" in message
    assert message.startswith("wf/bad.js:3: unknown interface")
    assert info.value.line == 3 and info.value.filename == "wf/bad.js"
    assert "myapp:demo/activity" in message  # lists what is importable


def test_unknown_function_is_a_load_error_naming_it() -> None:
    src = 'import {\n  step,\n  stepp,\n} from "myapp:demo/activity";\nexport default function () {}\n'
    with pytest.raises(JsWorkflowLoadError) as info:
        JsWorkflowRunner(src, "wf.js").check(make_host().interfaces())
    message = str(info.value)
    assert message.startswith("wf.js:3: 'myapp:demo/activity' has no function 'stepp'")
    assert "step" in message and "doTheThing" in message


def test_unknown_ext_function_and_host_api_name() -> None:
    src = 'import { stepSubmit, stepAwait } from "myapp:demo-obelisk-ext/activity";\nexport default 1;'
    with pytest.raises(JsWorkflowLoadError, match=r"wf\.js:1: .* has no function 'stepAwait'"):
        JsWorkflowRunner(src, "wf.js").check(make_host().interfaces())
    src = 'import { sleepy } from "obelisk:workflow@1.0.0";\nexport default 1;'
    with pytest.raises(JsWorkflowLoadError, match=r"has no function 'sleepy'.*createJoinSet"):
        JsWorkflowRunner(src, "wf.js").check(make_host().interfaces())


def test_relative_and_internal_imports_are_refused() -> None:
    for spec in ("./lib.js", "obelisk:internal", "fs"):
        src = f'import x from "{spec}";\nexport default function () {{}}\n'
        with pytest.raises(JsWorkflowLoadError, match=f"wf.js:1: .*'{spec}'"):
            JsWorkflowRunner(src, "wf.js").check(make_host().interfaces())


def test_versioned_interfaces_resolve_with_and_without_version() -> None:
    host = make_host()
    host.functions = {"myapp:v/ifc@1.0.0.go": FakeFunction(("x",), lambda p: {"ok": p[0]})}
    src = """
import { go } from "myapp:v/ifc@1.0.0";
import { go as go2 } from "myapp:v/ifc";
import { goSubmit } from "myapp:v-obelisk-ext/ifc@1.0.0";
export default () => go(1) + go2(2);
"""
    assert run_js(src, host=host)[0] == WfOk(3)


def test_load_errors_syntax_top_level_throw_and_export() -> None:
    interfaces = make_host().interfaces()
    # The line and its text: QuickJS's column of a parse error counts from another line.
    with pytest.raises(JsWorkflowLoadError, match=r"wf\.js: SyntaxError: .*\(line 3: 'a b'\)"):
        JsWorkflowRunner("export default function () {\n  let a = 1;\n  a b\n}\n", "wf.js").check(
            interfaces
        )
    with pytest.raises(
        JsWorkflowLoadError, match=r"module evaluation failed: Error: boom \(line 2"
    ):
        JsWorkflowRunner("const a = 1;\nthrow new Error('boom');\n", "wf.js").check(interfaces)
    with pytest.raises(JsWorkflowLoadError, match=r"no default export \(exports: other\)"):
        JsWorkflowRunner("export function other() {}\n", "wf.js").check(interfaces)
    with pytest.raises(JsWorkflowLoadError, match=r"export 'x' is not a function \(it is number\)"):
        JsWorkflowRunner("export const x = 1;\n", "wf.js", "x").check(interfaces)
    JsWorkflowRunner("export function x() {}\n", "wf.js", "x").check(interfaces)


def test_check_refuses_host_calls_at_top_level_and_endless_top_level_code() -> None:
    interfaces = make_host().interfaces()
    with pytest.raises(JsWorkflowLoadError, match="cannot be used while the module is only being"):
        JsWorkflowRunner(
            "const js = obelisk.createJoinSet();\nexport default () => 1;", "wf.js"
        ).check(interfaces)
    runner = JsWorkflowRunner("while (true) {}\nexport default () => 1;", "wf.js", load_timeout=0.2)
    with pytest.raises(JsWorkflowLoadError, match=r"did not finish within 0\.2 s"):
        runner.check(interfaces)


def test_unknown_import_at_run_time_is_a_trap() -> None:
    runner = JsWorkflowRunner('import { x } from "a:b/c";\nexport default () => 1;', "wf.js")
    outcome = runner.run(make_host(), [])
    assert isinstance(outcome, WfTrap) and "unknown interface 'a:b/c'" in outcome.reason


# ---------------------------------------------------------------------------
# Determinism and sandbox
# ---------------------------------------------------------------------------

DETERMINISM = """
export default function () {
  const d1 = Date.now();
  const d2 = new Date().getTime();
  const s = Date();
  return {
    d1, d2, s: typeof s, fixed: new Date(0).toISOString(), parsed: new Date("2020-01-01T00:00:00Z").getTime(),
    isDate: new Date() instanceof Date, ctor: new Date().constructor === Date,
    r: [Math.random(), Math.random(), Math.random()],
  };
}
"""


def test_date_and_math_random_are_deterministic() -> None:
    first, host1 = run_js(DETERMINISM, host=make_host(execution_id="E_A"))
    second, _ = run_js(DETERMINISM, host=make_host(execution_id="E_A"))
    other, _ = run_js(DETERMINISM, host=make_host(execution_id="E_B"))
    assert isinstance(first, WfOk) and first == second
    value = first.value
    assert value["d1"] == START_MS + 1 and value["d2"] == START_MS + 2
    assert value["s"] == "string" and value["fixed"] == "1970-01-01T00:00:00.000Z"
    assert value["parsed"] == 1_577_836_800_000
    assert value["isDate"] is True and value["ctor"] is True
    assert all(0 <= r < 1 for r in value["r"]) and len(set(value["r"])) == 3
    assert isinstance(other, WfOk) and other.value["r"] != value["r"]
    # Clock reads are host calls (recorded, with a stack); Math.random is not.
    assert [c.method for c in host1.calls] == ["now_ms"] * 5
    assert host1.calls[0].stack == [Frame("wf.js", 3, 19, "default")]


def test_sandbox_has_no_ambient_access() -> None:
    src = """
export default function () {
  return [typeof process, typeof fetch, typeof setTimeout, typeof setInterval,
          typeof performance, typeof require, typeof __obelisk_host, typeof __obelisk_internal,
          typeof WeakRef, typeof FinalizationRegistry,
          typeof obelisk, Object.isFrozen(obelisk)];
}
"""
    assert run_js(src)[0] == WfOk(
        [
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "undefined",
            "object",
            True,
        ]
    )


def test_console_goes_to_host_log() -> None:
    src = """
export default function () {
  console.log("hello", 1, {a: [1, 2]}, 5n);
  console.info("i"); console.warn("w"); console.error(new Error("e")); console.debug("d");
  console.trace("t");
  return null;
}
"""
    outcome, host = run_js(src)
    assert outcome == WfOk(None)
    assert host.logs[0] == ("info", 'hello 1 {"a":[1,2]} 5n')
    assert [lvl for lvl, _ in host.logs] == ["info", "info", "warn", "error", "debug", "trace"]
    assert host.logs[3][1].startswith("Error: e\n    at ")
    assert host.calls == []  # logs are not history


def test_log_module() -> None:
    src = 'import { info, warn } from "obelisk:log/log@1.0.0";\nexport default () => { info("a"); warn("b"); };'
    outcome, host = run_js(src)
    assert outcome == WfOk(None) and host.logs == [("info", "a"), ("warn", "b")]


# ---------------------------------------------------------------------------
# Results and child errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("return undefined;", WfOk(None)),
        ("return 2n ** 70n;", WfOk(2**70)),
        ("return {a: [1, 'x', null]};", WfOk({"a": [1, "x", None]})),
        ("return new Date(0);", WfOk("1970-01-01T00:00:00.000Z")),
        ("throw new Error('boom');", WfErr("boom")),
        ("throw new TypeError('bad');", WfErr("bad")),
        ("throw 'permanent-failure';", WfErr("permanent-failure")),
        ("throw {code: 7};", WfErr({"code": 7})),
        ("throw undefined;", WfErr(None)),
        ("return (async () => 5)();", WfOk(5)),
    ],
)
def test_results(body: str, expected: WorkflowOutcome) -> None:
    assert run_js(f"export default function () {{ {body} }}")[0] == expected


def test_params_are_positional() -> None:
    src = "export default function (a, b, c) { return [a, b, c]; }"
    assert run_js(src, [1, {"x": "y"}, None])[0] == WfOk([1, {"x": "y"}, None])


def test_wide_integers_cross_as_bigints() -> None:
    src = "export default function (a, b) { return [typeof a, a + 1n, typeof b, b]; }"
    assert run_js(src, [2**64 - 2, 2**53 - 1])[0] == WfOk(
        ["bigint", 2**64 - 1, "number", 2**53 - 1]
    )


def test_named_export() -> None:
    src = "export function serial(n) { return n * 2; }\nexport default () => 0;"
    assert run_js(src, [4], export="serial")[0] == WfOk(8)


CHILD_ERRORS = """
import { fail, crash, step } from "myapp:demo/activity";
export default function (mode) {
  const seen = [];
  try { fail(1); } catch (e) {
    seen.push([e instanceof obelisk.ChildExecutionError, e instanceof Error, e.name, e.value, e.ffqn, e.failureKind ?? null]);
  }
  try { crash(2); } catch (e) {
    seen.push([e.value, e.failureKind, e.reason, e.cancelled, e.message]);
  }
  seen.push(step(3, 0)); // continues after a caught child error
  if (mode === "rethrow") {
    try { fail(4); } catch (e) { throw e; }
  }
  if (mode === "uncaught") crash(5);
  return seen;
}
"""


def test_child_execution_error_can_be_caught() -> None:
    outcome, _ = run_js(CHILD_ERRORS, ["catch"])
    assert outcome == WfOk(
        [
            [True, True, "ChildExecutionError", "failed 1", "myapp:demo/activity.fail", None],
            [
                "execution-failed",
                "timed_out",
                "too slow",
                False,
                "child execution (myapp:demo/activity.crash) failed: timed_out: too slow",
            ],
            3,
        ]
    )


def test_rethrown_child_error_is_the_workflows_err() -> None:
    assert run_js(CHILD_ERRORS, ["rethrow"])[0] == WfErr("failed 4")
    assert run_js(CHILD_ERRORS, ["uncaught"])[0] == WfErr("execution-failed")


def test_dynamic_call_and_get_result() -> None:
    src = """
export default function () {
  const a = obelisk.call("myapp:demo/activity.step", [7, 0]);
  let b;
  try { obelisk.call("myapp:demo/activity.fail", [8]); } catch (e) { b = e.value; }
  const js = obelisk.createJoinSet({ name: "x" });
  const id = js.submit("myapp:demo/activity.step", [9, 0]);
  js.joinNext();
  return [a, b, obelisk.getResult(id), js.id];
}
"""
    assert run_js(src)[0] == WfOk([7, "failed 8", 9, "n:x"])


# ---------------------------------------------------------------------------
# Join sets
# ---------------------------------------------------------------------------


def test_join_set_api() -> None:
    src = """
export default function () {
  const js = obelisk.createJoinSet();
  const out = [js.id, js.lastId];
  const c1 = js.submit("myapp:demo/activity.step", [1, 0]);
  const d1 = js.submitDelay({ seconds: 2 });
  const c2 = js.submit("myapp:demo/activity.fail", [2]);
  out.push(js.joinNext(), js.lastId === c1);
  out.push(js.joinNext(), js.lastId === d1);
  try { js.joinNext(); } catch (e) { out.push([e.name, e.value, e.childId === c2, js.lastId === c2]); }
  out.push(js.joinNext(), js.joinNextTry());
  js.close();
  return out;
}
"""
    outcome, host = run_js(src)
    eid = host.execution_id
    assert outcome == WfOk(
        [
            "g:1",
            None,
            {"type": "child", "id": f"{eid}.g:1_1", "ffqn": STEP, "value": 1},
            True,
            {"type": "delay", "id": f"Delay_{eid[2:]}.g:1_2", "cancelled": False},
            True,
            ["ChildExecutionError", "failed 2", True, True],
            {"type": "allProcessed"},
            {"type": "allProcessed"},
        ]
    )
    assert host.history("submit_delay")[0].args == ("g:1", ("in", 2000))
    assert host.history("join_set_close")[0].args == ("g:1",)


def test_join_next_try_pending_and_stub() -> None:
    src = """
import { approveSubmit } from "myapp:demo-obelisk-ext/approval";
import { approveStub } from "myapp:demo-obelisk-stub/approval";
export default function () {
  const js = obelisk.createJoinSet({ name: "approvals" });
  const id = approveSubmit(js, "order-1");
  const before = js.joinNextTry();
  approveStub(id, { ok: true });
  const after = js.joinNextTry();
  const id2 = approveSubmit(js, "order-2");
  obelisk.stub(id2, { err: "nope" });
  let err;
  try { js.joinNextTry(); } catch (e) { err = e.value; }
  return [before, after, err, js.joinNextTry()];
}
"""
    outcome, host = run_js(
        src, host=make_host(never_finish=frozenset({"myapp:demo/approval.approve"}))
    )
    eid = host.execution_id
    assert outcome == WfOk(
        [
            {"type": "pending"},
            {
                "type": "child",
                "id": f"{eid}.n:approvals_1",
                "ffqn": "myapp:demo/approval.approve",
                "value": True,
            },
            "nope",
            {"type": "allProcessed"},
        ]
    )
    assert host.history("stub")[0].args == (f"{eid}.n:approvals_1", {"ok": True})


def test_await_next_all_processed_and_function_mismatch() -> None:
    src = """
import { stepSubmit, stepAwaitNext } from "myapp:demo-obelisk-ext/activity";
import { failSubmit } from "myapp:demo-obelisk-ext/activity";
export default function (mode) {
  const js = obelisk.createJoinSet();
  const out = [];
  try { stepAwaitNext(js); } catch (e) { out.push([e.name, e.value, e instanceof obelisk.AwaitNextError]); }
  const id = failSubmit(js.id, 1);
  try { stepAwaitNext(js); } catch (e) { out.push([e.name, e.value, js.lastId === id]); }
  js.submitDelay("now");
  try { stepAwaitNext(js); } catch (e) { out.push(e.value); }
  if (mode === "uncaught") stepAwaitNext(js);
  return out;
}
"""
    outcome, host = run_js(src)
    eid = host.execution_id
    assert outcome == WfOk(
        [
            ["AwaitNextError", "all-processed", True],
            [
                "AwaitNextError",
                {
                    "function-mismatch": {
                        "specified_function": STEP,
                        "actual_function": "myapp:demo/activity.fail",
                        "actual_id": f"{eid}.g:1_1",
                    }
                },
                True,
            ],
            {
                "function-mismatch": {
                    "specified_function": STEP,
                    "actual_function": None,
                    "actual_id": f"Delay_{eid[2:]}.g:1_2",
                }
            },
        ]
    )
    assert host.history("submit_delay")[0].args == ("g:1", "now")
    assert run_js(src, ["uncaught"])[0] == WfErr("all-processed")


def test_join_set_misuse() -> None:
    src = """
export default function (mode) {
  if (mode === "new") return new (obelisk.createJoinSet().constructor)("x", "g:9");
  if (mode === "submit-closed") {
    const js = obelisk.createJoinSet();
    js.close();
    js.submit("myapp:demo/activity.step", [1, 2]);
  }
  if (mode === "caught") {
    try { obelisk.call("myapp:nope/x.y", []); } catch (e) { return [e.name, e.message]; }
  }
  if (mode === "arity") {
    obelisk.createJoinSet();
  }
}
"""
    outcome = run_js(src, ["new"])[0]
    assert isinstance(outcome, WfTrap) and "obelisk.createJoinSet()" in outcome.reason
    outcome = run_js(src, ["submit-closed"])[0]
    assert outcome == WfTrap("join set 'g:1' is closed", "    at default (wf.js:7:8)")
    assert run_js(src, ["caught"])[0] == WfOk(["Error", "function 'myapp:nope/x.y' not found"])


def test_argument_checks_are_traps() -> None:
    cases = {
        "step(1, 2, 3)": "step takes 2 argument(s) (idx, sleep-millis), got 3",
        "obelisk.sleep({ weeks: 1 })": "sleep: unknown duration unit 'weeks'",
        "obelisk.sleep(5)": "sleep: expected a duration",
        "obelisk.sleep({ seconds: -1 })": "duration seconds must be a non-negative number",
        "obelisk.randomU64(5, 5)": "maxExclusive (5) must be greater than min (5)",
        "obelisk.randomU64(-1, 5)": "must be a non-negative safe integer or a BigInt",
        "obelisk.stub('x', 5)": "the result must be {ok: value} or {err: value}",
        "stepSubmit({}, 1, 2)": "expected a join set",
        "obelisk.call('x', 'y')": "params must be an array",
    }
    for expr, message in cases.items():
        src = (
            'import { step } from "myapp:demo/activity";\n'
            'import { stepSubmit } from "myapp:demo-obelisk-ext/activity";\n'
            f"export default function () {{ {expr}; }}"
        )
        outcome = run_js(src)[0]
        assert isinstance(outcome, WfTrap), expr
        assert message in outcome.reason, (expr, outcome.reason)


def test_missing_arguments_are_null() -> None:
    src = 'import { step } from "myapp:demo/activity";\nexport default () => step(4);'
    outcome, host = run_js(src)
    assert outcome == WfOk(4) and host.history("call")[0].args == (STEP, [4, None])


# ---------------------------------------------------------------------------
# Sleep, schedule, random, ids
# ---------------------------------------------------------------------------


def test_sleep_returns_the_wake_up_date() -> None:
    src = """
export default function () {
  const t0 = Date.now();
  const woke = obelisk.sleep({ minutes: 1, seconds: 30 });
  const at = obelisk.sleep({ at: new Date(Date.UTC(2030, 0, 1)) }, "new-year");
  const now = obelisk.sleep("now");
  return [woke instanceof Date, woke.getTime() - t0, at.toISOString(), now.getTime() - at.getTime()];
}
"""
    outcome, host = run_js(src)
    assert outcome == WfOk([True, 90_000, "2030-01-01T00:00:00.000Z", 0])
    assert [c.args for c in host.history("sleep")] == [
        (("in", 90_000), None),
        (("at", 1_893_456_000_000), "new-year"),
        ("now", None),
    ]


def test_cancelled_sleep_throws() -> None:
    src = """
export default function (rethrow) {
  try { obelisk.sleep({ seconds: 1 }); } catch (e) {
    if (rethrow) throw e;
    return [e.name, e.message, e.cancelled, e.failureKind, e.value, e.childId === undefined];
  }
}
"""
    host = make_host(cancel_delays=True)
    assert run_js(src, [False], host=host)[0] == WfOk(
        ["ChildExecutionError", "Sleep was cancelled", True, "cancelled", "cancelled", True]
    )
    # Uncaught: the workflow's err says why (like "execution-failed" for a child).
    assert run_js(src, [True], host=make_host(cancel_delays=True))[0] == WfErr("cancelled")


def test_schedule() -> None:
    src = """
import { sendEmailSchedule } from "myapp:demo-obelisk-schedule/email";
export default function () {
  return [
    sendEmailSchedule({ minutes: 5 }, "a@example.com"),
    sendEmailSchedule("now", "b@example.com"),
    obelisk.schedule("myapp:demo/email.send-email", ["c@example.com"], { at: 1_900_000_000_000 }),
    obelisk.schedule("myapp:demo/email.send-email", ["d@example.com"]),
  ];
}
"""
    outcome, host = run_js(src)
    assert isinstance(outcome, WfOk) and len(set(outcome.value)) == 4
    assert [c.args[1:] for c in host.history("schedule")] == [
        (["a@example.com"], ("in", 300_000)),
        (["b@example.com"], "now"),
        (["c@example.com"], ("at", 1_900_000_000_000)),
        (["d@example.com"], "now"),
    ]


def test_random_values_and_ids() -> None:
    src = """
export default function () {
  const a = obelisk.randomU64(10, 20);
  const b = obelisk.randomU64Inclusive(5, 5);
  const c = obelisk.randomU64(0n, 2n ** 64n);
  const s = obelisk.randomString(3, 8);
  return [typeof a, a >= 10 && a < 20, b, typeof c, c >= 0n, typeof s, s.length >= 3 && s.length < 8,
          /^[A-Za-z0-9]*$/.test(s), obelisk.executionIdCurrent(), obelisk.executionIdGenerate()];
}
"""
    outcome, host = run_js(src)
    assert outcome == WfOk(
        [
            "number",
            True,
            5,
            "bigint",
            True,
            "string",
            True,
            True,
            host.execution_id,
            "E_GENERATED000000000000001",
        ]
    )
    assert [c.args for c in host.history("random_u64")] == [(10, 19), (5, 5), (0, 2**64 - 1)]
    assert host.history("random_string")[0].args == (3, 8)


# ---------------------------------------------------------------------------
# Backtraces
# ---------------------------------------------------------------------------


def test_backtraces_point_at_the_calling_lines() -> None:
    src = """import { step } from "myapp:demo/activity";

function helper(js) {
  return js.submit("myapp:demo/activity.step", [1, 0]);
}

export default function main() {
  const js = obelisk.createJoinSet();
  helper(js);
  [1].map(() => step(2, 0));
  obelisk.sleep({ seconds: 1 });
  return js.joinNext().value;
}
"""
    outcome, host = run_js(src, filename="flows/main.js")
    assert outcome == WfOk(1)
    stacks = {c.method: c.stack for c in host.calls}
    # Lines are exact; columns are QuickJS's (the property of a member call, the first
    # argument of a plain call).
    assert stacks == {
        "join_set_create": [Frame("flows/main.js", 8, 22, "main")],
        "submit": [Frame("flows/main.js", 4, 13, "helper"), Frame("flows/main.js", 9, 10, "main")],
        "call": [Frame("flows/main.js", 10, 17, ""), Frame("flows/main.js", 10, 7, "main")],
        "sleep": [Frame("flows/main.js", 11, 11, "main")],
        "join_next": [Frame("flows/main.js", 12, 13, "main")],
    }


def test_parse_js_stack() -> None:
    stack = (
        "    at host (<obelisk:prelude>:60:30)\n"
        "    at step (myapp:demo/activity:3:1)\n"
        "    at helper (a/b.js:4:19)\n"
        "    at map (native)\n"
        "    at <anonymous> (a/b.js:10:3)\n"
        "    at a/b.js:12:5\n"
    )
    assert parse_js_stack(stack, "a/b.js") == [
        Frame("a/b.js", 4, 19, "helper"),
        Frame("a/b.js", 10, 3, ""),
        Frame("a/b.js", 12, 5, ""),
    ]
    assert parse_js_stack(stack)[1] == Frame("myapp:demo/activity", 3, 1, "step")


# ---------------------------------------------------------------------------
# Aborts, interrupts, host errors
# ---------------------------------------------------------------------------

SWALLOW = """
import { step } from "myapp:demo/activity";
export default function () {
  let n = 0;
  for (let i = 0; i < 50; i++) {
    try { step(i, 0); } catch (e) { n++; }
  }
  try { obelisk.sleep({ seconds: 1 }); } catch (e) { n++; }
  return "swallowed " + n;
}
"""


def test_run_aborted_cannot_be_swallowed() -> None:
    host = make_host(abort_after=3)
    outcome, _ = run_js(SWALLOW, host=host)
    assert outcome == WfAborted()
    assert len(host.calls) == 3  # the host was not called again after RunAborted
    assert host.host_calls_after_abort == 0


def test_run_aborted_stops_a_guest_that_spins_after_catching_it() -> None:
    src = """
import { step } from "myapp:demo/activity";
export default function () {
  try { step(1, 0); } catch (e) { }
  while (true) { try { while (true) {} } catch (e) { } }
}
"""
    started = time.monotonic()
    outcome, _ = run_js(src, host=make_host(abort_after=1))
    assert outcome == WfAborted()
    assert time.monotonic() - started < 5


def test_blocking_join_next_that_aborts() -> None:
    # A join_next with nothing to return: the fake host "unloads" the run (interrupt).
    src = """
import { approveSubmit, approveAwaitNext } from "myapp:demo-obelisk-ext/approval";
export default function () {
  const js = obelisk.createJoinSet();
  approveSubmit(js, "o");
  try { return approveAwaitNext(js); } catch (e) { return "caught"; }
}
"""
    host = make_host(never_finish=frozenset({"myapp:demo/approval.approve"}))
    assert run_js(src, host=host)[0] == WfAborted()


def test_interrupt_stops_a_spinning_guest() -> None:
    runner = JsWorkflowRunner(
        "export default function () { let i = 0; while (true) { i++; } }", "wf.js"
    )
    host = make_host()
    result: list[WorkflowOutcome] = []
    thread = threading.Thread(target=lambda: result.append(runner.run(host, [])))
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()
    started = time.monotonic()
    runner.interrupt("E_other")  # another execution: no effect
    time.sleep(0.1)
    assert thread.is_alive()
    runner.interrupt(host.execution_id)
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 2
    assert result == [WfAborted()]


def test_interrupt_while_the_host_blocks() -> None:
    runner = JsWorkflowRunner(SERIAL, "wf.js")
    host = make_host(block_seconds=0.05)
    result: list[WorkflowOutcome] = []
    thread = threading.Thread(target=lambda: result.append(runner.run(host, [])))
    thread.start()
    deadline = time.monotonic() + 10
    while not host.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.interrupt()
    thread.join(5)
    assert result == [WfAborted()]
    assert 1 <= len(host.calls) < 10


def test_spin_timeout() -> None:
    outcome, _ = run_js("export default () => { for (;;) {} };", spin_timeout=0.2)
    assert outcome == WfTimedOut()


def test_slow_host_calls_do_not_count_against_spin_timeout() -> None:
    host = make_host(block_seconds=0.15)
    outcome, _ = run_js(SERIAL, host=host, spin_timeout=0.1)
    assert outcome == WfOk("45")


def test_host_bug_is_re_raised() -> None:
    host = make_host()

    def broken(_self: Any = None) -> int:
        raise KeyError("boom")

    host.now_ms = broken  # type: ignore[method-assign]
    runner = JsWorkflowRunner(
        "export default () => { try { Date.now() } catch (e) {} for(;;){} };", "wf.js"
    )
    with pytest.raises(KeyError, match="boom"):
        runner.run(host, [])


def test_workflow_call_error_uncaught_is_a_trap() -> None:
    src = 'export default function () {\n  obelisk.call("myapp:nope/x.y", []);\n}\n'
    outcome = run_js(src)[0]
    assert isinstance(outcome, WfTrap)
    assert outcome.reason == "function 'myapp:nope/x.y' not found"
    assert "wf.js:2" in outcome.detail


def test_host_raising_workflow_call_error_from_a_fake() -> None:
    host = make_host()

    def bad_random(min_: int, max_inclusive: int) -> int:
        raise WorkflowCallError("no randomness today")

    host.random_u64 = bad_random  # type: ignore[method-assign]
    outcome = run_js("export default () => obelisk.randomU64(0, 9);", host=host)[0]
    assert outcome == WfTrap(
        "no randomness today", outcome.detail if isinstance(outcome, WfTrap) else ""
    )


def test_engine_failures_are_traps() -> None:
    outcome = run_js("export default () => new Promise(() => {});")[0]
    assert isinstance(outcome, WfTrap) and "never settles" in outcome.reason
    outcome = run_js("export default () => { const a = []; for (;;) a.push('x'.repeat(1e6)); };")[0]
    assert outcome == WfTrap("out of memory (the JS sandbox's limit is 64 MiB)")
    src = "export default function f() { try { return f() + 1; } catch (e) { return 0; } }"
    assert run_js(src)[0] == WfTrap("stack overflow")


# ---------------------------------------------------------------------------
# Fast paths: accelerated guest calls, prelude snapshot
# ---------------------------------------------------------------------------

EQUIVALENCE = """
import { step, fail } from "myapp:demo/activity";
import { stepSubmit, stepAwaitNext } from "myapp:demo-obelisk-ext/activity";
export default function (n) {
  console.log("start", n);
  const js = obelisk.createJoinSet();
  for (let i = 0; i < n; i++) stepSubmit(js, i, 0);
  let acc = 0;
  for (let i = 0; i < n; i++) acc += stepAwaitNext(js);
  let err;
  try { fail(1); } catch (e) { err = e.value; }
  return [acc, err, step(2n ** 60n, 0), Date.now(), Math.random(), obelisk.randomU64(0, 10),
          obelisk.executionIdCurrent(), js.joinNext(), "é ✓ \\u0000"];
}
"""


@pytest.mark.parametrize("accelerate", [True, False])
@pytest.mark.parametrize("snapshot", [True, False])
def test_fast_paths_are_active_and_equivalent(
    monkeypatch: pytest.MonkeyPatch, accelerate: bool, snapshot: bool
) -> None:
    seen: list[tuple[bool, bool, bool]] = []
    direct_memory: list[bool] = []
    original_open = js_runtime._Run.open

    def spy(self: js_runtime._Run, **kwargs: Any) -> None:
        original_open(self, **kwargs)
        if self.execution_id:  # not the load that takes the runner's module image
            seen.append((self.accelerated, self.from_snapshot, self.module_loaded))
            inst = self.ctx._engine_ctx._inst
            direct_memory.append("read" in vars(inst) and "alloc_write" in vars(inst))
            with pytest.raises(GuestMemoryError, match="out-of-range guest read"):
                inst.read(inst.mem.data_len(inst.store) - 2, 4)

    monkeypatch.setattr(js_runtime._Run, "open", spy)
    monkeypatch.setattr(js_runtime, "ACCELERATE", accelerate)
    monkeypatch.setattr(js_runtime, "USE_SNAPSHOT", snapshot)
    outcome, host = run_js(EQUIVALENCE, [5])
    # check() loads the module; run() starts from the runner's module image if it may.
    assert seen == [(accelerate, snapshot, False), (accelerate, snapshot, snapshot)]
    assert direct_memory == [accelerate, accelerate]  # `_fast_memory`
    assert isinstance(outcome, WfOk)
    value = outcome.value
    assert value[:4] == [10, "failed 1", 2**60, START_MS + 1]  # wide ints cross as BigInt
    assert value[6:] == [host.execution_id, {"type": "allProcessed"}, "é ✓ \x00"]
    assert host.logs == [("info", "start 5")]
    # Identical across the four combinations (same seed, same host answers).
    reference, _ = run_js(EQUIVALENCE, [5])
    assert outcome == reference
