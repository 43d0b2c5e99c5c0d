"""SQLite-specific storage behaviour (SPEC §10): file, pragmas, migrations, group commit.

The behaviour every backend shares is in test_contract.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.core import events as ev
from engine.core.records import LogLine
from engine.core.state import BlockedByJoinSet
from engine.storage.contract import (
    AppendExtras,
    Conflict,
    CreateRequest,
    StorageError,
    VersionConflict,
)
from engine.storage.sqlite import SqliteStorage, batches, schema
from engine.storage.sqlite.schema import SCHEMA_VERSION

from .conftest import (
    ACTIVITY_FFQN,
    WORKFLOW,
    WORKFLOW_FFQN,
    Executor,
    at,
    child_id,
    create_request,
    delay_id,
)
from .test_contract import RecordingLock, create, lock, submit_children


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "obelisk.sqlite"


@pytest.fixture
async def storage(db_path: Path) -> AsyncIterator[SqliteStorage]:
    s = await SqliteStorage.open(db_path)
    try:
        yield s
    finally:
        await s.close()


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def user_version(path: Path) -> int:
    with raw(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def tables(path: Path) -> set[str]:
    with raw(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


# ---------------------------------------------------------------------------------------
# file, pragmas, schema
# ---------------------------------------------------------------------------------------


async def test_fresh_database_has_the_current_schema(storage: SqliteStorage, db_path: Path) -> None:
    assert db_path.exists()
    assert user_version(db_path) == SCHEMA_VERSION
    assert {"executions", "events", "responses", "delays", "logs"} <= tables(db_path)


async def test_wal_and_synchronous_full(storage: SqliteStorage, db_path: Path) -> None:
    with raw(db_path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # synchronous is per connection: ask the writer's.
    assert storage._writer is not None
    [(level,)] = await storage._writer.call(lambda c: c.execute("PRAGMA synchronous").fetchall())
    assert level == 2  # FULL


async def test_reopen_does_not_migrate_again(db_path: Path) -> None:
    for _ in range(3):
        s = await SqliteStorage.open(db_path)
        await s.create(create_request(), at(0))
        await s.close()
    assert user_version(db_path) == SCHEMA_VERSION
    with raw(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM executions").fetchone()[0] == 3


async def test_newer_schema_is_a_clear_error(db_path: Path) -> None:
    with raw(db_path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StorageError) as info:
        await SqliteStorage.open(db_path)
    message = str(info.value)
    assert str(db_path) in message
    assert "newer" in message
    assert str(SCHEMA_VERSION + 1) in message
    assert user_version(db_path) == SCHEMA_VERSION + 1  # left untouched


async def test_migration_to_a_new_version_keeps_data(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = create_request(params=[1])
    s = await SqliteStorage.open(db_path)
    await s.create(request, at(0))
    await s.close()

    extra = "CREATE TABLE extra (x INTEGER NOT NULL);\nINSERT INTO extra VALUES (7);"
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, extra])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    s = await SqliteStorage.open(db_path)
    try:
        assert await s.get_created(request.execution_id) == request.created
    finally:
        await s.close()
    assert user_version(db_path) == SCHEMA_VERSION + 1
    with raw(db_path) as conn:
        assert conn.execute("SELECT x FROM extra").fetchall() == [(7,)]


async def test_failing_migration_leaves_the_database_unchanged(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = "CREATE TABLE half_done (x);\nSELECT no_such_function();"
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, broken])
    monkeypatch.setattr(schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(StorageError, match=str(db_path)):
        await SqliteStorage.open(db_path)
    assert "half_done" not in tables(db_path)
    assert user_version(db_path) < SCHEMA_VERSION + 1
    monkeypatch.undo()
    s = await SqliteStorage.open(db_path)  # the good migrations still apply
    await s.close()
    assert user_version(db_path) == SCHEMA_VERSION


async def test_concurrent_opens_of_a_fresh_file(tmp_path: Path) -> None:
    """Two engines starting on one new file: each migration runs once, both open."""
    for i in range(8):
        path = tmp_path / f"race{i}.sqlite"
        opened = await asyncio.gather(*(SqliteStorage.open(path) for _ in range(3)))
        await opened[0].create(create_request(), at(0))
        for s in opened:
            await s.close()
        assert user_version(path) == SCHEMA_VERSION


async def test_database_path_under_a_file_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    path = blocker / "obelisk.sqlite"
    with pytest.raises(StorageError, match=str(path)):
        await SqliteStorage.open(path)


async def test_database_path_that_is_a_directory_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "a-directory"
    path.mkdir()
    with pytest.raises(StorageError, match=str(path)):
        await SqliteStorage.open(path)


async def test_not_a_database_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.sqlite"
    path.write_bytes(b"this is not a database, just some text that is long enough" * 100)
    with pytest.raises(StorageError, match=str(path)):
        await SqliteStorage.open(path)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make `path` (file or directory) unwritable, even for root (who ignores modes)."""
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("running as root without chattr: cannot make a file read-only")
        if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not supported here")
        try:
            yield
        finally:
            subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        mode = path.stat().st_mode
        path.chmod(0o555 if path.is_dir() else 0o444)
        try:
            yield
        finally:
            path.chmod(mode)


