"""Identifiers (SPEC §2): parse/format round trips, derived ids, invalid inputs."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ulid import ULID

from engine.core.ids import (
    DelayId,
    ExecutionId,
    IdError,
    JoinSetId,
    child_id_text,
    join_set_text,
    new_deployment_id,
    new_executor_id,
    new_run_id,
    parent_id_text,
    parse_execution_id,
    parse_executor_id,
    parse_run_id,
)

U = "01JKX3M7V9Q2R8T5W0Y4Z6A1BC"
TOP = f"E_{U}"


# ---------------------------------------------------------------------------
# Join set ids
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["o:1-step", "o:2-sleep", "g:1", "g:42", "n:checkout", "n:a"])
def test_join_set_round_trip(text: str) -> None:
    js = JoinSetId.parse(text)
    assert str(js) == text
    assert JoinSetId.parse(str(js)) == js


def test_join_set_fields() -> None:
    assert JoinSetId.parse("o:1-step") == JoinSetId("o", "1-step")
    assert JoinSetId.parse("n:checkout").kind == "n"
    assert JoinSetId.parse("n:checkout").name == "checkout"


@pytest.mark.parametrize(
    "text",
    ["", "g", "g:", ":1", "x:1", "G:1", "g:1_1", "g:a.b", "g:a:b", "g:a b", " g:1", "g:1\n"],
)
def test_join_set_invalid(text: str) -> None:
    with pytest.raises(IdError, match=re.escape(repr(text))):
        JoinSetId.parse(text)


@pytest.mark.parametrize("name", ["", "a.b", "a_b", "a:b", "a b", "a\n", "é"])
def test_join_set_invalid_name(name: str) -> None:
    with pytest.raises(IdError, match=re.escape(repr(name))):
        JoinSetId.validate_name(name)
    with pytest.raises(IdError, match=re.escape(repr(name))):
        JoinSetId("n", name)


def test_join_set_invalid_kind() -> None:
    with pytest.raises(IdError, match="'x'"):
        JoinSetId("x", "1")  # type: ignore[arg-type]


def test_join_set_valid_name_returned() -> None:
    assert JoinSetId.validate_name("my-set-1") == "my-set-1"


# ---------------------------------------------------------------------------
# Execution ids
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        TOP,
        f"{TOP}.g:1_1",
        f"{TOP}.o:1-step_1",
        f"{TOP}.n:checkout_12",
        f"{TOP}.g:1_2.o:3-sleep_1",
        f"{TOP}.g:1_2.o:3-sleep_1.n:x_7",
        "E_7ZZZZZZZZZZZZZZZZZZZZZZZZZ",
        "E_00000000000000000000000000",
    ],
)
def test_execution_id_round_trip(text: str) -> None:
    eid = ExecutionId.parse(text)
    assert str(eid) == text
    assert ExecutionId.parse(str(eid)) == eid
    assert parse_execution_id(text) == eid


def test_top_level_fields() -> None:
    eid = ExecutionId.parse(TOP)
    assert eid.ulid == U
    assert eid.path == ()
    assert eid.is_top_level
    assert eid.parent() is None
    assert eid.top_level() == eid


def test_child_id_derived() -> None:
    top = ExecutionId.parse(TOP)
    js = JoinSetId("g", "1")
    child = top.child(js, 1)
    assert str(child) == f"{TOP}.g:1_1"
    assert not child.is_top_level
    assert child.parent() == (top, js)
    assert child.top_level() == top
    # derived, never random: the same inputs give the same id
    assert top.child(js, 1) == child
    assert top.child(js, 2) != child
    assert top.child(JoinSetId("g", "2"), 1) != child


def test_nested_child_id() -> None:
    top = ExecutionId.parse(TOP)
    g1 = JoinSetId.parse("g:1")
    o3 = JoinSetId.parse("o:3-sleep")
    child = top.child(g1, 2)
    grandchild = child.child(o3, 1)
    assert str(grandchild) == f"{TOP}.g:1_2.o:3-sleep_1"
    assert ExecutionId.parse(str(grandchild)) == grandchild
    assert grandchild.parent() == (child, o3)
    assert child.parent() == (top, g1)
    assert grandchild.top_level() == top
    assert grandchild.path == ((g1, 2), (o3, 1))


def test_delay_id_derived() -> None:
    top = ExecutionId.parse(TOP)
    js = JoinSetId.parse("o:2-sleep")
    d = top.delay(js, 1)
    assert str(d) == f"Delay_{U}.o:2-sleep_1"
    assert DelayId.parse(str(d)) == d
    assert d.owner() == (top, js)


def test_delay_of_child() -> None:
    child = ExecutionId.parse(f"{TOP}.g:1_2")
    js = JoinSetId.parse("o:1-sleep")
    d = child.delay(js, 3)
    assert str(d) == f"Delay_{U}.g:1_2.o:1-sleep_3"
    assert DelayId.parse(str(d)) == d
    assert d.owner() == (child, js)


def test_child_and_delay_with_same_infix_differ() -> None:
    top = ExecutionId.parse(TOP)
    js = JoinSetId.parse("g:1")
    assert str(top.child(js, 1)).removeprefix("E_") == str(top.delay(js, 1)).removeprefix("Delay_")


@pytest.mark.parametrize("n", [0, -1])
def test_child_index_starts_at_one(n: int) -> None:
    top = ExecutionId.parse(TOP)
    js = JoinSetId.parse("g:1")
    with pytest.raises(IdError, match=str(n)):
        top.child(js, n)
    with pytest.raises(IdError, match=str(n)):
        top.delay(js, n)


def test_generate_is_top_level_and_parses() -> None:
    a, b = ExecutionId.generate(), ExecutionId.generate()
    assert a != b
    assert a.is_top_level
    assert ExecutionId.parse(str(a)) == a


def test_from_ulid() -> None:
    u = ULID()
    assert str(ExecutionId.from_ulid(u)) == f"E_{u}"
    assert ExecutionId.from_ulid(U) == ExecutionId.parse(TOP)


@pytest.mark.parametrize("text", ["", "nope", U[:-1], "8" + U[1:], U.lower()])
def test_from_ulid_invalid(text: str) -> None:
    with pytest.raises(IdError, match=re.escape(repr(text))):
        ExecutionId.from_ulid(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        U,  # no prefix
        f"e_{U}",
        f"E_{U[:-1]}",  # 25 chars
        f"E_{U}A",  # 27 chars
        f"E_{U.lower()}",
        f"E_{U[:-1]}I",  # I is not Crockford
        f"E_{U[:-1]}O",
        f"E_{U[:-1]}U",
        f"E_8{U[1:]}",  # overflows 128 bits
        f"E_{U}\n",
        f" E_{U}",
        f"E_{U}.",
        f"E_{U}.g:1",
        f"E_{U}.g:1_0",
        f"E_{U}.g:1_01",
        f"E_{U}.g:1_-1",
        f"E_{U}.g:1_x",
        f"E_{U}.x:1_1",
        f"E_{U}.g:1_1.",
        f"E_{U}.g:1_1\n",
        f"E_{U}..g:1_1",
        f"E_{U}.g:a b_1",
        f"Delay_{U}.g:1_1",
        f"Exr_{U}",
    ],
)
def test_execution_id_invalid(text: str) -> None:
    with pytest.raises(IdError, match=re.escape(repr(text))):
        ExecutionId.parse(text)
    with pytest.raises(IdError):
        parse_execution_id(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        f"Delay_{U}",  # no join set segment
        f"delay_{U}.g:1_1",
        f"E_{U}.g:1_1",
        f"Delay_{U[:-1]}.g:1_1",
        f"Delay_{U}.g:1_0",
        f"Delay_{U}.g:1_1\n",
        f"Delay_{U}.g:1",
    ],
)
def test_delay_id_invalid(text: str) -> None:
    with pytest.raises(IdError, match=re.escape(repr(text))):
        DelayId.parse(text)


# ---------------------------------------------------------------------------
# Executor, run, deployment ids
# ---------------------------------------------------------------------------


def test_prefixed_ids() -> None:
    exr, run, dep = new_executor_id(), new_run_id(), new_deployment_id()
    assert exr.startswith("Exr_") and len(exr) == 4 + 26
    assert run.startswith("Run_") and len(run) == 4 + 26
    assert dep.startswith("Dep_") and len(dep) == 4 + 26
    assert parse_executor_id(exr) == exr
    assert parse_run_id(run) == run
    assert new_run_id() != run


@pytest.mark.parametrize(
    "text", ["", "Exr_", f"Run_{U}", f"Exr_{U}\n", f"Exr_{U[:-1]}", f"exr_{U}", f"Exr_{U}x"]
)
def test_executor_id_invalid(text: str) -> None:
    with pytest.raises(IdError, match=re.escape(repr(text))):
        parse_executor_id(text)


@pytest.mark.parametrize("text", ["", f"Exr_{U}", f"Run_{U}.g:1_1", f"Run_{U.lower()}"])
def test_run_id_invalid(text: str) -> None:
    with pytest.raises(IdError, match=re.escape(repr(text))):
        parse_run_id(text)


# ---------------------------------------------------------------------------
# Property: any derived id round-trips
# ---------------------------------------------------------------------------

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
ulids = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("01234567"),
    st.text(alphabet=_CROCKFORD, min_size=25, max_size=25),
)
names = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-",
    min_size=1,
    max_size=12,
)
join_sets = st.builds(JoinSetId, st.sampled_from(["o", "g", "n"]), names)
paths = st.lists(st.tuples(join_sets, st.integers(min_value=1, max_value=10**6)), max_size=4)


@settings(max_examples=300, deadline=None)
@given(ulids, paths)
def test_execution_id_round_trip_property(ulid: str, path: list[tuple[JoinSetId, int]]) -> None:
    eid = ExecutionId.from_ulid(ulid)
    for js, n in path:
        child = eid.child(js, n)
        assert child.parent() == (eid, js)
        eid = child
    text = str(eid)
    assert ExecutionId.parse(text) == eid
    assert str(ExecutionId.parse(text)) == text
    assert eid.top_level() == ExecutionId.from_ulid(ulid)


@settings(max_examples=300, deadline=None)
@given(ulids, paths, join_sets, st.integers(min_value=1, max_value=10**6))
def test_ids_as_text_are_the_texts_of_the_structured_ids(
    ulid: str, path: list[tuple[JoinSetId, int]], js: JoinSetId, n: int
) -> None:
    """The hot paths' text-level ids (`join_set_text`, `child_id_text`,
    `parent_id_text`) agree with `JoinSetId`/`ExecutionId` on every valid id."""
    parent = ExecutionId(ulid, tuple(path))
    assert join_set_text(js.kind, js.name) == str(js)
    child = child_id_text(str(parent), str(js), n)
    assert child == str(parent.child(js, n))
    assert parent_id_text(child) == (str(parent), str(js))
    top = parent.top_level()
    assert parent_id_text(str(top)) is None
    assert parent_id_text(str(parent)) == (
        None if not path else (str(ExecutionId(ulid, tuple(path[:-1]))), str(path[-1][0]))
    )


@pytest.mark.parametrize("name", ["", "a_b", "a.b", "a:b", "é", "a b"])
def test_join_set_text_checks_the_name_as_join_set_id_does(name: str) -> None:
    with pytest.raises(IdError, match="invalid join set name"):
        join_set_text("n", name)
    with pytest.raises(IdError, match="invalid join set name"):
        JoinSetId("n", name)


@settings(max_examples=200, deadline=None)
@given(ulids, paths, join_sets, st.integers(min_value=1, max_value=10**6))
def test_delay_id_round_trip_property(
    ulid: str, path: list[tuple[JoinSetId, int]], js: JoinSetId, n: int
) -> None:
    owner = ExecutionId(ulid, tuple(path))
    d = owner.delay(js, n)
    assert DelayId.parse(str(d)) == d
    assert d.owner() == (owner, js)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_parse_never_crashes_otherwise(text: str) -> None:
    """Arbitrary text either parses into an id that formats back identically, or IdError."""
    try:
        eid = ExecutionId.parse(text)
    except IdError:
        pass
    else:
        assert str(eid) == text
    try:
        d = DelayId.parse(text)
    except IdError:
        pass
    else:
        assert str(d) == text


def test_new_ulids_are_valid_unique_and_time_ordered() -> None:
    import time

    from ulid import ULID

    from engine.core.ids import new_ulid

    before = int(time.time() * 1000)
    ids = [new_ulid() for _ in range(10_000)]
    after = int(time.time() * 1000)
    assert len(set(ids)) == len(ids)
    for text in ids[:100]:
        assert ExecutionId.parse(f"E_{text}").ulid == text
        assert before <= ULID.from_str(text).milliseconds <= after
    # Later milliseconds sort later (the random part orders ids within one).
    first, second = new_ulid(), (time.sleep(0.002), new_ulid())[1]
    assert first < second
