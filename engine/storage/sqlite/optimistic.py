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

import re
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
    """SELECT: a read; INSERT, UPDATE, DELETE: a write to keep; anything else cannot be
    told apart here (NeedsWriteLock: the batch runs the usual way)."""
    verb = sql.lstrip()[:6].upper()
    if verb == "SELECT":
        return True
    if verb in ("INSERT", "UPDATE", "DELETE"):
        return False
    raise NeedsWriteLock(f"statement not known as a read or a write: {sql[:40]!r}")


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


#: The summary of one execution (`_write_summary`), and of many (`_write_locks`, and the
#: coalesced writes below): the same columns, in this order, with the id first.
UPDATE_SUMMARY = (
    "UPDATE executions SET state = ?, pending_at = ?, lock_expires_at = ?, next_version = ?, "
    "updated_at = ?, summary = ? WHERE execution_id = ?"
)
_UPDATE_SUMMARIES = (
    "UPDATE executions SET state = v.column2, pending_at = v.column3, "
    "lock_expires_at = v.column4, next_version = v.column5, updated_at = v.column6, "
    "summary = v.column7 FROM (VALUES "
)


def update_summaries_sql(rows: int) -> str:
    return (
        _UPDATE_SUMMARIES
        + ",".join(["(?,?,?,?,?,?,?)"] * rows)
        + ") AS v WHERE executions.execution_id = v.column1"
    )


_INSERT = re.compile(r"INSERT INTO (\w+) \(([^)]*)\) VALUES\s*((?:\(\?(?:,\?)*\),?)+)\s*$")
#: Tables whose writes are coalesced; a write of them in any other form keeps the batch
#: in its own order.
_COALESCED = ("executions", "events", "responses", "logs")
#: At most this many parameters per statement (SQLite allows 32766).
_MAX_PARAMETERS = 30_000


def apply_writes(conn: sqlite3.Connection, writes: Sequence[Write]) -> None:
    """Phase 2: the kept writes (raises as the statements would have).

    Every statement gives the GIL up while SQLite runs it, and gets it back only when
    the process's other threads let it — while the write lock is held. So the writes
    of the batch are coalesced: the rows of each table in one statement per 500 or so,
    the summaries in one `UPDATE … FROM (VALUES …)` (the last one of each execution,
    after its creation), the rest (delays) in their order. When a write has another
    form, everything is written as it came."""
    plan = _coalesce(writes)
    if plan is None:
        for sql, parameters, many in writes:
            if many:
                conn.executemany(sql, parameters)
            else:
                conn.execute(sql, parameters)
        return
    inserts, summaries, rest = plan
    created = inserts.pop(("executions", None), None)
    if created is not None:
        _insert_rows(conn, "executions", created)
    rows = list(summaries.values())
    step = _MAX_PARAMETERS // 7
    for i in range(0, len(rows), step):
        chunk = rows[i : i + step]
        conn.execute(update_summaries_sql(len(chunk)), [v for row in chunk for v in row])
    for (table, _), (columns, table_rows) in inserts.items():
        _insert_rows(conn, table, (columns, table_rows))
    for sql, parameters in rest:
        conn.execute(sql, parameters)


_Rows = tuple[str, list[Sequence[Any]]]


def _coalesce(
    writes: Sequence[Write],
) -> tuple[dict[tuple[str, str | None], _Rows], dict[str, tuple[Any, ...]], list[Any]] | None:
    inserts: dict[tuple[str, str | None], _Rows] = {}
    summaries: dict[str, tuple[Any, ...]] = {}
    rest: list[tuple[str, Any]] = []
    for sql, parameters, many in writes:
        if sql == UPDATE_SUMMARY and not many:
            *values, execution_id = parameters
            summaries.pop(execution_id, None)  # the last one, at the end
            summaries[execution_id] = (execution_id, *values)
            continue
        if sql.startswith(_UPDATE_SUMMARIES) and not many:
            for i in range(0, len(parameters), 7):
                row = tuple(parameters[i : i + 7])
                summaries.pop(row[0], None)
                summaries[row[0]] = row
            continue
        m = _INSERT.match(sql)
        if m is not None and m.group(1) in _COALESCED:
            table, columns = m.group(1), m.group(2)
            width = columns.count(",") + 1
            if many:
                new_rows = [tuple(row) for row in parameters]
            else:
                new_rows = [
                    tuple(parameters[i : i + width]) for i in range(0, len(parameters), width)
                ]
            key = (table, None if table == "executions" else columns)
            inserts.setdefault(key, (columns, []))[1].extend(new_rows)
            continue
        if many or any(table in sql for table in _COALESCED):
            return None  # another form: keep the order
        rest.append((sql, parameters))
    return inserts, summaries, rest


def _insert_rows(conn: sqlite3.Connection, table: str, rows: _Rows) -> None:
    columns, values = rows
    width = columns.count(",") + 1
    one = "(" + ",".join("?" * width) + ")"
    step = _MAX_PARAMETERS // width
    for i in range(0, len(values), step):
        chunk = values[i : i + step]
        conn.execute(
            f"INSERT INTO {table} ({columns}) VALUES " + ",".join([one] * len(chunk)),
            [v for row in chunk for v in row],
        )