async def test_read_only_database_file_is_a_clear_error_at_open(db_path: Path) -> None:
    s = await SqliteStorage.open(db_path)
    await s.create(create_request(), at(0))
    await s.close()
    with read_only(db_path), pytest.raises(StorageError, match=str(db_path)) as info:
        await SqliteStorage.open(db_path)
    assert "readonly" in str(info.value) or "read-only" in str(info.value)


async def test_new_database_in_read_only_directory_is_a_clear_error(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = directory / "obelisk.sqlite"
    with read_only(directory), pytest.raises(StorageError, match=str(path)):
        await SqliteStorage.open(path)


async def test_existing_database_in_read_only_directory_is_a_clear_error(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    path = directory / "obelisk.sqlite"
    s = await SqliteStorage.open(path)
    await s.close()
    with read_only(directory), pytest.raises(StorageError, match=str(path)):
        s = await SqliteStorage.open(path)
        await s.close()  # not reached when the open fails as it should


# ---------------------------------------------------------------------------------------
# group commit
# ---------------------------------------------------------------------------------------


async def test_group_commit_batches_concurrent_writes(storage: SqliteStorage) -> None:
    n = 300
    before = dict(storage.stats)
    await asyncio.gather(*(storage.create(create_request(), at(0)) for _ in range(n)))
    logical = storage.stats["logical"] - before["logical"]
    commits = storage.stats["commits"] - before["commits"]
    assert logical == n
    assert 1 <= commits <= n // 10, storage.stats


async def test_sequential_writes_commit_one_by_one(storage: SqliteStorage) -> None:
    before = dict(storage.stats)
    for _ in range(5):
        await storage.create(create_request(), at(0))
    assert storage.stats["commits"] - before["commits"] == 5
    assert storage.stats["logical"] - before["logical"] == 5


async def test_failing_logical_transaction_does_not_fail_its_batch(
    storage: SqliteStorage,
) -> None:
    taken = create_request(params=[1])
    await storage.create(taken, at(0))
    locked = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    [le] = locked
    good = [create_request() for _ in range(20)]
    commits_before = storage.stats["commits"]
    calls: list[Any] = [storage.create(r, at(2)) for r in good[:10]]
    calls.append(storage.create(create_request(taken.execution_id, params=[2]), at(2)))
    calls.append(storage.append(le.execution_id, 99, [ev.Finished(ev.ResultOk())], at(2)))
    calls.append(storage.append(le.execution_id, 0, [ev.Unlocked(at(2), "x")], at(2)))
    calls += [storage.create(r, at(2)) for r in good[10:]]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert storage.stats["commits"] - commits_before < len(calls)  # they did share commits

    assert isinstance(results[10], Conflict)
    assert isinstance(results[11], VersionConflict)
    assert isinstance(results[12], VersionConflict)
    others = results[:10] + results[13:]
    assert all(r is None for r in others), others
    for r in good:
        assert await storage.get_created(r.execution_id) == r.created
    assert (await storage.get_created(taken.execution_id)).params == [1]


async def test_transaction_that_breaks_the_batch_is_retried_alone(
    storage: SqliteStorage,
) -> None:
    """A logical transaction that ruins the whole physical one (here: it rolls it back)
    fails alone; the others of its batch are re-run and committed."""

    def vandal(conn: sqlite3.Connection, notes: object) -> None:
        conn.execute("ROLLBACK")

    good = [create_request() for _ in range(10)]
    calls: list[Any] = [storage.create(r, at(0)) for r in good[:5]]
    calls.append(storage._write(vandal))
    calls += [storage.create(r, at(0)) for r in good[5:]]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[5], StorageError)
    assert all(r is None for r in results[:5] + results[6:]), results
    for r in good:
        assert await storage.get_created(r.execution_id) == r.created
    # And the writer goes on.
    await storage.create(create_request(), at(1))


async def test_every_transaction_of_a_batch_gets_its_own_outcome(
    storage: SqliteStorage, db_path: Path
) -> None:
    """In one batch: a re-submitted id (already in the file, or created earlier in the
    same batch) and a duplicate response fail (or succeed) alone, and an execution
    created and paused in the same batch has the paused row (also in the indexed
    columns). Guards a writer that would hold a batch's rows back to its end."""
    existing = create_request(params=[1])
    await storage.create(existing, at(0))
    parents = []
    for _ in range(2):
        parent = await create(storage, WORKFLOW_FFQN)
        le = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
        js = "o:1-sleep"
        delay = delay_id(parent, js)
        request = ev.DelayRequest(delay, at(30), ev.ScheduleAtIn(28_000))
        await storage.append(
            parent,
            le.next_version,
            [
                ev.HistoryEvent(ev.JoinSetCreate(js)),
                ev.HistoryEvent(ev.JoinSetRequest(js, request)),
                ev.HistoryEvent(ev.JoinNext(js, run_expires_at=at(2))),
            ],
            at(2),
        )
        parents.append((parent, ev.DelayFinished(delay, js)))
    (a, response_a), (b, response_b) = parents
    fresh = create_request()

    async def batch(*calls: Any) -> list[Any]:
        good = [create_request() for _ in range(10)]
        commits_before = storage.stats["commits"]
        results = await asyncio.gather(
            *(storage.create(r, at(3)) for r in good[:5]),
            *calls,
            *(storage.create(r, at(3)) for r in good[5:]),
            return_exceptions=True,
        )
        assert storage.stats["commits"] - commits_before < len(results)  # shared commits
        for r in good:
            assert await storage.get_created(r.execution_id) == r.created
        assert all(r is None for r in results[:5] + results[-5:]), results
        return results[5:-5]

    # An id already in the file.
    assert await batch(storage.create(existing, at(3))) == [None]
    # A duplicate response: the same.
    ok_a, duplicate, ok_b = await batch(
        storage.append_response(a, response_a, at(31)),
        storage.append_response(a, response_a, at(31)),
        storage.append_response(b, response_b, at(31)),
    )
    assert isinstance(duplicate, Conflict) and ok_a is None and ok_b is None
    for parent in (a, b):
        assert len(await storage.get_responses(parent)) == 1
        assert (await storage.get_summary(parent)).responses == 1
    # Created, paused and submitted again in one batch.
    created, paused, again = await batch(
        storage.create(fresh, at(3)),
        storage.pause(fresh.execution_id, at(3)),
        storage.create(fresh, at(3)),
    )
    assert created is None and again is None and paused.paused
    assert await storage.get_created(fresh.execution_id) == fresh.created
    assert await storage.get_summary(fresh.execution_id) == paused
    with raw(db_path) as conn:  # the indexed columns too, not only the summary
        [(state, versions)] = conn.execute(
            "SELECT state, next_version FROM executions WHERE execution_id = ?",
            (fresh.execution_id,),
        ).fetchall()
        events = conn.execute(
            "SELECT count(*) FROM events WHERE execution_id = ?", (fresh.execution_id,)
        ).fetchone()[0]
    assert (state, versions, events) == ("paused", 2, 2)


async def test_a_failed_write_leaves_nothing_in_the_summary_cache(storage: SqliteStorage) -> None:
    """The writer keeps the summaries it wrote (no row read on the next write of the
    same execution): a rolled-back write must not be remembered."""
    r = create_request()
    await storage.create(r, at(0))
    [le] = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    v = le.next_version
    # the first event is applied, the second refused: the transaction is rolled back
    with pytest.raises(Conflict):
        await storage.append(
            le.execution_id, v, [ev.Unlocked(at(2), "x"), ev.Unlocked(at(2), "y")], at(2)
        )
    with pytest.raises(VersionConflict):
        await storage.append(le.execution_id, v + 1, [ev.Finished(ev.ResultOk())], at(2))
    s = await storage.append(le.execution_id, v, [ev.Finished(ev.ResultOk())], at(2))
    assert s.next_version == v + 1 and s.is_finished


async def test_a_rolled_back_response_leaves_nothing_in_the_summary_cache(
    storage: SqliteStorage,
) -> None:
    """A child's `finished` writes the parent's response and summary; when a later event
    of the same append is refused, neither stays (in the database or the cache)."""
    pid, [child], _ = await submit_children(storage, [None])
    [le] = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3)))
    done = ev.Finished(ev.ResultOk())
    with pytest.raises(Conflict, match="finished"):
        await storage.append(child, le.next_version, [done, ev.Unlocked(at(4), "x")], at(4))
    assert await storage.get_responses(pid, 0) == []
    # the parent's summary counts no response: this one is accepted
    await storage.append(child, le.next_version, [done], at(5))
    [response] = await storage.get_responses(pid, 0)
    assert isinstance(response.response, ev.ChildExecutionFinished)


