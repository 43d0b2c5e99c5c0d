"""A model of WIT value types, with a formatter and a parser for type strings.

Types come from two places: WASM components (via `wit_type_from_wasmtime` in `codec`) and
the `params` / `return_type` strings of `deployment.toml` (via `parse_wit_type`). Both end
up as the same frozen, hashable dataclasses, so signatures from either source compare equal
when they describe the same type.

WIT type strings follow WIT syntax: `u32`, `string`, `list<u8>`, `option<string>`,
`tuple<u8, string>`, `result`, `result<T>`, `result<_, E>`, `result<T, E>`. Records, variants,
enums and flags have no inline syntax in WIT (they are always named); `format_wit_type`
writes them as `record { a: u32 }`, `variant { a(string), b }`, `enum { a, b }`,
`flags { a, b }`, and the parser accepts that form too, so formatting always round-trips.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

PrimitiveName = Literal[
    "bool", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "f32", "f64", "char", "string"
]
PRIMITIVE_NAMES: frozenset[str] = frozenset(get_args(PrimitiveName))

#: Inclusive ranges of the integer types.
INT_RANGES: dict[str, tuple[int, int]] = {
    "u8": (0, 2**8 - 1),
    "u16": (0, 2**16 - 1),
    "u32": (0, 2**32 - 1),
    "u64": (0, 2**64 - 1),
    "s8": (-(2**7), 2**7 - 1),
    "s16": (-(2**15), 2**15 - 1),
    "s32": (-(2**31), 2**31 - 1),
    "s64": (-(2**63), 2**63 - 1),
}

# Older spellings still found in WIT documents.
_PRIMITIVE_ALIASES = {"float32": "f32", "float64": "f64"}


class WitTypeError(ValueError):
    """A type string does not parse, or a type cannot be represented in this model."""


@dataclass(frozen=True, slots=True)
class WitPrimitive:
    name: PrimitiveName


@dataclass(frozen=True, slots=True)
class WitList:
    element: WitType


@dataclass(frozen=True, slots=True)
class WitOption:
    inner: WitType


@dataclass(frozen=True, slots=True)
class WitResult:
    """`result<ok, err>`; either side may be absent (`result`, `result<T>`, `result<_, E>`)."""

    ok: WitType | None = None
    err: WitType | None = None


@dataclass(frozen=True, slots=True)
class WitTuple:
    elements: tuple[WitType, ...]


@dataclass(frozen=True, slots=True)
class WitRecord:
    """Field names are kebab-case as in WIT (JSON uses them in snake_case)."""

    fields: tuple[tuple[str, WitType], ...]


@dataclass(frozen=True, slots=True)
class WitVariant:
    cases: tuple[tuple[str, WitType | None], ...]


@dataclass(frozen=True, slots=True)
class WitEnum:
    cases: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class WitFlags:
    names: tuple[str, ...]


WitType: TypeAlias = (
    WitPrimitive
    | WitList
    | WitOption
    | WitResult
    | WitTuple
    | WitRecord
    | WitVariant
    | WitEnum
    | WitFlags
)

BOOL = WitPrimitive("bool")
S8 = WitPrimitive("s8")
S16 = WitPrimitive("s16")
S32 = WitPrimitive("s32")
S64 = WitPrimitive("s64")
U8 = WitPrimitive("u8")
U16 = WitPrimitive("u16")
U32 = WitPrimitive("u32")
U64 = WitPrimitive("u64")
F32 = WitPrimitive("f32")
F64 = WitPrimitive("f64")
CHAR = WitPrimitive("char")
STRING = WitPrimitive("string")


@dataclass(frozen=True, slots=True)
class FunctionSignature:
    """Parameter names and types of an exported function, and its result type (None: none)."""

    params: list[tuple[str, WitType]]
    result: WitType | None

    def format(self) -> str:
        params = ", ".join(f"{name}: {format_wit_type(t)}" for name, t in self.params)
        ret = "" if self.result is None else f" -> {format_wit_type(self.result)}"
        return f"func({params}){ret}"


def is_inline(t: WitType) -> bool:
    """True when `t` is expressible in plain WIT type syntax (no record/variant/enum/flags)."""
    match t:
        case WitPrimitive():
            return True
        case WitList(element=e) | WitOption(inner=e):
            return is_inline(e)
        case WitResult(ok=ok, err=err):
            return all(is_inline(x) for x in (ok, err) if x is not None)
        case WitTuple(elements=es):
            return all(is_inline(e) for e in es)
        case _:
            return False


def format_wit_type(t: WitType) -> str:
    """WIT syntax for `t` (see the module docstring for records, variants, enums and flags)."""
    match t:
        case WitPrimitive(name=name):
            return name
        case WitList(element=e):
            return f"list<{format_wit_type(e)}>"
        case WitOption(inner=e):
            return f"option<{format_wit_type(e)}>"
        case WitResult(ok=None, err=None):
            return "result"
        case WitResult(ok=ok, err=None):
            assert ok is not None
            return f"result<{format_wit_type(ok)}>"
        case WitResult(ok=ok, err=err):
            assert err is not None
            ok_s = "_" if ok is None else format_wit_type(ok)
            return f"result<{ok_s}, {format_wit_type(err)}>"
        case WitTuple(elements=es):
            return f"tuple<{', '.join(format_wit_type(e) for e in es)}>"
        case WitRecord(fields=fields):
            inner = ", ".join(f"{n}: {format_wit_type(ft)}" for n, ft in fields)
            return f"record {{ {inner} }}"
        case WitVariant(cases=cases):
            inner = ", ".join(n if ct is None else f"{n}({format_wit_type(ct)})" for n, ct in cases)
            return f"variant {{ {inner} }}"
        case WitEnum(cases=names):
            return f"enum {{ {', '.join(names)} }}"
        case WitFlags(names=names):
            return f"flags {{ {', '.join(names)} }}"
    raise TypeError(f"not a WIT type: {t!r}")


# A WIT identifier: kebab-case words, each all-lowercase or all-uppercase, optionally
# `%`-escaped (for keywords used as names).
_IDENT_RE = re.compile(r"%?[a-zA-Z][a-zA-Z0-9]*(?:-[a-zA-Z0-9]+)*")
_WORD_RE = re.compile(r"[a-z][a-z0-9]*|[A-Z][A-Z0-9]*")
_PUNCT = frozenset("<>,(){}:_")


def is_valid_wit_name(name: str) -> bool:
    """True for a kebab-case WIT identifier such as `user-id` or `HTTP-error`."""
    if not name:
        return False
    words = name.split("-")
    return all(_WORD_RE.fullmatch(w) for w in words) and not words[0][0].isdigit()


@dataclass(frozen=True, slots=True)
class _Token:
    kind: Literal["ident", "punct", "end"]
    text: str
    pos: int


def _tokenize(s: str) -> list[_Token]:
    tokens: list[_Token] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c.isspace():
            i += 1
            continue
        if c == "_" and not (i + 1 < len(s) and (s[i + 1].isalnum() or s[i + 1] == "-")):
            tokens.append(_Token("punct", c, i))
            i += 1
            continue
        if c in _PUNCT and c != "_":
            tokens.append(_Token("punct", c, i))
            i += 1
            continue
        m = _IDENT_RE.match(s, i)
        if m is None:
            raise WitTypeError(f"cannot parse type {s!r}: at position {i}: unexpected {c!r}")
        tokens.append(_Token("ident", m.group(), i))
        i = m.end()
    tokens.append(_Token("end", "", len(s)))
    return tokens


class _Parser:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tokens = _tokenize(source)
        self.i = 0

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def next(self) -> _Token:
        tok = self.tokens[self.i]
        if tok.kind != "end":
            self.i += 1
        return tok

    def fail(self, expected: str, tok: _Token | None = None) -> WitTypeError:
        tok = tok or self.peek()
        found = "end of input" if tok.kind == "end" else repr(tok.text)
        return WitTypeError(
            f"cannot parse type {self.source!r}: at position {tok.pos}: "
            f"expected {expected}, found {found}"
        )

    def expect(self, punct: str) -> None:
        tok = self.peek()
        if tok.kind != "punct" or tok.text != punct:
            raise self.fail(repr(punct))
        self.next()

    def accept(self, punct: str) -> bool:
        tok = self.peek()
        if tok.kind == "punct" and tok.text == punct:
            self.next()
            return True
        return False

    def name(self, what: str) -> str:
        tok = self.peek()
        if tok.kind != "ident":
            raise self.fail(what)
        self.next()
        name = tok.text.removeprefix("%")
        if not is_valid_wit_name(name):
            raise WitTypeError(
                f"cannot parse type {self.source!r}: at position {tok.pos}: "
                f"{name!r} is not a kebab-case WIT name"
            )
        return name

    def parse_type(self) -> WitType:
        tok = self.peek()
        if tok.kind != "ident":
            raise self.fail("a type")
        self.next()
        word = _PRIMITIVE_ALIASES.get(tok.text, tok.text)
        if word in PRIMITIVE_NAMES:
            return WitPrimitive(word)  # type: ignore[arg-type]
        if word == "list":
            self.expect("<")
            element = self.parse_type()
            self.expect(">")
            return WitList(element)
        if word == "option":
            self.expect("<")
            inner = self.parse_type()
            self.expect(">")
            return WitOption(inner)
        if word == "result":
            return self.parse_result()
        if word == "tuple":
            self.expect("<")
            elements = [self.parse_type()]
            while self.accept(","):
                elements.append(self.parse_type())
            self.expect(">")
            return WitTuple(tuple(elements))
        if word in ("record", "variant", "enum", "flags"):
            return self.parse_braced(word)
        raise WitTypeError(
            f"cannot parse type {self.source!r}: at position {tok.pos}: unknown type {tok.text!r} "
            "(named types are only known inside WASM components)"
        )

    def parse_result(self) -> WitResult:
        if not self.accept("<"):
            return WitResult()
        ok: WitType | None
        if self.accept("_"):
            ok = None
            if not self.accept(","):
                raise self.fail("',' after '_' (write `result` for no payloads)")
            err: WitType | None = self.parse_type()
        else:
            ok = self.parse_type()
            err = self.parse_type() if self.accept(",") else None
        self.expect(">")
        return WitResult(ok, err)

    def parse_braced(self, word: str) -> WitType:
        self.expect("{")
        names: list[str] = []
        items: list[tuple[str, WitType | None]] = []
        while not self.accept("}"):
            if names and not self.accept(","):
                raise self.fail("',' or '}'")
            if self.accept("}"):  # trailing comma
                break
            name_tok = self.peek()
            name = self.name("a name")
            if name in names:
                raise WitTypeError(
                    f"cannot parse type {self.source!r}: at position {name_tok.pos}: "
                    f"duplicate name {name!r}"
                )
            names.append(name)
            payload: WitType | None = None
            if word == "record":
                self.expect(":")
                payload = self.parse_type()
            elif word == "variant" and self.accept("("):
                payload = self.parse_type()
                self.expect(")")
            items.append((name, payload))
        if not items:
            raise WitTypeError(f"cannot parse type {self.source!r}: empty {word}")
        if word == "record":
            return WitRecord(tuple((n, t) for n, t in items if t is not None))
        if word == "variant":
            return WitVariant(tuple(items))
        if word == "enum":
            return WitEnum(tuple(names))
        return WitFlags(tuple(names))


def parse_wit_type(s: str) -> WitType:
    """Parse a WIT type string such as `result<list<u32>, string>`; `WitTypeError` if invalid."""
    if not isinstance(s, str):
        raise WitTypeError(f"a WIT type must be a string, got {type(s).__name__}")
    parser = _Parser(s)
    t = parser.parse_type()
    if parser.peek().kind != "end":
        raise parser.fail("end of input")
    return t
