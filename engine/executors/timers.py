"""The timers watcher (SPEC §6.3): expired locks and due delays, and executors whose
process died."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from datetime import datetime, timedelta

from engine.core import events as ev
from engine.core.clock import Clock
from engine.core.state import (
    expired_lock_event,
    on_executor_died,
)
from engine.storage.contract import (
    Conflict,
    NotFound,
    Storage,
    StorageError,
)
from engine.storage.disk_full import is_disk_full, report_disk_full

log = logging.getLogger("obelisk.executor")


def _log_timers_error(error: Exception) -> None:
    if is_disk_full(error):
        report_disk_full(log, error)
    else:
        log.error("timers watcher: %s", error)


class TimersWatcher:
    """Expired locks and due delays (SPEC §6.3), every 100 ms at a 500 ms leeway; and,
    at start and every second, the executors whose process died (`engine.storage.leases`):
    what they held is released at once instead of when their locks expire."""

    INTERVAL = 0.1
    LEEWAY = timedelta(milliseconds=500)
    DEAD_EXECUTORS_INTERVAL = timedelta(seconds=1)

    def __init__(self, storage: Storage, clock: Clock) -> None:
        self.storage = storage
        self.clock = clock
        self._task: asyncio.Task[None] | None = None
        self._next_dead_check: datetime | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="timers watcher")

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except StorageError as e:
                _log_timers_error(e)
            await self.clock.sleep(self.INTERVAL)

    async def tick(self) -> int:
        """One pass; returns how many timers it handled (tests call it directly)."""
        now = self.clock.now()
        released = 0
        if self._next_dead_check is None or now >= self._next_dead_check:
            self._next_dead_check = now + self.DEAD_EXECUTORS_INTERVAL
            released = await self.release_dead_executors(now)
        locks, delays = await self.storage.expired_timers(now - self.LEEWAY)
        jobs: list[Awaitable[object]] = []
        for lock in locks:
            event = expired_lock_event(lock.summary, now)
            jobs.append(self.storage.append(lock.execution_id, lock.next_version, [event], now))
        for delay in delays:
            jobs.append(
                self.storage.append_response(
                    delay.execution_id,
                    ev.DelayFinished(delay.delay_id, delay.join_set_id, "ok"),
                    now,
                )
            )
        for result in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(result, Exception) and not isinstance(result, Conflict | NotFound):
                _log_timers_error(result)
        return released + len(jobs)

    async def release_dead_executors(self, now: datetime) -> int:
        """Release what executors of dead processes hold (`on_executor_died`); forget
        the leases of those that hold nothing any more. Returns how many executions."""
        dead = await self.storage.dead_executors()
        if not dead:
            return 0
        held = await self.storage.held_by_executors(dead)
        jobs = []
        for h in held:
            event = on_executor_died(h.summary, dead, now)
            if event is not None:
                jobs.append(self.storage.append(h.execution_id, h.next_version, [event], now))
        if not jobs:
            await self.storage.forget_executors(dead)
            return 0
        names = sorted(dead)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        log.warning(  # a process died without stopping: worth an operator's attention
            "released %d execution(s) held by executors that died without stopping "
            "(%d executor(s), a process has one per component: %s)",
            len(jobs),
            len(names),
            shown,
        )
        for result in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(result, Exception) and not isinstance(result, Conflict | NotFound):
                _log_timers_error(result)
        return len(jobs)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
