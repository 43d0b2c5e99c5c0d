"""WIT values as JSON (SPEC §9.2), and their conversion to and from wasmtime-py values.

JSON form: bool/numbers/strings as JSON; `list`/`tuple` as arrays; `option` as `null` or the
value; `result` as `{"ok": v}` / `{"err": v}` (`{"ok": null}` when there is no payload);
`record` as an object with snake_case keys; `variant` as `"case"` or `{"case": payload}`
(case names stay kebab-case); `enum` as `"case"`; `flags` as an array of names.

wasmtime-py (50.x) represents component values as: bool/int/float/str (char too), `bytes` for
`list<u8>`, `list`, `tuple`, `wasmtime.component.Record` (attributes named by the kebab-case
field names), `set[str]` for flags, `str` for enums, and for variant-like types (variant,
option, result) either a bare payload (None for a case without payload) or, when two cases
cannot be told apart by Python class, `wasmtime.component.Variant(tag, payload)`. This module
mirrors that "tagged or not" rule exactly (see `_classes`/`_tagged`) and uses the WIT type to
read untagged values back, so an `err` is never mistaken for an `ok`.

Known wasmtime-py limitation: when lowering an untagged variant it picks the first case whose
Python class matches with `isinstance`, so e.g. `err(true)` of `result<u32, bool>` would be
sent as `ok(1)`. `json_to_wasmtime` detects such values and rejects them with a clear error
instead of passing a wrong value to the guest.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from wasmtime import component as wc

from engine.wit.types import (
    INT_RANGES,
    WitEnum,
    WitFlags,
    WitList,
    WitOption,
    WitPrimitive,
    WitRecord,
    WitResult,
    WitTuple,
    WitType,
    WitTypeError,
    WitVariant,
    format_wit_type,
)

__all__ = [
    "WitValueError",
    "json_to_wasmtime",
    "snake_case",
    "validate_json",
    "wasmtime_to_json",
    "wit_type_from_wasmtime",
]


class WitValueError(ValueError):
    """A value does not match its WIT type; the message starts with the value's path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


def snake_case(name: str) -> str:
    """JSON key of a WIT record field: `user-id` -> `user_id`."""
    return name.replace("-", "_")


