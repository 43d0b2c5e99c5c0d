"""Identifiers (SPEC §2): execution ids, join set ids, delay ids, executor/run ids.

Child execution ids and delay ids are derived from the parent's id, the join set and a
per-join-set counter, never random, so that replay reproduces them.
"""

from __future__ import annotations

import os
import random
import re
import time
from dataclasses import dataclass
from typing import Literal

from ulid import ULID

# ULIDs without a system call each (`ULID()` reads os.urandom, which gives up the GIL
# on every run a busy engine starts): unique, not unpredictable; reseeded in a fork.
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_random = random.Random(os.urandom(16))
os.register_at_fork(after_in_child=lambda: _random.seed(os.urandom(16)))


def new_ulid() -> str:
    """A ULID's text: 48 bits of milliseconds since the epoch, 80 random bits."""
    value = (time.time_ns() // 1_000_000) << 80 | _random.getrandbits(80)
    return "".join([_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5)])


# Crockford base32, canonical upper case; the first character is at most 7 (128 bits).
_ULID_RE = r"[0-7][0-9A-HJKMNP-TV-Z]{25}"
_NAME_RE = r"[A-Za-z0-9-]+"  # join set names: no '.', '_' or ':' so ids stay parseable
# Always used with `fullmatch` (a `$` anchor would accept a trailing newline).
_NAME_PATTERN = re.compile(_NAME_RE)
_ULID_PATTERN = re.compile(_ULID_RE)
_JOIN_SET_RE = re.compile(rf"(?P<kind>[ogn]):(?P<name>{_NAME_RE})")
_TOP_LEVEL_RE = re.compile(rf"E_(?P<ulid>{_ULID_RE})")
_SEGMENT_RE = re.compile(rf"(?P<kind>[ogn]):(?P<name>{_NAME_RE})_(?P<n>[1-9][0-9]*)")

#: A child or delay index has at most this many digits (below 2**63, so it fits every
#: database's integers); longer ones are refused before `int()` sees them, which would
#: raise a bare ValueError past 4,300 digits (Python's int-from-str limit).
MAX_INDEX_DIGITS = 18
_BOUNDED_SEGMENT = rf"\.[ogn]:{_NAME_RE}_[1-9][0-9]{{0,{MAX_INDEX_DIGITS - 1}}}"
#: The formats as regular expressions (valid in Python and ECMA-262), for documents such
#: as the OpenAPI description; `ExecutionId.parse` and `DelayId.parse` accept the same.
EXECUTION_ID_PATTERN = rf"^E_{_ULID_RE}({_BOUNDED_SEGMENT})*$"
DELAY_ID_PATTERN = rf"^Delay_{_ULID_RE}({_BOUNDED_SEGMENT})+$"


class IdError(ValueError):
    """An identifier that does not follow the formats of SPEC §2."""


JoinSetKind = Literal["o", "g", "n"]


@dataclass(frozen=True, slots=True, order=True)
class JoinSetId:
    """`o:1-step` (one-off), `g:2` (generated), `n:checkout` (named)."""

    kind: JoinSetKind
    name: str

    def __post_init__(self) -> None:
        if self.kind not in ("o", "g", "n"):
            raise IdError(f"invalid join set kind {self.kind!r}: expected 'o', 'g' or 'n'")
        JoinSetId.validate_name(self.name)

    def __str__(self) -> str:
        return join_set_text(self.kind, self.name)

    @staticmethod
    def parse(text: str) -> JoinSetId:
        m = _JOIN_SET_RE.fullmatch(text)
        if not m:
            raise IdError(f"invalid join set id {text!r}: expected o:NAME, g:NAME or n:NAME")
        kind: JoinSetKind = m["kind"]  # type: ignore[assignment]
        return JoinSetId(kind, m["name"])

    @staticmethod
    def validate_name(name: str) -> str:
        if not isinstance(name, str) or not _NAME_PATTERN.fullmatch(name):
            raise IdError(f"invalid join set name {name!r}: use letters, digits and '-' only")
        return name


