"""Opening a SQLite file: the reader's connection, WAL, the schema and its migrations.

`SCHEMA_VERSION` is the file's `PRAGMA user_version`; `MIGRATIONS[v - 1]` takes a file
from version v - 1 to v, run once by whichever engine opens the file first.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import aiosqlite

from engine.storage.contract import (
    StorageError,
)
from engine.storage.sqlite.queries import RESULT_CLASS_SQL

SCHEMA_VERSION = 6

MIGRATIONS: list[str] = [
    # 1: initial schema
    """
    CREATE TABLE executions (
        execution_id TEXT PRIMARY KEY,
        ffqn TEXT NOT NULL,
        component_type TEXT NOT NULL,
        parent_id TEXT,
        state TEXT NOT NULL,
        pending_at INTEGER,          -- set only while the state is exactly PendingAt
        lock_expires_at INTEGER,     -- set only while the underlying state is Locked
        next_version INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        summary BLOB NOT NULL
    );
    CREATE INDEX executions_due ON executions (ffqn, pending_at) WHERE pending_at IS NOT NULL;
    CREATE INDEX executions_lock_expiry ON executions (lock_expires_at)
        WHERE lock_expires_at IS NOT NULL;
    CREATE INDEX executions_created ON executions (created_at DESC, execution_id DESC);
    CREATE INDEX executions_state ON executions (state);
    CREATE INDEX executions_parent ON executions (parent_id) WHERE parent_id IS NOT NULL;

    CREATE TABLE events (
        execution_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        event BLOB NOT NULL,
        backtrace_id INTEGER,
        PRIMARY KEY (execution_id, version)
    ) WITHOUT ROWID;

    CREATE TABLE responses (
        execution_id TEXT NOT NULL,
        cursor INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        source_id TEXT NOT NULL,     -- child execution id or delay id: one response each
        response BLOB NOT NULL,
        PRIMARY KEY (execution_id, cursor)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX responses_source ON responses (execution_id, source_id);

    CREATE TABLE delays (
        delay_id TEXT PRIMARY KEY,
        execution_id TEXT NOT NULL,
        join_set_id TEXT NOT NULL,
        expires_at INTEGER NOT NULL
    );
    CREATE INDEX delays_expiry ON delays (expires_at);

    CREATE TABLE logs (
        id INTEGER PRIMARY KEY,
        execution_id TEXT NOT NULL,
        run_id TEXT,
        created_at INTEGER NOT NULL,
        level TEXT NOT NULL,
        stream TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX logs_execution ON logs (execution_id, id);
    """,
    # 2: workflow upgrades (SPEC §9.3): an execution whose upgrade failed stays on the
    # component digest that wrote its history; only that version's executor locks it.
    """
    ALTER TABLE executions ADD COLUMN pinned_digest TEXT;
    CREATE INDEX executions_pinned ON executions (pinned_digest)
        WHERE pinned_digest IS NOT NULL;
    """,
    # 3: backtraces (deduplicated guest stacks, SPEC §7.4) and component sources
    """
    CREATE TABLE backtraces (
        backtrace_id INTEGER PRIMARY KEY,
        hash BLOB NOT NULL UNIQUE,   -- sha256 of the component digest and the frames
        component_digest TEXT NOT NULL,
        frames BLOB NOT NULL         -- JSON [{file, line, column, function}], innermost first
    );

    CREATE TABLE component_sources (
        digest TEXT PRIMARY KEY,
        file TEXT NOT NULL,
        source TEXT NOT NULL
    );
    """,
    # 4: the console's "last change first" order pages through an index, not a sort
    """
    CREATE INDEX executions_updated ON executions (updated_at DESC, execution_id DESC);
    """,
    # 5: which executions each physical transaction wrote, so that the other processes
    # sharing the file forget only those (`engine.storage.sqlite.cache`)
    """
    CREATE TABLE row_writes (
        seq INTEGER PRIMARY KEY,     -- consecutive: rows are pruned only from the start
        writer TEXT NOT NULL,        -- the writing storage
        ids TEXT NOT NULL            -- execution ids, one per line; '*': anything
    );
    """,
    # 6: the finished counted by result class (the console's ok / err / failed) through
    # an index of the finished alone: ~5 ms per 100,000 instead of reading every summary
    # (~120 ms); a row enters it once, when it finishes (`queries.RESULT_CLASS_SQL`).
    f"""
    CREATE INDEX executions_result_class ON executions ({RESULT_CLASS_SQL})
        WHERE state = 'finished';
    """,
]


async def _connect(path: Path) -> aiosqlite.Connection:
    conn = aiosqlite.connect(path, isolation_level=None)
    try:
        return await conn
    except BaseException:
        # On a failed connect aiosqlite stops its worker thread without waiting for it:
        # wait here, or the thread outlives the event loop ("Event loop is closed").
        thread = conn._thread
        if thread.is_alive():
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 5.0)
        raise


def _set_wal(conn: sqlite3.Connection, path: str) -> None:
    # Switching a new file to WAL while another engine does the same can fail with
    # "database is locked" at once, without waiting for busy_timeout: retry for a while.
    deadline = time.monotonic() + 10.0
    while True:
        try:
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
    if str(mode).lower() != "wal":
        raise StorageError(f"database {path} cannot use WAL journal mode (it is in {mode} mode)")


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    def check(current: int) -> None:
        if current > SCHEMA_VERSION:
            raise StorageError(
                f"database {path} was created by a newer version of obelisk "
                f"(schema {current}, this version knows up to {SCHEMA_VERSION})"
            )

    (current,) = conn.execute("PRAGMA user_version").fetchone()
    check(current)
    if current == SCHEMA_VERSION:
        return
    # Several engines may open a new file at once: take the write lock first, then read
    # the version again, so that each migration runs exactly once. Statements are run one
    # by one because executescript would commit this transaction.
    conn.execute("BEGIN IMMEDIATE")
    try:
        (current,) = conn.execute("PRAGMA user_version").fetchone()
        check(current)
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in _statements(MIGRATIONS[version - 1]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _check_writable(conn: sqlite3.Connection) -> None:
    """Fail at open, not at the first write, when the file cannot be written."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        conn.execute(f"PRAGMA user_version = {int(version)}")  # a write, rolled back
    finally:
        conn.execute("ROLLBACK")


def _statements(script: str) -> list[str]:
    """Split a migration script into complete SQL statements."""
    statements: list[str] = []
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip().rstrip(";").strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip().rstrip(";").strip():
        raise ValueError(f"incomplete SQL statement in migration: {buffer!r}")
    return statements
