"""Optimistic batches: compute a batch without the write lock, write it with it.

When several processes write one SQLite file, the write lock is the bottleneck: a batch
holds it from BEGIN IMMEDIATE to COMMIT, and most of that time goes to Python (events
checked against the state machine, encoded, summaries computed) on a thread that shares
its CPU and the GIL with the process's runs. So, while other processes share the file
(`SqliteStorage`'s peer bus knows), a batch runs in two phases:

1. In a plain read transaction (no write lock) its logical transactions run against a
   `BufferedConnection`: reads go to the database, writes are kept in order. Each
   execution read or written is noted (`SummaryCache.touched`).
2. Under the write lock, `row_writes` tells which executions other writers changed
   since phase 1's snapshot (`SummaryCache.catch_up`). None of the noted ones: the
   kept writes are executed as they are and committed — the lock is held for a few
   statements and the fsync. Otherwise the batch runs again the usual way, under the
   lock, from scratch.

This is sound because every write of an execution's events, responses or delays also
writes its row (its summary), which `row_writes` names, and the other tables a logical
transaction reads are append-only (created events, backtraces). A write whose outcome
decides something (a unique key already there: a re-submission, a second response)
raises only in phase 2; the batch then runs again the usual way, with savepoints. A
logical transaction that needs a write's result at once (`lastrowid` of a new
backtrace) cannot be buffered: the batch runs the usual way.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any


class NeedsWriteLock(Exception):
    """A logical transaction used the result of a write: run the batch the usual way."""


class _WriteResult:
    """What a buffered write returns: nothing to read, and no result yet."""

    @property
    def lastrowid(self) -> int:
        raise NeedsWriteLock("lastrowid of a buffered write")

    @property
    def rowcount(self) -> int:
        raise NeedsWriteLock("rowcount of a buffered write")

    def fetchone(self) -> None:
        return None

    def fetchall(self) -> list[Any]:
        return []

    def __iter__(self) -> Iterator[Any]:
        return iter(())


_WRITE_RESULT = _WriteResult()

#: A kept write: (sql, parameters, executemany).
Write = tuple[str, Any, bool]


def is_read(sql: str) -> bool:
    return sql.lstrip()[:6].upper() == "SELECT"


class BufferedConnection:
    """Stands in for the writer's connection in phase 1 (see the module docstring):
    SELECTs run on the connection's read snapshot, everything else is kept in `writes`
    for phase 2. It carries the connection's caches, so the logical transactions use
    them as usual (their entries are undone with the rest when the batch runs again)."""

    __slots__ = ("backtrace_ids", "conn", "new_backtraces", "summaries", "writes")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.writes: list[Write] = []
        self.summaries = getattr(conn, "summaries", None)
        self.backtrace_ids = getattr(conn, "backtrace_ids", None)
        self.new_backtraces = getattr(conn, "new_backtraces", None)

    @property
    def in_transaction(self) -> bool:
        return True

    @property
    def total_changes(self) -> int:
        return self.conn.total_changes

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        if is_read(sql):
            return self.conn.execute(sql, parameters)
        self.writes.append((sql, parameters, False))
        return _WRITE_RESULT

    def executemany(self, sql: str, seq_of_parameters: Any) -> Any:
        if is_read(sql):
            raise NeedsWriteLock("executemany of a read")
        self.writes.append((sql, list(seq_of_parameters), True))
        return _WRITE_RESULT


def apply_writes(conn: sqlite3.Connection, writes: Sequence[Write]) -> None:
    """Phase 2: the kept writes, in order (raises as the statement would have)."""
    for sql, parameters, many in writes:
        if many:
            conn.executemany(sql, parameters)
        else:
            conn.execute(sql, parameters)
