"""What every executor shares (SPEC §6.1): the loop that locks due executions of its
component's FFQNs in batches while it has free slots, the in-flight runs, their
cancellation listeners, and a clean stop. `ActivityExecutor` (engine.executors.activity)
and `WorkflowExecutor` (engine.executors.workflow) run what it locks."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import Executor, Future
from datetime import datetime, timedelta
from typing import Any, TypeVar

from engine.core import events as ev
from engine.core.clock import Clock
from engine.core.ids import new_executor_id, new_run_id
from engine.core.state import (
    Locked,
)
from engine.runtimes.api import LoadedComponent
from engine.storage.contract import (
    AppendExtras,
    Conflict,
    ExecutorLease,
    LockedExecution,
    NotFound,
    Storage,
    StorageError,
    StorageFull,
)
from engine.storage.disk_full import is_disk_full, report_disk_full

log = logging.getLogger("obelisk.executor")
T = TypeVar("T")


class RunEnded:
    """Whether a run on a worker thread has ended (`done()`, `set_result(None)` from any
    thread, as a `concurrent.futures.Future`), and a future for whoever waits for that
    (`future()`, made only then: the executor's stop). A `Future` per run made ~12
    Python calls (a `Condition` made, taken and notified) for every activity run."""

    __slots__ = ("_ended", "_lock", "_waiter")

    def __init__(self) -> None:
        self._ended = False
        self._lock = threading.Lock()
        self._waiter: Future[None] | None = None

    def done(self) -> bool:
        return self._ended

    def set_result(self, _result: None) -> None:
        with self._lock:
            self._ended = True
            waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def future(self) -> Future[None]:
        """Done once the run has ended (at once if it has)."""
        with self._lock:
            if self._waiter is None:
                self._waiter = Future()
                if self._ended:
                    self._waiter.set_result(None)
            return self._waiter


#: How long stopping waits for interrupted runs before it leaves the stuck ones behind.
STOP_GRACE_SECONDS = 2.0


class BaseExecutor:
    """The loop shared by activity and workflow executors (SPEC §6.1).

    Each tick locks up to `exec.batch_size` due executions (never more than free slots of
    `exec.max_inflight`), runs each in its own task, and sleeps on an in-process
    notification (or `exec.tick_sleep`) when nothing is due.
    """

    with_log = False

    def __init__(
        self,
        storage: Storage,
        component: LoadedComponent,
        clock: Clock,
        threads: Executor,
    ) -> None:
        self.storage = storage
        self.component = component
        self.clock = clock
        self.threads = threads
        self.executor_id = new_executor_id()
        cfg = component.config
        self.ffqns = component.ffqns
        self.retry = ev.RetryConfig(cfg.max_retries, cfg.retry_exp_backoff_ms)
        #: Runs in progress: a task on the loop (workflows) or a future that a worker
        #: thread completes (activities), and the event that interrupts the run.
        self._inflight: dict[str, tuple[asyncio.Future[None] | RunEnded, threading.Event]] = {}
        self._slot_freed = asyncio.Event()
        #: Grace periods of cancelled runs (`_finish_if_still_running`).
        self._grace_tasks: set[asyncio.Task[None]] = set()
        #: The loop waits for `_slot_freed` (all slots taken): set under `_reserve_lock`.
        self._wants_slot = False
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Waiting for work with nothing due (its last lock found less than it asked for):
        #: only then may creators lock for it directly (`ActivityExecutor.reserve`).
        self._idle = False
        #: Slots promised to direct locks whose transaction has not committed yet.
        self._reserved = 0
        self._reserve_lock = threading.Lock()
        self._lease: ExecutorLease | None = None

    @property
    def name(self) -> str:
        return self.component.config.name

    def start(self) -> None:
        # Which process holds a lock, when several share one database (SPEC §6).
        log.info("executor %s started: %s", self.name, self.executor_id)
        # Before the first lock: other processes must not mistake it for a dead one.
        self._lease = self.storage.hold_executor_lease(self.executor_id)
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run_loop(), name=f"executor {self.name}")

    async def _run_loop(self) -> None:
        cfg = self.component.config.exec
        while not self._stopping:
            with self._reserve_lock:
                free = min(cfg.batch_size, cfg.max_inflight - len(self._inflight) - self._reserved)
                if free <= 0:
                    self._slot_freed.clear()
                    self._wants_slot = True
            if free <= 0:
                await self._slot_freed.wait()
                continue
            now = self.clock.now()
            try:
                batch = await self.storage.lock_pending(
                    ffqns=self.ffqns,
                    batch_size=free,
                    now=now,
                    component_id=self.component.component_id,
                    executor_id=self.executor_id,
                    run_id=new_run_id(),
                    lock_expires_at=now + timedelta(milliseconds=cfg.lock_expiry_ms),
                    retry_config=self.retry,
                    with_log=self.with_log,
                )
            except StorageError as e:
                if is_disk_full(e):  # every executor, every tick: once per interval
                    report_disk_full(log, e)
                else:
                    log.error("executor %s: locking failed: %s", self.name, e)
                await self.clock.sleep(cfg.tick_sleep_ms / 1000)
                continue
            for locked in batch:
                self._spawn(locked)
            if len(batch) < free:
                self._idle = True
                try:
                    await self.storage.wait_for_pending(self.ffqns, cfg.tick_sleep_ms / 1000)
                finally:
                    self._idle = False

    def _spawn(self, locked: LockedExecution) -> None:
        cancel = threading.Event()
        task = asyncio.create_task(self._guarded_run(locked, cancel))
        self._inflight[locked.execution_id] = (task, cancel)
        self.storage.subscribe_cancellations().add(locked.execution_id, cancel.set)

    async def _guarded_run(self, locked: LockedExecution, cancel: threading.Event) -> None:
        try:
            await self._run_one(locked, cancel)
        except StorageFull as e:  # its lock expires; the timers watcher retries it
            report_disk_full(log, e)
        except Exception:
            log.exception("executor %s: run of %s failed", self.name, locked.execution_id)
        finally:
            self.storage.subscribe_cancellations().remove(locked.execution_id)
            self._inflight.pop(locked.execution_id, None)
            self._slot_freed.set()

    async def _run_one(self, locked: LockedExecution, cancel: threading.Event) -> None:
        raise NotImplementedError

    async def _leave_behind(self) -> None:
        """Stopping, and runs did not end within `STOP_GRACE_SECONDS` of their interrupt:
        workflow runs are waited for (they answer interrupts at their next host call)."""

    async def _append_if_held(
        self,
        locked: LockedExecution,
        event: ev.Event,
        now: datetime,
        extras: AppendExtras | None = None,
        *,
        cancelling: bool = False,
    ) -> bool:
        """Append `event` for a run from outside it (after a cancellation, at a stop), at
        the version read now, if the execution is still locked by that run (and, with
        `cancelling`, being cancelled). False when it is not, or moved on meanwhile."""
        try:
            s = await self.storage.get_summary(locked.execution_id)
        except NotFound:
            return False
        u = s.underlying
        if not (isinstance(u, Locked) and u.run_id == locked.run_id):
            return False
        if cancelling and not s.cancelling:
            return False
        try:
            await self.storage.append(locked.execution_id, s.next_version, [event], now, extras)
        except (Conflict, NotFound):
            return False
        return True

    def _slot_freed_threadsafe(self) -> None:
        """A run ended or a reserved slot was given back, on any thread: wake the loop
        only if it waits for a slot (no loop wake-up per run otherwise)."""
        with self._reserve_lock:
            if not self._wants_slot:
                return
            self._wants_slot = False
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop
                loop.call_soon_threadsafe(self._slot_freed.set)

    async def stop(self) -> None:
        """Stop locking; interrupt runs and release them with `unlocked("executor closing")`."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # Until none is left: a direct lock taken on another thread as this began may
        # still add one.
        while inflight := list(self._inflight.values()):
            for _, cancel in inflight:
                cancel.set()
            _, stuck = await asyncio.wait(
                [
                    f if isinstance(f, asyncio.Future) else asyncio.wrap_future(f.future())
                    for f, _ in inflight
                ],
                timeout=STOP_GRACE_SECONDS,
            )
            if stuck:
                await self._leave_behind()
            for execution_id, (f, _) in list(self._inflight.items()):
                if f.done():  # ended without taking itself out: it must not loop here
                    del self._inflight[execution_id]
        if self._lease is not None:
            self._lease.release()
            self._lease = None


def ignore_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a conflict here changes nothing


def ok_payload_type(return_type: Any) -> Any:
    """The `ok` payload type of a `result<T, E>` return type, when the model exposes it."""
    return getattr(return_type, "ok", None)


def err_payload_type(return_type: Any) -> Any:
    """The `err` payload type of a `result<T, E>` return type (None for `result<T>`)."""
    return getattr(return_type, "err", None)
