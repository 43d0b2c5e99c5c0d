"""A full disk under the database: recognised once for every backend, reported as
`StorageFull`, and logged at most once per interval however often writes fail.

Writes fail many times a second while the disk is full (every submit, every executor's
locking round, the timers watcher): one log line per failure would drown the log, and
fill the disk of a log on the same filesystem even more.
"""

from __future__ import annotations

import errno
import logging
import sqlite3
import threading
import time
from collections.abc import Callable

from engine.storage.contract import StorageError, StorageFull

#: SQLite's primary result code SQLITE_FULL ("database or disk is full"): the disk, or
#: the database's `max_page_count`.
SQLITE_FULL = 13
#: PostgreSQL's SQLSTATE disk_full (asyncpg's DiskFullError), by code: no asyncpg import.
PG_DISK_FULL = "53100"
_OS_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})

#: How often a full disk is logged at most.
LOG_INTERVAL = 10.0


def is_disk_full(error: BaseException) -> bool:
    """Whether `error` (or what caused it) says the database's disk is full."""
    seen: BaseException | None = error
    for _ in range(4):  # a few links of the chain: a wrapped error counts too
        if seen is None:
            return False
        if isinstance(seen, StorageFull):
            return True
        code = getattr(seen, "sqlite_errorcode", 0) if isinstance(seen, sqlite3.Error) else 0
        if code & 0xFF == SQLITE_FULL:  # extended codes keep the primary one in the low byte
            return True
        if isinstance(seen, OSError) and seen.errno in _OS_FULL:
            return True
        if getattr(seen, "sqlstate", None) == PG_DISK_FULL:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def write_error(error: BaseException, what: str = "database write failed") -> StorageError:
    """The storage error a failed write raises: `StorageFull` for a full disk."""
    if isinstance(error, StorageFull):
        return error
    if is_disk_full(error):
        return StorageFull(f"the database's disk is full: {_first_line(error)}")
    if isinstance(error, StorageError):
        return error
    return StorageError(f"{what}: {error}")


class Throttle:
    """Logs a message at most once per `interval` seconds, with the number of the
    repeats it left out since. Thread-safe: the SQLite writer's thread may report too."""

    def __init__(
        self, interval: float = LOG_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last: float | None = None
        self._suppressed = 0

    def report(self, logger: logging.Logger, message: str) -> bool:
        """Log `message` (an error) unless one was logged less than `interval` ago;
        returns whether it was logged."""
        now = self._clock()
        with self._lock:
            if self._last is not None and now - self._last < self.interval:
                self._suppressed += 1
                return False
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        if suppressed:
            message += f" ({suppressed} more not logged in the last {self.interval:g} s)"
        logger.error("%s", message)
        return True


#: One per process: the API, the executors and the timers report the same full disk.
disk_full_log = Throttle()


def report_disk_full(logger: logging.Logger, error: BaseException) -> None:
    """Log a full disk (rate-limited, see `Throttle`)."""
    disk_full_log.report(logger, f"{write_error(error)}; writes fail until space is freed")


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


__all__ = [
    "LOG_INTERVAL",
    "Throttle",
    "disk_full_log",
    "is_disk_full",
    "report_disk_full",
    "write_error",
]
