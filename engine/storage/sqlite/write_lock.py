"""An exclusive `flock` taken around each write transaction of a SQLite database.

SQLite serialises writers itself, but a writer that finds the database locked sleeps in
its busy handler (1, 2, 5, 10 … ms) and checks again: when several processes write one
file at a high rate, most of a commit's wait is that sleep, not the other writer. With a
lock file, the kernel queues the waiting writers and wakes the next one the moment the
holder lets go. SQLite's own locking stays in force (the lock only decides who goes
first), so a writer that does not take it — an older tool, a migration at start — is
still safe, only not as fast.

One `WriteLock` belongs to one writer connection (one thread); it is not re-entrant
across threads. The file is named after the database's real path, so that processes
that open it by different paths (a symbolic link) queue together. Without `fcntl` (not Linux/Unix) or when the file cannot be opened, it
does nothing and SQLite's busy handler does the waiting as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("obelisk.storage")


class WriteLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.held = False
        if fcntl is None:
            return
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)  # private
        except OSError as e:
            log.warning("cannot use the write lock file %s (%s): writers wait in SQLite", path, e)

    def acquire(self, timeout: float = 10.0) -> None:
        """Wait up to `timeout` seconds (as SQLite's busy timeout would), retrying at
        once and then every half millisecond at most: a blocking `flock` cannot be given
        up, and a holder that is stopped (a debugger, SIGSTOP) must not hang this writer
        for good. Raises sqlite3.OperationalError ("database is locked") after that."""
        if self._fd is None or self.held:
            return
        start = time.perf_counter()
        pause = 0.00005
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.perf_counter() - start > timeout:
                    raise sqlite3.OperationalError(
                        f"database is locked: another writer has held {self.path} "
                        f"for over {timeout:g} s"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.0005)
        self.held = True

    def release(self) -> None:
        if self._fd is not None and self.held:
            self.held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        self.held = False
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