async def test_writes_of_another_connection_are_seen_despite_the_summary_cache(
    db_path: Path,
) -> None:
    """Two storages on one file (two writers): each sees the other's commits."""
    a = await SqliteStorage.open(db_path)
    b = await SqliteStorage.open(db_path)
    try:
        r = create_request()
        await a.create(r, at(0))
        [le] = await a.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
        v = le.next_version
        await b.append(le.execution_id, v, [ev.Unlocked(at(2), "by b")], at(2))
        with pytest.raises(VersionConflict):  # a's cached summary is out of date
            await a.append(le.execution_id, v, [ev.Finished(ev.ResultOk())], at(3))
        with pytest.raises(Conflict, match="needs a locked execution"):
            await a.append(le.execution_id, v + 1, [ev.Unlocked(at(3), "x")], at(3))
        s = await a.append(le.execution_id, v + 1, [ev.Finished(ev.ResultOk())], at(3))
        assert s.next_version == v + 2 and s.is_finished
    finally:
        await a.close()
        await b.close()


async def test_a_direct_lock_is_handed_over_once_before_its_commit(
    storage: SqliteStorage, db_path: Path
) -> None:
    """The child's run may start while the COMMIT that creates it waits for the disk: at
    the hand-over another connection does not see the child yet; after it, it does."""
    seen: list[bool] = []

    class PeekingLock(RecordingLock):
        def taken(self, execution: Any) -> None:
            with contextlib.closing(raw(db_path)) as c:
                row = c.execute(
                    "SELECT 1 FROM executions WHERE execution_id = ?",
                    (execution.execution_id,),
                ).fetchone()
            seen.append(row is not None)
            super().taken(execution)

    lock = PeekingLock(Executor([ACTIVITY_FFQN]), 2)
    _, [child], _ = await submit_children(storage, [lock])
    assert seen == [False]  # handed over before the COMMIT, and only once
    assert [h.execution_id for h in lock.handed if h is not None] == [child]
    with contextlib.closing(raw(db_path)) as c:
        assert c.execute("SELECT 1 FROM executions WHERE execution_id = ?", (child,)).fetchone()


