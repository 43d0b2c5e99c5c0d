"""The WIT side of the `workflow_wasm` runtime (`engine.runtimes.wasm.workflow`): the
interfaces this engine provides, the types of `obelisk:types@1.0.0` and
`obelisk:workflow@1.0.0` as the codec's model, the signatures an import of them must
declare, and the rendering / lowering of wasmtime component types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wasmtime import component as wc

from engine.wit.codec import wit_type_from_wasmtime
from engine.wit.types import (
    WitPrimitive,
    WitType,
    WitTypeError,
    format_wit_type,
    parse_wit_type,
)

TYPES_VERSION = "1.0.0"
WORKFLOW_SUPPORT_IFC = "obelisk:workflow/workflow-support@1.0.0"
JOIN_SET_IFC = f"obelisk:types/join-set@{TYPES_VERSION}"
LOG_IFC = "obelisk:log/log@1.0.0"
LOG_LEVELS = ("trace", "debug", "info", "warn", "error")

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
FUNCTION = parse_wit_type(_FUNCTION_T)
AWAIT_NEXT_ERROR = parse_wit_type(f"variant {{ all-processed, function-mismatch({_MISMATCH_T}) }}")
GET_EXTENSION_ERROR = parse_wit_type(
    f"variant {{ function-mismatch({_MISMATCH_T}), not-found-in-processed-responses }}"
)
STUB_ERROR = parse_wit_type("variant { execution-not-found, type-check-error(string), conflict }")
_JOIN_SET_CREATE_ERR_T = "variant { conflict, invalid-name(string) }"

_OWN = "own<join-set>"
BORROW_JOIN_SET = "borrow<join-set>"


def _fmt(text: str) -> str:
    """Normalize a type written in `parse_wit_type` syntax (handles stay as written)."""
    return format_wit_type(parse_wit_type(text))


#: `workflow-support` functions: (parameter types, result type or None), as `render_type` shows them.
SUPPORT_SIGNATURES: dict[str, tuple[tuple[str, ...], str | None]] = {
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
    "submit-delay": ((BORROW_JOIN_SET, _fmt(_SCHEDULE_AT_T)), _fmt(_EXECUTION_ID_T)),
    "join-next": (
        (BORROW_JOIN_SET,),
        _fmt(f"result<{_JSON_RESULT_T}, variant {{ all-processed }}>"),
    ),
    "join-next-try": (
        (BORROW_JOIN_SET,),
        _fmt(f"result<{_JSON_RESULT_T}, variant {{ all-processed, pending }}>"),
    ),
    "execution-id-current": ((), _fmt(_EXECUTION_ID_T)),
    "execution-id-generate": ((), _fmt(_EXECUTION_ID_T)),
    "submit-json": (
        (BORROW_JOIN_SET, _fmt(_FUNCTION_T), "string"),
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

JOIN_SET_METHOD_SIGNATURES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "[method]join-set.id": ((BORROW_JOIN_SET,), "string"),
    "[method]join-set.last-id": ((BORROW_JOIN_SET,), _fmt(f"option<{_RESPONSE_ID_T}>")),
}


def _t(text: str) -> WitType:
    return parse_wit_type(text)


RESULT_DATETIME = _t(f"result<{_DATETIME_T}>")
JOIN_NEXT_RESULT = _t(f"result<{_JSON_RESULT_T}, variant {{ all-processed }}>")
JOIN_NEXT_TRY_RESULT = _t(f"result<{_JSON_RESULT_T}, variant {{ all-processed, pending }}>")
DYNAMIC_ID_RESULT = _t(f"result<{_EXECUTION_ID_T}, {_DYNAMIC_ERR_T}>")
CALL_JSON_RESULT = _t(f"result<{_JSON_RESULT_T}, {_DYNAMIC_ERR_T}>")
STUB_JSON_RESULT = _t(
    "result<_, variant { execution-id-parsing-error(string), execution-not-found, "
    "type-check-error(string), conflict }>"
)
GET_RESULT_JSON_RESULT = _t(
    f"result<{_JSON_RESULT_T}, variant {{ execution-id-parsing-error(string), "
    "not-found-in-processed-responses }>"
)
LAST_ID_RESULT = _t(f"option<{_RESPONSE_ID_T}>")
STRING = WitPrimitive("string")


# ---------------------------------------------------------------------------------------------
# Rendering and lowering wasmtime types


def render_type(vt: Any, join_set: wc.ResourceType | None) -> str:
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
        ok = "_" if vt.ok is None else render_type(vt.ok, join_set)
        if vt.err is None:
            return "result" if vt.ok is None else f"result<{ok}>"
        return f"result<{ok}, {render_type(vt.err, join_set)}>"
    if isinstance(vt, wc.OptionType):
        return f"option<{render_type(vt.payload, join_set)}>"
    if isinstance(vt, wc.ListType):
        return f"list<{render_type(vt.element, join_set)}>"
    if isinstance(vt, wc.TupleType):
        return f"tuple<{', '.join(render_type(e, join_set) for e in vt.elements)}>"
    if isinstance(vt, wc.RecordType):
        return (
            "record { " + ", ".join(f"{n}: {render_type(t, join_set)}" for n, t in vt.fields) + " }"
        )
    if isinstance(vt, wc.VariantType):
        cases = ", ".join(
            n if t is None else f"{n}({render_type(t, join_set)})" for n, t in vt.cases
        )
        return f"variant {{ {cases} }}"
    return type(vt).__name__


@dataclass(frozen=True, slots=True)
class Case:
    """A case of a variant, option (`none`/`some`) or result (`ok`/`err`) for `lower_value`."""

    name: str
    payload: Any = None


@dataclass(frozen=True, slots=True)
class Own:
    """An owned handle of a host resource, for `lower_value`."""

    rep: int


def lower_value(vt: Any, value: Any, resource_id: Callable[[wc.ResourceType], int]) -> Any:
    """Build the wasmtime-py value of type `vt` from a plain description: `Case` for
    variant-like types, dicts (kebab-case keys) for records, `Own` for owned handles."""
    if isinstance(vt, wc.OwnType):
        assert isinstance(value, Own)
        return wc.ResourceHost.own(value.rep, resource_id(vt.ty))
    if isinstance(vt, wc.VariantType | wc.OptionType | wc.ResultType):
        assert isinstance(value, Case), value
        cases = dict(vt._cases())
        payload_t = cases[value.name]
        payload = None if payload_t is None else lower_value(payload_t, value.payload, resource_id)
        return wc.Variant(value.name, payload) if vt._tagged() else payload
    if isinstance(vt, wc.RecordType):
        record = wc.Record()
        for name, ft in vt.fields:
            setattr(record, name, lower_value(ft, value[name], resource_id))
        return record
    if isinstance(vt, wc.ListType):
        if isinstance(vt.element, wc.U8):
            return bytes(value)
        return [lower_value(vt.element, v, resource_id) for v in value]
    if isinstance(vt, wc.TupleType):
        return tuple(
            lower_value(t, v, resource_id) for t, v in zip(vt.elements, value, strict=True)
        )
    return value
