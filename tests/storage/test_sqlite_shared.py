"""Several processes on one SQLite file (here: several `SqliteStorage`s on one file, which
is the same to SQLite and to the lock file, and to the peer bus): wake-ups over the bus,
the write lock, the summary caches kept across each other's commits, optimistic batches.

The contract suite also runs against a shared file (`sqlite-shared` in conftest.py).
Waits are on futures with generous timeouts; the re-check intervals that would also
find what the bus announces are made longer than those timeouts.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.core import events as ev
from engine.storage.contract import Conflict, VersionConflict
from engine.storage.sqlite import SqliteStorage
from engine.storage.sqlite import peers as sqlite_peers

from .conftest import (
    ACTIVITY_FFQN,
    WORKFLOW,
    WORKFLOW_FFQN,
    Executor,
    at,
    create_request,
    delay_id,
)

pytestmark = pytest.mark.skipif(not sqlite_peers.supported(), reason="the peer bus is Linux-only")

OK = ev.ResultOk(7)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[SqliteStorage, SqliteStorage]]:
    a = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    b = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


def _counters(storage: SqliteStorage) -> dict[str, int]:
    writer = storage._writer
    assert writer is not None and writer.conn is not None
    return writer.conn.counters  # type: ignore[attr-defined,no-any-return]


async def _create_locked(storage: SqliteStorage, now: float = 0) -> tuple[str, int]:
    request = create_request()
    await storage.create(request, at(now))
    [locked] = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(now + 1)))
    assert locked.execution_id == request.execution_id
    return locked.execution_id, locked.next_version


async def _sleeping_workflow(storage: SqliteStorage) -> tuple[str, ev.DelayFinished]:
    """A workflow blocked on a delay; and the response that ends it."""
    request = create_request(None, WORKFLOW_FFQN)
    await storage.create(request, at(0))
    parent = request.execution_id
    [le] = await storage.lock_pending(**Executor([WORKFLOW_FFQN], WORKFLOW).lock_args(at(1)))
    js = "o:1-sleep"
    delay = delay_id(parent, js)
    await storage.append(
        parent,
        le.next_version,
        [
            ev.HistoryEvent(ev.JoinSetCreate(js)),
            ev.HistoryEvent(
                ev.JoinSetRequest(js, ev.DelayRequest(delay, at(30), ev.ScheduleAtIn(28_000)))
            ),
            ev.HistoryEvent(ev.JoinNext(js, run_expires_at=at(2))),
        ],
        at(2),
    )
    return parent, ev.DelayFinished(delay, js)


# -- the bus -----------------------------------------------------------------------------


async def test_a_result_finished_by_another_process_wakes_its_waiter(
    pair: tuple[SqliteStorage, SqliteStorage],
) -> None:
    a, b = pair
    b.FINISHED_RECHECK_INTERVAL = 3600  # only the bus can wake it
    eid, version = await _create_locked(a)
    waiting = asyncio.ensure_future(b.wait_for_finished(eid, timeout=30))
    await asyncio.sleep(0)  # the waiter registers before the finish
    await a.append(eid, version, [ev.Finished(OK)], at(2))
    assert await asyncio.wait_for(waiting, 30) == OK
    assert a.peers.stats["sent"] >= 1 and b.peers.stats["received"] >= 1


async def test_new_pending_work_wakes_an_executor_of_another_process(
    pair: tuple[SqliteStorage, SqliteStorage],
) -> None:
    a, b = pair
    waiting = asyncio.ensure_future(b.wait_for_pending([ACTIVITY_FFQN], timeout=3600))
    await asyncio.sleep(0)
    await a.create(create_request(), at(0))
    await asyncio.wait_for(waiting, 30)


async def test_a_response_pokes_the_inbox_of_a_run_in_another_process(
    pair: tuple[SqliteStorage, SqliteStorage],
) -> None:
    a, b = pair
    parent, response = await _sleeping_workflow(a)
    inbox = b.open_inbox(parent)
    try:
        await a.append_response(parent, response, at(31))
        _, poked = await asyncio.to_thread(inbox.take, 30)
        assert poked
    finally:
        b.close_inbox(parent, inbox)


async def test_a_peer_that_died_is_forgotten(
    pair: tuple[SqliteStorage, SqliteStorage], tmp_path: Path
) -> None:
    a, _ = pair
    ghost = "1-000000000000"  # registered, but no socket of that name exists
    (a.peers.directory / ghost).touch()
    a.peers._peers_at = 0.0  # read the directory again
    await a.create(create_request(), at(0))  # its commit is sent to every peer
    await a._write(lambda c, n: None)  # after that send (the writer is sequential)
    assert not (a.peers.directory / ghost).exists()
    assert len(os.listdir(a.peers.directory)) == 2


async def test_a_closed_storage_unregisters(tmp_path: Path) -> None:
    storage = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    name = storage.peers.name
    assert (storage.peers.directory / name).exists()
    await storage.close()
    assert not (storage.peers.directory / name).exists()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with pytest.raises(ConnectionRefusedError):
        probe.sendto(b"x", storage.peers._address(name))
    probe.close()


# -- caches and optimistic batches -------------------------------------------------------


async def test_a_write_by_another_process_is_seen_by_the_next_append(
    pair: tuple[SqliteStorage, SqliteStorage],
) -> None:
    """A's cached summary of the execution must not survive B's append to it."""
    a, b = pair
    eid, version = await _create_locked(a)
    other, other_version = await _create_locked(a, now=10)
    await a.append(
        eid, version, [ev.HistoryEvent(ev.Persist(1, ev.PersistRandomU64(0, 10)))], at(2)
    )
    await b.append(
        eid, version + 1, [ev.HistoryEvent(ev.Persist(2, ev.PersistRandomU64(0, 10)))], at(3)
    )
    with pytest.raises(VersionConflict):
        await a.append(eid, version + 1, [ev.Finished(OK)], at(4))
    await a.append(eid, version + 2, [ev.Finished(OK)], at(4))
    assert (await a.get_summary(eid)).result == OK
    # B wrote only `eid`: A still has `other` cached (and it is right).
    writer = a._writer
    assert writer is not None and writer.conn is not None
    assert other in writer.conn.summaries.committed  # type: ignore[attr-defined]
    await a.append(other, other_version, [ev.Finished(OK)], at(12))


async def test_writes_while_another_process_has_the_file_are_optimistic(
    pair: tuple[SqliteStorage, SqliteStorage],
) -> None:
    a, _ = pair
    for i in range(5):
        eid, version = await _create_locked(a, now=10 * i)
        await a.append(eid, version, [ev.Finished(OK)], at(10 * i + 2))
    assert _counters(a)["optimistic"] >= 10


async def test_two_processes_locking_the_same_queue_lock_each_execution_once(
    pair: tuple[SqliteStorage, SqliteStorage],
) -> None:
    a, b = pair
    ids = set()
    for _ in range(6):
        requests = [create_request() for _ in range(50)]
        await asyncio.gather(*(a.create(r, at(0)) for r in requests))
        ids |= {r.execution_id for r in requests}

    async def drain(storage: SqliteStorage) -> list[str]:
        executor = Executor([ACTIVITY_FFQN])
        got: list[str] = []
        while True:
            batch = await asyncio.gather(
                *(storage.lock_pending(**executor.lock_args(at(1), batch_size=7)) for _ in range(3))
            )
            locked = [le.execution_id for part in batch for le in part]
            if not locked:
                return got
            got += locked

    got_a, got_b = await asyncio.gather(drain(a), drain(b))
    assert sorted(got_a + got_b) == sorted(ids)  # every one, and none twice
    assert got_a and got_b
    for eid in ids:
        assert (await a.get_summary(eid)).next_version == 2


async def test_a_duplicate_in_an_optimistic_batch_is_decided_the_usual_way(
    pair: tuple[SqliteStorage, SqliteStorage],
) -> None:
    """Unique keys only fail when the batch is written: it then runs again with
    savepoints, and only the duplicate fails."""
    a, _ = pair
    parent, response = await _sleeping_workflow(a)
    first, second = await asyncio.gather(
        a.append_response(parent, response, at(31)),
        a.append_response(parent, response, at(31)),
        return_exceptions=True,
    )
    assert sum(isinstance(r, Conflict) for r in (first, second)) == 1
    assert len(await a.get_responses(parent, 0)) == 1
