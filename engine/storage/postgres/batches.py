"""Batches: the logical transactions queued meanwhile run as one physical transaction
with one NOTIFY (first without savepoints; when one fails after writing, again with a
SAVEPOINT each); a COMMIT without an answer is looked up by its transaction id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg

from engine.core.ids import ExecutionId, IdError
from engine.core.state import (
    IllegalAppend,
)
from engine.storage.common import (
    Notes,
    RemoteNotes,
    first_line,
)
from engine.storage.contract import (
    Conflict,
    StorageError,
)
from engine.storage.disk_full import is_disk_full, write_error
from engine.storage.postgres.target import is_connection_error

# ---------------------------------------------------------------------------------------
# The writer's connection wrapper and transactions
# ---------------------------------------------------------------------------------------


class _Conn:
    """The writer connection as a logical transaction sees it. `wrote` tells whether it
    changed anything: a failure before any write needs no rollback of the batch."""

    __slots__ = ("conn", "wrote")

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.wrote = False

    async def rows(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        return list(await self.conn.fetch(sql, *args))

    async def row(self, sql: str, *args: Any) -> asyncpg.Record | None:
        record: asyncpg.Record | None = await self.conn.fetchrow(sql, *args)
        return record

    async def write(self, sql: str, *args: Any) -> str:
        self.wrote = True
        status: str = await self.conn.execute(sql, *args)
        return status

    async def write_rows(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        self.wrote = True
        return list(await self.conn.fetch(sql, *args))


TxFn = Callable[[_Conn, Notes], Awaitable[Any]]


@dataclass(slots=True)
class _Tx:
    fn: TxFn
    future: asyncio.Future[Any]
    #: The executions whose rows it locks (FOR UPDATE): locked up front, see `_prelock`.
    keys: tuple[str, ...] = ()
    attempts: int = 0


Outcome = tuple[bool, Any, Notes]


@dataclass(frozen=True, slots=True)
class _Ident:
    """Where a batch's NOTIFY goes, and who sends it."""

    channel: str
    sender: str


class _CommitUnknown(Exception):
    """The connection failed while COMMIT was in flight."""

    def __init__(self, xid: str, outcomes: list[Outcome], cause: BaseException) -> None:
        super().__init__(str(cause))
        self.xid = xid
        self.outcomes = outcomes
        self.cause = cause


# ---------------------------------------------------------------------------------------
# Batches: one physical transaction, one NOTIFY
# ---------------------------------------------------------------------------------------


async def _run_batch(conn: asyncpg.Connection, batch: list[_Tx], ident: _Ident) -> list[Outcome]:
    """Run a batch of logical transactions as one physical transaction.

    First without savepoints. A logical transaction that raises before it wrote anything
    (a version conflict, an illegal transition: the usual failures) leaves nothing to
    undo and the others go on. One that fails after writing (or with an SQL error, which
    aborts the transaction) makes the batch roll back and run again with a SAVEPOINT per
    logical transaction (they are functions of the database, so running again is fine).
    """
    outcomes = await _run_plain(conn, batch, ident)
    if outcomes is not None:
        return outcomes
    return await _run_savepoints(conn, batch, ident)


async def _run_plain(
    conn: asyncpg.Connection, batch: list[_Tx], ident: _Ident
) -> list[Outcome] | None:
    outcomes: list[Outcome] = []
    await conn.execute("BEGIN")
    await _prelock(conn, batch)
    for tx in batch:
        notes = Notes()
        c = _Conn(conn)
        try:
            value = await tx.fn(c, notes)
        except Exception as e:
            if is_connection_error(e):
                raise
            if not c.wrote and not isinstance(e, asyncpg.PostgresError):
                outcomes.append((False, e, notes))
                continue
            await _rollback(conn)
            if len(batch) > 1:
                return None
            return [(False, e, notes)]
        outcomes.append((True, value, notes))
    try:
        await _commit(conn, outcomes, ident)
    except asyncpg.PostgresError as e:  # the transaction is gone; the statement was ours
        await _rollback(conn)
        if len(batch) > 1:
            return None
        return [(False, e, Notes())]
    return outcomes


