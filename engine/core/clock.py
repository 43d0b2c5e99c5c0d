"""Time, injectable: the engine never calls `datetime.now()` directly."""

from __future__ import annotations

import asyncio
import functools
import threading
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None:
        """Sleep `seconds` of this clock's time (a manual clock wakes on `advance`)."""
        ...


class SystemClock:
    #: `datetime.now(UTC)` as a `partial`: called in C, without a Python frame (a
    #: workflow's host call reads the clock several times; every run and write does).
    now = staticmethod(functools.partial(datetime.now, UTC))

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock for tests: time moves only when the test calls `advance`."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._changed = asyncio.Condition()

    def now(self) -> datetime:
        return self._now

    async def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        async with self._changed:
            self._changed.notify_all()
        # Let tasks woken by the new time run before the test continues.
        for _ in range(3):
            await asyncio.sleep(0)

    async def sleep(self, seconds: float) -> None:
        deadline = self._now + timedelta(seconds=seconds)
        async with self._changed:
            await self._changed.wait_for(lambda: self._now >= deadline)


class SteppingClock(SystemClock):
    """A clock for tests: wall time plus `step` seconds more for every reading, so code
    that checks deadlines between readings (lock extension) sees time pass at a known
    pace whatever the machine's speed. Sleeps are wall-clock sleeps."""

    def __init__(self, step: float) -> None:
        self._step = timedelta(seconds=step)
        self._extra = timedelta(0)
        self._lock = threading.Lock()  # read from worker threads too

    def now(self) -> datetime:
        with self._lock:
            self._extra += self._step
            return datetime.now(UTC) + self._extra


def utc(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
