"""The executor loop (SPEC §6.1) for activities, and the timers watcher (SPEC §6.3).

An executor locks due executions of its component's FFQNs in batches, runs each on a
worker thread (runners are synchronous; the GIL is released while WASM runs), and turns
the outcome into an append with the retry rules of `engine.core.state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, Future
from datetime import datetime, timedelta
from typing import Any, TypeVar

from engine.core import events as ev
from engine.core.clock import Clock
from engine.core.ids import new_executor_id, new_run_id
from engine.core.state import (
    Locked,
    expired_lock_event,
    on_executor_died,
    on_temporary_failure,
)
from engine.executors.pool import RunPool
from engine.runtimes.api import LoadedComponent, RunContext
from engine.runtimes.outcome import (
    LogLine,
    RunCancelled,
    RunErr,
    RunOk,
    RunOutcome,
    RunTimedOut,
    RunTrap,
)
from engine.storage.contract import (
    AppendExtras,
    Conflict,
    DirectLock,
    ExecutorLease,
    LockedExecution,
    NotFound,
    Storage,
    StorageError,
    StorageFull,
)
from engine.storage.disk_full import is_disk_full, report_disk_full
from engine.wit.codec import WitValueError, validate_json

log = logging.getLogger("obelisk.executor")
T = TypeVar("T")


def outcome_to_event(
    locked: LockedExecution,
    outcome: RunOutcome,
    now: Any,
    ok_type: Any = None,
    err_type: Any = None,
) -> ev.Event:
    """Map one run's outcome to the event to append (SPEC §5.1–5.3). A returned value
    that does not match the declared `ok_type`/`err_type` is a failure, not a result."""
    s = locked.summary
    checked = {RunOk: (ok_type, "return value"), RunErr: (err_type, "error value")}
    wit_type, what = checked.get(type(outcome), (None, ""))
    if wit_type is not None:
        assert isinstance(outcome, RunOk | RunErr)
        try:
            outcome = dataclasses.replace(
                outcome, value=validate_json(outcome.value, wit_type, what)
            )
        except WitValueError as e:
            failure = ev.ExecutionFailure("uncategorized", f"invalid {what}", str(e))
            return on_temporary_failure(s, now, failure.reason, str(e), failure)
    match outcome:
        case RunOk(value=value):
            return ev.Finished(ev.ResultOk(value))
        case RunErr(value=value, permanent=True):
            return ev.Finished(ev.ResultErr(value))
        case RunErr(value=value):
            return on_temporary_failure(
                s, now, "returned err", json.dumps(value), ev.ResultErr(value)
            )
        case RunTrap(reason=reason, detail=detail):
            return on_temporary_failure(
                s, now, reason, detail, ev.ExecutionFailure("uncategorized", reason, detail)
            )
        case RunTimedOut():
            return on_temporary_failure(
                s,
                now,
                "timed out",
                "",
                ev.ExecutionFailure("timed_out", "activity timed out"),
                timed_out=True,
            )
        case RunCancelled():
            return ev.Finished(ev.ExecutionFailure("cancelled", "cancellation requested"))
    raise AssertionError(outcome)


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
        self._inflight: dict[str, tuple[asyncio.Future[None] | Future[None], threading.Event]] = {}
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
                    f if isinstance(f, asyncio.Future) else asyncio.wrap_future(f)
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


class _DirectLock:
    """A slot of an activity executor promised to an execution being created (see
    `engine.storage.contract.DirectLock`)."""

    __slots__ = ("_executor", "_settled", "locked")

    def __init__(self, executor: ActivityExecutor, locked: ev.Locked) -> None:
        self._executor = executor
        self.locked = locked
        self._settled = threading.Lock()  # held once taken or released

    def taken(self, execution: LockedExecution | None) -> None:
        if self._settled.acquire(blocking=False):
            self._executor._direct_taken(execution)

    def release(self) -> None:
        if self._settled.acquire(blocking=False):
            self._executor._direct_release()


class ActivityExecutor(BaseExecutor):
    """Runs the activities of one component."""

    threads: RunPool

    def reserve(self, now: datetime) -> DirectLock | None:
        """A direct lock for an execution of this component about to be created at
        `now` (any thread), or None. Only while the executor waits with nothing due, so
        that nothing older is passed over (SPEC §4.2), and within `exec.max_inflight`."""
        cfg = self.component.config.exec
        with self._reserve_lock:
            if (
                self._stopping
                or not self._idle
                or len(self._inflight) + self._reserved >= cfg.max_inflight
            ):
                return None
            self._reserved += 1
        locked = ev.Locked(
            self.component.component_id,
            self.executor_id,
            new_run_id(),
            now + timedelta(milliseconds=cfg.lock_expiry_ms),
            self.retry,
        )
        return _DirectLock(self, locked)

    def _direct_taken(self, execution: LockedExecution | None) -> None:
        """Once the creation is written, on any thread (SQLite: its writer's)."""
        with self._reserve_lock:
            self._reserved -= 1
        if execution is None:
            self._slot_freed_threadsafe()
        elif self._stopping:
            # Locked while shutting down: let go of it as any run would.
            loop = self._loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._release_closing, execution)
        else:
            self._spawn(execution)

    def _release_closing(self, execution: LockedExecution) -> None:
        now = self.clock.now()
        task = asyncio.create_task(
            self.storage.append(
                execution.execution_id,
                execution.next_version,
                [ev.Unlocked(now, "executor closing")],
                now,
            )
        )
        task.add_done_callback(_ignore_outcome)

    def _direct_release(self) -> None:
        """The creating transaction failed (any thread)."""
        with self._reserve_lock:
            self._reserved -= 1
        self._slot_freed_threadsafe()

    # -- runs: on worker threads, start to outcome, without the event loop ------------
    def _spawn(self, locked: LockedExecution) -> None:
        """Run `locked` on a worker thread (any thread may call this): the outcome goes
        to the storage from there, and the storage's callback ends the run, so that a
        run costs the loop nothing (no task, no future to resolve, no wake-up)."""
        done: Future[None] = Future()
        cancel = _RunCancel(locked, lambda: self._finish_if_still_running(locked, done))
        self._inflight[locked.execution_id] = (done, cancel)
        self.storage.subscribe_cancellations().add(locked.execution_id, cancel.requested)
        try:
            # No future: the run reports on its own.
            self.threads.run_detached(functools.partial(self._run_in_thread, locked, cancel, done))
        except RuntimeError:  # the pool was shut down: the lock expires
            self._run_ended(locked, done, cancel)

    def _run_in_thread(
        self, locked: LockedExecution, cancel: threading.Event, done: Future[None]
    ) -> None:
        try:
            info = self.component.functions[locked.ffqn]
            lines: list[LogLine] = []
            remaining = (locked.lock_expires_at - self.clock.now()).total_seconds()
            deadline = time.monotonic() + max(0.0, remaining)
            clock = self.clock

            def sink(line: LogLine) -> None:  # stamped as emitted (a run may be long)
                lines.append(dataclasses.replace(line, at=clock.now()))

            run = self._runner_call(locked, deadline, cancel, sink)
            ok_type = _ok_type(info.return_type)
            err_type = _err_type(info.return_type)
            extras = AppendExtras(logs=lines, run_id=locked.run_id)
            outcome = run()
            now = self.clock.now()
            if self._stopping and not isinstance(outcome, RunOk | RunErr):
                # Interrupted by shutdown, not by the activity: release without a retry.
                event: ev.Event = ev.Unlocked(now, "executor closing")
            else:
                event = outcome_to_event(locked, outcome, now, ok_type, err_type)
        except Exception:
            log.exception("executor %s: run of %s failed", self.name, locked.execution_id)
            self._run_ended(locked, done, cancel)
            return

        def appended(ok: bool, value: Any) -> None:
            if ok:
                self._run_ended(locked, done, cancel)
            elif isinstance(value, Conflict | NotFound) and self._loop is not None:
                try:
                    handled = asyncio.run_coroutine_threadsafe(
                        self._append_failed(locked, event, extras, now, value), self._loop
                    )
                except RuntimeError:  # a closed loop
                    self._run_ended(locked, done, cancel)
                else:
                    handled.add_done_callback(lambda _f: self._run_ended(locked, done, cancel))
            else:
                log.error(
                    "executor %s: outcome of %s not written: %s",
                    self.name,
                    locked.execution_id,
                    value,
                )
                self._run_ended(locked, done, cancel)

        self.storage.append_then(
            locked.execution_id, locked.next_version, [event], now, extras, appended
        )

    def _run_ended(
        self, locked: LockedExecution, done: Future[None], cancel: threading.Event
    ) -> None:
        """Any thread. Only this run's entries go: a retry may be running already."""
        execution_id = locked.execution_id
        listener = cancel.requested if isinstance(cancel, _RunCancel) else cancel.set
        self.storage.subscribe_cancellations().remove(execution_id, listener)
        entry = self._inflight.get(execution_id)
        if entry is not None and entry[0] is done:
            self._inflight.pop(execution_id, None)
        if not done.done():
            done.set_result(None)
        self._slot_freed_threadsafe()

    def _runner_call(
        self,
        locked: LockedExecution,
        deadline: float,
        cancel: threading.Event,
        sink: Callable[[LogLine], None],
    ) -> Callable[[], RunOutcome]:
        cfg = self.component.config
        runner = self.component.activity_runner
        ctx = RunContext(deadline, cancel, sink, cfg.env_vars, cfg.allowed_hosts)
        return lambda: runner.run(locked.ffqn, locked.params, ctx)

    async def _append_failed(
        self,
        locked: LockedExecution,
        event: ev.Event,
        extras: AppendExtras,
        now: datetime,
        e: Conflict | NotFound,
    ) -> None:
        if isinstance(e, Conflict) and await self._append_after_cancellation(
            locked, event, extras, now
        ):
            return
        # Someone else moved it on (the watcher after a lock expiry, a cancellation).
        log.info(
            "executor %s: dropped outcome of %s: %s",
            self.component.config.name,
            locked.execution_id,
            e,
        )
        if extras.logs:
            await self.storage.append_logs(
                locked.execution_id, locked.run_id, extras.logs, self.clock.now()
            )

    async def _leave_behind(self) -> None:
        """Stopping, and activity runs blocked in a host call (a WASI sleep) did not end
        within `STOP_GRACE_SECONDS`: release their executions (`unlocked("executor
        closing")`, so that another run can take them) and stop without them; an
        outcome they write later is dropped."""
        for execution_id, (f, cancel) in list(self._inflight.items()):
            if f.done() or not isinstance(cancel, _RunCancel):
                continue
            locked = cancel.locked
            log.warning(
                "executor %s: stopping without the run of %s, blocked in a host call",
                self.name,
                execution_id,
            )
            del self._inflight[execution_id]
            now = self.clock.now()
            with contextlib.suppress(StorageError):
                await self._append_if_held(locked, ev.Unlocked(now, "executor closing"), now)

    def _finish_if_still_running(self, locked: LockedExecution, done: Future[None]) -> None:
        """On the loop, when the cancellation of a running execution was requested: the
        run is interrupted, but one blocked in a host call (a WASI sleep, a socket read)
        notices only when the call returns. If it has not ended after
        `CANCEL_GRACE_SECONDS`, the execution is finished `cancelled` without it (its
        outcome, if it ever comes, is dropped)."""

        async def later() -> None:
            await self.clock.sleep(CANCEL_GRACE_SECONDS)
            if done.done():
                return
            now = self.clock.now()
            event = ev.Finished(ev.ExecutionFailure("cancelled", "cancellation requested"))
            extras = AppendExtras(run_id=locked.run_id)
            if await self._append_after_cancellation(locked, event, extras, now):
                log.info(
                    "executor %s: %s finished cancelled; its run is still blocked in a host call",
                    self.name,
                    locked.execution_id,
                )

        task = asyncio.get_running_loop().create_task(later())
        self._grace_tasks.add(task)
        task.add_done_callback(self._grace_tasks.discard)
        task.add_done_callback(_ignore_outcome)

    async def _append_after_cancellation(
        self, locked: LockedExecution, event: ev.Event, extras: AppendExtras, now: datetime
    ) -> bool:
        """A cancellation requested during the run appended `cancellation_requested` while
        the execution stays locked by this run: finish it after that event (SPEC §8) with
        the run's final result, or `cancelled` if the run would have been retried."""
        if not isinstance(event, ev.Finished):
            event = ev.Finished(ev.ExecutionFailure("cancelled", "cancellation requested"))
        return await self._append_if_held(locked, event, now, extras, cancelling=True)


#: A cancelled activity run that has not ended this long after the request (blocked in a
#: host call) is left behind: its execution is finished `cancelled` without it.
CANCEL_GRACE_SECONDS = 1.0
#: How long stopping waits for interrupted runs before it leaves the stuck ones behind.
STOP_GRACE_SECONDS = 2.0


class _RunCancel(threading.Event):
    """The interrupt flag of one activity run. `requested` (the cancellation listener,
    called on the loop) sets it and starts the grace period."""

    def __init__(self, locked: LockedExecution, on_request: Callable[[], None]) -> None:
        super().__init__()
        self.locked = locked
        self._on_request = on_request

    def requested(self) -> None:
        self.set()
        self._on_request()


def _ignore_outcome(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: a conflict here changes nothing


def _ok_type(return_type: Any) -> Any:
    """The `ok` payload type of a `result<T, E>` return type, when the model exposes it."""
    return getattr(return_type, "ok", None)


def _err_type(return_type: Any) -> Any:
    """The `err` payload type of a `result<T, E>` return type (None for `result<T>`)."""
    return getattr(return_type, "err", None)


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
