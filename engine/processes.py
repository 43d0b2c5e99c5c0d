"""More engine processes: `Engine.start(processes=N)`.

One Python process runs its Python code on one CPU at a time (the GIL), so an engine
uses a second CPU through a second process. With `processes=N`, the engine starts N − 1
*helper* processes (`python -m engine.helper_process`), each a full engine — executors,
timers watcher, cancellation driver, hot reload — without an API; the starting process
(the server's, the console's) is the first. Each process is placed on a CPU of its own.

- SQLite: helper i works on a file of its own, shard i of the data dir
  (`engine.storage.sharded`); the starting process serves the API over every shard.
- PostgreSQL: every process works on the one database, as several servers would.

- A helper stops when its stdin closes: when the engine stops, and when the starting
  process dies however it dies (the pipe closes with it), so no helper outlives it.
- A helper that dies is started again (after 1 s, then up to 30 s between tries); what
  it held is released at once through its executors' leases, as after any crash.
- A helper that cannot start (the deployment, the data dir) fails `Engine.start`, with
  what the helper said.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import sys
from pathlib import Path

from engine.errors import EngineError

log = logging.getLogger("obelisk.processes")

#: How long a helper may take to start (it compiles nothing the first process has not:
#: the compiled cache is shared).
START_TIMEOUT = 120.0
#: How long a stopping helper gets before it is killed.
STOP_TIMEOUT = 15.0
#: How a helper process is started (its arguments follow).
HELPER_COMMAND = [sys.executable, "-m", "engine.helper_process"]
#: The database URL of a helper (PostgreSQL; empty: SQLite in the data dir).
DATABASE_ENV = "OBELISK_HELPER_DATABASE_URL"


class HelperError(EngineError):
    """A helper process could not start; the message is what it said."""


class Helpers:
    """The helper processes of one engine."""

    def __init__(
        self,
        deployment: Path,
        data_dir: Path,
        cpus: list[set[int]] | None,
        count: int,
        database_url: str | None = None,
        *,
        sharded: bool = False,
    ) -> None:
        self.deployment = deployment
        #: Helper i (from 0) works on shard i + 1 of the data dir.
        self.sharded = sharded
        self.data_dir = data_dir
        self.cpus = cpus
        self.count = count
        #: Passed in the environment, not on the command line (it may hold a password).
        self.database_url = database_url
        self.procs: list[asyncio.subprocess.Process | None] = [None] * count
        self._stopping = False
        self._watchers: list[asyncio.Task[None]] = []
        self._forwarders: set[asyncio.Task[None]] = set()

    def alive(self, index: int) -> bool:
        """Whether helper `index` (from 0) is running."""
        proc = self.procs[index] if 0 <= index < len(self.procs) else None
        return proc is not None and proc.returncode is None

    @property
    def pids(self) -> list[int]:
        return [p.pid for i, p in enumerate(self.procs) if p is not None and self.alive(i)]

    async def start(self) -> None:
        """Start every helper and wait until each has its engine up."""
        try:
            await asyncio.gather(*(self._spawn(i) for i in range(self.count)))
        except BaseException:
            await self.stop()
            raise
        self._watchers = [
            asyncio.create_task(self._watch(i), name=f"engine helper {i + 1}")
            for i in range(self.count)
        ]

    async def _spawn(self, index: int) -> None:
        cpus = self.cpus[index + 1] if self.cpus else None
        proc = await asyncio.create_subprocess_exec(
            *HELPER_COMMAND,
            "--deployment",
            str(self.deployment),
            "--data-dir",
            str(self.data_dir),
            *(["--cpus", ",".join(map(str, sorted(cpus)))] if cpus else []),
            *(["--shard", str(index + 1)] if self.sharded else []),
            # Its log lines at the level of this process's.
            "--log-level",
            logging.getLevelName(logging.getLogger().getEffectiveLevel()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,  # its log lines go where this process's go
            env={**os.environ, DATABASE_ENV: self.database_url or ""},
        )
        self.procs[index] = proc
        assert proc.stderr is not None
        task = asyncio.create_task(_forward_log_lines(proc.stderr), name="helper log lines")
        self._forwarders.add(task)
        task.add_done_callback(self._forwarders.discard)
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
        except TimeoutError:
            proc.kill()
            raise HelperError(
                f"engine helper {index + 1} did not start in {START_TIMEOUT:g} s"
            ) from None
        text = line.decode(errors="replace").strip()
        if text != "ready":
            await proc.wait()
            raise HelperError(
                f"engine helper {index + 1} could not start: {text.removeprefix('error: ')}"
                if text
                else f"engine helper {index + 1} exited with {proc.returncode}"
            )

    async def _watch(self, index: int) -> None:
        delay = 1.0
        while not self._stopping:
            proc = self.procs[index]
            if proc is None:
                return
            code = await proc.wait()
            if self._stopping:
                return
            log.warning(
                "engine helper %d (pid %d) exited with %s: starting it again in %g s",
                index + 1,
                proc.pid,
                code,
                delay,
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            try:
                await self._spawn(index)
                delay = 1.0
            except (HelperError, OSError) as e:
                log.error("%s", e)
                delay = min(delay * 2, 30.0)

    async def stop(self) -> None:
        """Ask each helper to stop (its stdin closes), then wait; kill the late ones."""
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for task in self._watchers:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        procs = [p for p in self.procs if p is not None and p.returncode is None]
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                log.warning("engine helper (pid %d) did not stop: killed", proc.pid)
                proc.kill()
                await proc.wait()
        if self._forwarders:  # their last lines (at the end of their stderr)
            await asyncio.wait(set(self._forwarders), timeout=5)
        for task in list(self._forwarders):
            task.cancel()


async def _forward_log_lines(stream: asyncio.StreamReader) -> None:
    """A helper's stderr (its log lines, formatted by it) to where this process's log
    lines go: its root logger's streams (the console's log file, not the screen), or
    stderr when logging is not set up."""
    # Chunks, not lines: a line of any length must not stop the forwarding (the helper
    # would block on a full pipe).
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := await stream.read(65536):
        text = decoder.decode(chunk)
        handlers = logging.getLogger().handlers
        streams = [h.stream for h in handlers if isinstance(h, logging.StreamHandler)]
        for target in streams or [sys.stderr]:
            with contextlib.suppress(Exception):  # a closed stream: the line is lost
                target.write(text)
                target.flush()
