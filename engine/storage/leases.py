"""Which executors are alive, for the processes of one host that share a database.

A lock records the executor that took it (`locked.executor_id`). When the process of
that executor dies, the lock would only be noticed once it expires (`exec.lock_expiry`,
SPEC §6.3) — after a crash, a restarted server would sit idle that long before resuming
its work. Instead, every executor of a running process holds an exclusive `flock` on a
file named after it in one directory next to the database. The kernel drops the lock
when the process ends, however it ends (SIGKILL included), so a file that anyone can lock
is the lease of a dead executor: its locks are released at once (`on_executor_died`).

A lease file is created locked (written under a temporary name, locked, then renamed),
so that nobody ever sees the file of a live executor unlocked. On a platform without
`fcntl` leases are not kept and locks wait for their expiry as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from engine.core.ids import IdError, parse_executor_id
from engine.storage.data_files import private_dir

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)


class ExecutorLease:
    """The lease of one executor of this process: held until `release`."""

    def __init__(self, leases: ExecutorLeases, executor_id: str, fd: int | None) -> None:
        self._leases = leases
        self.executor_id = executor_id
        self._fd = fd

    def release(self) -> None:
        """The executor stopped (its runs are released): remove the file, then unlock."""
        fd, self._fd = self._fd, None
        self._leases._held.pop(self.executor_id, None)
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self._leases.directory / self.executor_id)
        os.close(fd)


class ExecutorLeases:
    """The lease files of the executors sharing one database, in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        #: The leases this process holds (never reported dead to itself).
        self._held: dict[str, ExecutorLease] = {}

    def hold(self, executor_id: str) -> ExecutorLease:
        """Take the lease of `executor_id` (before it locks anything). When the file
        cannot be written the executor runs without one (its locks then wait for their
        expiry after a crash), with a warning: leases only make recovery quicker."""
        fd = None
        if fcntl is not None:
            try:
                fd = self._create_locked(executor_id)
            except OSError as e:
                log.warning(
                    "executor %s: no lease file in %s (%s): after a crash its locks are "
                    "released only when they expire",
                    executor_id,
                    self.directory,
                    e,
                )
        lease = ExecutorLease(self, executor_id, fd)
        self._held[executor_id] = lease
        return lease

    def _create_locked(self, executor_id: str) -> int:
        private_dir(self.directory)
        tmp = self.directory / f".{executor_id}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, f"{os.getpid()}\n".encode())  # for a curious operator
            os.rename(tmp, self.directory / executor_id)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return fd

    def dead(self) -> set[str]:
        """The executors whose lease file nobody holds: their process has ended."""
        if fcntl is None:
            return set()
        dead = set()
        for name in self._names():
            if name in self._held:
                continue
            with contextlib.suppress(OSError):
                if self._unheld(name, unlink=False):
                    dead.add(name)
        return dead

    def forget(self, executor_ids: set[str]) -> None:
        """Remove the files of dead executors that hold nothing any more, and temporary
        files left by a process that died while creating its lease."""
        if fcntl is None:
            return
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.directory):
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        self._unheld(entry.name, unlink=True)
        for executor_id in executor_ids - set(self._held):
            with contextlib.suppress(OSError):
                self._unheld(executor_id, unlink=True)

    def _names(self) -> list[str]:
        try:
            names = os.listdir(self.directory)
        except OSError:  # none yet, or unusable (`hold` warned): nobody is known dead
            return []
        valid = []
        for name in names:
            with contextlib.suppress(IdError):
                valid.append(parse_executor_id(name))
        return valid

    def _unheld(self, name: str, *, unlink: bool) -> bool:
        """Whether nobody holds the file `name` (then unlinked under our lock, if asked)."""
        fd = os.open(self.directory / name, os.O_RDWR | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            if unlink:
                os.unlink(self.directory / name)
            return True
        finally:
            os.close(fd)  # drops our lock
