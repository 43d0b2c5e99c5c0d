"""The writer's connection and its physical transactions: the write lock (the lock file,
then SQLite's), BEGIN / COMMIT / ROLLBACK, and what each commit tells the other writers
sharing the file (`engine.storage.sqlite.cache`).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from typing import Any

from engine.storage.sqlite.cache import SummaryCache, record_unknown_writes
from engine.storage.sqlite.write_lock import WriteLock


class _WriterConnection(sqlite3.Connection):
    """The writer's connection, with what it remembers across its transactions."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Backtrace hash → id of rows known to be committed: a workflow's stacks
        #: repeat, and each one is looked up once instead of at every write.
        self.backtrace_ids: dict[bytes, int] = {}
        #: Hashes the current physical transaction inserted (a rollback undoes them).
        self.new_backtraces: set[bytes] = set()
        self.summaries = SummaryCache(f"{os.getpid()}-{os.urandom(6).hex()}")
        #: Taken before BEGIN IMMEDIATE, let go after COMMIT / ROLLBACK (set at start).
        self.write_lock: WriteLock | None = None
        #: Batches written optimistically, those that then ran the usual way, and why
        #: (`_count`).
        self.counters: dict[str, int] = {}


def _summaries(conn: sqlite3.Connection) -> SummaryCache | None:
    return getattr(conn, "summaries", None)


def _begin(conn: sqlite3.Connection) -> None:
    _begin_write(conn)
    cache = _summaries(conn)
    if cache is not None:
        try:
            cache.began(conn)
        except BaseException:  # nothing written yet: no transaction may stay open
            with contextlib.suppress(sqlite3.Error):
                _end(conn, "ROLLBACK")
            raise


#: How long a writer retries BEGIN IMMEDIATE while another one holds the database.
BEGIN_TIMEOUT = 10.0


def _begin_write(conn: sqlite3.Connection) -> None:
    """Take the write lock: the lock file, then SQLite's. The writer's connection has
    no busy timeout (SQLite's busy handler sleeps a millisecond or more between tries):
    the previous holder is at most finishing its COMMIT, so retry at once, then back
    off."""
    lock: WriteLock | None = getattr(conn, "write_lock", None)
    if lock is not None:
        lock.acquire()
    try:
        pause = 0.00005
        deadline = 0.0
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as e:
                if not _is_busy(e):
                    raise
                now = time.monotonic()
                if not deadline:
                    deadline = now + BEGIN_TIMEOUT
                elif now > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.002)
    except BaseException:
        _release(conn)
        raise
    new = getattr(conn, "new_backtraces", None)
    if new:
        new.clear()


def _is_busy(e: sqlite3.Error) -> bool:
    text = str(e)
    return "locked" in text or "busy" in text


def _end(conn: sqlite3.Connection, how: str) -> None:
    """COMMIT or ROLLBACK the physical transaction, letting the next writer go.

    The lock file goes first: SQLite lets go of its own lock inside the COMMIT, right
    after the fsync, without waiting for this thread to get the GIL back (which can
    take milliseconds while the process's runs take turns). The next writer meanwhile
    retries its BEGIN (`_begin_write`)."""
    _release(conn)
    conn.execute(how)


def _release(conn: sqlite3.Connection) -> None:
    lock: WriteLock | None = getattr(conn, "write_lock", None)
    if lock is not None:
        lock.release()


def _record_unknown(conn: sqlite3.Connection, writer_id: str) -> None:
    """After a `_Call` changed rows outside a batch: the other writers forget everything
    (before the first migration there is no table to tell them: nothing to forget)."""
    if conn.in_transaction:
        return  # it left its own transaction open: its owner decides (tests only)
    try:
        _begin_write(conn)
    except sqlite3.OperationalError:  # before the first migration: nobody to tell
        return
    try:
        record_unknown_writes(conn, writer_id)
        _end(conn, "COMMIT")
    except sqlite3.Error:
        with contextlib.suppress(sqlite3.Error):
            _end(conn, "ROLLBACK")


def _record_writes(conn: sqlite3.Connection, changes_before: int) -> None:
    """Before the COMMIT: name what this transaction wrote for the other writers
    (`engine.storage.sqlite.cache`), when it changed anything."""
    cache = _summaries(conn)
    if cache is not None and conn.total_changes != changes_before:
        cache.record_writes(conn)
