"""The phase-2 writes of optimistic batches (`engine.storage.sqlite.optimistic`): kept
writes coalesced into a few statements must leave the database exactly as the writes
made one by one would (each execution's last summary, after its creation; delays in
their order), and a write of another form keeps the batch's own order."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from engine.storage.sqlite.optimistic import (
    UPDATE_SUMMARY,
    BufferedConnection,
    NeedsWriteLock,
    Write,
    apply_writes,
    update_summaries_sql,
)
from engine.storage.sqlite.schema import MIGRATIONS, _statements

INSERT_EXECUTION = (
    "INSERT INTO executions (execution_id, ffqn, component_type, parent_id, state, "
    "pending_at, lock_expires_at, next_version, created_at, updated_at, summary) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
INSERT_EVENTS = (
    "INSERT INTO events (execution_id, version, created_at, event, backtrace_id) VALUES "
)


def _database(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    for script in MIGRATIONS:
        for statement in _statements(script):
            conn.execute(statement)
    return conn


def _dump(conn: sqlite3.Connection) -> dict[str, list[Any]]:
    return {
        table: conn.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()
        for table in ("executions", "events", "responses", "delays", "logs")
    }


def _batch() -> list[Write]:
    """Writes as two logical transactions would keep them: creations, summaries written
    twice, events in multi-row statements, a delay inserted then deleted, logs."""
    writes: list[Write] = []
    for n in range(3):
        eid = f"E_{n}"
        writes.append(
            (
                INSERT_EXECUTION,
                (eid, "f", "activity_wasm", None, "pending_at", 1, None, 1, 1, 1, b"s0"),
                False,
            )
        )
        writes.append(
            (
                INSERT_EVENTS + "(?,?,?,?,?),(?,?,?,?,?)",
                (eid, 0, 1, b"c", None, eid, 1, 1, b"l", None),
                False,
            )
        )
        writes.append((UPDATE_SUMMARY, ("locked", None, 9, 2, 2, b"s1", eid), False))
    writes.append(
        (
            update_summaries_sql(2),
            ["E_0", "blocked", None, 8, 3, 3, b"s2", "E_1", "finished", None, None, 3, 3, b"s2"],
            False,
        )
    )
    writes.append(
        (
            "INSERT INTO delays (delay_id, execution_id, join_set_id, expires_at) VALUES (?,?,?,?)",
            ("D_1", "E_0", "o:1", 5),
            False,
        )
    )
    writes.append(
        (
            "INSERT INTO responses (execution_id, cursor, created_at, source_id, response) VALUES (?,?,?,?,?)",
            ("E_0", 1, 4, "D_1", b"r"),
            False,
        )
    )
    writes.append(("DELETE FROM delays WHERE delay_id = ?", ("D_1",), False))
    writes.append(
        (
            "INSERT INTO delays (delay_id, execution_id, join_set_id, expires_at) VALUES (?,?,?,?)",
            ("D_2", "E_2", "o:1", 6),
            False,
        )
    )
    writes.append((UPDATE_SUMMARY, ("pending_at", 4, None, 3, 4, b"s3", "E_0"), False))
    writes.append(
        (
            "INSERT INTO logs (execution_id, run_id, created_at, level, stream, message) VALUES (?,?,?,?,?,?)",
            [("E_0", None, 1, "info", "log", "a"), ("E_1", None, 2, "info", "log", "b")],
            True,
        )
    )
    return writes


def _one_by_one(conn: sqlite3.Connection, writes: list[Write]) -> None:
    for sql, parameters, many in writes:
        if many:
            conn.executemany(sql, parameters)
        else:
            conn.execute(sql, parameters)


def test_coalesced_writes_leave_what_the_writes_one_by_one_leave(tmp_path: Path) -> None:
    plain = _database(tmp_path / "plain.sqlite")
    _one_by_one(plain, _batch())
    coalesced = _database(tmp_path / "coalesced.sqlite")
    statements: list[str] = []
    coalesced.set_trace_callback(statements.append)
    apply_writes(coalesced, _batch())
    coalesced.set_trace_callback(None)
    assert _dump(coalesced) == _dump(plain)
    # One statement per table written (and the delays' own, in their order).
    assert len(statements) == 8


def test_a_write_of_another_form_keeps_the_order(tmp_path: Path) -> None:
    writes = [
        *_batch(),
        ("UPDATE executions SET pinned_digest = ? WHERE execution_id = ?", ("d", "E_1"), False),
    ]
    plain = _database(tmp_path / "plain.sqlite")
    _one_by_one(plain, writes)
    other = _database(tmp_path / "other.sqlite")
    statements: list[str] = []
    other.set_trace_callback(statements.append)
    apply_writes(other, writes)
    other.set_trace_callback(None)
    assert _dump(other) == _dump(plain)
    assert len(statements) == len(writes) + 1  # (the executemany is traced per row)


def test_a_duplicate_key_raises_when_written(tmp_path: Path) -> None:
    conn = _database(tmp_path / "db.sqlite")
    writes = _batch()
    with pytest.raises(sqlite3.IntegrityError):
        apply_writes(conn, [*writes, writes[0]])


def test_the_buffered_connection_reads_and_keeps_writes(tmp_path: Path) -> None:
    conn = _database(tmp_path / "db.sqlite")
    _one_by_one(conn, _batch()[:3])
    buffered = BufferedConnection(conn)
    assert buffered.execute("SELECT count(*) FROM executions").fetchone() == (1,)
    result = buffered.execute(UPDATE_SUMMARY, ("x", None, None, 5, 5, b"s", "E_0"))
    assert result.fetchone() is None
    assert buffered.writes == [(UPDATE_SUMMARY, ("x", None, None, 5, 5, b"s", "E_0"), False)]
    assert conn.execute("SELECT next_version FROM executions").fetchone() == (2,)  # not yet
    with pytest.raises(NeedsWriteLock):
        _ = result.lastrowid