class ReportingLock(RecordingLock):
    """A direct lock whose "run" reports at once, from the writer's thread, through
    `append_then` (as an activity run does from its worker thread)."""

    def __init__(self, storage: SqliteStorage, outcome: list[ev.Event], version_offset: int = 0):
        super().__init__(Executor([ACTIVITY_FFQN]), 2)
        self.storage = storage
        self.outcome = outcome
        self.version_offset = version_offset
        self.reported: list[tuple[bool, Any]] = []
        self.done = asyncio.get_running_loop().create_future()

    def taken(self, execution: Any) -> None:
        super().taken(execution)
        loop = self.done.get_loop()

        def reported(ok: bool, value: Any) -> None:
            self.reported.append((ok, value))
            loop.call_soon_threadsafe(self.done.set_result, None)

        self.storage.append_then(
            execution.execution_id,
            execution.next_version + self.version_offset,
            self.outcome,
            at(3),
            None,
            reported,
        )


async def test_a_directly_locked_childs_outcome_joins_the_commit_that_created_it(
    storage: SqliteStorage, db_path: Path
) -> None:
    """The transaction that hands a child over stays open for the child's outcome (a
    quick activity reports well within `LINGER`): one COMMIT for both, not two."""
    lock = ReportingLock(storage, [ev.Finished(ev.ResultOk(7))])
    before = dict(storage.stats)
    parent, [child], _ = await submit_children(storage, [lock])
    await lock.done
    # The parent's creation, its lock, then its append with the child's outcome.
    assert storage.stats["logical"] - before["logical"] == 4
    assert storage.stats["commits"] - before["commits"] == 3
    [(ok, summary)] = lock.reported
    assert ok and summary.is_finished
    [response] = await storage.get_responses(parent, 0)
    assert isinstance(response.response, ev.ChildExecutionFinished)
    assert response.response.child_execution_id == child