@dataclass(frozen=True, slots=True)
class ExecutionId:
    """A top-level id (`E_<ULID>`) or a derived child id (`<parent>.<join set>_<n>`)."""

    ulid: str
    path: tuple[tuple[JoinSetId, int], ...] = ()

    @staticmethod
    def generate() -> ExecutionId:
        return ExecutionId(new_ulid())

    @staticmethod
    def from_ulid(ulid: ULID | str) -> ExecutionId:
        text = str(ulid)
        if not _ULID_PATTERN.fullmatch(text):
            raise IdError(f"invalid ULID {text!r}: expected 26 Crockford base32 characters")
        return ExecutionId(text)

    @staticmethod
    def parse(text: str) -> ExecutionId:
        head, *segments = text.split(".")
        m = _TOP_LEVEL_RE.fullmatch(head)
        if not m:
            raise IdError(
                f"invalid execution id {_shortened(text)}: expected E_<ULID>[.<join set>_<n>…]"
            )
        path: list[tuple[JoinSetId, int]] = []
        for seg in segments:
            sm = _SEGMENT_RE.fullmatch(seg)
            if not sm:
                raise IdError(
                    f"invalid execution id {_shortened(text)}: bad child segment {_shortened(seg)}"
                )
            if len(sm["n"]) > MAX_INDEX_DIGITS:
                raise IdError(
                    f"invalid execution id {_shortened(text)}: the index of child segment "
                    f"{_shortened(seg)} has more than {MAX_INDEX_DIGITS} digits"
                )
            kind: JoinSetKind = sm["kind"]  # type: ignore[assignment]
            path.append((JoinSetId(kind, sm["name"]), int(sm["n"])))
        return ExecutionId(m["ulid"], tuple(path))

    def __str__(self) -> str:
        return "E_" + self.ulid + _format_path(self.path)

    @property
    def is_top_level(self) -> bool:
        return not self.path

    def child(self, join_set: JoinSetId, n: int) -> ExecutionId:
        """The derived id of the n-th child (n from 1) submitted into `join_set`."""
        if n < 1:
            raise IdError(f"invalid child index {n!r} in {join_set}: it starts at 1")
        return ExecutionId(self.ulid, (*self.path, (join_set, n)))

    def delay(self, join_set: JoinSetId, n: int) -> DelayId:
        if n < 1:
            raise IdError(f"invalid delay index {n!r} in {join_set}: it starts at 1")
        return DelayId(self.ulid, (*self.path, (join_set, n)))

    def parent(self) -> tuple[ExecutionId, JoinSetId] | None:
        """The parent execution and the join set this child was submitted into."""
        if not self.path:
            return None
        return ExecutionId(self.ulid, self.path[:-1]), self.path[-1][0]

    def top_level(self) -> ExecutionId:
        return ExecutionId(self.ulid)


@dataclass(frozen=True, slots=True)
class DelayId:
    """`Delay_<top-level ULID><same infix as a child>`."""

    ulid: str
    path: tuple[tuple[JoinSetId, int], ...]

    def __str__(self) -> str:
        return "Delay_" + self.ulid + _format_path(self.path)

    @staticmethod
    def parse(text: str) -> DelayId:
        if not text.startswith("Delay_"):
            raise IdError(f"invalid delay id {text!r}: expected Delay_<ULID>.<join set>_<n>")
        try:
            as_exec = ExecutionId.parse("E_" + text[len("Delay_") :])
        except IdError:
            raise IdError(
                f"invalid delay id {_shortened(text)}: expected Delay_<ULID>.<join set>_<n>… "
                f"(an index has at most {MAX_INDEX_DIGITS} digits)"
            ) from None
        if not as_exec.path:
            raise IdError(f"invalid delay id {text!r}: missing join set segment")
        return DelayId(as_exec.ulid, as_exec.path)

    def owner(self) -> tuple[ExecutionId, JoinSetId]:
        """The execution that requested the delay and its join set."""
        return ExecutionId(self.ulid, self.path[:-1]), self.path[-1][0]


def _shortened(text: str, limit: int = 80) -> str:
    """`text` quoted, cut in the middle when long: an error message stays readable."""
    if len(text) <= limit:
        return repr(text)
    half = limit // 2
    return repr(text[:half] + "…" + text[-half:])


def _format_path(path: tuple[tuple[JoinSetId, int], ...]) -> str:
    return "".join(_segment(str(js), n) for js, n in path)


def _segment(join_set_id: str, n: int) -> str:
    return f".{join_set_id}_{n}"


# The same ids as text, for the paths every workflow step takes (a step made ~20 Python
# calls parsing, building and formatting `ExecutionId`s and `JoinSetId`s). Each is the
# text of its structured counterpart (tests compare them).


def join_set_text(kind: JoinSetKind, name: str) -> str:
    """`str(JoinSetId(kind, name))`, with `name` checked the same way (`IdError`)."""
    return f"{kind}:{JoinSetId.validate_name(name)}"


def child_id_text(parent_id: str, join_set_id: str, n: int) -> str:
    """`str(ExecutionId.parse(parent_id).child(JoinSetId.parse(join_set_id), n))` for
    ids that are valid (made by this module), `n` ≥ 1."""
    return parent_id + _segment(join_set_id, n)


def parent_id_text(execution_id: str) -> tuple[str, str] | None:
    """`ExecutionId.parse(execution_id).parent()` as text for a valid id (one read
    from storage): the parent's id and the join set id, None for a top-level id."""
    parent, dot, segment = execution_id.rpartition(".")
    if not dot:
        return None
    return parent, segment.rpartition("_")[0]


def _prefixed_parse(prefix: str, text: str) -> str:
    if not text.startswith(prefix) or not _ULID_PATTERN.fullmatch(text[len(prefix) :]):
        raise IdError(f"invalid id {text!r}: expected {prefix}<ULID>")
    return text


def new_executor_id() -> str:
    return "Exr_" + new_ulid()


def new_run_id() -> str:
    return "Run_" + new_ulid()


def new_deployment_id() -> str:
    return "Dep_" + new_ulid()


def parse_executor_id(text: str) -> str:
    return _prefixed_parse("Exr_", text)


def parse_run_id(text: str) -> str:
    return _prefixed_parse("Run_", text)


def parse_execution_id(text: str) -> ExecutionId:
    return ExecutionId.parse(text)