async def _run_savepoints(
    conn: asyncpg.Connection, batch: list[_Tx], ident: _Ident
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    await conn.execute("BEGIN")
    await _prelock(conn, batch)
    for tx in batch:
        notes = Notes()
        await conn.execute("SAVEPOINT tx")
        try:
            value = await tx.fn(_Conn(conn), notes)
        except Exception as e:
            if is_connection_error(e):
                raise
            await conn.execute("ROLLBACK TO SAVEPOINT tx")
            await conn.execute("RELEASE SAVEPOINT tx")
            outcomes.append((False, e, notes))
        else:
            await conn.execute("RELEASE SAVEPOINT tx")
            outcomes.append((True, value, notes))
    try:
        await _commit(conn, outcomes, ident)
    except asyncpg.PostgresError as e:
        await _rollback(conn)
        if len(batch) == 1:
            return [(False, e, Notes())]
        results: list[Outcome] = []
        for tx in batch:  # each alone: one bad transaction cannot fail the others
            results += await _run_savepoints(conn, [tx], ident)
        return results
    return outcomes


async def _prelock(conn: asyncpg.Connection, batch: list[_Tx]) -> None:
    """Lock every row the batch's transactions will lock, in one statement and in id
    order. Batches of different processes otherwise lock rows in their own orders (a
    child's row, then its parent's) and deadlock, which PostgreSQL resolves only after
    `deadlock_timeout` (1 s) of stall; in one global order they just wait their turn."""
    keys = sorted({k for tx in batch for k in tx.keys})
    if keys:
        await conn.execute(
            "SELECT 1 FROM executions WHERE execution_id = ANY($1::text[]) "
            "ORDER BY execution_id FOR UPDATE",
            keys,
        )


def _with_parent(execution_id: str) -> tuple[str, ...]:
    """The execution and its parent (whose row a `finished` answers)."""
    try:
        parent = ExecutionId.parse(execution_id).parent()
    except IdError:
        return (execution_id,)
    return (execution_id,) if parent is None else (execution_id, str(parent[0]))


async def _commit(conn: asyncpg.Connection, outcomes: list[Outcome], ident: _Ident) -> None:
    """NOTIFY what the committed transactions changed (nothing when none succeeded),
    note the transaction id, COMMIT.

    The id lets the writer find out, after a connection lost during COMMIT, whether the
    batch is in the database (then its callers are acknowledged, not run again)."""
    if not any(ok for ok, _, _ in outcomes):  # nothing changed: nobody to tell
        xid = await conn.fetchval("SELECT pg_current_xact_id()::text")
        return await _commit_noting(conn, outcomes, str(xid))
    payload = RemoteNotes()
    for ok, _, notes in outcomes:
        if ok:
            payload.add(notes)
    chunks = payload.chunks(ident.sender)
    for chunk in chunks[:-1]:
        await conn.execute("SELECT pg_notify($1, $2)", ident.channel, chunk)
    xid = await conn.fetchval(
        "SELECT pg_current_xact_id()::text FROM pg_notify($1, $2)", ident.channel, chunks[-1]
    )
    await _commit_noting(conn, outcomes, str(xid))


async def _commit_noting(conn: asyncpg.Connection, outcomes: list[Outcome], xid: str) -> None:
    """COMMIT; a connection lost meanwhile leaves it to be asked whether `xid` committed."""
    try:
        await conn.execute("COMMIT")
    except Exception as e:
        if is_connection_error(e):
            raise _CommitUnknown(xid, outcomes, e) from e
        raise


async def _rollback(conn: asyncpg.Connection) -> None:
    try:
        await conn.execute("ROLLBACK")
    except Exception as e:
        if is_connection_error(e):
            raise


def _translate(e: Exception) -> Exception:
    if isinstance(e, StorageError):
        return e
    if isinstance(e, IllegalAppend):
        return Conflict(str(e))
    if is_disk_full(e):  # DiskFullError (SQLSTATE 53100)
        return write_error(e)
    if isinstance(e, asyncpg.PostgresError):
        return StorageError(f"database error: {first_line(e)}")
    return e
