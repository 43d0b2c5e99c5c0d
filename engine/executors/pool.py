"""The thread pool activity runs use: few threads while runs are short, more when they block.

With `concurrent.futures.ThreadPoolExecutor(64)`, a burst of short jobs (trivial
activities: ~100 µs of work each) wakes up to 64 threads that then contend for the GIL, and
every `loop.run_in_executor` hop goes through two futures and their callbacks. Both cost
more CPU than such a job itself. `RunPool` instead

- runs jobs on `core` threads (2 × CPUs, at least 2) taking work from one `SimpleQueue`;
- has a watchdog that, when queued jobs see no job picked up for `stall` seconds (every
  thread is busy with something slow: a sleep, an HTTP call, a long computation), starts
  more threads, up to `max_workers`; threads beyond `core` exit after `idle_timeout`
  seconds without work. A job that waits behind blocked threads therefore starts at most
  about `stall` (10 ms) later than with one thread per job;
- hands results back to asyncio in batches: one `call_soon_threadsafe` for all the
  results that arrive before the loop gets to them (`run_async`).

It is also a `concurrent.futures.Executor` (`submit`, `shutdown`), so
`loop.run_in_executor(pool, fn)` keeps working.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

log = logging.getLogger("obelisk.pool")

T = TypeVar("T")

_STOP = object()


def _deliver(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():  # the awaiting task was cancelled
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class _Mailbox:
    """Results for one event loop: posted from pool threads, delivered in batches.

    Only the first result posted while the loop has not drained the box yet costs a
    `call_soon_threadsafe` (a self-pipe write, a loop wake-up, a GIL hand-off); results
    that arrive meanwhile ride along.
    """

    __slots__ = ("_items", "_lock", "_scheduled", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: list[tuple[asyncio.Future[Any], bool, Any]] = []
        self._lock = threading.Lock()
        self._scheduled = False

    def post(self, fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
        with self._lock:
            self._items.append((fut, ok, value))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # a closed loop: nobody waits any more
            with self._lock:
                self._items.clear()
                self._scheduled = False

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
            self._scheduled = False
        for fut, ok, value in items:
            _deliver(fut, ok, value)


class RunPool(Executor):
    def __init__(
        self,
        max_workers: int,
        *,
        core: int | None = None,
        stall: float = 0.01,
        idle_timeout: float = 10.0,
        thread_name_prefix: str = "pool",
        initializer: Callable[[], None] | None = None,
    ) -> None:
        if max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self.max_workers = max_workers
        default_core = max(2, 2 * (os.cpu_count() or 1))
        self.core = min(max_workers, default_core if core is None else core)
        self.stall = stall
        self.idle_timeout = idle_timeout
        self.prefix = thread_name_prefix
        self.initializer = initializer  # called first on every new thread
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._names = 0
        self._taken = 0  # jobs picked up so far (approximate is fine): progress marker
        self._kick = threading.Event()  # work is queued: the watchdog should look
        self._watchdog: threading.Thread | None = None
        self._shutdown = False
        self._mailbox: _Mailbox | None = None  # of the loop that last called run_async

    # -- submitting -------------------------------------------------------------------
    def run_async(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run `fn()` on a pool thread; the result arrives on the running event loop."""
        loop = asyncio.get_running_loop()
        box = self._mailbox
        if box is None or box.loop is not loop:
            box = self._mailbox = _Mailbox(loop)
        fut: asyncio.Future[T] = loop.create_future()
        self._put((box, fut, fn))
        return fut

    def run_detached(self, fn: Callable[[], None]) -> None:
        """Run `fn()` on a pool thread with nobody to tell: no future at all (a caller
        that reports on its own, as an activity run does). An exception is logged."""
        self._put((None, None, fn))

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        cf: Future[T] = Future()
        self._put((None, cf, lambda: fn(*args, **kwargs)))
        return cf

    def _put(self, job: tuple[Any, Any, Callable[[], Any]]) -> None:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        self._queue.put(job)
        if self._threads < self.core:
            with self._lock:
                if self._threads < self.core:
                    self._spawn(core=True)
                    return
        if self._threads < self.max_workers and not self._kick.is_set():
            self._ensure_watchdog()
            self._kick.set()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            threads = self._threads
        if cancel_futures:
            while True:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is not _STOP:
                    self._cancel(job)
        for _ in range(threads):
            self._queue.put(_STOP)
        self._kick.set()

    # -- threads ----------------------------------------------------------------------
    def _spawn(self, core: bool) -> None:  # with self._lock held
        self._threads += 1
        self._names += 1
        threading.Thread(
            target=self._work, args=(core,), name=f"{self.prefix}_{self._names}", daemon=True
        ).start()

    def _work(self, core: bool) -> None:
        if self.initializer is not None:
            try:
                self.initializer()
            except Exception:  # a placement hint: never a reason to lose a worker
                log.exception("pool thread initializer failed")
        get = self._queue.get
        timeout = None if core else self.idle_timeout
        while True:
            try:
                job = get(timeout=timeout)
            except queue.Empty:
                with self._lock:
                    self._threads -= 1
                return
            if job is _STOP:
                with self._lock:
                    self._threads -= 1
                return
            self._taken += 1
            self._run(job)
            del job

    @staticmethod
    def _run(job: tuple[Any, Any, Callable[[], Any]]) -> None:
        box, fut, fn = job
        if fut is None:  # run_detached()
            try:
                fn()
            except Exception:
                log.exception("pool job failed")
            return
        if box is None:  # submit(): a concurrent.futures.Future
            if not fut.set_running_or_notify_cancel():
                return
            try:
                result = fn()
            except BaseException as e:
                fut.set_exception(e)
            else:
                fut.set_result(result)
            return
        try:
            value, ok = fn(), True
        except BaseException as e:
            value, ok = e, False
        box.post(fut, ok, value)

    @staticmethod
    def _cancel(job: tuple[Any, Any, Callable[[], Any]]) -> None:
        box, fut, _ = job
        if fut is None:  # run_detached(): nobody waits
            return
        if box is None:
            fut.cancel()
        else:
            with contextlib.suppress(RuntimeError):
                box.loop.call_soon_threadsafe(fut.cancel)

    def _ensure_watchdog(self) -> None:
        if self._watchdog is None:
            with self._lock:
                if self._watchdog is None:
                    self._watchdog = threading.Thread(
                        target=self._watch, name=f"{self.prefix}-watchdog", daemon=True
                    )
                    self._watchdog.start()

    def _watch(self) -> None:
        """Start threads while queued jobs make no progress (every thread is blocked)."""
        while True:
            self._kick.wait()
            if self._shutdown:
                return
            taken = self._taken
            time.sleep(self.stall)
            if self._shutdown:
                return
            if self._queue.empty():
                self._kick.clear()
                if self._queue.empty():
                    continue
                self._kick.set()  # a job came in between: look again
            if self._taken == taken:
                with self._lock:
                    extra = min(self._queue.qsize(), self.max_workers - self._threads)
                    for _ in range(max(0, extra)):
                        self._spawn(core=False)
