"""The executor of activities (SPEC §6.1): each locked execution runs on a worker thread
through its component's `ActivityRunner` (runners are synchronous; the GIL is released
while WASM runs), and the outcome becomes an append with the retry rules of
`engine.core.state`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from engine.core import events as ev
from engine.core.ids import new_run_id
from engine.core.state import (
    on_temporary_failure,
)
from engine.executors.base import (
    BaseExecutor,
    RunEnded,
    err_payload_type,
    ignore_outcome,
    ok_payload_type,
)
from engine.executors.pool import RunPool
from engine.runtimes.api import RunContext
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
    LockedExecution,
    NotFound,
    StorageError,
)
from engine.wit.codec import WitValueError, validate_json

log = logging.getLogger("obelisk.executor")

#: How long a cancelled run may take to notice before its execution is finished without it.
CANCEL_GRACE_SECONDS = 1.0


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
        task.add_done_callback(ignore_outcome)

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
        done = RunEnded()
        cancel = _RunCancel(locked, lambda: self._finish_if_still_running(locked, done))
        self._inflight[locked.execution_id] = (done, cancel)
        self.storage.subscribe_cancellations().add(locked.execution_id, cancel.requested)
        try:
            # No future: the run reports on its own.
            self.threads.run_detached(functools.partial(self._run_in_thread, locked, cancel, done))
        except RuntimeError:  # the pool was shut down: the lock expires
            self._run_ended(locked, done, cancel)

    def _run_in_thread(
        self, locked: LockedExecution, cancel: threading.Event, done: RunEnded
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
            ok_type = ok_payload_type(info.return_type)
            err_type = err_payload_type(info.return_type)
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

    def _run_ended(self, locked: LockedExecution, done: RunEnded, cancel: threading.Event) -> None:
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

    def _finish_if_still_running(self, locked: LockedExecution, done: RunEnded) -> None:
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
        task.add_done_callback(ignore_outcome)

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
