"""Executor leases through the storage contract, for every backend: a lease is alive
while its process lives and dead — to this process and to another one opening the same
database — once that process is SIGKILLed; what its executors held is found, and a
forgotten lease is gone. (SQLite: `engine.storage.leases`, file locks; PostgreSQL:
`engine.storage.postgres.leases`, advisory locks held by the process's connection.)"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

from engine.core.ids import new_executor_id
from engine.storage.contract import Storage
from engine.storage.sharded import ShardedStorage
from engine.storage.sqlite import SqliteStorage
from tests.pg_cluster import schema_dsn
from tests.storage.conftest import T0, Executor, Reopen, _postgres, create_request

REPO_ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import asyncio, sys
from engine.storage.postgres import PostgresStorage
from engine.storage.sqlite import SqliteStorage

async def main() -> None:
    where, *executor_ids = sys.argv[1:]
    opener = PostgresStorage.open if where.startswith("postgresql:") else SqliteStorage.open
    storage = await opener(where)
    held = [storage.hold_executor_lease(e) for e in executor_ids]
    await storage.dead_executors()  # after the leases were taken
    print("holding", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def location(storage: Storage, tmp_path: Path) -> str:
    """What another process opens to reach the same database as `storage`."""
    if isinstance(storage, ShardedStorage):  # the leases a process holds are in its shard
        first = storage.shards[0]
        assert isinstance(first, SqliteStorage)
        return str(first.path)
    if isinstance(storage, SqliteStorage):
        return str(storage.path)
    return schema_dsn(_postgres["dsn"], tmp_path)


def hold_in_child(where: str, *executor_ids: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, where, *executor_ids],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    assert child.stdout is not None
    line = child.stdout.readline()
    if line != "holding\n":
        child.kill()
        raise AssertionError(f"the holder did not start: {line!r}, exit {child.wait(10)}")
    return child


async def dead_soon(storage: Storage, want: set[str], timeout: float = 10.0) -> set[str]:
    """`dead_executors()` once it is `want` (the server ends a killed client's session a
    moment after the kernel closed its socket), else what it last was."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while (dead := await storage.dead_executors()) != want and loop.time() < deadline:
        await asyncio.sleep(0.02)  # polling the server's view: no event to wait on
    return dead


async def test_a_lease_is_alive_while_its_process_lives_and_dead_after_sigkill(
    storage: Storage, open_storage: Reopen, tmp_path: Path
) -> None:
    a, b = new_executor_id(), new_executor_id()
    mine = storage.hold_executor_lease(new_executor_id())
    child = hold_in_child(location(storage, tmp_path), a, b)
    worker = Executor(["testing:act/ifc.step"])
    worker.executor_id = a
    try:
        # The child's leases are alive, and our own is never dead to us.
        assert await storage.dead_executors() == set()
        await storage.create(create_request(), T0)
        [locked] = await storage.lock_pending(**worker.lock_args(T0))
        assert [h.execution_id for h in await storage.held_by_executors({a})] == [
            locked.execution_id
        ]
        assert await storage.held_by_executors({b}) == []
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert await dead_soon(storage, {a, b}) == {a, b}
    other = await open_storage()  # another process's view: the same, ours alive
    try:
        assert await other.dead_executors() == {a, b}
        [held] = await other.held_by_executors({a, b})
        assert held.execution_id == locked.execution_id
        assert held.summary.next_version == held.next_version == 2
        assert getattr(held.summary.underlying, "executor_id", None) == a
        await storage.forget_executors({a})
        assert await storage.dead_executors() == {b}
        assert await other.dead_executors() == {b}
        mine.release()  # a clean stop: gone, not dead
        assert await other.dead_executors() == {b}
        await other.forget_executors({b})
        assert await storage.dead_executors() == set()
    finally:
        await other.close()


async def test_a_lease_released_before_close_or_held_at_close_is_not_dead(
    storage: Storage, open_storage: Reopen
) -> None:
    other = await open_storage()
    released = other.hold_executor_lease(new_executor_id())
    other.hold_executor_lease(new_executor_id())  # still held when `other` closes
    released.release()
    assert await storage.dead_executors() == set()
    await other.close()  # a clean stop: its leases go with it
    assert await storage.dead_executors() == set()
