"""What the SQLite writer remembers between its transactions, and how it learns what
other processes sharing the file changed meanwhile.

Every physical transaction that changes the database also inserts one `row_writes` row
naming the executions whose rows it wrote (`record_writes`), in the same transaction.
Another writer that sees `PRAGMA data_version` move reads the rows after the last one it
knows (`SummaryCache.catch_up`) and forgets only those executions, instead of everything:
several processes that each work on their own executions keep their caches. The same
rows tell an optimistic batch (`engine.storage.sqlite.optimistic`) whether what it read
is still current. A commit the rows do not account for (a gap, or `data_version` moved
with no new row) forgets everything.

Summaries are never changed in place (`apply_event` returns new ones), so sharing them
with the callers of a write is safe.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from engine.core.state import ExecutionSummary

#: `row_writes.ids` of a transaction whose writes are not known one by one.
EVERYTHING = "*"
#: Rows kept: writers further behind than this forget their whole cache.
KEEP_ROW_WRITES = 2000


class SummaryCache:
    """The summaries (and `updated_at`) of the executions the writer wrote lately, so
    that the next write of one reads and decodes no row: a workflow step writes its own
    summary, its child's and (with the child's result) its own again.

    Entries of the open physical transaction are kept apart (`tx`) and become committed
    ones only after its COMMIT; a rollback drops them."""

    MAX = 10_000

    def __init__(self, writer_id: str) -> None:
        #: This writer's name in `row_writes` (its own rows are skipped on catch-up).
        self.writer_id = writer_id
        self.committed: dict[str, tuple[ExecutionSummary, int]] = {}
        self.tx: dict[str, tuple[ExecutionSummary, int]] = {}
        self.enabled = True
        self._data_version: int | None = None
        #: The last `row_writes.seq` accounted for (None: not read yet).
        self.last_seen: int | None = None
        #: While an optimistic batch runs: every execution it read or wrote ...
        self.touched: set[str] | None = None
        #: ... and how to undo the current logical transaction's entries.
        self.undo: list[tuple[str, tuple[ExecutionSummary, int] | None]] | None = None
        #: The `row_writes` row of the open transaction (known once it commits).
        self._recorded: int | None = None

    # -- entries -------------------------------------------------------------------------
    def get(self, execution_id: str) -> tuple[ExecutionSummary, int] | None:
        if self.touched is not None:
            self.touched.add(execution_id)
        if not self.enabled:
            return None
        found = self.tx.get(execution_id)
        return found if found is not None else self.committed.get(execution_id)

    def put(self, execution_id: str, s: ExecutionSummary, updated_us: int) -> None:
        if self.touched is not None:
            self.touched.add(execution_id)
        if self.enabled:
            if self.undo is not None:
                self.undo.append((execution_id, self.tx.get(execution_id)))
            self.tx[execution_id] = (s, updated_us)

    def revert(self, undo: list[tuple[str, tuple[ExecutionSummary, int] | None]]) -> None:
        """Take back the entries a logical transaction put (it failed)."""
        for execution_id, previous in reversed(undo):
            if previous is None:
                self.tx.pop(execution_id, None)
            else:
                self.tx[execution_id] = previous

    def commit(self) -> None:
        """The transaction committed: its entries are known to be in the database."""
        if self._recorded is not None:
            # Its `row_writes` row is ours, and nothing came in between (the write lock
            # was held). Not before the COMMIT: a rolled-back row's number is reused.
            self.last_seen, self._recorded = self._recorded, None
        committed = self.committed
        for execution_id, entry in self.tx.items():
            committed.pop(execution_id, None)  # to the end: the oldest go first
            if not entry[0].is_finished:
                committed[execution_id] = entry
        self.tx.clear()
        if len(committed) > self.MAX:
            for execution_id in list(committed)[: self.MAX // 2]:
                del committed[execution_id]

    def clear(self) -> None:
        self.committed.clear()
        self.tx.clear()

    # -- other writers -------------------------------------------------------------------
    def began(self, conn: sqlite3.Connection) -> set[str] | None:
        """In a new transaction (read or write): forget what other connections wrote
        since the last time. Returns the executions they wrote (None: anything)."""
        self.tx.clear()
        self._recorded = None
        return self.catch_up(conn)

    def catch_up(self, conn: sqlite3.Connection) -> set[str] | None:
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._data_version and self.last_seen is not None:
            return set()
        self._data_version = version
        if self.last_seen is None:  # the first transaction: nothing is cached yet
            self.last_seen = _last_seq(conn)
            self.committed.clear()
            return None
        rows = conn.execute(
            "SELECT seq, writer, ids FROM row_writes WHERE seq > ? ORDER BY seq",
            (self.last_seen,),
        ).fetchall()
        if not rows or rows[0][0] != self.last_seen + 1:
            # A commit with no row (a writer that does not record: an older tool, a
            # hand-made change) or rows already pruned: anything may have changed.
            self.last_seen = rows[-1][0] if rows else _last_seq(conn)
            self.committed.clear()
            return None
        changed: set[str] = set()
        everything = False
        for _, writer, ids in rows:
            if writer == self.writer_id:
                continue
            if ids == EVERYTHING:
                everything = True
            elif ids:
                changed.update(ids.split("\n"))
        self.last_seen = rows[-1][0]
        if everything:
            self.committed.clear()
            return None
        for execution_id in changed:
            self.committed.pop(execution_id, None)
        return changed

    def record_writes(self, conn: sqlite3.Connection) -> None:
        """Before the COMMIT of a transaction that changed something: its `row_writes`
        row (which executions it wrote, or everything when not known one by one)."""
        ids = "\n".join(self.tx) if self.enabled else EVERYTHING
        self._recorded = _insert_row_writes(conn, self.writer_id, ids)


def record_unknown_writes(conn: sqlite3.Connection, writer_id: str) -> None:
    """A change made outside the cached path (set-up, tests): readers forget everything."""
    _insert_row_writes(conn, writer_id, EVERYTHING)


def _insert_row_writes(conn: sqlite3.Connection, writer_id: str, ids: str) -> int:
    cursor = conn.execute("INSERT INTO row_writes (writer, ids) VALUES (?, ?)", (writer_id, ids))
    seq = cursor.lastrowid
    assert seq is not None
    if seq % 500 == 0:
        conn.execute("DELETE FROM row_writes WHERE seq <= ?", (seq - KEEP_ROW_WRITES,))
    return int(seq)


def _last_seq(conn: sqlite3.Connection) -> int:
    row: Any = conn.execute("SELECT max(seq) FROM row_writes").fetchone()
    return int(row[0] or 0)