async def test_a_refused_outcome_in_a_lingering_transaction_rolls_back_alone(
    storage: SqliteStorage,
) -> None:
    """A logical transaction added while the transaction lingers runs in a savepoint:
    when it is refused, what came before stays and nothing of it is remembered."""
    finished = ev.Finished(ev.ResultOk(7))
    # `finished` then an illegal second event: the append is refused half-way.
    lock = ReportingLock(storage, [finished, ev.Unlocked(at(3), "x")])
    parent, [child], _ = await submit_children(storage, [lock])
    await lock.done
    [(ok, error)] = lock.reported
    assert not ok and isinstance(error, Conflict)
    assert await storage.get_responses(parent, 0) == []  # the parent's response too
    s = await storage.get_summary(child)
    assert not s.is_finished
    # The writer's cached summary of the child is the committed one: this one fits.
    [handed] = lock.handed
    assert handed is not None
    done = await storage.append(child, handed.next_version, [finished], at(4))
    assert done.is_finished and done.next_version == handed.next_version + 1
    assert len(await storage.get_responses(parent, 0)) == 1


async def test_a_lingered_transaction_that_breaks_the_savepoint_is_retried_not_lost(
    storage: SqliteStorage,
) -> None:
    """A logical transaction taken while lingering that ends the whole transaction (its
    RELEASE then fails) is in the batch the savepoints then retry: it fails alone, its
    caller is answered, the rest commits."""
    loop = asyncio.get_running_loop()
    vandal_done: asyncio.Future[tuple[bool, Any]] = loop.create_future()

    def vandal(conn: sqlite3.Connection, notes: object) -> None:
        conn.execute("ROLLBACK")

    class VandalFirst(ReportingLock):
        def taken(self, execution: Any) -> None:
            if not self.handed:  # a retry hands the lock over again: once is enough
                reply = batches._CallbackReply(
                    lambda ok, value: loop.call_soon_threadsafe(vandal_done.set_result, (ok, value))
                )
                assert storage._writer is not None
                storage._writer.put(batches._Tx(vandal, None, 0, reply))
                super().taken(execution)
            else:
                self.handed.append(execution)

    lock = VandalFirst(storage, [ev.Finished(ev.ResultOk(7))])
    parent, [child], _ = await submit_children(storage, [lock])
    ok, error = await asyncio.wait_for(vandal_done, 5)
    assert not ok and isinstance(error, StorageError)
    await asyncio.wait_for(lock.done, 5)
    assert (await storage.get_summary(child)).is_finished
    assert len(await storage.get_responses(parent, 0)) == 1


def _in_thread(fn: Any) -> Any:
    return asyncio.get_running_loop().run_in_executor(None, fn)


async def test_a_run_is_answered_before_the_commit_and_told_when_it_is_durable(
    storage: SqliteStorage, db_path: Path
) -> None:
    """`append_from_thread` with the run's inbox answers just before the COMMIT and
    notes that transaction in the inbox; `wait_committed` then confirms it."""
    r = create_request()
    await storage.create(r, at(0))
    [le] = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    inbox = storage.open_inbox(le.execution_id)
    try:
        s = await _in_thread(
            lambda: storage.append_from_thread(
                le.execution_id, le.next_version, [ev.Finished(ev.ResultOk())], at(2), None, inbox
            )
        )
        assert s.is_finished
        assert inbox.uncommitted[1] > 0  # answered before its COMMIT
        assert await _in_thread(inbox.wait_committed)
        assert inbox.uncommitted == (0, 0)
        with contextlib.closing(raw(db_path)) as c:
            [(state,)] = c.execute(
                "SELECT state FROM executions WHERE execution_id = ?", (le.execution_id,)
            ).fetchall()
        assert state == "finished"
    finally:
        storage.close_inbox(le.execution_id, inbox)


