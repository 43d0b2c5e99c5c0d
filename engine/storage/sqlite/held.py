"""Writes a batch holds back until its end (`HeldWrites`), on the usual path of the
single writer (`engine.storage.sqlite.batches._run_batch_plain`).

A batch of ~30 logical transactions (100 workflows stepping at once) made ~8 statements
per step: a summary `UPDATE`, event `INSERT`s, a child's `INSERT`, a response `INSERT`
each. Every statement gives the GIL up while SQLite runs it and has to get it back from
the process's busy runs, and carries sqlite3's per-statement cost. Held back, the rows of
each table go in one statement per batch, a summary written twice in the batch is written
once (its last value), and a summary of an execution the batch creates goes into its
`INSERT` instead of an `UPDATE` after it.

What stays exact: no reader outside the writer sees anything before the COMMIT, and the
held writes are all made before it (and before anything is handed to other threads).
Inside the batch, the logical transactions read summaries through the summary cache
(`engine.storage.sqlite.cache`), which is written at once as before; every other
statement that names a table with held rows first writes them (`_WriterConnection`), so
it sees what it would have seen. A held write that fails (a duplicate response, an
execution id submitted again) fails the whole batch, which then runs again the usual
way, one savepoint per logical transaction: each one gets the outcome it would have had.

Multi-row `UPDATE … FROM (VALUES …)` is not used here: in SQLite it costs about twice the
CPU per row of one `UPDATE` per row (measured), so the summaries stay one statement each.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from engine.core import events as ev
from engine.core.state import ExecutionSummary
from engine.storage.common import projection
from engine.storage.sqlite.optimistic import UPDATE_SUMMARY

INSERT_EXECUTION = (
    "INSERT INTO executions (execution_id, ffqn, component_type, parent_id, state, "
    "pending_at, lock_expires_at, next_version, created_at, updated_at, summary) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
_INSERT_EXECUTIONS = INSERT_EXECUTION.split("VALUES")[0] + "VALUES "
_INSERT_EVENTS = (
    "INSERT INTO events (execution_id, version, created_at, event, backtrace_id) VALUES "
)
_INSERT_RESPONSES = (
    "INSERT INTO responses (execution_id, cursor, created_at, source_id, response) VALUES "
)
#: Rows per multi-row INSERT (at most 11 columns: 5,500 parameters; SQLite allows 32,766).
_ROWS = 500


class HeldWriteFailed(Exception):
    """A held write failed (its cause: the error): the batch runs again the usual way,
    where the logical transaction that made it gets its own outcome."""


def observes(sql: str) -> bool:
    """Whether `sql` may read or write a row a batch holds back."""
    return "executions" in sql or "events" in sql or "responses" in sql


class HeldWrites:
    """The held rows of the open batch (see the module docstring)."""

    __slots__ = ("created", "events", "responses", "summaries")

    def __init__(self) -> None:
        #: Execution id → its row (`INSERT_EXECUTION`'s columns), created in this batch.
        self.created: dict[str, list[Any]] = {}
        #: Execution id → its last summary and `updated_at` (µs).
        self.summaries: dict[str, tuple[ExecutionSummary, int]] = {}
        #: Rows of events and responses, 5 values each, in order.
        self.events: list[Any] = []
        self.responses: list[Any] = []

    @property
    def pending(self) -> bool:
        return bool(self.created or self.summaries or self.events or self.responses)

    def summary(self, execution_id: str, s: ExecutionSummary, updated_us: int) -> None:
        row = self.created.get(execution_id)
        if row is None:
            self.summaries[execution_id] = (s, updated_us)
            return
        state, pending_at, lock_expires_at = projection(s)
        row[4:8] = (state, pending_at, lock_expires_at, s.next_version)
        row[9] = updated_us
        row[10] = s  # encoded when written

    def flush(self, conn: sqlite3.Connection) -> None:
        """Write everything held (`HeldWriteFailed`, from the statement's error, when one
        fails); nothing is held after it either way (a failure rolls the batch back)."""
        try:
            self._write(conn)
        except Exception as e:
            raise HeldWriteFailed(f"a held write failed: {e}") from e

    def _write(self, conn: sqlite3.Connection) -> None:
        created, self.created = self.created, {}
        summaries, self.summaries = self.summaries, {}
        events, self.events = self.events, []
        responses, self.responses = self.responses, []
        execute = sqlite3.Connection.execute
        rows: list[Any] = []
        for row in created.values():
            s = row[10]
            if isinstance(s, ExecutionSummary):
                row[10] = ev.encode(s)
            rows += row
        _insert_rows(conn, _INSERT_EXECUTIONS, rows, 11)
        for execution_id, (s, t) in summaries.items():
            state, pending_at, lock_expires_at = projection(s)
            execute(
                conn,
                UPDATE_SUMMARY,
                (state, pending_at, lock_expires_at, s.next_version, t, ev.encode(s), execution_id),
            )
        _insert_rows(conn, _INSERT_EVENTS, events, 5)
        _insert_rows(conn, _INSERT_RESPONSES, responses, 5)


def _insert_rows(conn: sqlite3.Connection, head: str, values: list[Any], width: int) -> None:
    """`values` (`width` per row) in one statement per `_ROWS` rows."""
    one = "(" + ",".join("?" * width) + ")"
    step = _ROWS * width
    for i in range(0, len(values), step):
        chunk = values[i : i + step]
        sqlite3.Connection.execute(conn, head + ",".join([one] * (len(chunk) // width)), chunk)


def held(conn: sqlite3.Connection) -> HeldWrites | None:
    """The open batch's held writes, or None: write at once."""
    return getattr(conn, "held", None)
