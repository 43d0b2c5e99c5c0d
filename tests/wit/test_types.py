"""WIT type strings: parsing, formatting, errors, and the parse(format(t)) == t round trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.wit.types import (
    BOOL,
    CHAR,
    F32,
    F64,
    PRIMITIVE_NAMES,
    S8,
    S64,
    STRING,
    U8,
    U32,
    U64,
    FunctionSignature,
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
    is_inline,
    is_valid_wit_name,
    parse_wit_type,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bool", BOOL),
        ("s8", S8),
        ("s64", S64),
        ("u8", U8),
        ("u64", U64),
        ("f32", F32),
        ("f64", F64),
        ("float32", F32),
        ("float64", F64),
        ("char", CHAR),
        ("string", STRING),
        ("list<u32>", WitList(U32)),
        ("list<list<string>>", WitList(WitList(STRING))),
        ("option<string>", WitOption(STRING)),
        ("tuple<u8, string>", WitTuple((U8, STRING))),
        ("tuple<u8>", WitTuple((U8,))),
        ("result", WitResult()),
        ("result<string>", WitResult(STRING)),
        ("result<_, string>", WitResult(None, STRING)),
        ("result<string, string>", WitResult(STRING, STRING)),
        ("result<list<u32>, option<string>>", WitResult(WitList(U32), WitOption(STRING))),
        ("  list < u32 >  ", WitList(U32)),
        ("result<_,string>", WitResult(None, STRING)),
        (
            "record { a-b: u32, c: list<string>, }",
            WitRecord((("a-b", U32), ("c", WitList(STRING)))),
        ),
        ("variant { x(u8), y }", WitVariant((("x", U8), ("y", None)))),
        ("enum {a, b-c}", WitEnum(("a", "b-c"))),
        ("flags{r,w}", WitFlags(("r", "w"))),
        ("record { %list: u8 }", WitRecord((("list", U8),))),
    ],
)
def test_parse(text: str, expected: WitType) -> None:
    assert parse_wit_type(text) == expected


@pytest.mark.parametrize(
    ("t", "text"),
    [
        (WitResult(), "result"),
        (WitResult(STRING), "result<string>"),
        (WitResult(None, STRING), "result<_, string>"),
        (WitResult(U32, STRING), "result<u32, string>"),
        (WitTuple((U8, STRING)), "tuple<u8, string>"),
        (WitList(WitOption(CHAR)), "list<option<char>>"),
        (WitRecord((("user-id", U64),)), "record { user-id: u64 }"),
        (WitVariant((("a", STRING), ("b", None))), "variant { a(string), b }"),
        (WitEnum(("x", "y")), "enum { x, y }"),
        (WitFlags(("r",)), "flags { r }"),
    ],
)
def test_format(t: WitType, text: str) -> None:
    assert format_wit_type(t) == text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "at position 0: expected a type, found end of input"),
        ("list<u32", "at position 8: expected '>', found end of input"),
        ("list<u32>>", "at position 9: expected end of input, found '>'"),
        ("list u32", "at position 5: expected '<', found 'u32'"),
        ("u32 u32", "at position 4: expected end of input, found 'u32'"),
        ("tuple<>", "at position 6: expected a type, found '>'"),
        ("tuple<u8,>", "at position 9: expected a type, found '>'"),
        ("result<_>", "at position 8: expected ',' after '_'"),
        ("result<string, string, string>", "at position 21: expected '>', found ','"),
        ("option<>", "at position 7: expected a type, found '>'"),
        ("my-record", "at position 0: unknown type 'my-record'"),
        ("list<foo>", "at position 5: unknown type 'foo'"),
        ("option<_x>", "at position 7: unexpected '_'"),
        ("list<u32]", "at position 8: unexpected ']'"),
        ("record {}", "empty record"),
        ("enum { a, a }", "duplicate name 'a'"),
        ("record { a u32 }", "expected ':', found 'u32'"),
        ("record { Ab: u32 }", "'Ab' is not a kebab-case WIT name"),
        ("variant { a(u8 }", "expected ')', found '}'"),
        ("borrow<x>", "unknown type 'borrow'"),
    ],
)
def test_parse_errors_name_position_and_expectation(text: str, fragment: str) -> None:
    with pytest.raises(WitTypeError) as e:
        parse_wit_type(text)
    assert fragment in str(e.value)
    assert repr(text) in str(e.value) or fragment.startswith("empty")


def test_parse_rejects_non_strings() -> None:
    with pytest.raises(WitTypeError, match="must be a string"):
        parse_wit_type(42)  # type: ignore[arg-type]


def test_is_inline() -> None:
    assert is_inline(parse_wit_type("result<list<tuple<u8, string>>, option<char>>"))
    assert not is_inline(WitList(WitEnum(("a",))))
    assert not is_inline(WitResult(None, WitVariant((("a", None),))))


@pytest.mark.parametrize("name", ["a", "user-id", "HTTP-error", "a1-b2", "x-Y"])
def test_valid_names(name: str) -> None:
    assert is_valid_wit_name(name)


@pytest.mark.parametrize("name", ["", "-a", "a-", "a--b", "1a", "a-1b", "aB", "a_b"])
def test_invalid_names(name: str) -> None:
    assert not is_valid_wit_name(name)


def test_types_are_hashable_and_compare_structurally() -> None:
    a = parse_wit_type("result<list<u32>, string>")
    b = WitResult(WitList(WitPrimitive("u32")), STRING)
    assert a == b and hash(a) == hash(b)
    assert {a: 1}[b] == 1


def test_function_signature_format() -> None:
    sig = FunctionSignature([("name", STRING), ("n", U32)], WitResult(STRING, STRING))
    assert sig.format() == "func(name: string, n: u32) -> result<string, string>"
    assert FunctionSignature([], None).format() == "func()"


# --- property: parse(format(t)) == t -----------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9]{0,4}(-[a-z][a-z0-9]{0,3}){0,2}", fullmatch=True)
primitives = st.sampled_from(sorted(PRIMITIVE_NAMES)).map(WitPrimitive)  # type: ignore[arg-type]


def _compound(children: st.SearchStrategy[WitType]) -> st.SearchStrategy[WitType]:
    return st.one_of(
        children.map(WitList),
        children.map(WitOption),
        st.builds(WitResult, st.none() | children, st.none() | children),
        st.lists(children, min_size=1, max_size=4).map(lambda es: WitTuple(tuple(es))),
    )


def _named(children: st.SearchStrategy[WitType]) -> st.SearchStrategy[WitType]:
    unique_names = st.lists(names, min_size=1, max_size=4, unique=True)
    return st.one_of(
        unique_names.flatmap(
            lambda ns: st.tuples(*[children for _ in ns]).map(
                lambda ts: WitRecord(tuple(zip(ns, ts, strict=True)))
            )
        ),
        unique_names.flatmap(
            lambda ns: st.tuples(*[st.none() | children for _ in ns]).map(
                lambda ts: WitVariant(tuple(zip(ns, ts, strict=True)))
            )
        ),
        unique_names.map(lambda ns: WitEnum(tuple(ns))),
        unique_names.map(lambda ns: WitFlags(tuple(ns))),
    )


inline_types = st.recursive(primitives, _compound, max_leaves=12)
all_types = st.recursive(primitives, lambda c: _compound(c) | _named(c), max_leaves=12)


@given(inline_types)
def test_inline_types_round_trip(t: WitType) -> None:
    assert is_inline(t)
    assert parse_wit_type(format_wit_type(t)) == t


@given(all_types)
def test_all_types_round_trip(t: WitType) -> None:
    assert parse_wit_type(format_wit_type(t)) == t