async def test_a_run_left_blocked_is_answered_with_its_first_response(
    storage: SqliteStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An early answer that says "blocked by the join set" is held back until the
    transaction posts a response to the run (here: its child's outcome, lingered in):
    the run wakes once and finds the response in its inbox."""
    parent = await create(storage, WORKFLOW_FFQN)
    wf = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    js = "g:1"
    child = child_id(parent, js, 1)
    history: list[ev.Event] = [
        ev.HistoryEvent(ev.JoinSetCreate(js)),
        ev.HistoryEvent(ev.JoinSetRequest(js, ev.ChildExecutionRequest(child, ACTIVITY_FFQN, []))),
        ev.HistoryEvent(ev.JoinNext(js, run_expires_at=wf.lock_expires_at)),
    ]
    reporter = ReportingLock(storage, [ev.Finished(ev.ResultOk(7))])
    created = create_request(child, ACTIVITY_FFQN, params=[], parent=(parent, js)).created
    extras = AppendExtras(creates=[CreateRequest(child, created, reporter)])
    inbox = storage.open_inbox(parent)
    order: list[str] = []
    post, set_early = type(inbox).post, batches._ThreadReply.set_early
    monkeypatch.setattr(
        type(inbox), "post", lambda self, *a: (order.append("response"), post(self, *a))[1]
    )
    monkeypatch.setattr(
        batches._ThreadReply,
        "set_early",
        lambda self, *a: (order.append("answer"), set_early(self, *a))[1],
    )
    try:
        s = await _in_thread(
            lambda: storage.append_from_thread(
                parent, wf.next_version, history, at(2), extras, inbox
            )
        )
        assert isinstance(s.underlying, BlockedByJoinSet)
        assert order == ["response", "answer"]
        items, _ = inbox.take(0)  # no wait: it came first
        assert [r.response.child_execution_id for r in items] == [child]  # type: ignore[union-attr]
        assert await _in_thread(inbox.wait_committed)
    finally:
        storage.close_inbox(parent, inbox)
    await reporter.done


async def test_a_write_that_depends_on_a_failed_transaction_is_refused(
    storage: SqliteStorage,
) -> None:
    """A run that computed with an early outcome of a transaction whose COMMIT failed
    writes nothing: the writer refuses its next append (it replays instead)."""
    r = create_request()
    await storage.create(r, at(0))
    [le] = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    inbox = storage.open_inbox(le.execution_id)
    try:
        commits = storage.notifier.commits
        seq = commits.begin()
        commits.settle(seq, False)
        inbox.note_uncommitted(seq)
        with pytest.raises(Conflict, match="not committed"):
            await _in_thread(
                lambda: storage.append_from_thread(
                    le.execution_id,
                    le.next_version,
                    [ev.Finished(ev.ResultOk())],
                    at(2),
                    None,
                    inbox,
                )
            )
    finally:
        storage.close_inbox(le.execution_id, inbox)
    s = await storage.get_summary(le.execution_id)
    assert not s.is_finished and s.next_version == le.next_version


# ---------------------------------------------------------------------------------------
# durability and concurrency with other connections
# ---------------------------------------------------------------------------------------


async def test_acknowledged_writes_are_committed(storage: SqliteStorage, db_path: Path) -> None:
    """Once a write returns it is in the file: another connection sees it."""
    request = create_request()
    await storage.create(request, at(0))
    with raw(db_path) as conn:
        rows = conn.execute(
            "SELECT version FROM events WHERE execution_id = ?", (request.execution_id,)
        ).fetchall()
    assert rows == [(0,)]


async def test_everything_survives_close_and_reopen(db_path: Path) -> None:
    s = await SqliteStorage.open(db_path)
    parent = create_request(ffqn="testing:wf/ifc.serial", scheduled_at=at(0))
    await s.create(parent, at(0))
    pid = parent.execution_id
    [le] = await s.lock_pending(
        **Executor(["testing:wf/ifc.serial"], parent.created.component_id).lock_args(at(1))
    )

    child = child_id(pid, "g:1")
    await s.append(
        pid,
        le.next_version,
        [
            ev.HistoryEvent(ev.JoinSetCreate("g:1")),
            ev.HistoryEvent(
                ev.JoinSetRequest("g:1", ev.ChildExecutionRequest(child, ACTIVITY_FFQN, [3]))
            ),
            ev.HistoryEvent(ev.JoinNext("g:1", run_expires_at=at(2))),
        ],
        at(2),
        AppendExtras(
            creates=[create_request(child, params=[3], parent=(pid, "g:1"))],
            logs=[LogLine("info", "submitted")],
            run_id=le.run_id,
        ),
    )
    [cle] = await s.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3)))
    await s.append(child, cle.next_version, [ev.Finished(ev.ResultOk("done"))], at(4))
    before = (
        await s.get_events(pid),
        await s.get_responses(pid),
        await s.get_summary(pid),
        await s.get_row(pid),
        await s.get_events(child),
        await s.get_logs(pid),
        await s.count_by_state(),
        await s.next_timer_at(),
    )
    await s.close()

    s = await SqliteStorage.open(db_path)
    try:
        after = (
            await s.get_events(pid),
            await s.get_responses(pid),
            await s.get_summary(pid),
            await s.get_row(pid),
            await s.get_events(child),
            await s.get_logs(pid),
            await s.count_by_state(),
            await s.next_timer_at(),
        )
        assert after == before
        assert await s.wait_for_finished(child, timeout=1) == ev.ResultOk("done")
    finally:
        await s.close()


async def test_readers_do_not_block_the_writer(storage: SqliteStorage, db_path: Path) -> None:
    """WAL: an open read transaction elsewhere does not stop commits."""
    with raw(db_path) as conn:
        conn.execute("BEGIN")
        conn.execute("SELECT count(*) FROM executions").fetchone()
        await asyncio.wait_for(storage.create(create_request(), at(0)), 5)
        conn.execute("COMMIT")


async def test_storage_closed_refuses_writes(db_path: Path) -> None:
    s = await SqliteStorage.open(db_path)
    await s.close()
    await s.close()  # idempotent
    with pytest.raises(StorageError, match="closed"):
        await s.create(create_request(), at(0))


# ---------------------------------------------------------------------------------------
# executors of dead processes (engine.storage.leases)
# ---------------------------------------------------------------------------------------


async def test_held_by_executors_finds_the_locks_and_waiting_runs_of_those_executors(
    storage: SqliteStorage, db_path: Path
) -> None:
    from engine.core.state import PendingAt, on_executor_died

    from .test_contract import BlockedParent

    assert storage.leases.directory == Path(f"{db_path}-executors")
    ex = Executor([ACTIVITY_FFQN])
    running = await create(storage)
    await lock(storage, running, 1, ex)
    released = await create(storage)  # locked by `ex` once, then failed: held by nobody
    le = await lock(storage, released, 1, ex)
    await storage.append(released, le.next_version, [ev.TemporarilyFailed(at(50), "x")], at(1))
    done = await create(storage)
    le = await lock(storage, done, 1, ex)
    await storage.append(done, le.next_version, [ev.Finished(ev.ResultOk(1))], at(1))
    blocked = await BlockedParent.build(storage, t=2)
    unblocked = await BlockedParent.build(storage, t=2)
    await storage.append_response(
        unblocked.parent,
        ev.ChildExecutionFinished(unblocked.children[0], "g:1", 2, ev.ResultOk(1)),
        at(5),
    )
    assert (await storage.get_summary(unblocked.parent)).state == PendingAt(
        unblocked.locked.lock_expires_at, unblocked.locked_ref
    )

    async def held(*executors: str) -> set[str]:
        return {h.execution_id for h in await storage.held_by_executors(set(executors))}

    assert await held() == set()
    assert await held(ex.executor_id) == {running}
    assert await held(blocked.executor_id) == {blocked.parent}
    assert await held(unblocked.executor_id) == {unblocked.parent}
    dead = {ex.executor_id, blocked.executor_id, unblocked.executor_id}
    assert await held(*dead) == {running, blocked.parent, unblocked.parent}

    # What the watcher appends leaves nothing held: the lock timed out, the claims dropped.
    for h in await storage.held_by_executors(dead):
        event = on_executor_died(h.summary, dead, at(6))
        assert event is not None
        await storage.append(h.execution_id, h.next_version, [event], at(6))
    assert await held(*dead) == set()
    assert (await storage.get_summary(unblocked.parent)).state == PendingAt(at(6), None)
    s = await storage.get_summary(blocked.parent)
    assert s.state == BlockedByJoinSet("g:1", at(6), False, None)
