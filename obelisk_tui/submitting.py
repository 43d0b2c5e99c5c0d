"""Submitting and stubbing from the console: a params template and the check of the
params (or a stub's return value) from the WIT type strings the engine lists."""

from __future__ import annotations

import json
from typing import Any

from engine.views import (
    DeploymentInfo,
    FunctionExport,
    ParamInfo,
)


def template_value(type_text: str) -> Any:
    """A placeholder JSON value of a WIT type (the submit form's starting point)."""
    from engine.wit.types import (
        WitEnum,
        WitFlags,
        WitList,
        WitOption,
        WitPrimitive,
        WitRecord,
        WitResult,
        WitTuple,
        WitType,
        WitVariant,
        parse_wit_type,
    )

    def value(t: WitType) -> Any:
        match t:
            case WitPrimitive(name=name):
                if name == "bool":
                    return False
                if name in ("f32", "f64"):
                    return 0.0
                if name == "char":
                    return "a"
                if name == "string":
                    return ""
                return 0
            case WitList():
                return []
            case WitOption():
                return None
            case WitResult(ok=ok):
                return {"ok": None if ok is None else value(ok)}
            case WitTuple(elements=es):
                return [value(e) for e in es]
            case WitRecord(fields=fields):
                return {n.replace("-", "_"): value(ft) for n, ft in fields}
            case WitVariant(cases=cases):
                case_name, payload = cases[0]
                return case_name if payload is None else {case_name: value(payload)}
            case WitEnum(cases=cases):
                return cases[0]
            case WitFlags():
                return []
        return None

    try:
        return value(parse_wit_type(type_text))
    except ValueError:
        return None


def exported_functions(deployment: DeploymentInfo) -> list[FunctionExport]:
    """Every function the deployment exports, by FFQN."""
    exports = (f for c in deployment["components"] for f in c["exports"])
    return sorted(exports, key=lambda f: f["ffqn"])


def stub_template(return_type: str | None) -> str:
    """The stub form's starting point: `{"ok": <a value of the ok type>}`."""
    value = template_value(return_type) if return_type else None
    return json.dumps(value if isinstance(value, dict) else {"ok": None}, ensure_ascii=False)


def check_stub(return_type: str | None, text: str) -> tuple[Any | None, str | None]:
    """The stub's return value parsed from the form's JSON text (`{"ok": …}` or
    `{"err": …}`, checked against the function's return type), or the error to show."""
    from engine.wit.codec import WitValueError, validate_json
    from engine.wit.types import parse_wit_type

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not JSON: {e.msg} at line {e.lineno}, column {e.colno}"
    if not (isinstance(value, dict) and len(value) == 1 and set(value) <= {"ok", "err"}):
        return None, 'the return value is {"ok": …} or {"err": …}'
    if return_type:
        try:
            validate_json(value, parse_wit_type(return_type), "result")
        except WitValueError as e:
            return None, str(e)
        except ValueError:
            pass  # a type the console cannot parse: the engine will check it
    return value, None


def params_template(params: list[ParamInfo]) -> str:
    return json.dumps([template_value(p["type"]) for p in params], ensure_ascii=False)


def check_params(
    ffqn: str, params: list[ParamInfo], text: str
) -> tuple[list[Any] | None, str | None]:
    """The params parsed from the form's JSON text, or the error to show beside it."""
    from engine.wit.codec import WitValueError, validate_json
    from engine.wit.types import parse_wit_type

    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return None, f"not JSON: {e.msg} at line {e.lineno}, column {e.colno}"
    if not isinstance(value, list):
        return None, "params must be a JSON array, in declared order"
    if len(value) != len(params):
        expected = ", ".join(f"{p['name']}: {p['type']}" for p in params) or "none"
        return None, f"{ffqn} takes {len(params)} parameter(s) ({expected}), got {len(value)}"
    for i, (p, v) in enumerate(zip(params, value, strict=True)):
        try:
            validate_json(v, parse_wit_type(p["type"]), f"params[{i}] ({p['name']})")
        except WitValueError as e:
            return None, str(e)
        except ValueError:
            continue  # a type the console cannot parse: the engine will check it
    return value, None