def _describe(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_name(t: WitType) -> str:
    text = format_wit_type(t)
    return text if len(text) <= 80 else text[:77] + "..."


def _mismatch(path: str, t: WitType, value: Any) -> WitValueError:
    return WitValueError(path, f"expected {_type_name(t)}, got {_describe(value)}")


def _single_key(value: Any, path: str, t: WitType, what: str) -> tuple[str, Any]:
    if not isinstance(value, dict) or len(value) != 1:
        raise WitValueError(path, f"expected {what} for {_type_name(t)}, got {_describe(value)}")
    ((key, payload),) = value.items()
    if not isinstance(key, str):
        raise _mismatch(path, t, value)
    return key, payload


# ---------------------------------------------------------------------------------------------
# JSON validation and normalization


def validate_json(value: Any, t: WitType, path: str = "params[0]") -> Any:
    """Check that JSON `value` matches `t`; return it normalized, or raise `WitValueError`.

    Normalized: floats for f32/f64, records with every field (missing option fields as null)
    in declaration order, variant cases without payload as `"case"`, flags deduplicated in
    declaration order, arrays as lists.
    """
    match t:
        case WitPrimitive(name=prim):
            return _validate_primitive(value, t, prim, path)
        case WitList(element=element):
            if not isinstance(value, list | tuple):
                raise _mismatch(path, t, value)
            return [validate_json(v, element, f"{path}[{i}]") for i, v in enumerate(value)]
        case WitTuple(elements=elements):
            if not isinstance(value, list | tuple) or len(value) != len(elements):
                raise WitValueError(
                    path,
                    f"expected {_type_name(t)} (an array of {len(elements)}), "
                    f"got {_describe(value)}",
                )
            return [
                validate_json(v, et, f"{path}[{i}]")
                for i, (v, et) in enumerate(zip(value, elements, strict=True))
            ]
        case WitOption(inner=inner):
            return None if value is None else validate_json(value, inner, path)
        case WitResult(ok=ok, err=err):
            return _validate_result(value, t, ok, err, path)
        case WitRecord(fields=fields):
            return _validate_record(value, t, fields, path)
        case WitVariant(cases=cases):
            return _validate_variant(value, t, cases, path)
        case WitEnum(cases=names):
            if not isinstance(value, str) or value not in names:
                raise WitValueError(
                    path,
                    f"expected one of: {', '.join(names)} (enum), got {_describe(value)}",
                )
            return value
        case WitFlags(names=names):
            if not isinstance(value, list | tuple):
                raise _mismatch(path, t, value)
            seen: set[str] = set()
            for i, v in enumerate(value):
                if not isinstance(v, str) or v not in names:
                    raise WitValueError(
                        f"{path}[{i}]",
                        f"expected one of: {', '.join(names)} (flags), got {_describe(v)}",
                    )
                seen.add(v)
            return [n for n in names if n in seen]
    raise TypeError(f"not a WIT type: {t!r}")


def _validate_primitive(value: Any, t: WitType, name: str, path: str) -> Any:
    if name == "bool":
        if type(value) is not bool:
            raise _mismatch(path, t, value)
        return value
    if name in INT_RANGES:
        if type(value) is not int:
            raise _mismatch(path, t, value)
        lo, hi = INT_RANGES[name]
        if not lo <= value <= hi:
            raise WitValueError(path, f"expected {name}, got {value} (out of range {lo}..{hi})")
        return value
    if name in ("f32", "f64"):
        if type(value) not in (int, float):
            raise _mismatch(path, t, value)
        try:
            return float(value)
        except OverflowError:
            raise WitValueError(path, f"expected {name}, got {value} (too large)") from None
    if name == "char":
        if not isinstance(value, str) or len(value) != 1 or 0xD800 <= ord(value) <= 0xDFFF:
            raise WitValueError(path, f"expected char (one character), got {_describe(value)}")
        return value
    if name == "string":
        if not isinstance(value, str):
            raise _mismatch(path, t, value)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise WitValueError(path, "expected string, got a lone surrogate") from None
        return value
    raise TypeError(f"unknown primitive {name!r}")


def _validate_result(
    value: Any, t: WitType, ok: WitType | None, err: WitType | None, path: str
) -> Any:
    key, payload = _single_key(value, path, t, '{"ok": ...} or {"err": ...}')
    if key not in ("ok", "err"):
        raise WitValueError(path, f'expected {{"ok": ...}} or {{"err": ...}}, got key {key!r}')
    side = ok if key == "ok" else err
    if side is None:
        if payload is not None:
            raise WitValueError(
                f"{path}.{key}",
                f"expected null ({key} has no payload), got {_describe(payload)}",
            )
        return {key: None}
    return {key: validate_json(payload, side, f"{path}.{key}")}


def _validate_variant(
    value: Any, t: WitType, cases: tuple[tuple[str, WitType | None], ...], path: str
) -> Any:
    case_types = dict(cases)
    if isinstance(value, str):
        name, payload, has_payload = value, None, False
    else:
        name, payload = _single_key(value, path, t, '"case" or {"case": payload}')
        has_payload = True
    if name not in case_types:
        raise WitValueError(
            path, f"unknown case {name!r}, expected one of: {', '.join(case_types)}"
        )
    ct = case_types[name]
    if ct is None:
        if payload is not None:
            raise WitValueError(
                f"{path}.{name}", f"case {name!r} has no payload, got {_describe(payload)}"
            )
        return name
    if not has_payload:
        raise WitValueError(path, f"case {name!r} needs a payload: {{{json.dumps(name)}: ...}}")
    return {name: validate_json(payload, ct, f"{path}.{name}")}


def _validate_record(
    value: Any, t: WitType, fields: tuple[tuple[str, WitType], ...], path: str
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _mismatch(path, t, value)
    keys = {snake_case(n): (n, ft) for n, ft in fields}
    for key in value:
        if key not in keys:
            hint = f" (fields are: {', '.join(keys)})"
            raise WitValueError(path, f"unknown field {key!r}{hint}")
    out: dict[str, Any] = {}
    for key, (_, ft) in keys.items():
        if key in value:
            out[key] = validate_json(value[key], ft, f"{path}.{key}")
        elif isinstance(ft, WitOption):
            out[key] = None
        else:
            raise WitValueError(path, f"missing field {key!r}")
    return out


# ---------------------------------------------------------------------------------------------
# wasmtime-py's representation


def _cases(t: WitOption | WitResult | WitVariant) -> tuple[tuple[str, WitType | None], ...]:
    match t:
        case WitOption(inner=inner):
            return (("none", None), ("some", inner))
        case WitResult(ok=ok, err=err):
            return (("ok", ok), ("err", err))
        case WitVariant(cases=cases):
            return cases


@lru_cache(maxsize=4096)
def _classes(t: WitType) -> frozenset[type]:
    """The Python classes wasmtime-py uses for values of `t` (its `ValType.add_classes`)."""
    match t:
        case WitPrimitive(name=name):
            if name == "bool":
                return frozenset({bool})
            if name in INT_RANGES:
                return frozenset({int})
            if name in ("f32", "f64"):
                return frozenset({float})
            return frozenset({str})
        case WitList(element=element):
            return frozenset({bytes}) if element == WitPrimitive("u8") else frozenset({list})
        case WitRecord():
            return frozenset({wc.Record})
        case WitTuple():
            return frozenset({tuple})
        case WitEnum():
            return frozenset({str})
        case WitFlags():
            return frozenset({set})
        case WitOption() | WitResult() | WitVariant():
            if _tagged(t):
                return frozenset({wc.Variant})
            out: set[type] = set()
            for _, ct in _cases(t):
                out |= {object} if ct is None else _classes(ct)
            return frozenset(out)
    raise TypeError(f"not a WIT type: {t!r}")


@lru_cache(maxsize=4096)
def _tagged(t: WitOption | WitResult | WitVariant) -> bool:
    """Whether wasmtime-py wraps values of `t` in `Variant` (its `VariantLikeType._tagged`)."""
    seen: set[type] = set()
    for _, ct in _cases(t):
        case = {object} if ct is None else set(_classes(ct))
        if case & seen:
            return True
        seen |= case
    return False


def json_to_wasmtime(value: Any, t: WitType, path: str = "params[0]") -> Any:
    """Validate JSON `value` against `t` and convert it to what wasmtime-py's Func call takes."""
    return _to_wasmtime(validate_json(value, t, path), t, path)


def _to_wasmtime(value: Any, t: WitType, path: str) -> Any:
    """`value` is already normalized by `validate_json`."""
    match t:
        case WitPrimitive():
            return value
        case WitList(element=element):
            if element == WitPrimitive("u8"):
                return bytes(value)
            return [_to_wasmtime(v, element, f"{path}[{i}]") for i, v in enumerate(value)]
        case WitTuple(elements=elements):
            return tuple(
                _to_wasmtime(v, et, f"{path}[{i}]")
                for i, (v, et) in enumerate(zip(value, elements, strict=True))
            )
        case WitRecord(fields=fields):
            record = wc.Record()
            for name, ft in fields:
                key = snake_case(name)
                setattr(record, name, _to_wasmtime(value[key], ft, f"{path}.{key}"))
            return record
        case WitEnum():
            return value
        case WitFlags():
            return set(value)
        case WitOption(inner=inner):
            if value is None:
                return _variant_value(t, "none", None, path)
            return _variant_value(t, "some", _to_wasmtime(value, inner, path), path)
        case WitResult(ok=ok, err=err):
            ((key, payload),) = value.items()
            side = ok if key == "ok" else err
            converted = None if side is None else _to_wasmtime(payload, side, f"{path}.{key}")
            return _variant_value(t, key, converted, path)
        case WitVariant(cases=cases):
            if isinstance(value, str):
                return _variant_value(t, value, None, path)
            ((name, payload),) = value.items()
            ct = dict(cases)[name]
            assert ct is not None
            return _variant_value(t, name, _to_wasmtime(payload, ct, f"{path}.{name}"), path)
    raise TypeError(f"not a WIT type: {t!r}")


def _variant_value(
    t: WitOption | WitResult | WitVariant, case: str, payload: Any, path: str
) -> Any:
    if _tagged(t):
        return wc.Variant(case, payload)
    # Untagged: wasmtime-py picks the first case whose class matches; make sure it is ours.
    for name, ct in _cases(t):
        if ct is None:
            if payload is not None:
                continue
        elif not isinstance(payload, tuple(_classes(ct))):
            continue
        if name != case:
            raise WitValueError(
                path,
                f"case {case!r} of {_type_name(t)} cannot be passed through wasmtime-py: "
                f"it would be read as case {name!r}",
            )
        return payload
    raise WitValueError(path, f"case {case!r} of {_type_name(t)} cannot be represented")


def wasmtime_to_json(value: Any, t: WitType, path: str = "result") -> Any:
    """Convert a value returned by wasmtime-py for WIT type `t` to its §9.2 JSON form."""
    match t:
        case WitPrimitive(name=prim):
            if not _matches(value, t):
                raise _unexpected(path, t, value)
            if prim in ("f32", "f64"):
                return float(value)
            return value
        case WitList(element=element):
            if isinstance(value, bytes | bytearray) and element == WitPrimitive("u8"):
                return list(value)
            if not isinstance(value, list):
                raise _unexpected(path, t, value)
            return [wasmtime_to_json(v, element, f"{path}[{i}]") for i, v in enumerate(value)]
        case WitTuple(elements=elements):
            if not isinstance(value, tuple | list) or len(value) != len(elements):
                raise _unexpected(path, t, value)
            return [
                wasmtime_to_json(v, et, f"{path}[{i}]")
                for i, (v, et) in enumerate(zip(value, elements, strict=True))
            ]
        case WitRecord(fields=fields):
            out: dict[str, Any] = {}
            for name, ft in fields:
                key = snake_case(name)
                if not hasattr(value, name):
                    raise WitValueError(path, f"record value has no field {name!r}")
                out[key] = wasmtime_to_json(getattr(value, name), ft, f"{path}.{key}")
            return out
        case WitEnum(cases=names):
            if not isinstance(value, str) or value not in names:
                raise _unexpected(path, t, value)
            return value
        case WitFlags(names=names):
            if not isinstance(value, set | frozenset | list | tuple):
                raise _unexpected(path, t, value)
            present = set(value)
            unknown = present - set(names)
            if unknown:
                raise WitValueError(path, f"unknown flags {sorted(unknown)}")
            return [n for n in names if n in present]
        case WitOption() | WitResult() | WitVariant():
            case, payload = _read_variant(value, t, path)
            ct = dict(_cases(t))[case]
            json_payload = None if ct is None else wasmtime_to_json(payload, ct, f"{path}.{case}")
            if isinstance(t, WitOption):
                return json_payload
            if isinstance(t, WitResult):
                return {case: json_payload}
            return case if ct is None else {case: json_payload}
    raise TypeError(f"not a WIT type: {t!r}")


def _unexpected(path: str, t: WitType, value: Any) -> WitValueError:
    return WitValueError(
        path, f"expected a wasmtime value of {_type_name(t)}, got {type(value).__name__}"
    )


def _read_variant(value: Any, t: WitOption | WitResult | WitVariant, path: str) -> tuple[str, Any]:
    cases = _cases(t)
    if _tagged(t):
        if not isinstance(value, wc.Variant) or value.tag not in dict(cases):
            raise _unexpected(path, t, value)
        return value.tag, value.payload
    for name, ct in cases:
        if (value is None) if ct is None else _matches(value, ct):
            return name, value
    raise _unexpected(path, t, value)


def _matches(value: Any, t: WitType) -> bool:
    """Whether `value` can be what wasmtime-py lifted for `t` (exact classes: bool is no int)."""
    match t:
        case WitPrimitive(name=name):
            if name == "bool":
                return type(value) is bool
            if name in INT_RANGES:
                return type(value) is int
            if name in ("f32", "f64"):
                return type(value) is float
            if name == "char":
                return type(value) is str and len(value) == 1
            return type(value) is str
        case WitList(element=element):
            if element == WitPrimitive("u8"):
                return type(value) is bytes
            return type(value) is list
        case WitRecord():
            return isinstance(value, wc.Record)
        case WitTuple(elements=elements):
            return type(value) is tuple and len(value) == len(elements)
        case WitEnum(cases=names):
            return type(value) is str and value in names
        case WitFlags():
            return type(value) is set
        case WitOption() | WitResult() | WitVariant():
            if _tagged(t):
                return isinstance(value, wc.Variant) and value.tag in dict(_cases(t))
            return any(
                (value is None) if ct is None else _matches(value, ct) for _, ct in _cases(t)
            )
    return False


# ---------------------------------------------------------------------------------------------
# wasmtime-py type objects


def wit_type_from_wasmtime(valtype: Any) -> WitType:
    """Convert a `wasmtime.component` value type (from a FuncType) into the model.

    Resources, futures, streams and error-context have no JSON form: `WitTypeError`.
    """
    simple: dict[type, WitType] = {
        wc.Bool: WitPrimitive("bool"),
        wc.S8: WitPrimitive("s8"),
        wc.S16: WitPrimitive("s16"),
        wc.S32: WitPrimitive("s32"),
        wc.S64: WitPrimitive("s64"),
        wc.U8: WitPrimitive("u8"),
        wc.U16: WitPrimitive("u16"),
        wc.U32: WitPrimitive("u32"),
        wc.U64: WitPrimitive("u64"),
        wc.F32: WitPrimitive("f32"),
        wc.F64: WitPrimitive("f64"),
        wc.Char: WitPrimitive("char"),
        wc.String: WitPrimitive("string"),
    }
    found = simple.get(type(valtype))
    if found is not None:
        return found
    if isinstance(valtype, wc.ListType):
        return WitList(wit_type_from_wasmtime(valtype.element))
    if isinstance(valtype, wc.OptionType):
        return WitOption(wit_type_from_wasmtime(valtype.payload))
    if isinstance(valtype, wc.ResultType):
        ok, err = valtype.ok, valtype.err
        return WitResult(
            None if ok is None else wit_type_from_wasmtime(ok),
            None if err is None else wit_type_from_wasmtime(err),
        )
    if isinstance(valtype, wc.TupleType):
        return WitTuple(tuple(wit_type_from_wasmtime(e) for e in valtype.elements))
    if isinstance(valtype, wc.RecordType):
        return WitRecord(tuple((n, wit_type_from_wasmtime(ft)) for n, ft in valtype.fields))
    if isinstance(valtype, wc.VariantType):
        return WitVariant(
            tuple(
                (n, None if ct is None else wit_type_from_wasmtime(ct)) for n, ct in valtype.cases
            )
        )
    if isinstance(valtype, wc.EnumType):
        return WitEnum(tuple(valtype.names))
    if isinstance(valtype, wc.FlagsType):
        return WitFlags(tuple(valtype.names))
    kinds = {
        wc.OwnType: "resource handle (own)",
        wc.BorrowType: "resource handle (borrow)",
        wc.FutureType: "future",
        wc.StreamType: "stream",
        wc.ErrorContext: "error-context",
    }
    for cls, kind in kinds.items():
        if isinstance(valtype, cls):
            raise WitTypeError(f"unsupported WIT type: {kind} has no JSON form")
    raise WitTypeError(f"unsupported wasmtime type {type(valtype).__name__}")
