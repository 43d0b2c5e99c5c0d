"""Which executors are alive, for the processes (on any hosts) that share one PostgreSQL
database: the counterpart of `engine.storage.leases` (file locks, one host) for
`PostgresStorage`.

Every executor of a running process holds a session-level advisory lock
(`pg_advisory_lock`) on a key derived from its id, on one connection per process that
does nothing else, and has a row in `executor_leases` naming the key. The server drops
a session's advisory locks when its connection ends: when the process exits, however it
exits (SIGKILL included), the kernel closes its socket and the backend ends. A row whose
key anybody can lock is then the lease of a dead executor, and its locks are released at
once (`on_executor_died`) instead of when they expire (SPEC §6.3).

- The lock is taken before the row is inserted, on the same connection: nobody ever
  sees the row of a live executor unlocked.
- Advisory locks are re-entrant within a session: this process never tests its own keys.
- When the lease connection itself is lost (a network failure, the database restarted),
  this process's leases are gone and other processes may release what its executors
  hold; their runs then end with `lock_lost` when they next write, as after a lock
  expiry, and the leases are taken again on the next connection. A host that vanishes
  without closing its connections keeps its leases until the server notices the dead
  TCP connection (its keepalive settings): its locks expire before that, as without
  leases.
- A connection pooler in transaction mode (pgbouncer) does not keep sessions: point the
  engine at PostgreSQL itself, or at a pooler in session mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable, Iterator

import asyncpg

from engine.storage.common import first_line

log = logging.getLogger("obelisk.storage")

#: What the lease connection's failures look like (then it is dropped and reopened).
_FAILURES = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)

SCHEMA = """
CREATE TABLE executor_leases (
    executor_id TEXT COLLATE "C" PRIMARY KEY,
    lock_key BIGINT NOT NULL       -- the key of the executor's advisory lock
);
"""


def lease_key(executor_id: str) -> int:
    """The advisory lock key of an executor: 64 bits of a hash of its (random) id."""
    digest = hashlib.blake2b(f"obelisk-executor:{executor_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresLease:
    """The lease of one executor of this process: held until `release`."""

    def __init__(self, leases: PostgresLeases, executor_id: str) -> None:
        self._leases = leases
        self.executor_id = executor_id

    def release(self) -> None:
        """The executor stopped (its runs are released): delete the row, then unlock."""
        self._leases._release(self.executor_id)


class PostgresLeases:
    """The leases of this process's executors, on a connection of their own (opened
    lazily by `connect`, reopened after a failure). `hold` and `release` are called from
    the event loop and return at once; the statements run in order in the background,
    and `dead`, `forget` and `close` come after every earlier one."""

    def __init__(self, connect: Callable[[], Awaitable[asyncpg.Connection]]) -> None:
        self._connect = connect
        self._conn: asyncpg.Connection | None = None
        #: The executors of this process with a lease (never reported dead to itself).
        self._held: dict[str, int] = {}
        #: One statement at a time on the connection, in the order they were asked for.
        self._lock = asyncio.Lock()
        self._pending: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- this process's leases ----------------------------------------------------------
    def hold(self, executor_id: str) -> PostgresLease:
        key = lease_key(executor_id)
        self._held[executor_id] = key
        self._background(self._take(executor_id, key))
        return PostgresLease(self, executor_id)

    def _release(self, executor_id: str) -> None:
        key = self._held.pop(executor_id, None)
        if key is not None and not self._closed:
            self._background(self._drop(executor_id, key))

    async def _settled(self) -> None:
        """After the statements of every `hold` and `release` asked for so far."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    def _background(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _take(self, executor_id: str, key: int) -> None:
        async with self._lock:
            if executor_id not in self._held:
                return  # released before it was taken
            conn = self._conn
            if conn is None or conn.is_closed():
                await self._connection()  # a new one takes every held lease, this one too
            else:
                await self._run(conn, _take_sql, executor_id, key)

    async def _drop(self, executor_id: str, key: int) -> None:
        async with self._lock:
            conn = self._conn
            if conn is None:
                return  # the lock went with the connection; a dead check removes the row
            await self._run(conn, _drop_sql, executor_id, key)

    async def _connection(self) -> asyncpg.Connection | None:
        """The lease connection, opened (and every held lease taken on it) if needed;
        None, with a warning, when the database cannot be reached."""
        if self._conn is not None and not self._conn.is_closed():
            return self._conn
        self._conn = None
        try:
            conn = await self._connect()
        except _FAILURES as e:
            log.warning("executor leases: cannot connect (%s); retrying", _reason(e))
            return None
        with self._guarded(conn):
            for executor_id, key in list(self._held.items()):
                await _take_sql(conn, executor_id, key)
            self._conn = conn
            return conn
        return None

    async def _run(
        self,
        conn: asyncpg.Connection,
        statement: Callable[[asyncpg.Connection, str, int], Awaitable[None]],
        executor_id: str,
        key: int,
    ) -> None:
        with self._guarded(conn):
            await statement(conn, executor_id, key)

    @contextlib.contextmanager
    def _guarded(self, conn: asyncpg.Connection) -> Iterator[None]:
        """Around statements on the lease connection: a database failure is logged and
        suppressed, and the connection dropped (the next use reconnects and takes the
        held leases again)."""
        try:
            yield
        except _FAILURES as e:
            log.warning("executor leases: %s; reconnecting", _reason(e))
            if self._conn is conn:
                self._conn = None
            with contextlib.suppress(Exception):
                conn.terminate()

    # -- other processes' leases --------------------------------------------------------
    async def dead(self) -> set[str]:
        """The executors whose lease nobody holds: their process has ended (none while
        the database cannot be reached)."""
        await self._settled()
        async with self._lock:
            conn = await self._connection()
            if conn is None:
                return set()
            with self._guarded(conn):
                # A live session's lock cannot be taken; what this one takes it gives
                # back at once. Rows inserted after the snapshot are of live executors.
                # (OFFSET 0 keeps the planner from trying locks on rows it then drops.)
                rows = await conn.fetch(
                    "SELECT executor_id, lock_key FROM (SELECT executor_id, lock_key"
                    " FROM executor_leases WHERE NOT (executor_id = ANY($1::text[])) OFFSET 0) s"
                    " WHERE pg_try_advisory_lock(lock_key)",
                    list(self._held),
                )
                await _unlock(conn, rows)
                return {str(r["executor_id"]) for r in rows}
            return set()

    async def forget(self, executor_ids: set[str]) -> None:
        """Delete the rows of dead executors (those whose lock can be taken)."""
        gone = sorted(executor_ids - set(self._held))
        if not gone:
            return
        await self._settled()
        async with self._lock:
            conn = await self._connection()
            if conn is None:
                return
            with self._guarded(conn):
                async with conn.transaction():
                    rows = await conn.fetch(
                        "DELETE FROM executor_leases WHERE executor_id IN ("
                        " SELECT executor_id FROM (SELECT executor_id, lock_key"
                        " FROM executor_leases WHERE executor_id = ANY($1::text[]) OFFSET 0) s"
                        " WHERE pg_try_advisory_lock(lock_key)) RETURNING lock_key",
                        gone,
                    )
                await _unlock(conn, rows)

    async def close(self) -> None:
        """After the executors stopped: wait for their releases, delete the rows of any
        lease still held, and close the connection (which drops the locks)."""
        if self._closed:
            return
        await self._settled()
        self._closed = True
        async with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            with contextlib.suppress(*_FAILURES):
                if self._held:
                    await conn.execute(
                        "DELETE FROM executor_leases WHERE executor_id = ANY($1::text[])",
                        list(self._held),
                    )
                await conn.close(timeout=5)
            if not conn.is_closed():
                conn.terminate()
            self._held.clear()


async def _take_sql(conn: asyncpg.Connection, executor_id: str, key: int) -> None:
    # Lock first, then the row (see the module's docstring). Nobody else holds a new
    # key, but for a moment another process's `dead` check may hold it: wait for that.
    await conn.execute("SELECT pg_advisory_lock($1)", key)
    await conn.execute(
        "INSERT INTO executor_leases (executor_id, lock_key) VALUES ($1, $2) "
        "ON CONFLICT (executor_id) DO NOTHING",
        executor_id,
        key,
    )


async def _drop_sql(conn: asyncpg.Connection, executor_id: str, key: int) -> None:
    await conn.execute("DELETE FROM executor_leases WHERE executor_id = $1", executor_id)
    await conn.execute("SELECT pg_advisory_unlock($1)", key)


async def _unlock(conn: asyncpg.Connection, rows: list[asyncpg.Record]) -> None:
    """Give back the advisory locks that a dead-executor probe took."""
    if rows:
        await conn.execute(
            "SELECT pg_advisory_unlock(k) FROM unnest($1::bigint[]) AS k",
            [r["lock_key"] for r in rows],
        )


def _reason(e: BaseException) -> str:
    return first_line(e) or type(e).__name__
