"""The SQLite writer's summary cache across writers (`engine.storage.sqlite.cache`):
what another connection wrote is forgotten, whatever happened to this one's own
transactions. Plain connections on one file stand for the writers of several processes."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from engine.storage.sqlite import SqliteStorage
from engine.storage.sqlite.cache import SummaryCache
from engine.storage.sqlite.schema import MIGRATIONS, _statements

from .conftest import at, create_request


class _Summary:
    """What the cache keeps, as far as it looks at it."""

    is_finished = False


S: Any = _Summary()


def _writers(path: Path, n: int) -> list[tuple[sqlite3.Connection, SummaryCache]]:
    out = []
    for i in range(n):
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode = WAL")
        if i == 0:
            for script in MIGRATIONS:
                for statement in _statements(script):
                    conn.execute(statement)
        cache = SummaryCache(f"writer-{i}")
        conn.execute("BEGIN IMMEDIATE")
        cache.began(conn)
        conn.execute("COMMIT")
        out.append((conn, cache))
    return out


def _write(conn: sqlite3.Connection, cache: SummaryCache, execution_id: str) -> None:
    conn.execute("BEGIN IMMEDIATE")
    cache.began(conn)
    cache.put(execution_id, S, 0)
    cache.record_writes(conn)
    conn.execute("COMMIT")
    cache.commit()


def test_another_writers_execution_is_forgotten_and_the_rest_kept(tmp_path: Path) -> None:
    (a, ca), (b, cb) = _writers(tmp_path / "db.sqlite", 2)
    _write(a, ca, "X")
    _write(a, ca, "Y")
    _write(b, cb, "X")
    a.execute("BEGIN IMMEDIATE")
    assert ca.began(a) == {"X"}
    a.execute("ROLLBACK")
    assert "X" not in ca.committed and "Y" in ca.committed


def test_a_rolled_back_commit_does_not_hide_what_others_wrote_after_it(tmp_path: Path) -> None:
    """The number of a rolled-back `row_writes` row is taken by the next writer's row:
    it must still be read."""
    (a, ca), (b, cb), (c, cc) = _writers(tmp_path / "db.sqlite", 3)
    _write(a, ca, "X")
    a.execute("BEGIN IMMEDIATE")
    ca.began(a)
    ca.put("Y", S, 0)
    ca.record_writes(a)
    a.execute("ROLLBACK")  # its COMMIT failed
    _write(b, cb, "X")  # takes the same number
    _write(c, cc, "Z")
    a.execute("BEGIN IMMEDIATE")
    assert ca.began(a) == {"X", "Z"}
    a.execute("ROLLBACK")
    assert "X" not in ca.committed


def test_a_commit_without_a_row_forgets_everything(tmp_path: Path) -> None:
    (a, ca), (b, _) = _writers(tmp_path / "db.sqlite", 2)
    _write(a, ca, "X")
    b.execute(
        "INSERT INTO logs (execution_id, created_at, level, stream, message) "
        "VALUES ('X', 0, 'info', 'log', 'by hand')"
    )
    a.execute("BEGIN IMMEDIATE")
    assert ca.began(a) is None
    a.execute("ROLLBACK")
    assert not ca.committed


async def test_a_failure_after_begin_leaves_no_transaction_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails between BEGIN and COMMIT is rolled back before the next batch
    (which used to commit it, or fail on "a transaction within a transaction")."""
    peer = await SqliteStorage.open(tmp_path / "obelisk.sqlite")  # optimistic batches
    storage = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    try:
        real = SummaryCache.record_writes
        calls = []

        def fail_once(self: SummaryCache, conn: sqlite3.Connection) -> None:
            calls.append(1)
            if len(calls) == 1:
                raise sqlite3.OperationalError("disk I/O error")
            real(self, conn)

        monkeypatch.setattr(SummaryCache, "record_writes", fail_once)
        request = create_request()
        await storage.create(request, at(0))  # the retry with savepoints writes it
        monkeypatch.setattr(SummaryCache, "record_writes", real)
        other = create_request()
        await storage.create(other, at(1))
        writer = storage._writer
        assert writer is not None and writer.conn is not None
        assert not writer.conn.in_transaction
        for r in (request, other):
            assert (await storage.get_summary(r.execution_id)).next_version == 1
        assert writer.conn.counters["optimistic"] >= 1  # type: ignore[attr-defined]
    finally:
        await storage.close()
        await peer.close()
