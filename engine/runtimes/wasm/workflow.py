"""The `workflow_wasm` runtime: run an export of a component-model workflow deterministically
against a `WorkflowHost` (SPEC §7.2, §7.5).

`WasmWorkflowRunner(component)` inspects the component once: its exported functions (FFQNs
and WIT types, like an activity) and its imports, from which it builds a wasmtime
`component.Linker` that defines exactly what the component imports. `check(interfaces,
signatures)` verifies the imports against a deployment; `run(host, params)` instantiates
the component in a fresh `Store` on the calling thread and calls the export. Every host
function is a plain synchronous call of the `WorkflowHost` on that thread, which may block
it (waiting for a child) for as long as the host likes.

Importable interfaces
=====================

* `obelisk:workflow/workflow-support@1.0.0` — the host API of §7.2 (`engine/wit/obelisk/
  workflow@1.0.0.wit`): `random-u64`, `random-u64-inclusive`, `random-string`, `sleep`,
  `join-set-create`, `join-set-create-named`, `join-set-close`, `submit-delay`,
  `join-next`, `join-next-try`, `execution-id-current`, `execution-id-generate`,
  `submit-json`, `schedule-json`, `call-json`, `stub-json`, `get-result-json`.
* `obelisk:types/*@1.0.0` (`types@1.0.0.wit`): `time`, `execution` (types only) and
  `join-set`, whose `join-set` resource is a host resource: `id()`, `last-id()`;
  dropping a handle closes the join set (§7.3), as does `join-set-close`.
* `obelisk:log/log@1.0.0` — `trace/debug/info/warn/error(message)` → `host.log`.
* For every deployed interface `ns:pkg/ifc` (versioned or not, exactly as exported):

  | import | function | host call |
  |---|---|---|
  | `ns:pkg/ifc` | `f(args) -> R` | `host.call` (direct call) |
  | `ns:pkg-obelisk-ext/ifc` | `f-submit(join-set: borrow<join-set>, args) -> execution-id` | `host.submit` |
  | | `f-await-next(join-set: borrow<join-set>) -> result<R, await-next-extension-error>` (SPEC shape) or `-> result<tuple<execution-id, R>, await-next-extension-error>` (the original's) | `host.join_next(js, ffqn)` |
  | | `f-get(execution-id) -> result<R, get-extension-error>` | `host.get_result` |
  | `ns:pkg-obelisk-schedule/ifc` | `f-schedule(schedule-at, args) -> execution-id` | `host.schedule` |
  | `ns:pkg-obelisk-stub/ifc` | `f-stub(execution-id, R)` or `-> result<_, stub-error>` | `host.stub` |

  `args` and `R` must be the target function's parameter and return types (checked by
  `check` when it is given the deployment's signatures). Values cross as §9.2 JSON through
  `engine.wit.codec`. When a child ended in an execution failure, `R`'s err becomes
  `"execution-failed"` (a `string` err), the `execution-failed` case of a variant or enum
  err (with the failure reason when that case carries a `string`), or `err` for
  `result<T>`; any other err type cannot represent it and the workflow traps.
* WASI 0.2 (any 0.2.x), deterministic (§7.5): the runtime does not use wasmtime's WASI
  (wasmtime-py 50 cannot replace its clocks or randomness) but defines every imported WASI
  function itself: `wasi:clocks/wall-clock` is frozen at the unix epoch (resolution 1 ns),
  `wasi:clocks/monotonic-clock` at 0 (its pollables are always ready, so a sleep returns at
  once), `wasi:random/*` returns zeros, `wasi:cli/environment` is empty (no variables,
  arguments or cwd), stdin is closed, stdout/stderr lines go to `host.log` (`info` /
  `error`), terminals are absent, `wasi:filesystem/preopens` has no directories, and every
  other WASI function (filesystem, sockets, http, `exit`) traps when called — a component
  may import them (Rust's std does) as long as it does not use them.

Any other import is a `WasmWorkflowLoadError` naming it.

Results and stopping
====================
`ok(v)` → `WfOk(v)`, `err(v)` → `WfErr(v)` (§9.2 JSON). A trap → `WfTrap(reason, detail)`;
misuse of the host API (a `WorkflowCallError` from a host call without an error channel,
a bad handle, a bad argument) traps the guest with that message. A `RunAborted` raised by
the host traps the guest at once (wasm cannot catch traps), every later host call of the
run raises again, and the outcome is `WfAborted()`. `runner.interrupt(execution_id)` (from
any thread) stops a computing guest within an epoch tick (~5 ms, `WasmEngine`'s epoch
interruption) → `WfAborted()`; `run(..., spin_timeout=s)` stops a guest that computes for
more than `s` seconds without a host call → `WfTimedOut()`. An unexpected exception in a
host call (a bug) traps the guest and is re-raised by `run()`.

Which export runs: `run(host, params, ffqn=…)`, else `host.ffqn` if the host has it, else
the component's only export.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import wasmtime
from wasmtime import WasmtimeError
from wasmtime import _ffi as ffi
from wasmtime import component as wc

from engine.runtimes.outcome import (
    WfAborted,
    WfErr,
    WfOk,
    WfTimedOut,
    WfTrap,
    WorkflowOutcome,
)
from engine.runtimes.wasm.activity import (
    ComponentLoadError,
    WasmEngine,
    engine_of,
    inspect_exports,
)
from engine.runtimes.workflow_host import (
    AllProcessed,
    ChildResponse,
    DelayResponse,
    FunctionMismatch,
    FunctionShape,
    Pending,
    RunAborted,
    ScheduleAtArg,
    WorkflowCallError,
    WorkflowHost,
)
from engine.wit.codec import (
    WitValueError,
    json_to_wasmtime,
    wasmtime_to_json,
    wit_type_from_wasmtime,
)
from engine.wit.types import (
    FunctionSignature,
    WitEnum,
    WitPrimitive,
    WitResult,
    WitTuple,
    WitType,
    WitTypeError,
    WitVariant,
    format_wit_type,
    parse_wit_type,
)

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "JOIN_SET_IFC",
    "LOG_IFC",
    "TYPES_VERSION",
    "WORKFLOW_SUPPORT_IFC",
    "WasmWorkflowLoadError",
    "WasmWorkflowRunner",
    "signatures_of",
]

_log = logging.getLogger(__name__)

TYPES_VERSION = "1.0.0"
WORKFLOW_SUPPORT_IFC = "obelisk:workflow/workflow-support@1.0.0"
JOIN_SET_IFC = f"obelisk:types/join-set@{TYPES_VERSION}"
LOG_IFC = "obelisk:log/log@1.0.0"
DEFAULT_MEMORY_LIMIT = 512 * 1024 * 1024
"""Bytes of linear memory a workflow instance may use."""

_LOG_LEVELS = ("trace", "debug", "info", "warn", "error")
_EXT_SUFFIXES = {"-obelisk-ext": "ext", "-obelisk-schedule": "schedule", "-obelisk-stub": "stub"}
_INTERFACE_RE = re.compile(r"([^:/@\s]+):([^:/@\s]+)/([^/@\s]+)(@[^\s]+)?")
_ABORT_MARKER = "obelisk: workflow run aborted"
_MAX_LINE_BYTES = 64 * 1024
_MAX_RANDOM_BYTES = 1 << 24
_JOIN_SET_RESOURCE = 0x0B_5E_0001  # host resource type id of `join-set`
_OTHER_RESOURCES = 0x0B_5E_1000  # first id for other (WASI) resources


class WasmWorkflowLoadError(Exception):
    """The component cannot run as a workflow (an import this engine does not provide, or
    whose types do not match), or does not match the deployment."""


class _GuestError(Exception):
    """The guest misused an import: trap with this message."""


# ---------------------------------------------------------------------------------------------
# The types of `obelisk:types@1.0.0` and `obelisk:workflow@1.0.0`, as the codec's model.

_DATETIME_T = "record { seconds: u64, nanoseconds: u32 }"
_DURATION_T = "variant { milliseconds(u64), seconds(u64), minutes(u32), hours(u32), days(u32) }"
_SCHEDULE_AT_T = f"variant {{ now, at({_DATETIME_T}), in({_DURATION_T}) }}"
_EXECUTION_ID_T = "record { id: string }"
_FUNCTION_T = "record { interface-name: string, function-name: string }"
_RESPONSE_ID_T = f"variant {{ execution-id({_EXECUTION_ID_T}), delay-id({_EXECUTION_ID_T}) }}"
_MISMATCH_T = (
    f"record {{ specified-function: {_FUNCTION_T}, actual-function: option<{_FUNCTION_T}>, "
    f"actual-id: {_RESPONSE_ID_T} }}"
)
_JSON_RESULT_T = "result<option<string>, option<string>>"
_DYNAMIC_ERR_T = (
    "variant { ffqn-parsing-error(string), function-not-found, type-check-error(string) }"
)

DATETIME = parse_wit_type(_DATETIME_T)
SCHEDULE_AT = parse_wit_type(_SCHEDULE_AT_T)
EXECUTION_ID = parse_wit_type(_EXECUTION_ID_T)
AWAIT_NEXT_ERROR = parse_wit_type(f"variant {{ all-processed, function-mismatch({_MISMATCH_T}) }}")
GET_EXTENSION_ERROR = parse_wit_type(
    f"variant {{ function-mismatch({_MISMATCH_T}), not-found-in-processed-responses }}"
)
STUB_ERROR = parse_wit_type("variant { execution-not-found, type-check-error(string), conflict }")
_JOIN_SET_CREATE_ERR_T = "variant { conflict, invalid-name(string) }"

_OWN = "own<join-set>"
_BORROW = "borrow<join-set>"


def _fmt(text: str) -> str:
    """Normalize a type written in `parse_wit_type` syntax (handles stay as written)."""
    return format_wit_type(parse_wit_type(text))


#: `workflow-support` functions: (parameter types, result type or None), as `_render` shows them.
_SUPPORT_SIGNATURES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "random-u64": (("u64", "u64"), "u64"),
    "random-u64-inclusive": (("u64", "u64"), "u64"),
    "random-string": (("u16", "u16"), "string"),
    "sleep": ((_fmt(_SCHEDULE_AT_T), "option<string>"), _fmt(f"result<{_DATETIME_T}>")),
    "join-set-create": ((), _OWN),
    "join-set-create-named": (
        ("string",),
        f"result<{_OWN}, {_fmt(_JOIN_SET_CREATE_ERR_T)}>",
    ),
    "join-set-close": ((_OWN,), None),
    "submit-delay": ((_BORROW, _fmt(_SCHEDULE_AT_T)), _fmt(_EXECUTION_ID_T)),
    "join-next": ((_BORROW,), _fmt(f"result<{_JSON_RESULT_T}, variant {{ all-processed }}>")),
    "join-next-try": (
        (_BORROW,),
        _fmt(f"result<{_JSON_RESULT_T}, variant {{ all-processed, pending }}>"),
    ),
    "execution-id-current": ((), _fmt(_EXECUTION_ID_T)),
    "execution-id-generate": ((), _fmt(_EXECUTION_ID_T)),
    "submit-json": (
        (_BORROW, _fmt(_FUNCTION_T), "string"),
        _fmt(f"result<{_EXECUTION_ID_T}, {_DYNAMIC_ERR_T}>"),
    ),
    "schedule-json": (
        (_fmt(_SCHEDULE_AT_T), _fmt(_FUNCTION_T), "string"),
        _fmt(f"result<{_EXECUTION_ID_T}, {_DYNAMIC_ERR_T}>"),
    ),
    "call-json": (
        (_fmt(_FUNCTION_T), "string"),
        _fmt(f"result<{_JSON_RESULT_T}, {_DYNAMIC_ERR_T}>"),
    ),
    "stub-json": (
        (_fmt(_EXECUTION_ID_T), "string"),
        _fmt(
            "result<_, variant { execution-id-parsing-error(string), execution-not-found, "
            "type-check-error(string), conflict }>"
        ),
    ),
    "get-result-json": (
        (_fmt(_EXECUTION_ID_T),),
        _fmt(
            f"result<{_JSON_RESULT_T}, variant {{ execution-id-parsing-error(string), "
            "not-found-in-processed-responses }>"
        ),
    ),
}

_JOIN_SET_METHODS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "[method]join-set.id": ((_BORROW,), "string"),
    "[method]join-set.last-id": ((_BORROW,), _fmt(f"option<{_RESPONSE_ID_T}>")),
}


def _t(text: str) -> WitType:
    return parse_wit_type(text)


_RESULT_DATETIME = _t(f"result<{_DATETIME_T}>")
_JOIN_NEXT_RESULT = _t(f"result<{_JSON_RESULT_T}, variant {{ all-processed }}>")
_JOIN_NEXT_TRY_RESULT = _t(f"result<{_JSON_RESULT_T}, variant {{ all-processed, pending }}>")
_DYNAMIC_ID_RESULT = _t(f"result<{_EXECUTION_ID_T}, {_DYNAMIC_ERR_T}>")
_CALL_JSON_RESULT = _t(f"result<{_JSON_RESULT_T}, {_DYNAMIC_ERR_T}>")
_STUB_JSON_RESULT = _t(
    "result<_, variant { execution-id-parsing-error(string), execution-not-found, "
    "type-check-error(string), conflict }>"
)
_GET_RESULT_JSON_RESULT = _t(
    f"result<{_JSON_RESULT_T}, variant {{ execution-id-parsing-error(string), "
    "not-found-in-processed-responses }>"
)
_LAST_ID = _t(f"option<{_RESPONSE_ID_T}>")
_STRING = WitPrimitive("string")


# ---------------------------------------------------------------------------------------------
# Rendering and lowering wasmtime types


def _render(vt: Any, join_set: wc.ResourceType | None) -> str:
    """A wasmtime component type as WIT text (`format_wit_type`), handles as `own<join-set>`
    / `borrow<join-set>` (or `own<resource>` for any other resource)."""
    if isinstance(vt, wc.OwnType | wc.BorrowType):
        kind = "own" if isinstance(vt, wc.OwnType) else "borrow"
        name = "join-set" if join_set is not None and vt.ty == join_set else "resource"
        return f"{kind}<{name}>"
    try:
        return format_wit_type(wit_type_from_wasmtime(vt))
    except WitTypeError:
        pass
    if isinstance(vt, wc.ResultType):
        ok = "_" if vt.ok is None else _render(vt.ok, join_set)
        if vt.err is None:
            return "result" if vt.ok is None else f"result<{ok}>"
        return f"result<{ok}, {_render(vt.err, join_set)}>"
    if isinstance(vt, wc.OptionType):
        return f"option<{_render(vt.payload, join_set)}>"
    if isinstance(vt, wc.ListType):
        return f"list<{_render(vt.element, join_set)}>"
    if isinstance(vt, wc.TupleType):
        return f"tuple<{', '.join(_render(e, join_set) for e in vt.elements)}>"
    if isinstance(vt, wc.RecordType):
        return "record { " + ", ".join(f"{n}: {_render(t, join_set)}" for n, t in vt.fields) + " }"
    if isinstance(vt, wc.VariantType):
        cases = ", ".join(n if t is None else f"{n}({_render(t, join_set)})" for n, t in vt.cases)
        return f"variant {{ {cases} }}"
    return type(vt).__name__


@dataclass(frozen=True, slots=True)
class _Case:
    """A case of a variant, option (`none`/`some`) or result (`ok`/`err`) for `_lower`."""

    name: str
    payload: Any = None


@dataclass(frozen=True, slots=True)
class _Own:
    """An owned handle of a host resource, for `_lower`."""

    rep: int


def _lower(vt: Any, value: Any, resource_id: Callable[[wc.ResourceType], int]) -> Any:
    """Build the wasmtime-py value of type `vt` from a plain description: `_Case` for
    variant-like types, dicts (kebab-case keys) for records, `_Own` for owned handles."""
    if isinstance(vt, wc.OwnType):
        assert isinstance(value, _Own)
        return wc.ResourceHost.own(value.rep, resource_id(vt.ty))
    if isinstance(vt, wc.VariantType | wc.OptionType | wc.ResultType):
        assert isinstance(value, _Case), value
        cases = dict(vt._cases())
        payload_t = cases[value.name]
        payload = None if payload_t is None else _lower(payload_t, value.payload, resource_id)
        return wc.Variant(value.name, payload) if vt._tagged() else payload
    if isinstance(vt, wc.RecordType):
        record = wc.Record()
        for name, ft in vt.fields:
            setattr(record, name, _lower(ft, value[name], resource_id))
        return record
    if isinstance(vt, wc.ListType):
        if isinstance(vt.element, wc.U8):
            return bytes(value)
        return [_lower(vt.element, v, resource_id) for v in value]
    if isinstance(vt, wc.TupleType):
        return tuple(_lower(t, v, resource_id) for t, v in zip(vt.elements, value, strict=True))
    return value


# ---------------------------------------------------------------------------------------------
# Import analysis


@dataclass(frozen=True, slots=True)
class _ImportedFunc:
    name: str
    params: tuple[tuple[str, Any], ...]  # wasmtime value types
    result: Any  # wasmtime value type or None


@dataclass(slots=True)
class _ImportedInterface:
    name: str
    kind: str  # support | types | log | wasi | direct | ext | schedule | stub
    target: str | None  # the deployed interface for direct/ext/schedule/stub
    functions: dict[str, _ImportedFunc] = field(default_factory=dict)
    resources: dict[str, wc.ResourceType] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Target:
    """An import that reaches a deployed function (direct call or extension function)."""

    kind: str  # direct | submit | await-next | get | schedule | stub
    ffqn: str
    label: str  # `ns:pkg-obelisk-ext/ifc.f-submit`, for messages
    params: tuple[WitType, ...]  # the target's parameters, as the import declares them
    returns: WitResult  # R, the target's return type, as the import declares it
    result: WitType | None  # the import function's own result type
    with_id: bool = False  # await-next returns tuple<execution-id, R>


def _split_interface(name: str) -> tuple[str, str, str, str] | None:
    m = _INTERFACE_RE.fullmatch(name)
    if m is None:
        return None
    return m.group(1), m.group(2), m.group(3), m.group(4) or ""


def _classify(name: str) -> tuple[str, str | None]:
    if name.startswith("wasi:"):
        return "wasi", None
    if name == WORKFLOW_SUPPORT_IFC:
        return "support", None
    if name == LOG_IFC:
        return "log", None
    split = _split_interface(name)
    if split is None:
        return "unsupported", None
    ns, pkg, ifc, version = split
    if ns == "obelisk":
        if pkg == "types" and version == f"@{TYPES_VERSION}":
            return "types", None
        return "unsupported", None
    for suffix, kind in _EXT_SUFFIXES.items():
        if pkg.endswith(suffix) and len(pkg) > len(suffix):
            return kind, f"{ns}:{pkg[: -len(suffix)]}/{ifc}{version}"
    return "direct", name


def workflow_only_imports(component: wc.Component, engine: wasmtime.Engine) -> list[str]:
    """The imports of `component` that only a workflow is given (the workflow host API,
    extension interfaces, other components' functions): an activity importing one can
    never be instantiated."""
    return [
        name
        for name in component.type.imports(engine)
        if _classify(name)[0] not in ("wasi", "log", "types", "unsupported")
    ]


def _inspect_imports(component: wc.Component, engine: wasmtime.Engine) -> list[_ImportedInterface]:
    out: list[_ImportedInterface] = []
    for name, ext in component.type.imports(engine).items():
        ty = ext.ty
        kind, target = _classify(name)
        if not isinstance(ty, wc.ComponentInstanceType):
            out.append(_ImportedInterface(name, "unsupported-item", None))
            continue
        ifc = _ImportedInterface(name, kind, target)
        for item_name, item in ty.exports(engine).items():
            it = item.ty
            if isinstance(it, wc.FuncType):
                ifc.functions[item_name] = _ImportedFunc(item_name, tuple(it.params), it.result)
            elif isinstance(it, wc.ResourceType):
                ifc.resources[item_name] = it
        out.append(ifc)
    return out


def signatures_of(registry_functions: Mapping[str, Any]) -> dict[str, FunctionSignature]:
    """Deployed FFQN → signature, from `Registry.functions` (FFQN → (FunctionInfo, …))."""
    out: dict[str, FunctionSignature] = {}
    for ffqn, entry in registry_functions.items():
        info = entry[0] if isinstance(entry, tuple) else entry
        out[ffqn] = FunctionSignature([(p.name, p.type) for p in info.params], info.return_type)
    return out


# ---------------------------------------------------------------------------------------------
# Per-run state


@dataclass(slots=True)
class _JoinSet:
    id: str
    closed: bool = False
    last_id: tuple[str, str] | None = None  # ("execution-id" | "delay-id", id)


_CURRENT = threading.local()


def _current() -> _Run | None:
    run: _Run | None = getattr(_CURRENT, "run", None)
    return run


class _Run:
    """One run of the guest; reachable from host functions through a thread-local."""

    def __init__(self, host: WorkflowHost, spin_timeout: float | None) -> None:
        self.host = host
        self.execution_id = host.execution_id
        self.spin_timeout = spin_timeout
        self.stop = False  # interrupt() was called
        self.aborted = False  # the host raised RunAborted
        self.timed_out = False
        self.trap: str | None = None
        self.host_failure: BaseException | None = None
        self.in_guest = False
        self.guest_since = time.monotonic()
        self.join_sets: dict[int, _JoinSet] = {}
        self.join_set_ids: set[str] = set()
        self.child_ffqn: dict[str, str] = {}
        self._partial: dict[int, bytes] = {1: b"", 2: b""}

    # -- guarding host calls --

    def enter(self, impl: Callable[..., Any], store: Any, args: Sequence[Any]) -> Any:
        """Run a host function: map host exceptions to traps (see the module docstring)."""
        if self.aborted or self.stop or self.host_failure is not None:
            self.aborted = True
            raise WasmtimeError(_ABORT_MARKER)
        try:
            return impl(self, store, *args)
        except RunAborted:
            self.aborted = True
            raise WasmtimeError(_ABORT_MARKER) from None
        except (WorkflowCallError, _GuestError) as e:
            message = str(e) or type(e).__name__
            if self.trap is None:
                self.trap = message
            raise WasmtimeError(message) from None
        except WasmtimeError:
            raise
        except BaseException as e:  # a bug in the host or here: stop, re-raise from run()
            self.host_failure = e
            raise WasmtimeError(_ABORT_MARKER) from None
        finally:
            self.guest_since = time.monotonic()

    def check(self) -> str | None:
        """Epoch tick (on the guest's thread, only while guest code runs)."""
        if self.stop or self.aborted or self.host_failure is not None:
            return "aborted"
        if (
            self.spin_timeout is not None
            and time.monotonic() - self.guest_since > self.spin_timeout
        ):
            self.timed_out = True
            return "timeout"
        return None

    # -- join sets --

    def new_join_set(self, join_set_id: str) -> _Own:
        rep = len(self.join_sets) + 1
        self.join_sets[rep] = _JoinSet(join_set_id)
        self.join_set_ids.add(join_set_id)
        return _Own(rep)

    def join_set(self, store: Any, handle: Any) -> _JoinSet:
        if not isinstance(handle, wc.ResourceAny):
            raise _GuestError(f"expected a join-set handle, got {type(handle).__name__}")
        try:
            host = handle.to_host(store)
        except WasmtimeError as e:
            raise _GuestError(f"not a join-set handle: {_cause(str(e))}") from None
        if host.type != _JOIN_SET_RESOURCE:
            raise _GuestError("not a join-set handle")
        js = self.join_sets.get(host.rep)
        if js is None:
            raise _GuestError(f"unknown join-set handle {host.rep}")
        return js

    def close(self, js: _JoinSet) -> None:
        if not js.closed:
            js.closed = True
            self.host.join_set_close(js.id)

    # -- stdout / stderr --

    def write(self, stream: int, data: bytes) -> None:
        if stream not in self._partial:
            return
        buf = self._partial[stream] + data
        *lines, rest = buf.split(b"\n")
        while len(rest) > _MAX_LINE_BYTES:
            lines.append(rest[:_MAX_LINE_BYTES])
            rest = rest[_MAX_LINE_BYTES:]
        self._partial[stream] = rest
        for line in lines:
            self._emit(stream, line)

    def flush_output(self) -> None:
        for stream, rest in list(self._partial.items()):
            if rest:
                self._partial[stream] = b""
                self._emit(stream, rest)

    def _emit(self, stream: int, line: bytes) -> None:
        text = line.removesuffix(b"\r").decode("utf-8", errors="replace")
        try:
            self.host.log("info" if stream == 1 else "error", text)
        except RunAborted:
            raise
        except Exception:
            _log.exception("workflow %s: cannot store a log line", self.execution_id)


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
    if err == _STRING:
        return {"err": "execution-failed"}
    if isinstance(err, WitEnum) and "execution-failed" in err.cases:
        return {"err": "execution-failed"}
    if isinstance(err, WitVariant):
        cases = dict(err.cases)
        if "execution-failed" in cases:
            payload = cases["execution-failed"]
            if payload is None:
                return {"err": "execution-failed"}
            if payload == _STRING:
                reason = failure.get("reason", "") if isinstance(failure, Mapping) else ""
                return {"err": {"execution-failed": reason or _failure_text(failure)}}
    raise _GuestError(
        f"{what} ended in an execution failure ({_failure_text(failure)}), which its err type "
        f"{format_wit_type(err)} cannot represent (use `string` or a variant with an "
        "`execution-failed` case)"
    )


def _to_guest(value: Any, t: WitType, what: str) -> Any:
    try:
        return json_to_wasmtime(value, t, what)
    except WitValueError as e:
        raise _GuestError(f"cannot pass {what} to the workflow: {e}") from None


def _from_guest(value: Any, t: WitType, what: str) -> Any:
    try:
        return wasmtime_to_json(value, t, what)
    except WitValueError as e:
        raise _GuestError(f"cannot read {what}: {e}") from None


def _function_json(ffqn: str) -> dict[str, str]:
    interface, _, function = ffqn.rpartition(".")
    return {"interface_name": interface, "function_name": function}


def _ffqn_of(function: Any) -> str:
    interface = str(function["interface_name"])
    name = str(function["function_name"])
    if "." in name or not name or _split_interface(interface) is None:
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


def _support_functions() -> dict[str, Callable[..., Any]]:
    def random_u64(run: _Run, store: Any, lo: int, hi_exclusive: int) -> int:
        if hi_exclusive <= lo:
            raise _GuestError(f"random-u64: empty range [{lo}, {hi_exclusive})")
        return run.host.random_u64(lo, hi_exclusive - 1)

    def random_u64_inclusive(run: _Run, store: Any, lo: int, hi: int) -> int:
        if hi < lo:
            raise _GuestError(f"random-u64-inclusive: empty range [{lo}, {hi}]")
        return run.host.random_u64(lo, hi)

    def random_string(run: _Run, store: Any, min_len: int, max_len_exclusive: int) -> str:
        if max_len_exclusive <= min_len:
            raise _GuestError(f"random-string: empty length range [{min_len}, {max_len_exclusive})")
        return run.host.random_string(min_len, max_len_exclusive)

    def sleep(run: _Run, store: Any, at: Any, name: str | None) -> Any:
        woke = run.host.sleep(_schedule_at(_from_guest(at, SCHEDULE_AT, "schedule-at")), name)
        value = {"err": None} if woke is None else {"ok": _datetime(woke)}
        return _to_guest(value, _RESULT_DATETIME, "sleep result")

    def join_set_create(run: _Run, store: Any) -> Any:
        return run.new_join_set(run.host.join_set_create())

    def join_set_create_named(run: _Run, store: Any, name: str) -> Any:
        if f"n:{name}" in run.join_set_ids:
            return _Case("err", _Case("conflict"))
        try:
            js_id = run.host.join_set_create(name)
        except WorkflowCallError as e:
            if "already exists" in str(e):
                return _Case("err", _Case("conflict"))
            return _Case("err", _Case("invalid-name", str(e)))
        return _Case("ok", run.new_join_set(js_id))

    def join_set_close(run: _Run, store: Any, handle: Any) -> None:
        js = run.join_set(store, handle)
        run.close(js)
        with contextlib.suppress(WasmtimeError):
            handle.drop(store)  # our destructor sees a closed join set: nothing more to do

    def submit_delay(run: _Run, store: Any, handle: Any, at: Any) -> Any:
        js = run.join_set(store, handle)
        delay_id = run.host.submit_delay(
            js.id, _schedule_at(_from_guest(at, SCHEDULE_AT, "timeout"))
        )
        return _to_guest({"id": delay_id}, EXECUTION_ID, "delay-id")

    def answer_json(js: _JoinSet, answer: Any) -> dict[str, Any] | None:
        if isinstance(answer, ChildResponse):
            js.last_id = ("execution-id", answer.execution_id)
            return {"ok": _json_result(answer.result)}
        if isinstance(answer, DelayResponse):
            js.last_id = ("delay-id", answer.delay_id)
            return {"ok": {"ok": None} if answer.outcome == "ok" else {"err": None}}
        return None

    def join_next(run: _Run, store: Any, handle: Any) -> Any:
        js = run.join_set(store, handle)
        answer = run.host.join_next(js.id)
        if isinstance(answer, FunctionMismatch):  # not asked for; treat as the response
            answer = answer.response
        value = answer_json(js, answer)
        if value is None:
            value = {"err": "all-processed"}
        return _to_guest(value, _JOIN_NEXT_RESULT, "join-next result")

    def join_next_try(run: _Run, store: Any, handle: Any) -> Any:
        js = run.join_set(store, handle)
        answer = run.host.join_next_try(js.id)
        value = answer_json(js, answer)
        if value is None:
            value = {"err": "pending" if isinstance(answer, Pending) else "all-processed"}
        return _to_guest(value, _JOIN_NEXT_TRY_RESULT, "join-next-try result")

    def execution_id_current(run: _Run, store: Any) -> Any:
        return _to_guest({"id": run.execution_id}, EXECUTION_ID, "execution-id")

    def execution_id_generate(run: _Run, store: Any) -> Any:
        return _to_guest({"id": run.host.execution_id_generate()}, EXECUTION_ID, "execution-id")

    def parse_dynamic(run: _Run, function: Any, params: str) -> tuple[str, list[Any]] | Any:
        try:
            ffqn = _ffqn_of(_from_guest(function, parse_wit_type(_FUNCTION_T), "function"))
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

    def submit_json(run: _Run, store: Any, handle: Any, function: Any, params: str) -> Any:
        js = run.join_set(store, handle)
        parsed = parse_dynamic(run, function, params)
        if isinstance(parsed, tuple):
            ffqn, values = parsed
            try:
                child = run.host.submit(js.id, ffqn, values)
            except WorkflowCallError as e:
                parsed = {"err": {"type-check-error": str(e)}}
            else:
                run.child_ffqn[child] = ffqn
                parsed = {"ok": {"id": child}}
        return _to_guest(parsed, _DYNAMIC_ID_RESULT, "submit-json result")

    def schedule_json(run: _Run, store: Any, at: Any, function: Any, params: str) -> Any:
        schedule_at = _schedule_at(_from_guest(at, SCHEDULE_AT, "schedule-at"))
        parsed = parse_dynamic(run, function, params)
        if isinstance(parsed, tuple):
            ffqn, values = parsed
            try:
                parsed = {"ok": {"id": run.host.schedule(ffqn, values, schedule_at)}}
            except WorkflowCallError as e:
                parsed = {"err": {"type-check-error": str(e)}}
        return _to_guest(parsed, _DYNAMIC_ID_RESULT, "schedule-json result")

    def call_json(run: _Run, store: Any, function: Any, params: str) -> Any:
        parsed = parse_dynamic(run, function, params)
        if isinstance(parsed, tuple):
            ffqn, values = parsed
            try:
                parsed = {"ok": _json_result(run.host.call(ffqn, values))}
            except WorkflowCallError as e:
                parsed = {"err": {"type-check-error": str(e)}}
        return _to_guest(parsed, _CALL_JSON_RESULT, "call-json result")

    def stub_json(run: _Run, store: Any, eid: Any, result_json: str) -> Any:
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
        return _to_guest(value, _STUB_JSON_RESULT, "stub-json result")

    def get_result_json(run: _Run, store: Any, eid: Any) -> Any:
        target = _execution_id(_from_guest(eid, EXECUTION_ID, "execution-id"))
        value: Any
        if not target.startswith("E_"):
            value = {"err": {"execution-id-parsing-error": f"not an execution id: {target!r}"}}
        else:
            try:
                value = {"ok": _json_result(run.host.get_result(target))}
            except WorkflowCallError:
                value = {"err": "not-found-in-processed-responses"}
        return _to_guest(value, _GET_RESULT_JSON_RESULT, "get-result-json result")

    return {
        "random-u64": random_u64,
        "random-u64-inclusive": random_u64_inclusive,
        "random-string": random_string,
        "sleep": sleep,
        "join-set-create": join_set_create,
        "join-set-create-named": join_set_create_named,
        "join-set-close": join_set_close,
        "submit-delay": submit_delay,
        "join-next": join_next,
        "join-next-try": join_next_try,
        "execution-id-current": execution_id_current,
        "execution-id-generate": execution_id_generate,
        "submit-json": submit_json,
        "schedule-json": schedule_json,
        "call-json": call_json,
        "stub-json": stub_json,
        "get-result-json": get_result_json,
    }


def _stub(run: _Run, target: str, result: Any) -> dict[str, Any]:
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
    def id_(run: _Run, store: Any, handle: Any) -> str:
        return run.join_set(store, handle).id

    def last_id(run: _Run, store: Any, handle: Any) -> Any:
        js = run.join_set(store, handle)
        value = None if js.last_id is None else {js.last_id[0]: {"id": js.last_id[1]}}
        return _to_guest(value, _LAST_ID, "last-id")

    return {"[method]join-set.id": id_, "[method]join-set.last-id": last_id}


def _log_function(level: str) -> Callable[..., None]:
    def log(run: _Run, store: Any, message: str) -> None:
        run.flush_output()
        run.host.log(level, message)

    return log


def _join_set_dtor(store: Any, rep: int) -> None:
    """A guest dropped a join-set handle: close the join set (SPEC §7.3)."""
    run = _current()
    if run is None or not run.in_guest:
        return
    js = run.join_sets.get(rep)
    if js is None or js.closed:
        return
    run.enter(lambda r, s: r.close(js), store, ())


# ---------------------------------------------------------------------------------------------
# Host functions: deployed functions (direct calls and extension functions)


def _target_function(t: _Target) -> Callable[..., Any]:
    def params_json(args: Sequence[Any]) -> list[Any]:
        return [
            _from_guest(a, pt, f"{t.label} argument {i + 1}")
            for i, (a, pt) in enumerate(zip(args, t.params, strict=True))
        ]

    def child_value(result: Mapping[str, Any], what: str) -> dict[str, Any]:
        return _typed_result(result, t.returns, what)

    assert t.kind == "stub" or t.result is not None
    result_t: WitType = t.result if t.result is not None else t.returns

    if t.kind == "direct":

        def direct(run: _Run, store: Any, *args: Any) -> Any:
            result = run.host.call(t.ffqn, params_json(args))
            return _to_guest(child_value(result, f"child {t.ffqn}"), result_t, t.label)

        return direct

    if t.kind == "submit":

        def submit(run: _Run, store: Any, handle: Any, *args: Any) -> Any:
            js = run.join_set(store, handle)
            child = run.host.submit(js.id, t.ffqn, params_json(args))
            run.child_ffqn[child] = t.ffqn
            return _to_guest({"id": child}, EXECUTION_ID, t.label)

        return submit

    if t.kind == "await-next":

        def await_next(run: _Run, store: Any, handle: Any) -> Any:
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
                typed = child_value(answer.result, f"child {answer.execution_id}")
                value = {"ok": [{"id": answer.execution_id}, typed] if t.with_id else typed}
            return _to_guest(value, result_t, t.label)

        return await_next

    if t.kind == "get":

        def get(run: _Run, store: Any, eid: Any) -> Any:
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
                    value = {"ok": child_value(result, f"child {child}")}
            return _to_guest(value, result_t, t.label)

        return get

    if t.kind == "schedule":

        def schedule(run: _Run, store: Any, at: Any, *args: Any) -> Any:
            schedule_at = _schedule_at(_from_guest(at, SCHEDULE_AT, "schedule-at"))
            new_id = run.host.schedule(t.ffqn, params_json(args), schedule_at)
            return _to_guest({"id": new_id}, EXECUTION_ID, t.label)

        return schedule

    def stub(run: _Run, store: Any, eid: Any, value: Any) -> Any:
        target = _execution_id(_from_guest(eid, EXECUTION_ID, "execution-id"))
        result = _from_guest(value, t.returns, f"{t.label} value")
        outcome = _stub(run, target, result)
        if t.result is None:
            if "err" in outcome:
                raise _GuestError(f"{t.label}: cannot stub {target}: {outcome['err']}")
            return None
        return _to_guest(outcome, t.result, t.label)

    return stub


# ---------------------------------------------------------------------------------------------
# Host functions: deterministic WASI 0.2


def _stream_rep(store: Any, handle: Any) -> int:
    try:
        return int(handle.to_host(store).rep)
    except (WasmtimeError, AttributeError):
        return -1


_OK_NONE = _Case("ok", None)
_CLOSED = _Case("err", _Case("closed"))
_POLLABLE = _Own(0)


def _wasi_functions() -> dict[tuple[str, str], Callable[..., Any]]:
    """(interface without version, function) → implementation returning a `_lower` value."""

    def const(value: Any) -> Callable[..., Any]:
        return lambda run, store, *args: value

    def zero_bytes(run: _Run, store: Any, n: int) -> bytes:
        if n > _MAX_RANDOM_BYTES:
            raise _GuestError(f"asked for {n} random bytes")
        return bytes(n)

    def write(run: _Run, store: Any, handle: Any, contents: bytes) -> _Case:
        run.write(_stream_rep(store, handle), bytes(contents))
        return _OK_NONE

    def write_zeroes(run: _Run, store: Any, handle: Any, n: int) -> _Case:
        run.write(_stream_rep(store, handle), bytes(min(n, _MAX_LINE_BYTES)))
        return _OK_NONE

    def exit_(run: _Run, store: Any, status: Any) -> None:
        code = status if isinstance(status, int) else (0 if status is None else 1)
        raise _GuestError(f"the workflow called wasi:cli/exit (code {code})")

    def poll(run: _Run, store: Any, pollables: list[Any]) -> list[int]:
        return list(range(len(pollables)))

    out: dict[tuple[str, str], Callable[..., Any]] = {
        ("wasi:clocks/wall-clock", "now"): const({"seconds": 0, "nanoseconds": 0}),
        ("wasi:clocks/wall-clock", "resolution"): const({"seconds": 0, "nanoseconds": 1}),
        ("wasi:clocks/monotonic-clock", "now"): const(0),
        ("wasi:clocks/monotonic-clock", "resolution"): const(1),
        ("wasi:clocks/monotonic-clock", "subscribe-instant"): const(_POLLABLE),
        ("wasi:clocks/monotonic-clock", "subscribe-duration"): const(_POLLABLE),
        ("wasi:random/random", "get-random-bytes"): zero_bytes,
        ("wasi:random/random", "get-random-u64"): const(0),
        ("wasi:random/insecure", "get-insecure-random-bytes"): zero_bytes,
        ("wasi:random/insecure", "get-insecure-random-u64"): const(0),
        ("wasi:random/insecure-seed", "insecure-seed"): const((0, 0)),
        ("wasi:cli/environment", "get-environment"): const([]),
        ("wasi:cli/environment", "get-arguments"): const([]),
        ("wasi:cli/environment", "initial-cwd"): const(_Case("none")),
        ("wasi:cli/exit", "exit"): exit_,
        ("wasi:cli/exit", "exit-with-code"): exit_,
        ("wasi:cli/stdin", "get-stdin"): const(_Own(0)),
        ("wasi:cli/stdout", "get-stdout"): const(_Own(1)),
        ("wasi:cli/stderr", "get-stderr"): const(_Own(2)),
        ("wasi:cli/terminal-stdin", "get-terminal-stdin"): const(_Case("none")),
        ("wasi:cli/terminal-stdout", "get-terminal-stdout"): const(_Case("none")),
        ("wasi:cli/terminal-stderr", "get-terminal-stderr"): const(_Case("none")),
        ("wasi:io/error", "[method]error.to-debug-string"): const(""),
        ("wasi:io/poll", "[method]pollable.ready"): const(True),
        ("wasi:io/poll", "[method]pollable.block"): const(None),
        ("wasi:io/poll", "poll"): poll,
        ("wasi:filesystem/preopens", "get-directories"): const([]),
        ("wasi:filesystem/types", "filesystem-error-code"): const(_Case("none")),
    }
    streams = "wasi:io/streams"
    for method in ("write", "blocking-write-and-flush"):
        out[streams, f"[method]output-stream.{method}"] = write
    for method in ("write-zeroes", "blocking-write-zeroes-and-flush"):
        out[streams, f"[method]output-stream.{method}"] = write_zeroes
    for method in ("flush", "blocking-flush"):
        out[streams, f"[method]output-stream.{method}"] = const(_OK_NONE)
    out[streams, "[method]output-stream.check-write"] = const(_Case("ok", 1 << 20))
    for method in ("splice", "blocking-splice"):
        out[streams, f"[method]output-stream.{method}"] = const(_Case("ok", 0))
    for method in ("read", "blocking-read", "skip", "blocking-skip"):
        out[streams, f"[method]input-stream.{method}"] = const(_CLOSED)
    for resource in ("input-stream", "output-stream"):
        out[streams, f"[method]{resource}.subscribe"] = const(_POLLABLE)
    return out


_SUPPORT = _support_functions()
_JOIN_SET_FUNCS = _join_set_methods()
_WASI = _wasi_functions()


def _unversioned(name: str) -> str:
    return name.split("@", 1)[0]


# ---------------------------------------------------------------------------------------------
# Calling an export, reading traps


@dataclass(frozen=True, slots=True)
class _Export:
    """An exported function: its export index (valid for every instance) and types."""

    index: Any  # wc.ExportIndex
    params: tuple[Any, ...]  # wasmtime-py ValTypes
    ok: Any  # ValType of the ok payload, or None
    err: Any  # ValType of the err payload, or None


def _call_export(
    func: wc.Func, store: wasmtime.Store, export: _Export, args: Sequence[Any]
) -> tuple[bool, Any]:
    """Call an export returning `result<…>` → (is_ok, payload as wasmtime-py lifts it).

    Like `Func.__call__` of wasmtime-py 50, without its process-global slot for host
    exceptions (our host functions only raise `WasmtimeError`), and reading the result's
    case from the C value rather than guessing it from the payload's Python class.
    """
    if len(args) != len(export.params):
        raise TypeError(f"expected {len(export.params)} arguments, got {len(args)}")
    param_capi = (ffi.wasmtime_component_val_t * max(len(args), 1))()
    n = 0
    try:
        for ty, value in zip(export.params, args, strict=True):
            ty.convert_to_c(store, value, ctypes.pointer(param_capi[n]))
            n += 1
        result_space = ffi.wasmtime_component_val_t()
        error = ffi.wasmtime_component_func_call(
            ctypes.byref(func._func), store._context(), param_capi, n, ctypes.byref(result_space), 1
        )
        if error:
            raise WasmtimeError._from_ptr(error)
        if result_space.kind != ffi.WASMTIME_COMPONENT_RESULT.value:
            raise TypeError("the function did not return a result")
        is_ok = bool(result_space.of.result.is_ok)
        payload_ty = export.ok if is_ok else export.err
        ptr = result_space.of.result.val
        if payload_ty is None or not ptr:
            return is_ok, None
        payload = payload_ty.convert_from_c(ptr.contents)
        ptr.contents.kind = ffi.WASMTIME_COMPONENT_BOOL  # the payload now belongs to Python
        ptr.contents.of.boolean = False
        ffi.wasmtime_component_val_delete(ptr)
        return is_ok, payload
    finally:
        for i in range(n):
            ffi.wasmtime_component_val_delete(ctypes.byref(param_capi[i]))


def _post_return(func: wc.Func, store: wasmtime.Store) -> None:
    error = ffi.wasmtime_component_func_post_return(ctypes.byref(func._func), store._context())
    if error:
        raise WasmtimeError._from_ptr(error)


def _causes(message: str) -> list[str]:
    """The lines of a wasmtime (anyhow) error: the context, then each numbered cause."""
    head, _, tail = message.partition("Caused by:")
    lines = [head.strip().splitlines()[0].strip().rstrip(":")] if head.strip() else []
    for line in tail.strip().splitlines():
        line = re.sub(r"^\d+:\s*", "", line.strip())
        if line:
            lines.append(line)
    return lines


def _cause(message: str) -> str:
    lines = [x for x in _causes(message) if not x.startswith("error while executing at wasm")]
    return ": ".join(lines) or message.strip()


_TRAP_NAMES = {
    "wasm `unreachable` instruction executed": "unreachable",
    "integer divide by zero": "integer divide by zero",
    "out of bounds memory access": "out of bounds memory access",
    "call stack exhausted": "stack overflow",
}


def _trap_reason(error: WasmtimeError) -> str:
    causes = _causes(str(error))
    cause = causes[-1] if causes else str(error).strip()
    if cause.startswith("wasm trap: "):
        what = cause.removeprefix("wasm trap: ")
        return f"trap: {_TRAP_NAMES.get(what, what)}"
    return f"trap: {cause}"[:300]


# ---------------------------------------------------------------------------------------------
# The runner


class WasmWorkflowRunner:
    """Runs the exported functions of one `workflow_wasm` component; one fresh instance
    (and store) per `run()`. Construction inspects the component and raises
    `WasmWorkflowLoadError` for imports this engine cannot provide; `check()` verifies the
    imports against a deployment."""

    def __init__(
        self,
        component: wc.Component,
        engine: WasmEngine | None = None,
        *,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        label: str = "component",
    ) -> None:
        self.component = component
        self.engine = engine or engine_of(component)
        self.memory_limit = memory_limit
        self.label = label
        try:
            self.exports: dict[str, FunctionSignature] = inspect_exports(component, self.engine)
        except ComponentLoadError as e:
            raise WasmWorkflowLoadError(f"{label}: {e}") from None
        if not self.exports:
            raise WasmWorkflowLoadError(f"{label}: the component exports no functions")
        eng = self.engine.engine
        self._exports = self._export_table(eng)
        self._imports = _inspect_imports(component, eng)
        self._join_set_type = self._find_join_set_type()
        self.targets: dict[str, _Target] = {}  # "<import>#<function>" → target
        problems = self._validate_imports()
        if problems:
            raise WasmWorkflowLoadError(
                f"{label}: cannot run as a workflow:\n  " + "\n  ".join(problems)
            )
        self._resource_ids: list[tuple[wc.ResourceType, int]] = []
        if self._join_set_type is not None:
            self._resource_ids.append((self._join_set_type, _JOIN_SET_RESOURCE))
        self._linker = self._build_linker()
        self._lock = threading.Lock()
        self._active: set[_Run] = set()

    # -- inspection --

    def _export_table(self, eng: wasmtime.Engine) -> dict[str, _Export]:
        out: dict[str, _Export] = {}
        exported = self.component.type.exports(eng)
        for ffqn in self.exports:
            interface, _, function = ffqn.rpartition(".")
            ifc_index = self.component.get_export_index(interface)
            index = (
                None if ifc_index is None else self.component.get_export_index(function, ifc_index)
            )
            ifc_type = exported[interface].ty
            assert isinstance(ifc_type, wc.ComponentInstanceType)
            fty = ifc_type.exports(eng)[function].ty
            assert isinstance(fty, wc.FuncType)
            result = fty.result
            ok = result.ok if isinstance(result, wc.ResultType) else None
            err = result.err if isinstance(result, wc.ResultType) else None
            out[ffqn] = _Export(index, tuple(t for _, t in fty.params), ok, err)
        return out

    @property
    def ffqns(self) -> list[str]:
        return sorted(self.exports)

    def imported_interfaces(self) -> dict[str, str]:
        """Imported interface → kind (`support`, `types`, `log`, `wasi`, `direct`, `ext`,
        `schedule`, `stub`)."""
        return {i.name: i.kind for i in self._imports}

    def _find_join_set_type(self) -> wc.ResourceType | None:
        for ifc in self._imports:
            if ifc.name == JOIN_SET_IFC and "join-set" in ifc.resources:
                return ifc.resources["join-set"]
        return None

    def _render(self, vt: Any) -> str:
        return _render(vt, self._join_set_type)

    def _signature_problem(
        self, where: str, fn: _ImportedFunc, expected: tuple[tuple[str, ...], str | None]
    ) -> str | None:
        got_params = tuple(self._render(t) for _, t in fn.params)
        got_result = None if fn.result is None else self._render(fn.result)
        if (got_params, got_result) == expected:
            return None

        def show(params: Sequence[str], result: str | None) -> str:
            return f"func({', '.join(params)})" + ("" if result is None else f" -> {result}")

        return (
            f"{where}: expected {show(*expected)}, the component imports "
            f"{show(got_params, got_result)}"
        )

    def _validate_imports(self) -> list[str]:
        problems: list[str] = []
        for ifc in self._imports:
            where = ifc.name
            if ifc.kind == "unsupported-item":
                problems.append(f"import `{where}` is not an interface")
            elif ifc.kind == "unsupported":
                hint = ""
                if where.startswith("obelisk:workflow/"):
                    hint = f" (this engine provides {WORKFLOW_SUPPORT_IFC})"
                elif where.startswith("obelisk:types/"):
                    hint = f" (this engine provides obelisk:types/*@{TYPES_VERSION})"
                elif where.startswith("obelisk:log/"):
                    hint = f" (this engine provides {LOG_IFC})"
                problems.append(f"unsupported import `{where}`{hint}")
            elif ifc.kind == "support":
                for name, fn in ifc.functions.items():
                    sig = _SUPPORT_SIGNATURES.get(name)
                    if sig is None:
                        problems.append(
                            f"{where} has no function `{name}` (available: "
                            f"{', '.join(sorted(_SUPPORT_SIGNATURES))})"
                        )
                    elif (p := self._signature_problem(f"{where}.{name}", fn, sig)) is not None:
                        problems.append(p)
            elif ifc.kind == "types":
                for name, fn in ifc.functions.items():
                    sig = _JOIN_SET_METHODS.get(name) if ifc.name == JOIN_SET_IFC else None
                    if sig is None:
                        problems.append(f"{where} has no function `{name}`")
                    elif (p := self._signature_problem(f"{where}.{name}", fn, sig)) is not None:
                        problems.append(p)
            elif ifc.kind == "log":
                for name, fn in ifc.functions.items():
                    if name not in _LOG_LEVELS:
                        problems.append(f"{where} has no function `{name}`")
                    elif (
                        p := self._signature_problem(f"{where}.{name}", fn, (("string",), None))
                    ) is not None:
                        problems.append(p)
            elif ifc.kind in ("direct", "ext", "schedule", "stub"):
                for name, fn in ifc.functions.items():
                    try:
                        self.targets[f"{ifc.name}#{name}"] = self._target(ifc, name, fn)
                    except _GuestError as e:
                        problems.append(f"{where}.{name}: {e}")
        return problems

    def _plain(self, vt: Any, what: str) -> WitType:
        try:
            return wit_type_from_wasmtime(vt)
        except WitTypeError as e:
            raise _GuestError(f"{what} has type {self._render(vt)}: {e}") from None

    def _target(self, ifc: _ImportedInterface, name: str, fn: _ImportedFunc) -> _Target:
        assert ifc.target is not None
        label = f"{ifc.name}.{name}"
        params = list(fn.params)
        result = None if fn.result is None else self._plain(fn.result, "the result")

        def plain_params(items: Sequence[tuple[str, Any]]) -> tuple[WitType, ...]:
            return tuple(self._plain(t, f"parameter `{n}`") for n, t in items)

        def expect_join_set(items: Sequence[tuple[str, Any]]) -> None:
            if not items or self._render(items[0][1]) != _BORROW:
                raise _GuestError(
                    f"the first parameter must be `borrow<join-set>` of {JOIN_SET_IFC}"
                )

        def returns_of(t: WitType | None, what: str) -> WitResult:
            if not isinstance(t, WitResult):
                shown = "nothing" if t is None else format_wit_type(t)
                raise _GuestError(f"{what} must be the target's result<…> type, got {shown}")
            return t

        if ifc.kind == "direct":
            ffqn = f"{ifc.target}.{name}"
            return _Target(
                "direct",
                ffqn,
                label,
                plain_params(params),
                returns_of(result, "the result"),
                result,
            )
        kind_suffixes = {
            "ext": ("-submit", "-await-next", "-get"),
            "schedule": ("-schedule",),
            "stub": ("-stub",),
        }[ifc.kind]
        suffix = next((s for s in kind_suffixes if name.endswith(s) and len(name) > len(s)), None)
        if suffix is None:
            raise _GuestError(
                f"an {ifc.kind} function must be named <function>{' / <function>'.join(kind_suffixes)}"
            )
        ffqn = f"{ifc.target}.{name[: -len(suffix)]}"
        if suffix == "-submit":
            expect_join_set(params)
            if result != EXECUTION_ID:
                raise _GuestError(f"must return execution-id, got {self._show(fn.result)}")
            # R is unknown from a submit alone: checked against the deployment in check().
            return _Target("submit", ffqn, label, plain_params(params[1:]), WitResult(), result)
        if suffix == "-await-next":
            expect_join_set(params)
            if len(params) != 1:
                raise _GuestError("takes only the join set")
            if not isinstance(result, WitResult) or result.err != AWAIT_NEXT_ERROR:
                raise _GuestError(
                    "must return result<R, await-next-extension-error> (or "
                    f"result<tuple<execution-id, R>, …>), got {self._show(fn.result)}"
                )
            ok = result.ok
            with_id = (
                isinstance(ok, WitTuple)
                and len(ok.elements) == 2
                and ok.elements[0] == EXECUTION_ID
            )
            inner = ok.elements[1] if with_id and isinstance(ok, WitTuple) else ok
            return _Target(
                "await-next", ffqn, label, (), returns_of(inner, "R"), result, with_id=with_id
            )
        if suffix == "-get":
            if len(params) != 1 or self._plain(params[0][1], "the parameter") != EXECUTION_ID:
                raise _GuestError("takes one execution-id")
            if not isinstance(result, WitResult) or result.err != GET_EXTENSION_ERROR:
                raise _GuestError(
                    f"must return result<R, get-extension-error>, got {self._show(fn.result)}"
                )
            return _Target("get", ffqn, label, (), returns_of(result.ok, "R"), result)
        if suffix == "-schedule":
            if not params or self._plain(params[0][1], "the first parameter") != SCHEDULE_AT:
                raise _GuestError("the first parameter must be schedule-at")
            if result != EXECUTION_ID:
                raise _GuestError(f"must return execution-id, got {self._show(fn.result)}")
            return _Target("schedule", ffqn, label, plain_params(params[1:]), WitResult(), result)
        # -stub
        if len(params) != 2 or self._plain(params[0][1], "the first parameter") != EXECUTION_ID:
            raise _GuestError("takes (execution-id, R)")
        if result is not None and result != WitResult(None, STUB_ERROR):
            raise _GuestError(
                f"must return nothing or result<_, stub-error>, got {self._show(fn.result)}"
            )
        returns = returns_of(self._plain(params[1][1], "the value"), "the value")
        return _Target("stub", ffqn, label, (), returns, result)

    def _show(self, vt: Any) -> str:
        return "nothing" if vt is None else self._render(vt)

    # -- linking --

    def _resource_id(self, rt: wc.ResourceType) -> int:
        for known, rid in self._resource_ids:
            if known == rt:
                return rid
        rid = _OTHER_RESOURCES + len(self._resource_ids)
        self._resource_ids.append((rt, rid))
        return rid

    def _build_linker(self) -> wc.Linker:
        linker = wc.Linker(self.engine.engine)
        with linker.root() as root:
            for ifc in self._imports:
                if ifc.kind == "unsupported-item":
                    continue
                with root.add_instance(ifc.name) as inst:
                    for rname, rt in ifc.resources.items():
                        rid = self._resource_id(rt)
                        dtor = _join_set_dtor if rid == _JOIN_SET_RESOURCE else _no_dtor
                        inst.add_resource(rname, wc.ResourceType.host(rid), dtor)
                    for fname, fn in ifc.functions.items():
                        inst.add_func(fname, self._host_function(ifc, fname, fn))
        return linker

    def _host_function(
        self, ifc: _ImportedInterface, name: str, fn: _ImportedFunc
    ) -> Callable[..., Any]:
        impl: Callable[..., Any]
        result_vt = fn.result
        if ifc.kind == "support":
            impl = _SUPPORT[name]
            if name in ("join-set-create", "join-set-create-named"):
                impl = self._lowered(impl, result_vt)
        elif ifc.kind == "types":
            impl = _JOIN_SET_FUNCS[name]
        elif ifc.kind == "log":
            impl = _log_function(name)
        elif ifc.kind == "wasi":
            found = _WASI.get((_unversioned(ifc.name), name))
            if found is None:
                impl = _unavailable(f"{ifc.name}.{name}")
            else:
                impl = self._lowered(found, result_vt)
        else:
            impl = _target_function(self.targets[f"{ifc.name}#{name}"])
        return _guarded(impl)

    def _lowered(self, impl: Callable[..., Any], result_vt: Any) -> Callable[..., Any]:
        resource_id = self._resource_id

        def lowered(run: _Run, store: Any, *args: Any) -> Any:
            value = impl(run, store, *args)
            if result_vt is None:
                return None
            return _lower(result_vt, value, resource_id)

        return lowered

    # -- validation against a deployment --

    def check(
        self,
        interfaces: Mapping[str, Mapping[str, FunctionShape]],
        signatures: Mapping[str, FunctionSignature] | None = None,
        *,
        timeout: float = 10.0,
    ) -> None:
        """Verify that every direct-call and extension import reaches a deployed function
        (`interfaces`, as `WorkflowHost.interfaces()` returns them) with the same parameter
        and return types (`signatures`: deployed FFQN → signature, when given), then
        instantiate once. Raises `WasmWorkflowLoadError` listing every problem."""
        problems: list[str] = []
        for ifc in self._imports:
            if ifc.kind not in ("direct", "ext", "schedule", "stub"):
                continue
            assert ifc.target is not None
            deployed = interfaces.get(ifc.target)
            if deployed is None:
                problems.append(
                    f"unknown interface `{ifc.name}` imported: no deployed component exports "
                    f"`{ifc.target}` (deployed: {', '.join(sorted(interfaces)) or 'none'})"
                )
                continue
            for name in ifc.functions:
                t = self.targets[f"{ifc.name}#{name}"]
                fname = t.ffqn.rpartition(".")[2]
                if fname not in deployed:
                    problems.append(
                        f"`{ifc.name}` has no function `{name}`: `{ifc.target}` has no "
                        f"`{fname}` (available: {', '.join(sorted(deployed))})"
                    )
                    continue
                if signatures is None or t.ffqn not in signatures:
                    continue
                problem = _compare(t, signatures[t.ffqn])
                if problem is not None:
                    problems.append(f"{t.label}: {problem}")
        if problems:
            raise WasmWorkflowLoadError(
                f"{self.label}: imports do not match the deployment:\n  " + "\n  ".join(problems)
            )
        self._verify_instantiable(timeout)

    def _verify_instantiable(self, timeout: float) -> None:
        limit = time.monotonic() + timeout
        store, _ = self.engine.new_store(lambda: "timeout" if time.monotonic() > limit else None)
        try:
            self._linker.instantiate(store, self.component)
        except WasmtimeError as e:
            raise WasmWorkflowLoadError(
                f"{self.label}: cannot instantiate the component: {_cause(str(e))}"
            ) from None

    # -- running --

    def interrupt(self, execution_id: str | None = None) -> None:
        """Stop the runs of this runner in progress (all, or that execution's), from any
        thread: their outcome is `WfAborted`. A guest blocked in a host call is not woken
        (the host must return or raise); a computing guest stops within an epoch tick."""
        with self._lock:
            for run in self._active:
                if execution_id is None or run.execution_id == execution_id:
                    run.stop = True

    def _select(self, ffqn: str | None, host: Any) -> str | WfTrap:
        if ffqn is None:
            ffqn = getattr(host, "ffqn", None)
        if ffqn is None:
            if len(self.exports) == 1:
                return next(iter(self.exports))
            return WfTrap(
                f"{self.label} exports several functions ({', '.join(self.ffqns)}): "
                "the caller must name the one to run"
            )
        if ffqn not in self.exports:
            return WfTrap(f"function not exported by the component: {ffqn}")
        return ffqn

    def run(
        self,
        host: WorkflowHost,
        params: list[Any],
        *,
        ffqn: str | None = None,
        spin_timeout: float | None = None,
    ) -> WorkflowOutcome:
        """Run an export once against `host` with §9.2 JSON `params`.

        Never raises for guest faults; re-raises an unexpected exception of the host.
        """
        selected = self._select(ffqn, host)
        if isinstance(selected, WfTrap):
            return selected
        signature = self.exports[selected]
        if not isinstance(signature.result, WitResult):
            return WfTrap(f"{selected} does not return a result: {signature.format()}")
        args = _convert_params(signature, params)
        if isinstance(args, WfTrap):
            return args
        run = _Run(host, spin_timeout)
        with self._lock:
            self._active.add(run)
        previous = _current()
        _CURRENT.run = run
        try:
            outcome = self._run(run, selected, signature.result, args)
        finally:
            _CURRENT.run = previous
            with self._lock:
                self._active.discard(run)
        if run.host_failure is not None:
            raise run.host_failure
        if run.stop or run.aborted:
            return WfAborted()
        return outcome

    def _run(
        self, run: _Run, ffqn: str, result_type: WitResult, args: list[Any]
    ) -> WorkflowOutcome:
        export = self._exports[ffqn]
        store, interrupt = self.engine.new_store(run.check)
        store.set_limits(memory_size=self.memory_limit)
        run.guest_since = time.monotonic()
        run.in_guest = True
        try:
            instance = self._linker.instantiate(store, self.component)
            func = instance.get_func(store, export.index)
            if func is None:
                return WfTrap(f"function not exported by the component: {ffqn}")
            is_ok, raw = _call_export(func, store, export, args)
            _post_return(func, store)
        except WasmtimeError as e:
            return self._failure(run, e, interrupt.reason)
        except (TypeError, ValueError) as e:  # wasmtime-py rejected a converted value
            return WfTrap(f"invalid params: {e}", repr(e))
        finally:
            run.in_guest = False
            try:
                run.flush_output()
            except RunAborted:
                run.aborted = True
        side = result_type.ok if is_ok else result_type.err
        try:
            value = None if side is None else wasmtime_to_json(raw, side, "result")
        except WitValueError as e:
            return WfTrap(f"cannot read the result: {e}", repr(raw))
        return WfOk(value) if is_ok else WfErr(value)

    @staticmethod
    def _failure(run: _Run, error: WasmtimeError, reason: str | None) -> WorkflowOutcome:
        if run.stop or run.aborted or run.host_failure is not None or reason == "aborted":
            return WfAborted()
        if run.timed_out or reason == "timeout":
            return WfTimedOut()
        if run.trap is not None:
            return WfTrap(run.trap, str(error))
        return WfTrap(_trap_reason(error), str(error))


def _no_dtor(store: Any, rep: int) -> None:
    return None


def _unavailable(name: str) -> Callable[..., Any]:
    def unavailable(run: _Run, store: Any, *args: Any) -> Any:
        raise _GuestError(f"{name} is not available to workflows (SPEC §7.5)")

    return unavailable


def _guarded(impl: Callable[..., Any]) -> Callable[..., Any]:
    def host_function(store: Any, *args: Any) -> Any:
        run = _current()
        if run is None or not run.in_guest:
            raise WasmtimeError("obelisk: a workflow host function was called outside a run")
        return run.enter(impl, store, args)

    return host_function


def _convert_params(signature: FunctionSignature, params: Any) -> list[Any] | WfTrap:
    expected = signature.params
    if not isinstance(params, list) or len(params) != len(expected):
        got = f"{len(params)}" if isinstance(params, list) else type(params).__name__
        names = ", ".join(f"{n}: {format_wit_type(t)}" for n, t in expected)
        return WfTrap(f"invalid params: expected {len(expected)} ({names}), got {got}")
    args = []
    for i, ((name, t), value) in enumerate(zip(expected, params, strict=True)):
        try:
            args.append(json_to_wasmtime(value, t, f"params[{i}]"))
        except WitValueError as e:
            return WfTrap(f"invalid params: parameter {name!r}: {e}", str(e))
    return args


def _compare(t: _Target, deployed: FunctionSignature) -> str | None:
    """Whether an import's view of a deployed function matches its real signature."""
    want_params = tuple(pt for _, pt in deployed.params)
    show = ", ".join(format_wit_type(p) for p in want_params)
    if t.kind in ("direct", "submit", "schedule") and t.params != want_params:
        got = ", ".join(format_wit_type(p) for p in t.params)
        return f"the deployed function takes ({show}), the import passes ({got})"
    if t.kind in ("direct", "await-next", "get", "stub") and t.returns != deployed.result:
        want = "nothing" if deployed.result is None else format_wit_type(deployed.result)
        return (
            f"the deployed function returns {want}, the import expects {format_wit_type(t.returns)}"
        )
    return None
