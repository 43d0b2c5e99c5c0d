"""`ShardedStorage` (`engine.storage.sharded`): one engine's executions in several SQLite
files. Here in one process: shard 0 opened as the API's own, shard 1 opened twice — as the
API's observer and as its owner (what the helper process has), with real files and the
real peer bus between the two.

Lists are checked against their definition: every shard's rows that pass the filter,
sorted in the order asked for, then offset and limit applied.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.core import events as ev
from engine.core.ids import ExecutionId
from engine.core.state import Paused
from engine.storage.contract import Conflict, ExecutionRow, ListFilter, NotFound
from engine.storage.sharded import (
    ShardedStorage,
    existing_shards,
    home_shard,
    shard_path,
)
from engine.storage.sqlite import SqliteStorage
from engine.storage.sqlite import peers as sqlite_peers

from .conftest import OTHER_FFQN, WORKFLOW_FFQN, at, create_request
from .test_contract import OK42, BlockedParent, _list_fixture, create, finish, lock
from .test_sqlite_shared import _sleeping_workflow

pytestmark = pytest.mark.skipif(not sqlite_peers.supported(), reason="the peer bus is Linux-only")


@dataclasses.dataclass
class Shards:
    sharded: ShardedStorage
    #: What each shard's owner process has open (shard 0's is the API's own).
    owners: list[SqliteStorage]


@pytest.fixture
async def shards(tmp_path: Path) -> AsyncIterator[Shards]:
    own = await SqliteStorage.open(shard_path(tmp_path, 0))
    observer = await SqliteStorage.open(shard_path(tmp_path, 1), observer=True)
    owner = await SqliteStorage.open(shard_path(tmp_path, 1))
    sharded = ShardedStorage([own, observer])
    try:
        yield Shards(sharded, [own, owner])
    finally:
        await sharded.close()
        await owner.close()


def _top_level_with_home(home: int) -> str:
    while True:
        eid = str(ExecutionId.generate())
        if home_shard(eid, 2) == home:
            return eid


# -- where executions live ------------------------------------------------------------------


def test_shard_files(tmp_path: Path) -> None:
    assert shard_path(tmp_path, 0) == tmp_path / "obelisk.sqlite"
    assert shard_path(tmp_path, 2) == tmp_path / "obelisk-shard2.sqlite"
    assert existing_shards(tmp_path) == 1
    (tmp_path / "obelisk.sqlite").touch()
    (tmp_path / "obelisk-shard2.sqlite").touch()  # shard 1 missing: made again
    (tmp_path / "obelisk-shard2.sqlite-wal").touch()
    (tmp_path / "obelisk-shardx.sqlite").touch()
    assert existing_shards(tmp_path) == 3


async def test_generated_ids_take_the_shards_in_turn(shards: Shards) -> None:
    ids = [str(shards.sharded.generate_id()) for _ in range(6)]
    assert [home_shard(eid, 2) for eid in ids] == [0, 1, 0, 1, 0, 1]
    for eid in ids:
        await shards.sharded.create(create_request(eid), at(0))
    for i, eid in enumerate(ids):
        assert (await shards.owners[i % 2].get_summary(eid)).next_version == 1
        with pytest.raises(NotFound):
            await shards.owners[1 - i % 2].get_summary(eid)
    assert (await shards.sharded.count_by_state())["pending_at"] == 6


async def test_a_shard_whose_process_is_down_gets_no_new_submissions(shards: Shards) -> None:
    shards.sharded.available = lambda index: index != 1
    assert {home_shard(str(shards.sharded.generate_id()), 2) for _ in range(4)} == {0}
    shards.sharded.available = lambda index: False  # then the own shard
    assert home_shard(str(shards.sharded.generate_id()), 2) == 0
    shards.sharded.available = lambda index: True
    assert [home_shard(str(shards.sharded.generate_id()), 2) for _ in range(2)] == [1, 0]


async def test_a_submitted_id_goes_home_and_a_second_submit_finds_it(shards: Shards) -> None:
    eid = _top_level_with_home(1)
    request = create_request(eid)
    await shards.sharded.create(request, at(0))
    await shards.sharded.create(request, at(1))  # idempotent, in the same file
    assert (await shards.owners[1].get_summary(eid)).next_version == 1
    with pytest.raises(NotFound):
        await shards.owners[0].get_summary(eid)


async def test_an_execution_away_from_its_home_is_found(shards: Shards) -> None:
    """A workflow's schedule creates a top-level execution in the workflow's shard."""
    eid = _top_level_with_home(0)
    await shards.owners[1].create(create_request(eid), at(0))
    assert (await shards.sharded.get_row(eid)).execution_id == eid
    assert await shards.sharded.shard_index(eid) == 1
    # Submitted again (the same, or other params) it is found where it is, as in one file.
    await shards.sharded.create(create_request(eid), at(1))
    with pytest.raises(Conflict):
        await shards.sharded.create(create_request(eid, params=[1]), at(1))
    with pytest.raises(NotFound):
        await shards.owners[0].get_summary(eid)
    await shards.sharded.pause(eid, at(1))
    assert isinstance((await shards.owners[1].get_summary(eid)).state, Paused)


async def test_an_unknown_execution_is_not_found_by_its_id(shards: Shards) -> None:
    eid = str(ExecutionId.generate())
    with pytest.raises(NotFound, match=eid):
        await shards.sharded.get_summary(eid)
    with pytest.raises(NotFound, match=eid):
        await shards.sharded.get_events(f"{eid}.g:1_1")


async def test_reads_and_commands_reach_the_shard_of_a_child(shards: Shards) -> None:
    owner = shards.owners[1]
    blocked = await BlockedParent.build(owner, t=0)
    [child] = blocked.children
    api = shards.sharded
    assert (await api.get_row(child)).parent_id == blocked.parent
    assert [e.version for e in await api.get_events(blocked.parent)] == [0, 1, 2, 3, 4]
    assert await api.get_responses(blocked.parent) == []
    summary = await api.request_cancellation(child, at(5))  # a pending activity
    assert isinstance(summary.result, ev.ExecutionFailure)
    assert summary.result.kind == "cancelled"
    # The owner sees the cancellation's response at its parent.
    [response] = await owner.get_responses(blocked.parent)
    assert isinstance(response.response, ev.ChildExecutionFinished)
    assert response.response.child_execution_id == child


async def test_a_delay_is_cancelled_in_the_shard_of_its_workflow(shards: Shards) -> None:
    parent, response = await _sleeping_workflow(shards.owners[1])
    summary = await shards.sharded.cancel_delay(response.delay_id, at(5))
    assert summary.responses == 1
    [stored] = await shards.owners[1].get_responses(parent)
    assert stored.response == ev.DelayFinished(response.delay_id, response.join_set_id, "cancelled")


# -- the peer bus between the owner and the observer ----------------------------------------


async def test_an_observer_leaves_the_owner_writing_as_one_process(shards: Shards) -> None:
    owner = shards.owners[1]
    assert owner.peers.has_peers() and not owner.peers.has_engine_peers()
    blocked = await BlockedParent.build(owner, t=0)
    await finish(owner, blocked.children[0], 3)
    writer = owner._writer
    assert writer is not None and writer.conn is not None
    assert not writer.conn.counters.get("optimistic")  # type: ignore[attr-defined]


async def test_results_and_changes_of_the_owner_reach_the_api(shards: Shards) -> None:
    observer = shards.sharded.shards[1]
    assert isinstance(observer, SqliteStorage)
    observer.FINISHED_RECHECK_INTERVAL = 3600  # only the bus can wake it
    owner = shards.owners[1]
    eid = _top_level_with_home(1)
    await shards.sharded.create(create_request(eid), at(0))
    feed = shards.sharded.changes()
    waiting = asyncio.ensure_future(shards.sharded.wait_for_finished(eid, timeout=30))
    await asyncio.sleep(0)
    generation = feed.generation
    locked = await lock(owner, eid, 1)  # a commit with nothing to announce but itself
    assert await feed.wait_changed(generation, 30) > generation
    await owner.append(eid, locked.next_version, [ev.Finished(OK42)], at(2))
    assert await asyncio.wait_for(waiting, 30) == OK42


async def test_the_merged_feed_waits_for_any_shard(shards: Shards) -> None:
    feed = shards.sharded.changes()
    generation = feed.generation
    assert await feed.wait_changed(generation, 0.01) == generation  # nothing changed
    waiting = asyncio.ensure_future(feed.wait_changed(generation, 30))
    await asyncio.sleep(0)
    await shards.owners[0].create(create_request(), at(0))
    assert await asyncio.wait_for(waiting, 30) > generation


# -- lists and counts -----------------------------------------------------------------------


async def _spread(shards: Shards) -> list[ExecutionRow]:
    """The contract suite's list fixture in each shard (rows of both at the same
    instants: ties are ordered by id across shards), and a few more; every row."""
    for owner in shards.owners:
        await _list_fixture(owner)
        for t in (1, 2, 30):
            await create(owner, OTHER_FFQN, now=t, scheduled_at=at(100))
    everything = ListFilter(limit=1000)
    rows = [r for o in shards.owners for r in await o.list_executions(everything)]
    assert len(rows) == 14
    return rows


def _expected(rows: list[ExecutionRow], flt: ListFilter, matching: set[str]) -> list[str]:
    keys = {
        "created_desc": (lambda r: (r.created_at, r.execution_id), True),
        "created_asc": (lambda r: (r.created_at, r.execution_id), False),
        "updated_desc": (lambda r: (r.updated_at, r.execution_id), True),
    }
    key, descending = keys[flt.order]
    chosen = sorted((r for r in rows if r.execution_id in matching), key=key, reverse=descending)
    return [r.execution_id for r in chosen][flt.offset : flt.offset + flt.limit]


@pytest.mark.parametrize(
    "flt",
    [
        ListFilter(),
        ListFilter(limit=3),
        ListFilter(offset=5, limit=4),
        ListFilter(offset=13),
        ListFilter(order="created_asc", offset=2, limit=5),
        ListFilter(order="updated_desc", limit=6),
        ListFilter(order="updated_desc", offset=3, limit=3, hide_finished=True),
        ListFilter(ffqn_prefix="testing:act/", limit=4, offset=1),
        ListFilter(states=["pending_at"], order="created_asc"),
        ListFilter(top_level_only=True, offset=1, limit=2),
        ListFilter(ffqn_prefix=WORKFLOW_FFQN),
    ],
)
async def test_lists_and_counts_merge_the_shards(shards: Shards, flt: ListFilter) -> None:
    rows = await _spread(shards)
    unpaged = dataclasses.replace(flt, limit=1000, offset=0)
    matching = {r.execution_id for o in shards.owners for r in await o.list_executions(unpaged)}
    got = await shards.sharded.list_executions(flt)
    assert [r.execution_id for r in got] == _expected(rows, flt, matching)
    assert await shards.sharded.count_executions(flt) == len(matching)


async def test_paging_with_before_id_crosses_the_shards(shards: Shards) -> None:
    rows = await _spread(shards)
    seen: list[str] = []
    before = None
    while True:
        page = await shards.sharded.list_executions(ListFilter(limit=3, before_id=before))
        if not page:
            break
        seen += [r.execution_id for r in page]
        before = page[-1].execution_id
    assert seen == _expected(rows, ListFilter(limit=1000), {r.execution_id for r in rows})
    # A filter and the cursor together; an unknown cursor has nothing before it.
    cursor = seen[6]
    page = await shards.sharded.list_executions(
        ListFilter(before_id=cursor, ffqn_prefix=OTHER_FFQN)
    )
    later = {r.execution_id for r in rows if r.ffqn == OTHER_FFQN} & set(seen[7:])
    assert [r.execution_id for r in page] == [e for e in seen if e in later]
    assert await shards.sharded.count_executions(
        ListFilter(before_id=cursor, ffqn_prefix=OTHER_FFQN)
    ) == len(later)
    unknown = str(ExecutionId.generate())
    assert await shards.sharded.list_executions(ListFilter(before_id=unknown)) == []


async def test_extras_come_from_each_rows_shard(shards: Shards) -> None:
    await _spread(shards)
    want = {
        r.execution_id: (r.children, r.last_event)
        for o in shards.owners
        for r in await o.list_executions(ListFilter(limit=1000, with_extras=True))
    }
    got = await shards.sharded.list_executions(ListFilter(limit=1000, with_extras=True))
    assert {r.execution_id: (r.children, r.last_event) for r in got} == want
    assert sorted(c or 0 for c, _ in want.values())[-2:] == [1, 1]  # the two parents
    page = await shards.sharded.list_executions(ListFilter(offset=4, limit=3, with_extras=True))
    assert [(r.children, r.last_event) for r in page] == [want[r.execution_id] for r in page]


async def test_counts_by_state_add_up(shards: Shards) -> None:
    await _spread(shards)
    assert await shards.sharded.count_by_state() == {
        "finished": 2,
        "pending_at": 10,
        "blocked_by_join_set": 2,
    }


async def test_unfinished_executions_are_every_shards(shards: Shards) -> None:
    """A report (orphaned functions in the reload status); upgrades use their own."""
    await _spread(shards)
    want = []
    for owner in shards.owners:
        want += await owner.unfinished_executions([OTHER_FFQN])
    want.sort()
    assert len(want) == 8
    assert await shards.sharded.unfinished_executions([OTHER_FFQN]) == want


async def test_component_sources_are_found_in_any_shard(shards: Shards) -> None:
    from engine.storage.contract import ComponentSource

    source = ComponentSource("sha256:" + "ef" * 32, "wf.js", "export function f() {}")
    await shards.owners[1].save_component_sources([source])
    assert await shards.sharded.get_component_source(source.digest) == source
    assert await shards.sharded.get_component_source("sha256:" + "00" * 32) is None


def test_one_shard_is_not_sharded() -> None:
    with pytest.raises(ValueError, match="at least two shards"):
        ShardedStorage([])
