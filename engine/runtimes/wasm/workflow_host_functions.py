"""The host functions a `workflow_wasm` guest imports (`engine.runtimes.wasm.workflow`) and
the linker that defines them: `obelisk:workflow/workflow-support` (one function per host
API call), `obelisk:types/join-set`, `obelisk:log`, the deployed functions reached directly
or through extension interfaces (one factory per kind of `Target`), and deterministic WASI
(`engine.runtimes.wasm.workflow_wasi`). Each takes the `WorkflowRun` and the store first;
`build_linker` wraps it so that it runs guarded by `WorkflowRun.enter`."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import wasmtime
from wasmtime import WasmtimeError
from wasmtime import component as wc

from engine.runtimes.wasm.workflow_imports import (
    ImportedFunc,
    ImportedInterface,
    Target,
    split_interface,
)
from engine.runtimes.wasm.workflow_run import (
    JOIN_SET_RESOURCE,
    GuestError,
    JoinSet,
    WorkflowRun,
    current_run,
)
from engine.runtimes.wasm.workflow_wasi import WASI_FUNCTIONS
from engine.runtimes.wasm.workflow_wit import (
    CALL_JSON_RESULT,
    DYNAMIC_ID_RESULT,
    EXECUTION_ID,
    FUNCTION,
    GET_RESULT_JSON_RESULT,
    JOIN_NEXT_RESULT,
    JOIN_NEXT_TRY_RESULT,
    LAST_ID_RESULT,
    RESULT_DATETIME,
    SCHEDULE_AT,
    STRING,
    STUB_JSON_RESULT,
    Case,
    lower_value,
)
from engine.runtimes.workflow_host import (
    AllProcessed,
    ChildResponse,
    DelayResponse,
    FunctionMismatch,
    Pending,
    ScheduleAtArg,
    WorkflowCallError,
)
from engine.wit.codec import WitValueError, json_to_wasmtime, wasmtime_to_json
from engine.wit.types import WitEnum, WitResult, WitType, WitVariant, format_wit_type

__all__ = ["build_linker"]

# ---------------------------------------------------------------------------------------------
# Conversions shared by host functions


def _schedule_at(value: Any) -> ScheduleAtArg:
    """§9.2 JSON of `schedule-at` → the host's form."""
    if value == "now":
        return "now"
    ((case, payload),) = value.items()
    if case == "at":
        return ("at", payload["seconds"] * 1000 + payload["nanoseconds"] // 1_000_000)
    ((unit, n),) = payload.items()
    factor = {"milliseconds": 1, "seconds": 1000, "minutes": 60_000, "hours": 3_600_000}
    return ("in", n * factor.get(unit, 86_400_000))


def _datetime(ms: int) -> dict[str, int]:
    ms = max(ms, 0)
    return {"seconds": ms // 1000, "nanoseconds": (ms % 1000) * 1_000_000}


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, allow_nan=False)


def _json_result(result: Mapping[str, Any]) -> dict[str, Any]:
    """A child's result as `result<option<string>, option<string>>` JSON."""
    if "ok" in result:
        return {"ok": _json_text(result["ok"])}
    if "err" in result:
        return {"err": _json_text(result["err"])}
    return {"err": json.dumps("execution-failed")}


def _failure_text(failure: Any) -> str:
    if not isinstance(failure, Mapping):
        return "execution failure"
    reason = failure.get("reason") or ""
    return f"{failure.get('kind', 'uncategorized')}{': ' + reason if reason else ''}"


def _typed_result(result: Mapping[str, Any], returns: WitResult, what: str) -> dict[str, Any]:
    """A child's result (§9.2 form) as JSON of its declared return type `returns`; an
    execution failure becomes the `execution-failed` err (SPEC §5.1)."""
    if "ok" in result or "err" in result:
        return dict(result)
    failure = result.get("execution_failure")
    err = returns.err
    if err is None:
        return {"err": None}
    if err == STRING:
        return {"err": "execution-failed"}
    if isinstance(err, WitEnum) and "execution-failed" in err.cases:
        return {"err": "execution-failed"}
    if isinstance(err, WitVariant):
        cases = dict(err.cases)
        if "execution-failed" in cases:
            payload = cases["execution-failed"]
            if payload is None:
                return {"err": "execution-failed"}
            if payload == STRING:
                reason = failure.get("reason", "") if isinstance(failure, Mapping) else ""
                return {"err": {"execution-failed": reason or _failure_text(failure)}}
    raise GuestError(
        f"{what} ended in an execution failure ({_failure_text(failure)}), which its err type "
        f"{format_wit_type(err)} cannot represent (use `string` or a variant with an "
        "`execution-failed` case)"
    )


def _to_guest(value: Any, t: WitType, what: str) -> Any:
    try:
        return json_to_wasmtime(value, t, what)
    except WitValueError as e:
        raise GuestError(f"cannot pass {what} to the workflow: {e}") from None


def _from_guest(value: Any, t: WitType, what: str) -> Any:
    try:
        return wasmtime_to_json(value, t, what)
    except WitValueError as e:
        raise GuestError(f"cannot read {what}: {e}") from None


def _function_json(ffqn: str) -> dict[str, str]:
    interface, _, function = ffqn.rpartition(".")
    return {"interface_name": interface, "function_name": function}


def _ffqn_of(function: Any) -> str:
    interface = str(function["interface_name"])
    name = str(function["function_name"])
    if "." in name or not name or split_interface(interface) is None:
        raise ValueError(f"invalid function: interface {interface!r}, function {name!r}")
    return f"{interface}.{name}"


def _execution_id(value: Any) -> str:
    return str(value["id"])


def _mismatch(specified: str, answer: ChildResponse | DelayResponse) -> dict[str, Any]:
    if isinstance(answer, ChildResponse):
        actual: Any = _function_json(answer.ffqn) if answer.ffqn else None
        actual_id: Any = {"execution-id": {"id": answer.execution_id}}
    else:
        actual = None
        actual_id = {"delay-id": {"id": answer.delay_id}}
    return {
        "function-mismatch": {
            "specified_function": _function_json(specified),
            "actual_function": actual,
            "actual_id": actual_id,
        }
    }


# ---------------------------------------------------------------------------------------------
# Host functions: obelisk:workflow/workflow-support, obelisk:types/join-set, obelisk:log


def _random_u64(run: WorkflowRun, store: Any, lo: int, hi_exclusive: int) -> int:
    if hi_exclusive <= lo:
        raise GuestError(f"random-u64: empty range [{lo}, {hi_exclusive})")
    return run.host.random_u64(lo, hi_exclusive - 1)


def _random_u64_inclusive(run: WorkflowRun, store: Any, lo: int, hi: int) -> int:
    if hi < lo:
        raise GuestError(f"random-u64-inclusive: empty range [{lo}, {hi}]")
    return run.host.random_u64(lo, hi)


def _random_string(run: WorkflowRun, store: Any, min_len: int, max_len_exclusive: int) -> str:
    if max_len_exclusive <= min_len:
        raise GuestError(f"random-string: empty length range [{min_len}, {max_len_exclusive})")
    return run.host.random_string(min_len, max_len_exclusive)


def _sleep(run: WorkflowRun, store: Any, at: Any, name: str | None) -> Any:
    woke = run.host.sleep(_schedule_at(_from_guest(at, SCHEDULE_AT, "schedule-at")), name)
    value = {"err": None} if woke is None else {"ok": _datetime(woke)}
    return _to_guest(value, RESULT_DATETIME, "sleep result")


def _join_set_create(run: WorkflowRun, store: Any) -> Any:
    return run.new_join_set(run.host.join_set_create())


def _join_set_create_named(run: WorkflowRun, store: Any, name: str) -> Any:
    if f"n:{name}" in run.join_set_ids:
        return Case("err", Case("conflict"))
    try:
        js_id = run.host.join_set_create(name)
    except WorkflowCallError as e:
        if "already exists" in str(e):
            return Case("err", Case("conflict"))
        return Case("err", Case("invalid-name", str(e)))
    return Case("ok", run.new_join_set(js_id))


def _join_set_close(run: WorkflowRun, store: Any, handle: Any) -> None:
    js = run.join_set(store, handle)
    run.close(js)
    with contextlib.suppress(WasmtimeError):
        handle.drop(store)  # our destructor sees a closed join set: nothing more to do


def _submit_delay(run: WorkflowRun, store: Any, handle: Any, at: Any) -> Any:
    js = run.join_set(store, handle)
    delay_id = run.host.submit_delay(js.id, _schedule_at(_from_guest(at, SCHEDULE_AT, "timeout")))
    return _to_guest({"id": delay_id}, EXECUTION_ID, "delay-id")


def _answer_json(js: JoinSet, answer: Any) -> dict[str, Any] | None:
    if isinstance(answer, ChildResponse):
        js.last_id = ("execution-id", answer.execution_id)
        return {"ok": _json_result(answer.result)}
    if isinstance(answer, DelayResponse):
        js.last_id = ("delay-id", answer.delay_id)
        return {"ok": {"ok": None} if answer.outcome == "ok" else {"err": None}}
    return None


def _join_next(run: WorkflowRun, store: Any, handle: Any) -> Any:
    js = run.join_set(store, handle)
    answer = run.host.join_next(js.id)
    if isinstance(answer, FunctionMismatch):  # not asked for; treat as the response
        answer = answer.response
    value = _answer_json(js, answer)
    if value is None:
        value = {"err": "all-processed"}
    return _to_guest(value, JOIN_NEXT_RESULT, "join-next result")


def _join_next_try(run: WorkflowRun, store: Any, handle: Any) -> Any:
    js = run.join_set(store, handle)
    answer = run.host.join_next_try(js.id)
    value = _answer_json(js, answer)
    if value is None:
        value = {"err": "pending" if isinstance(answer, Pending) else "all-processed"}
    return _to_guest(value, JOIN_NEXT_TRY_RESULT, "join-next-try result")


def _execution_id_current(run: WorkflowRun, store: Any) -> Any:
    return _to_guest({"id": run.execution_id}, EXECUTION_ID, "execution-id")


def _execution_id_generate(run: WorkflowRun, store: Any) -> Any:
    return _to_guest({"id": run.host.execution_id_generate()}, EXECUTION_ID, "execution-id")


def _parse_dynamic(run: WorkflowRun, function: Any, params: str) -> tuple[str, list[Any]] | Any:
    try:
        ffqn = _ffqn_of(_from_guest(function, FUNCTION, "function"))
    except (ValueError, KeyError) as e:
        return {"err": {"ffqn-parsing-error": str(e)}}
    if not run.host.function_exists(ffqn):
        return {"err": "function-not-found"}
    try:
        parsed = json.loads(params)
    except ValueError as e:
        return {"err": {"type-check-error": f"params are not JSON: {e}"}}
    if not isinstance(parsed, list):
        return {"err": {"type-check-error": "params must be a JSON array"}}
    return ffqn, parsed


def _submit_json(run: WorkflowRun, store: Any, handle: Any, function: Any, params: str) -> Any:
    js = run.join_set(store, handle)
    parsed = _parse_dynamic(run, function, params)
    if isinstance(parsed, tuple):
        ffqn, values = parsed
        try:
            child = run.host.submit(js.id, ffqn, values)
        except WorkflowCallError as e:
            parsed = {"err": {"type-check-error": str(e)}}
        else:
            run.child_ffqn[child] = ffqn
            parsed = {"ok": {"id": child}}
    return _to_guest(parsed, DYNAMIC_ID_RESULT, "submit-json result")


def _schedule_json(run: WorkflowRun, store: Any, at: Any, function: Any, params: str) -> Any:
    schedule_at = _schedule_at(_from_guest(at, SCHEDULE_AT, "schedule-at"))
    parsed = _parse_dynamic(run, function, params)
    if isinstance(parsed, tuple):
        ffqn, values = parsed
        try:
            parsed = {"ok": {"id": run.host.schedule(ffqn, values, schedule_at)}}
        except WorkflowCallError as e:
            parsed = {"err": {"type-check-error": str(e)}}
    return _to_guest(parsed, DYNAMIC_ID_RESULT, "schedule-json result")


def _call_json(run: WorkflowRun, store: Any, function: Any, params: str) -> Any:
    parsed = _parse_dynamic(run, function, params)
    if isinstance(parsed, tuple):
        ffqn, values = parsed
        try:
            parsed = {"ok": _json_result(run.host.call(ffqn, values))}
        except WorkflowCallError as e:
            parsed = {"err": {"type-check-error": str(e)}}
    return _to_guest(parsed, CALL_JSON_RESULT, "call-json result")


def _stub_json(run: WorkflowRun, store: Any, eid: Any, result_json: str) -> Any:
    target = _execution_id(_from_guest(eid, EXECUTION_ID, "execution-id"))
    value: Any
    if not target.startswith("E_"):
        value = {"err": {"execution-id-parsing-error": f"not an execution id: {target!r}"}}
    else:
        try:
            result = json.loads(result_json)
        except ValueError as e:
            value = {"err": {"type-check-error": f"not JSON: {e}"}}
        else:
            value = _stub(run, target, result)
    return _to_guest(value, STUB_JSON_RESULT, "stub-json result")


def _get_result_json(run: WorkflowRun, store: Any, eid: Any) -> Any:
    target = _execution_id(_from_guest(eid, EXECUTION_ID, "execution-id"))
    value: Any
    if not target.startswith("E_"):
        value = {"err": {"execution-id-parsing-error": f"not an execution id: {target!r}"}}
    else:
        try:
            value = {"ok": _json_result(run.host.get_result(target))}
        except WorkflowCallError:
            value = {"err": "not-found-in-processed-responses"}
    return _to_guest(value, GET_RESULT_JSON_RESULT, "get-result-json result")


_SUPPORT: dict[str, Callable[..., Any]] = {
    "random-u64": _random_u64,
    "random-u64-inclusive": _random_u64_inclusive,
    "random-string": _random_string,
    "sleep": _sleep,
    "join-set-create": _join_set_create,
    "join-set-create-named": _join_set_create_named,
    "join-set-close": _join_set_close,
    "submit-delay": _submit_delay,
    "join-next": _join_next,
    "join-next-try": _join_next_try,
    "execution-id-current": _execution_id_current,
    "execution-id-generate": _execution_id_generate,
    "submit-json": _submit_json,
    "schedule-json": _schedule_json,
    "call-json": _call_json,
    "stub-json": _stub_json,
    "get-result-json": _get_result_json,
}


def _stub(run: WorkflowRun, target: str, result: Any) -> dict[str, Any]:
    """`host.stub`, with its errors as a `stub-error`-like JSON value."""
    if not isinstance(result, dict):
        return {"err": {"type-check-error": 'expected {"ok": value} or {"err": value}'}}
    try:
        run.host.stub(target, result)
    except WorkflowCallError as e:
        message = str(e)
        if "another result" in message:
            return {"err": "conflict"}
        if message.startswith("stub result") or "params" in message:
            return {"err": {"type-check-error": message}}
        return {"err": "execution-not-found"}
    return {"ok": None}


def _join_set_methods() -> dict[str, Callable[..., Any]]:
    def id_(run: WorkflowRun, store: Any, handle: Any) -> str:
        return run.join_set(store, handle).id

    def last_id(run: WorkflowRun, store: Any, handle: Any) -> Any:
        js = run.join_set(store, handle)
        value = None if js.last_id is None else {js.last_id[0]: {"id": js.last_id[1]}}
        return _to_guest(value, LAST_ID_RESULT, "last-id")

    return {"[method]join-set.id": id_, "[method]join-set.last-id": last_id}


def _log_function(level: str) -> Callable[..., None]:
    def log(run: WorkflowRun, store: Any, message: str) -> None:
        run.flush_output()
        run.host.log(level, message)

    return log


def _join_set_dtor(store: Any, rep: int) -> None:
    """A guest dropped a join-set handle: close the join set (SPEC §7.3)."""
    run = current_run()
    if run is None or not run.in_guest:
        return
    js = run.join_sets.get(rep)
    if js is None or js.closed:
        return
    run.enter(lambda r, s: r.close(js), store, ())


# ---------------------------------------------------------------------------------------------
# Host functions: deployed functions (direct calls and extension functions)


def _params_json(t: Target, args: Sequence[Any]) -> list[Any]:
    return [
        _from_guest(a, pt, f"{t.label} argument {i + 1}")
        for i, (a, pt) in enumerate(zip(args, t.params, strict=True))
    ]


def _direct_call(t: Target, result_t: WitType) -> Callable[..., Any]:
    def direct(run: WorkflowRun, store: Any, *args: Any) -> Any:
        result = run.host.call(t.ffqn, _params_json(t, args))
        return _to_guest(_typed_result(result, t.returns, f"child {t.ffqn}"), result_t, t.label)

    return direct


def _submit(t: Target, result_t: WitType) -> Callable[..., Any]:
    def submit(run: WorkflowRun, store: Any, handle: Any, *args: Any) -> Any:
        js = run.join_set(store, handle)
        child = run.host.submit(js.id, t.ffqn, _params_json(t, args))
        run.child_ffqn[child] = t.ffqn
        return _to_guest({"id": child}, EXECUTION_ID, t.label)

    return submit


def _await_next(t: Target, result_t: WitType) -> Callable[..., Any]:
    def await_next(run: WorkflowRun, store: Any, handle: Any) -> Any:
        js = run.join_set(store, handle)
        answer = run.host.join_next(js.id, t.ffqn)
        value: Any
        if isinstance(answer, AllProcessed):
            value = {"err": "all-processed"}
        elif isinstance(answer, FunctionMismatch):
            response = answer.response
            js.last_id = ("execution-id", response.execution_id)
            run.child_ffqn.setdefault(response.execution_id, response.ffqn)
            value = {"err": _mismatch(t.ffqn, response)}
        elif isinstance(answer, DelayResponse):
            js.last_id = ("delay-id", answer.delay_id)
            value = {"err": _mismatch(t.ffqn, answer)}
        else:
            js.last_id = ("execution-id", answer.execution_id)
            typed = _typed_result(answer.result, t.returns, f"child {answer.execution_id}")
            value = {"ok": [{"id": answer.execution_id}, typed] if t.with_id else typed}
        return _to_guest(value, result_t, t.label)

    return await_next


def _get(t: Target, result_t: WitType) -> Callable[..., Any]:
    def get(run: WorkflowRun, store: Any, eid: Any) -> Any:
        child = _execution_id(_from_guest(eid, EXECUTION_ID, "execution-id"))
        known = run.child_ffqn.get(child)
        value: Any
        if known is not None and known != t.ffqn:
            value = {"err": _mismatch(t.ffqn, ChildResponse(child, known, {}))}
        else:
            try:
                result = run.host.get_result(child)
            except WorkflowCallError:
                value = {"err": "not-found-in-processed-responses"}
            else:
                value = {"ok": _typed_result(result, t.returns, f"child {child}")}
        return _to_guest(value, result_t, t.label)

    return get


def _schedule(t: Target, result_t: WitType) -> Callable[..., Any]:
    def schedule(run: WorkflowRun, store: Any, at: Any, *args: Any) -> Any:
        schedule_at = _schedule_at(_from_guest(at, SCHEDULE_AT, "schedule-at"))
        new_id = run.host.schedule(t.ffqn, _params_json(t, args), schedule_at)
        return _to_guest({"id": new_id}, EXECUTION_ID, t.label)

    return schedule


def _stub_function(t: Target, result_t: WitType) -> Callable[..., Any]:
    def stub(run: WorkflowRun, store: Any, eid: Any, value: Any) -> Any:
        target = _execution_id(_from_guest(eid, EXECUTION_ID, "execution-id"))
        result = _from_guest(value, t.returns, f"{t.label} value")
        outcome = _stub(run, target, result)
        if t.result is None:
            if "err" in outcome:
                raise GuestError(f"{t.label}: cannot stub {target}: {outcome['err']}")
            return None
        return _to_guest(outcome, t.result, t.label)

    return stub


#: `Target.kind` → the host function of such an import (given the target and the import's
#: result type, or R for a stub without result).
_TARGET_FUNCTIONS: dict[str, Callable[[Target, WitType], Callable[..., Any]]] = {
    "direct": _direct_call,
    "submit": _submit,
    "await-next": _await_next,
    "get": _get,
    "schedule": _schedule,
    "stub": _stub_function,
}


def _target_function(t: Target) -> Callable[..., Any]:
    assert t.kind == "stub" or t.result is not None
    result_t: WitType = t.result if t.result is not None else t.returns
    return _TARGET_FUNCTIONS[t.kind](t, result_t)


# ---------------------------------------------------------------------------------------------
# The linker: every import of the component defined

_OTHER_RESOURCES = 0x0B_5E_1000  # first id for other (WASI) resources
_JOIN_SET_FUNCS = _join_set_methods()


def _unversioned(name: str) -> str:
    return name.split("@", 1)[0]


class _ResourceIds:
    """The host resource type id of each imported resource type: `JOIN_SET_RESOURCE` for
    `join-set`, the next free id for any other (WASI) resource."""

    def __init__(self, join_set_type: wc.ResourceType | None) -> None:
        self._ids: list[tuple[wc.ResourceType, int]] = []
        if join_set_type is not None:
            self._ids.append((join_set_type, JOIN_SET_RESOURCE))

    def id_of(self, rt: wc.ResourceType) -> int:
        for known, rid in self._ids:
            if known == rt:
                return rid
        rid = _OTHER_RESOURCES + len(self._ids)
        self._ids.append((rt, rid))
        return rid


def build_linker(
    engine: wasmtime.Engine,
    imports: Sequence[ImportedInterface],
    targets: Mapping[str, Target],
    join_set_type: wc.ResourceType | None,
) -> wc.Linker:
    """A linker that defines exactly what the component imports (`imports`, validated:
    `targets` holds the target of every direct-call and extension function)."""
    resource_ids = _ResourceIds(join_set_type)
    linker = wc.Linker(engine)
    with linker.root() as root:
        for ifc in imports:
            if ifc.kind == "unsupported-item":
                continue
            with root.add_instance(ifc.name) as inst:
                for rname, rt in ifc.resources.items():
                    rid = resource_ids.id_of(rt)
                    dtor = _join_set_dtor if rid == JOIN_SET_RESOURCE else _no_dtor
                    inst.add_resource(rname, wc.ResourceType.host(rid), dtor)
                for fname, fn in ifc.functions.items():
                    impl = _host_function(ifc, fname, fn, targets, resource_ids.id_of)
                    inst.add_func(fname, _guarded(impl))
    return linker


def _host_function(
    ifc: ImportedInterface,
    name: str,
    fn: ImportedFunc,
    targets: Mapping[str, Target],
    resource_id: Callable[[wc.ResourceType], int],
) -> Callable[..., Any]:
    impl: Callable[..., Any]
    result_vt = fn.result
    if ifc.kind == "support":
        impl = _SUPPORT[name]
        if name in ("join-set-create", "join-set-create-named"):
            impl = _lowered(impl, result_vt, resource_id)
    elif ifc.kind == "types":
        impl = _JOIN_SET_FUNCS[name]
    elif ifc.kind == "log":
        impl = _log_function(name)
    elif ifc.kind == "wasi":
        found = WASI_FUNCTIONS.get((_unversioned(ifc.name), name))
        if found is None:
            impl = _unavailable(f"{ifc.name}.{name}")
        else:
            impl = _lowered(found, result_vt, resource_id)
    else:
        impl = _target_function(targets[f"{ifc.name}#{name}"])
    return impl


def _lowered(
    impl: Callable[..., Any], result_vt: Any, resource_id: Callable[[wc.ResourceType], int]
) -> Callable[..., Any]:
    def lowered(run: WorkflowRun, store: Any, *args: Any) -> Any:
        value = impl(run, store, *args)
        if result_vt is None:
            return None
        return lower_value(result_vt, value, resource_id)

    return lowered


def _no_dtor(store: Any, rep: int) -> None:
    return None


def _unavailable(name: str) -> Callable[..., Any]:
    def unavailable(run: WorkflowRun, store: Any, *args: Any) -> Any:
        raise GuestError(f"{name} is not available to workflows (SPEC §7.5)")

    return unavailable


def _guarded(impl: Callable[..., Any]) -> Callable[..., Any]:
    def host_function(store: Any, *args: Any) -> Any:
        run = current_run()
        if run is None or not run.in_guest:
            raise WasmtimeError("obelisk: a workflow host function was called outside a run")
        return run.enter(impl, store, args)

    return host_function
