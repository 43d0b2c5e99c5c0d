"""WIT values as JSON: validation, conversion to/from wasmtime-py values, and a real round trip.

The round trip goes through `testing:codec/roundtrip` (tests/fixtures/components.py): the
exported function forwards to an imported one that the host answers with the identity, so
every value is lowered into and lifted out of guest memory by wasmtime, both directions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import wasmtime
from hypothesis import assume, given
from hypothesis import strategies as st
from wasmtime import component as wc

from engine.wit.codec import (
    WitValueError,
    json_to_wasmtime,
    validate_json,
    wasmtime_to_json,
    wit_type_from_wasmtime,
)
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
    WitVariant,
    parse_wit_type,
)
from tests.fixtures import components as fx

POINT = "record { x: s32, y-coord: option<s32> }"
SHAPE = "variant { circle(f64), square(u32), empty }"
FAILURE = "variant { permanent-failure(string), temporary(string) }"
COLOR = "enum { red, green, light-blue }"
PERMS = "flags { read, write, exec-all }"


def _record(**fields: Any) -> wc.Record:
    r = wc.Record()
    for k, v in fields.items():
        setattr(r, k.replace("_", "-"), v)
    return r


# (type, JSON as given, normalized JSON, wasmtime-py value)
CASES: list[tuple[str, Any, Any, Any]] = [
    ("bool", True, True, True),
    ("bool", False, False, False),
    ("s8", -128, -128, -128),
    ("s16", 32767, 32767, 32767),
    ("s32", -(2**31), -(2**31), -(2**31)),
    ("s64", -(2**63), -(2**63), -(2**63)),
    ("u8", 255, 255, 255),
    ("u16", 0, 0, 0),
    ("u32", 2**32 - 1, 2**32 - 1, 2**32 - 1),
    ("u64", 2**64 - 1, 2**64 - 1, 2**64 - 1),
    ("f32", 1, 1.0, 1.0),
    ("f32", 1.5, 1.5, 1.5),
    ("f64", -0.25, -0.25, -0.25),
    ("char", "é", "é", "é"),
    ("char", "😀", "😀", "😀"),
    ("string", "", "", ""),
    ("string", "héllo\n", "héllo\n", "héllo\n"),
    ("list<u32>", [1, 2], [1, 2], [1, 2]),
    ("list<u32>", [], [], []),
    ("list<u8>", [0, 255], [0, 255], b"\x00\xff"),
    ("list<string>", ["a", "b"], ["a", "b"], ["a", "b"]),
    ("list<char>", ["a"], ["a"], ["a"]),
    ("option<string>", None, None, None),
    ("option<string>", "x", "x", "x"),
    ("option<option<u32>>", None, None, wc.Variant("none")),
    ("option<option<u32>>", 5, 5, wc.Variant("some", 5)),
    ("result", {"ok": None}, {"ok": None}, wc.Variant("ok")),
    ("result", {"err": None}, {"err": None}, wc.Variant("err")),
    ("result<string>", {"ok": "x"}, {"ok": "x"}, "x"),
    ("result<string>", {"err": None}, {"err": None}, None),
    ("result<_, string>", {"ok": None}, {"ok": None}, None),
    ("result<_, string>", {"err": "e"}, {"err": "e"}, "e"),
    ("result<string, string>", {"ok": "x"}, {"ok": "x"}, wc.Variant("ok", "x")),
    ("result<string, string>", {"err": "e"}, {"err": "e"}, wc.Variant("err", "e")),
    ("result<u32, string>", {"ok": 3}, {"ok": 3}, 3),
    ("result<u32, string>", {"err": "e"}, {"err": "e"}, "e"),
    (
        f"result<string, {FAILURE}>",
        {"err": {"permanent-failure": "p"}},
        {"err": {"permanent-failure": "p"}},
        wc.Variant("permanent-failure", "p"),
    ),
    ("tuple<u8, string>", [1, "a"], [1, "a"], (1, "a")),
    (POINT, {"x": 1}, {"x": 1, "y_coord": None}, _record(x=1, y_coord=None)),
    (POINT, {"x": 1, "y_coord": -2}, {"x": 1, "y_coord": -2}, _record(x=1, y_coord=-2)),
    (
        f"list<{POINT}>",
        [{"x": 0, "y_coord": 0}],
        [{"x": 0, "y_coord": 0}],
        [_record(x=0, y_coord=0)],
    ),
    (SHAPE, {"circle": 2}, {"circle": 2.0}, 2.0),
    (SHAPE, {"square": 2}, {"square": 2}, 2),
    (SHAPE, "empty", "empty", None),
    (SHAPE, {"empty": None}, "empty", None),
    (f"option<{SHAPE}>", None, None, wc.Variant("none")),
    (f"option<{SHAPE}>", "empty", "empty", wc.Variant("some", None)),
    (f"option<{SHAPE}>", {"square": 1}, {"square": 1}, wc.Variant("some", 1)),
    (FAILURE, {"temporary": "t"}, {"temporary": "t"}, wc.Variant("temporary", "t")),
    (COLOR, "light-blue", "light-blue", "light-blue"),
    (PERMS, [], [], set()),
    (PERMS, ["exec-all", "read", "read"], ["read", "exec-all"], {"read", "exec-all"}),
]


@pytest.mark.parametrize(("type_text", "given", "normalized", "native"), CASES)
def test_both_ways(type_text: str, given: Any, normalized: Any, native: Any) -> None:
    t = parse_wit_type(type_text)
    assert validate_json(given, t) == normalized
    converted = json_to_wasmtime(given, t)
    assert converted == native
    assert type(converted) is type(native)
    assert wasmtime_to_json(native, t) == normalized


@pytest.mark.parametrize(
    ("type_text", "value", "message"),
    [
        ("bool", 1, "params[0]: expected bool, got 1"),
        ("u8", 256, "params[0]: expected u8, got 256 (out of range 0..255)"),
        ("u32", -1, "params[0]: expected u32, got -1 (out of range 0..4294967295)"),
        ("u64", 2**64, "params[0]: expected u64, got 18446744073709551616"),
        ("s8", -129, "params[0]: expected s8, got -129"),
        ("s32", True, "params[0]: expected s32, got true"),
        ("u32", 1.0, "params[0]: expected u32, got 1.0"),
        ("f64", "1", 'params[0]: expected f64, got "1"'),
        ("f64", False, "params[0]: expected f64, got false"),
        ("f32", 10**400, "too large"),
        ("char", "ab", 'params[0]: expected char (one character), got "ab"'),
        ("char", "", "expected char"),
        ("char", "\ud800", "expected char"),
        ("string", None, "params[0]: expected string, got null"),
        ("string", "\ud800", "lone surrogate"),
        ("list<u32>", [1, -1], "params[0][1]: expected u32, got -1"),
        ("list<u32>", "12", "params[0]: expected list<u32>"),
        ("tuple<u8, string>", [1], "params[0]: expected tuple<u8, string> (an array of 2)"),
        ("tuple<u8, string>", [1, 2], "params[0][1]: expected string, got 2"),
        ("option<u8>", "x", 'params[0]: expected u8, got "x"'),
        ("result<u8, string>", {"ok": 1, "err": "x"}, 'expected {"ok": ...} or {"err": ...}'),
        ("result<u8, string>", {"value": 1}, "got key 'value'"),
        ("result<u8, string>", "ok", 'expected {"ok": ...}'),
        ("result<u8, string>", {"err": 1}, "params[0].err: expected string, got 1"),
        ("result<_, string>", {"ok": 1}, "params[0].ok: expected null (ok has no payload)"),
        (
            POINT,
            {"x": 1, "y-coord": 2},
            "params[0]: unknown field 'y-coord' (fields are: x, y_coord)",
        ),
        (POINT, {"y_coord": 2}, "params[0]: missing field 'x'"),
        (POINT, {"x": "1"}, 'params[0].x: expected s32, got "1"'),
        (POINT, [1, 2], "params[0]: expected record"),
        (SHAPE, "circle", "params[0]: case 'circle' needs a payload"),
        (
            SHAPE,
            "triangle",
            "params[0]: unknown case 'triangle', expected one of: circle, square, empty",
        ),
        (SHAPE, {"empty": 1}, "params[0].empty: case 'empty' has no payload"),
        (SHAPE, {"square": -1}, "params[0].square: expected u32, got -1"),
        (SHAPE, {"square": 1, "circle": 1.0}, 'expected "case" or {"case": payload}'),
        (COLOR, "blue", 'params[0]: expected one of: red, green, light-blue (enum), got "blue"'),
        (
            PERMS,
            ["read", "admin"],
            'params[0][1]: expected one of: read, write, exec-all (flags), got "admin"',
        ),
        (PERMS, "read", "params[0]: expected flags"),
    ],
)
def test_validation_errors_name_the_path(type_text: str, value: Any, message: str) -> None:
    t = parse_wit_type(type_text)
    with pytest.raises(WitValueError) as e:
        validate_json(value, t)
    assert message in str(e.value)
    assert e.value.path.startswith("params[0]")
    with pytest.raises(WitValueError):
        json_to_wasmtime(value, t)


def test_nested_path_in_message() -> None:
    t = WitRecord((("items", WitList(WitPrimitive("u32"))),))
    with pytest.raises(WitValueError, match=r"^params\[1\]\.items\[3\]: expected u32, got -1"):
        validate_json({"items": [1, 2, 3, -1]}, t, "params[1]")


def test_value_wasmtime_py_would_misroute_is_rejected() -> None:
    # wasmtime-py lowers untagged variants by isinstance: True is an int, so err(true) of
    # result<u32, bool> would become ok(1). We refuse instead of corrupting the value.
    t = parse_wit_type("result<u32, bool>")
    assert json_to_wasmtime({"ok": 1}, t) == 1
    with pytest.raises(WitValueError, match="would be read as case 'ok'"):
        json_to_wasmtime({"err": True}, t)
    # lifting is exact: a bool comes back as err
    assert wasmtime_to_json(True, t) == {"err": True}
    assert wasmtime_to_json(1, t) == {"ok": 1}


def test_untagged_result_with_option_payload() -> None:
    t = parse_wit_type("result<option<u32>, string>")
    assert wasmtime_to_json(None, t) == {"ok": None}
    assert wasmtime_to_json(3, t) == {"ok": 3}
    assert wasmtime_to_json("e", t) == {"err": "e"}
    with pytest.raises(WitValueError, match="would be read as case 'ok'"):
        json_to_wasmtime({"err": "e"}, t)


def test_wasmtime_to_json_rejects_foreign_values() -> None:
    with pytest.raises(WitValueError, match="result: expected a wasmtime value of u32, got str"):
        wasmtime_to_json("1", WitPrimitive("u32"))
    with pytest.raises(WitValueError):
        wasmtime_to_json(wc.Variant("nope", 1), parse_wit_type("result<string, string>"))
    with pytest.raises(WitValueError, match="unknown flags"):
        wasmtime_to_json({"admin"}, parse_wit_type(PERMS))
    with pytest.raises(WitValueError, match="no field"):
        wasmtime_to_json(wc.Record(), parse_wit_type(POINT))


def test_wit_type_from_wasmtime_simple_types() -> None:
    assert wit_type_from_wasmtime(wc.U32()) == WitPrimitive("u32")
    assert wit_type_from_wasmtime(wc.Char()) == WitPrimitive("char")
    with pytest.raises(Exception, match="error-context"):
        wit_type_from_wasmtime(wc.ErrorContext())


# --- through a real component -------------------------------------------------------------------

ROUNDTRIP_VALUES: dict[str, list[Any]] = {
    "id-bool": [True, False],
    "id-s8": [-128, 127],
    "id-s16": [-32768, 5],
    "id-s32": [-(2**31), 2**31 - 1],
    "id-s64": [-(2**63), 2**63 - 1],
    "id-u8": [0, 255],
    "id-u16": [65535],
    "id-u32": [2**32 - 1],
    "id-u64": [2**64 - 1, 0],
    "id-f32": [1.5, -2, 0.0],
    "id-f64": [3.25, 1e300],
    "id-char": ["a", "😀"],
    "id-string": ["", "hello wörld"],
    "id-list-u32": [[], [1, 2, 3]],
    "id-bytes": [[], [0, 1, 255]],
    "id-list-string": [["a", "bc", ""]],
    "id-option": [None, "x"],
    "id-option-option": [None, 7],
    "id-result": [{"ok": None}, {"err": None}],
    "id-result-ok": [{"ok": "x"}, {"err": None}],
    "id-result-err": [{"ok": None}, {"err": "e"}],
    "id-result-same": [{"ok": "x"}, {"err": "e"}],
    "id-result-u32": [{"ok": 4}, {"err": "e"}],
    "id-result-failure": [
        {"ok": "x"},
        {"err": {"permanent-failure": "p"}},
        {"err": {"temporary": "t"}},
    ],
    "id-tuple": [[1, "a"]],
    "id-big-tuple": [list(range(17))],
    "id-point": [{"x": 1, "y_coord": None}, {"x": -1, "y_coord": 5}],
    "id-points": [[], [{"x": 1, "y_coord": 2}, {"x": 3, "y_coord": None}]],
    "id-shape": [{"circle": 1.5}, {"square": 3}, "empty"],
    "id-option-shape": [None, "empty", {"square": 9}],
    "id-color": ["red", "light-blue"],
    "id-perms": [[], ["read", "exec-all"], ["read", "write", "exec-all"]],
    "id-char-list": [["a", "b"]],
}


class Roundtrip:
    def __init__(self) -> None:
        self.engine = wasmtime.Engine()
        self.component = wc.Component.from_file(self.engine, fx.codec_component())
        self.received: list[Any] = []
        linker = wc.Linker(self.engine)
        with linker.root() as root, root.add_instance(fx.CODEC_IFC) as ifc:
            for name, _, _ in fx.ROUNDTRIP_FUNCS:
                ifc.add_func(name, self._identity)
        self.linker = linker

    def _identity(self, _store: Any, value: Any) -> Any:
        self.received.append(value)
        return value

    def call(self, function: str, value: Any) -> Any:
        store = wasmtime.Store(self.engine)
        instance = self.linker.instantiate(store, self.component)
        ifc = instance.get_export_index(store, fx.CODEC_IFC)
        index = instance.get_export_index(store, function, ifc)
        assert index is not None
        func = instance.get_func(store, index)
        assert func is not None
        return func(store, value)


@pytest.fixture(scope="module")
def roundtrip() -> Iterator[Roundtrip]:
    yield Roundtrip()


def test_every_roundtrip_function_has_values() -> None:
    assert set(ROUNDTRIP_VALUES) == {name for name, _, _ in fx.ROUNDTRIP_FUNCS}


def test_types_read_from_the_component(roundtrip: Roundtrip) -> None:
    exports = roundtrip.component.type.exports(roundtrip.engine)[fx.CODEC_IFC].ty
    funcs = {
        name: ext.ty
        for name, ext in exports.exports(roundtrip.engine).items()
        if isinstance(ext.ty, wc.FuncType)
    }
    for name, _, t in fx.ROUNDTRIP_FUNCS:
        ((param_name, param_type),) = funcs[name].params
        assert param_name == "x"
        assert wit_type_from_wasmtime(param_type) == t, name
        assert wit_type_from_wasmtime(funcs[name].result) == t, name


@pytest.mark.parametrize(
    ("function", "wit", "t"), fx.ROUNDTRIP_FUNCS, ids=[f[0] for f in fx.ROUNDTRIP_FUNCS]
)
def test_values_survive_a_trip_through_guest_memory(
    roundtrip: Roundtrip, function: str, wit: str, t: WitType
) -> None:
    for value in ROUNDTRIP_VALUES[function]:
        sent = json_to_wasmtime(value, t)
        roundtrip.received.clear()
        back = roundtrip.call(function, sent)
        assert roundtrip.received == [sent]  # the host saw exactly what we sent
        assert wasmtime_to_json(back, t) == validate_json(value, t)


# --- property: JSON -> wasmtime -> JSON is the normalization --------------------------------------

names = st.from_regex(r"[a-z][a-z0-9]{0,3}(-[a-z][a-z0-9]{0,2}){0,1}", fullmatch=True)
primitive_types = st.sampled_from(
    ["bool", "s8", "u8", "s32", "u64", "s64", "f32", "f64", "char", "string"]
).map(WitPrimitive)  # type: ignore[arg-type]


def _types(children: st.SearchStrategy[WitType]) -> st.SearchStrategy[WitType]:
    unique = st.lists(names, min_size=1, max_size=3, unique=True)
    return st.one_of(
        children.map(WitList),
        children.map(WitOption),
        st.builds(WitResult, st.none() | children, st.none() | children),
        st.lists(children, min_size=1, max_size=3).map(lambda es: WitTuple(tuple(es))),
        unique.flatmap(
            lambda ns: st.tuples(*[children for _ in ns]).map(
                lambda ts: WitRecord(tuple(zip(ns, ts, strict=True)))
            )
        ),
        unique.flatmap(
            lambda ns: st.tuples(*[st.none() | children for _ in ns]).map(
                lambda ts: WitVariant(tuple(zip(ns, ts, strict=True)))
            )
        ),
        unique.map(lambda ns: WitEnum(tuple(ns))),
        unique.map(lambda ns: WitFlags(tuple(ns))),
    )


wit_types = st.recursive(primitive_types, _types, max_leaves=8)


def json_values(t: WitType) -> st.SearchStrategy[Any]:
    match t:
        case WitPrimitive(name="bool"):
            return st.booleans()
        case WitPrimitive(name=name) if name in INT_RANGES:
            lo, hi = INT_RANGES[name]
            return st.integers(lo, hi)
        case WitPrimitive(name="f32"):
            return st.floats(width=32, allow_nan=False)
        case WitPrimitive(name="f64"):
            return st.floats(allow_nan=False)
        case WitPrimitive(name="char"):
            return st.characters(exclude_categories=["Cs"])
        case WitPrimitive():
            return st.text(st.characters(exclude_categories=["Cs"]), max_size=5)
        case WitList(element=e):
            return st.lists(json_values(e), max_size=3)
        case WitOption(inner=e):
            return st.none() | json_values(e)
        case WitResult(ok=ok, err=err):
            return st.one_of(
                (st.just(None) if ok is None else json_values(ok)).map(lambda v: {"ok": v}),
                (st.just(None) if err is None else json_values(err)).map(lambda v: {"err": v}),
            )
        case WitTuple(elements=es):
            return st.tuples(*[json_values(e) for e in es]).map(list)
        case WitRecord(fields=fields):
            return st.fixed_dictionaries({n.replace("-", "_"): json_values(ft) for n, ft in fields})
        case WitVariant(cases=cases):
            return st.one_of(
                [
                    st.just(n) if ct is None else json_values(ct).map(lambda v, n=n: {n: v})
                    for n, ct in cases
                ]
            )
        case WitEnum(cases=cs):
            return st.sampled_from(cs)
        case WitFlags(names=ns):
            return st.lists(st.sampled_from(ns), max_size=4)
    raise AssertionError(t)


@given(st.data(), wit_types)
def test_json_wasmtime_json_is_normalization(data: st.DataObject, t: WitType) -> None:
    value = data.draw(json_values(t))
    normalized = validate_json(value, t)
    try:
        native = json_to_wasmtime(value, t)
    except WitValueError as e:
        assume("cannot be passed through wasmtime-py" not in str(e))
        raise
    assert wasmtime_to_json(native, t) == normalized
    assert validate_json(normalized, t) == normalized
