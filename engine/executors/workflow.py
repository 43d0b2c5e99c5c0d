"""The workflow executor: lock, replay the function against its log, write the outcome.

A run happens on a worker thread: the runtime executes the guest, which calls the
`ReplayHost`; the host answers from history or writes new events through the event loop.
When the function returns or traps, its open join sets are closed (SPEC §7.3) and
`finished` is written. Nondeterminism finishes the execution; being unloaded (strategy
`interrupt`, or `await` past the lock expiry) writes nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, cast

from engine.components import Registry
from engine.core import events as ev
from engine.core.state import on_temporary_failure
from engine.executors.base import BaseExecutor, err_payload_type, ok_payload_type
from engine.executors.replay_host import ReplayHost
from engine.executors.upgrade import check_upgrade, dry_run_host, history_writers
from engine.runtimes.workflow_host import RunAborted
from engine.storage.contract import (
    Conflict,
    DirectLock,
    LockedExecution,
    Storage,
)
from engine.wit.codec import WitValueError, validate_json

log = logging.getLogger("obelisk.workflow")


class WorkflowExecutor(BaseExecutor):
    """Runs the workflows of one `workflow_js` / `workflow_wasm` component."""

    with_log = True

    def __init__(
        self,
        *args: Any,
        registry: Registry,
        deployment_id: str,
        direct_locks: Callable[[str, datetime], DirectLock | None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.registry = registry
        self.deployment_id = deployment_id
        #: Children locked as they are created by an activity executor of this process.
        self.direct_locks = direct_locks
        self.retry = ev.RetryConfig(None, self.component.config.retry_exp_backoff_ms)
        self._on_stop: dict[str, Any] = {}
        #: Called (from a worker thread, with the engine's loop) after a run pinned an
        #: execution to the version that wrote it (`ReloadManager.revive_soon`).
        self.on_pinned: Callable[[asyncio.AbstractEventLoop], None] | None = None

    async def stop(self) -> None:
        self._stopping = True
        for callback in list(self._on_stop.values()):
            callback()
        await super().stop()

    async def _run_one(self, locked: LockedExecution, cancel: threading.Event) -> None:
        cfg = self.component.config
        host = ReplayHost(
            locked=locked,
            storage=self.storage,
            registry=self.registry,
            clock=self.clock,
            loop=asyncio.get_running_loop(),
            component_id=self.component.component_id,
            executor_id=self.executor_id,
            deployment_id=self.deployment_id,
            lock_expiry=timedelta(milliseconds=cfg.exec.lock_expiry_ms),
            strategy=cfg.blocking_strategy,
            direct_locks=self.direct_locks,
        )
        host.retry_config = self.retry
        runner = self.component.workflow_runner

        def on_cancel() -> None:
            # Cancellation, pause or shutdown: the run must let go of the execution.
            host.interrupt("closing" if self._stopping else "released")
            runner.interrupt(locked.execution_id)

        self.storage.subscribe_cancellations().add(locked.execution_id, on_cancel)
        self._on_stop[locked.execution_id] = on_cancel
        if cancel.is_set():
            on_cancel()
        try:
            await asyncio.get_running_loop().run_in_executor(
                self.threads, lambda: self._drive(host, locked)
            )
        finally:
            self._on_stop.pop(locked.execution_id, None)
            host.close()
        if self._stopping and host.aborted is not None and host.aborted.kind == "closing":
            with contextlib.suppress(Conflict):
                await self.storage.append(
                    locked.execution_id,
                    host.version,
                    [ev.Unlocked(self.clock.now(), "executor closing")],
                    self.clock.now(),
                )
        elif host.aborted is not None:
            await self._release_if_cancelling(locked)

    async def _release_if_cancelling(self, locked: LockedExecution) -> None:
        """A run stopped by a cancellation still holds the lock: release it at once, so
        that the cancellation driver tears the workflow down (SPEC §8) without waiting
        for the lock to expire."""
        now = self.clock.now()
        await self._append_if_held(locked, ev.Unlocked(now, "cancelled"), now, cancelling=True)

    def _drive(self, host: ReplayHost, locked: LockedExecution) -> None:
        """On the worker thread: run the guest, close join sets, write the outcome."""
        runner = self.component.workflow_runner
        # A guest computing without host calls for as long as a lock lasts is stopped
        # (SPEC §6.2): host calls extend the lock, spinning does not.
        spin_timeout = self.component.config.exec.lock_expiry_ms / 1000
        try:
            if self._runs_on_this_version(host, locked):
                outcome = runner.run(host, locked.params, spin_timeout=spin_timeout)
                self._finish(host, locked, outcome, spin_timeout)
        finally:
            # Writes may have been answered before they were durable: the run is over
            # once they are (or are known lost: a later run replays).
            host.wait_durable()

    def _runs_on_this_version(self, host: ReplayHost, locked: LockedExecution) -> bool:
        """May this version run the execution? Yes when it wrote the history (or there is
        none). History written by another version — the file was edited while the engine
        was stopped, or an upgrade check never ran — is first replayed against this code
        (SPEC §9.3, as on a reload): compatible → `component_upgrade_finished{success}`
        and the run goes on; incompatible → `…{failed}`, the execution is pinned to the
        version that wrote it and released, and an executor of that version is asked
        for (`on_pinned`)."""
        digest = self.component.component_id.digest
        writers = history_writers(locked.events or [])
        writer = writers[-1] if writers else None
        if writer is None or writer == digest:
            return True
        dry = dry_run_host(
            locked, self.storage, self.registry, self.clock, host.loop, self.component
        )
        ok, reason = check_upgrade(self.component, dry, locked.params)
        if host.aborted is not None:
            return False  # paused, cancelled or stopping meanwhile: decide nothing now
        outcome: ev.UpgradeSuccess | ev.UpgradeFailed = (
            ev.UpgradeSuccess() if ok else ev.UpgradeFailed(reason)
        )
        event = ev.ComponentUpgradeFinished(digest, self.deployment_id, outcome)
        if ok:
            if digest in writers:
                # Back to a version it was upgraded away from: with several engines on
                # one database, most likely because this one has not reloaded yet.
                log.warning(
                    "workflow %s: moved back from %s to %s, which it was upgraded from; "
                    "another engine sharing the database may run a newer version of it",
                    locked.execution_id,
                    writer,
                    digest,
                )
            else:
                log.info("workflow %s: upgraded from %s to %s", locked.execution_id, writer, digest)
            try:
                host.flush([event])
            except RunAborted:
                return False
            return True
        log.warning(
            "workflow %s: its history, written by version %s, cannot continue on %s (%s); "
            "it stays on %s",
            locked.execution_id,
            writer,
            digest,
            reason,
            writer,
        )
        now = self.clock.now()
        try:
            s = host._sync(
                self.storage.append_upgrade_finished(
                    locked.execution_id, host.version, event, writer, now
                )
            )
            host._sync(
                self.storage.append(
                    locked.execution_id,
                    s.next_version,
                    [ev.Unlocked(now, f"pinned to version {writer}")],
                    now,
                )
            )
        except (Conflict, RunAborted) as e:
            log.info("workflow %s: could not pin it: %s", locked.execution_id, e)
            return False
        if self.on_pinned is not None:
            self.on_pinned(host.loop)
        return False

    def _finish(
        self, host: ReplayHost, locked: LockedExecution, outcome: Any, spin_timeout: float
    ) -> None:
        from engine.runtimes.outcome import WfAborted, WfErr, WfOk, WfTimedOut, WfTrap

        try:
            if host.aborted is not None or isinstance(outcome, WfAborted):
                self._finish_aborted(host)
                return
            if isinstance(outcome, WfTimedOut):
                # A timeout, not a result: retried (workflows forever, SPEC §5.2) by a new
                # run that replays; the join sets stay open for it.
                now = self.clock.now()
                reason = f"computed for {spin_timeout:g} s without a host call"
                host.flush(
                    [
                        on_temporary_failure(
                            locked.summary,
                            now,
                            "timed out",
                            reason,
                            ev.ExecutionFailure("timed_out", reason),
                            timed_out=True,
                        )
                    ]
                )
                return
            # A child never outlives its parent: close what is still open (SPEC §7.3).
            leftover = host.close_on_return()
            if leftover is not None:
                host.failure = ev.ExecutionFailure(
                    "nondeterminism_detected", "nondeterminism detected", leftover
                )
                self._finish_aborted(host)
                return
            result: ev.ExecutionResult
            match outcome:
                case WfOk(value=value):
                    result = self._checked(locked.ffqn, value, err=False)
                case WfErr(value=value):
                    result = self._checked(locked.ffqn, value, err=True)
                case WfTrap(reason=reason, detail=detail):
                    result = ev.ExecutionFailure("uncategorized", reason, detail)
                case _:
                    result = ev.ExecutionFailure("uncategorized", f"unexpected outcome {outcome!r}")
            host.flush([ev.Finished(result)])
        except RunAborted:
            self._finish_aborted(host)

    def _checked(self, ffqn: str, value: Any, *, err: bool) -> ev.ExecutionResult:
        """The returned (`ok`) or thrown (`err`) value, if it has the declared type."""
        return_type = self.component.functions[ffqn].return_type
        wit_type = (err_payload_type if err else ok_payload_type)(return_type)
        make = ev.ResultErr if err else ev.ResultOk
        if wit_type is None:
            return make(value)
        what = "error value" if err else "return value"
        try:
            return make(validate_json(value, wit_type, what))
        except WitValueError as e:
            return ev.ExecutionFailure("uncategorized", f"invalid {what}", str(e))

    def _finish_aborted(self, host: ReplayHost) -> None:
        """Finish with `host.failure` (nondeterminism, a constraint violation), after
        closing the join sets the log has; nothing to write for a run that was only
        stopped (unloaded, lock lost, released)."""
        failure = host.failure
        if failure is None:
            return
        try:
            host.close_from_log()
            # The guest's logs up to the failure are kept (they tell what it did).
            host.flush([ev.Finished(failure)])
        except RunAborted as e:
            # Waiting for children that are awaited (`interrupt`: unloaded; `await`: the
            # lock ran out), interrupted, or the lock is gone: a later run fails the
            # same way and carries on from the log.
            log.info("workflow %s: %s not recorded yet: %s", host.execution_id, failure.kind, e)


class _PinnedLocking:
    """The storage, except that `lock_pending` only takes executions pinned to one digest."""

    def __init__(self, storage: Storage, digest: str) -> None:
        self._storage = storage
        self._digest = digest

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)

    async def lock_pending(self, **kwargs: Any) -> list[LockedExecution]:
        kwargs["pinned_digest"] = self._digest
        return await self._storage.lock_pending(**kwargs)


class PinnedWorkflowExecutor(WorkflowExecutor):
    """Runs an old version of a workflow component for the executions whose upgrade to
    the deployed version failed (they are pinned to this digest)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pinned_digest = self.component.component_id.digest
        self.storage = cast(Storage, _PinnedLocking(self.storage, self.pinned_digest))

    @property
    def name(self) -> str:
        return f"{self.component.config.name}@{self.pinned_digest[:15]}"
