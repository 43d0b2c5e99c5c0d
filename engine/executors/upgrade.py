"""Workflow upgrades (SPEC §9.3): may a running execution continue on a new version?

When a deployment reload changes the code of a workflow component, every execution of
it that has not finished is checked by replaying its log against the new code in a
*dry run*: a `DryRunHost` answers the guest from the recorded history exactly like a
real run, but never writes anything. The first call past the end of the history (or a
wait for a response that has not arrived yet) means the new code reproduced everything
the old one recorded: the upgrade is compatible. A mismatch, or history left over when
the function returns, means it is not.

The outcome is recorded as `component_upgrade_finished{digest, deployment_id, outcome}`.
A compatible execution continues on the new code. An incompatible one is *pinned* (in
the same transaction) to the component digest it was running on: executors of the
current deployment never lock pinned executions; a `PinnedWorkflowExecutor`, kept alive
with the old version's component, runs them to the end (see `engine.reload`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Literal, TypeVar

import msgspec

from engine.components import LoadedComponent, Registry, validate_params
from engine.core import events as ev
from engine.core.clock import Clock
from engine.core.ids import new_run_id
from engine.errors import InvalidParams
from engine.executors.replay_host import ReplayHost
from engine.runtimes.workflow_host import RunAborted
from engine.storage.contract import (
    Conflict,
    LockedExecution,
    NotFound,
    Storage,
    UnfinishedExecution,
    VersionConflict,
)

log = logging.getLogger("obelisk.upgrade")
T = TypeVar("T")

#: A dry run may compute this long without a host call before it is given up.
CHECK_SPIN_TIMEOUT = 5.0
#: How many dry runs of one reload run at once (each holds a worker thread).
CHECK_CONCURRENCY = 8


class UpgradeResult(msgspec.Struct, frozen=True):
    """What one execution's upgrade check decided (reload status, API, console)."""

    execution_id: str
    ffqn: str
    #: The component digest it was running on before (None if unknown).
    from_digest: str | None
    to_digest: str
    outcome: Literal["success", "failed"]
    reason: str = ""
    #: After a failure: the digest it stays on (the version that keeps running it).
    pinned_digest: str | None = None


class DryRunHost(ReplayHost):
    """A `ReplayHost` that matches history and stops, writing nothing, where a real run
    would start writing: `aborted.kind` is then "compatible". Nondeterminism sets
    `failure` as usual."""

    COMPATIBLE = "compatible"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: Which export a multi-function (WASM) component runs.
        self.ffqn: str = kwargs["locked"].ffqn

    def _next_recorded(self) -> tuple[int, ev.HistoryEventKind] | None:
        if self.cursor >= len(self.history):
            raise self._abort(self.COMPATIBLE, "the new code reached the end of the history")
        return super()._next_recorded()

    def _sync(self, coro: Coroutine[Any, Any, T], *args: Any, **kwargs: Any) -> T:
        # Only a run past the end of its history talks to the storage.
        coro.close()
        raise self._abort(self.COMPATIBLE, "the new code went past the end of the history")

    _wait = _sync  # waiting for responses: only past the end of the history too

    def _fetch_responses(self, timeout: float) -> None:
        raise self._abort(self.COMPATIBLE, "the new code went past the end of the history")

    def flush(self, extra: list[ev.Event] | None = None, *args: Any, **kwargs: Any) -> Any:
        if self._buffer or extra:
            raise self._abort(self.COMPATIBLE, "the new code writes new history")
        return None

    def _wait_response(self, join_set_id: str, *, blocked: bool) -> ev.StoredResponse:
        stored = self._take_response(join_set_id)
        if stored is not None:
            return stored
        if self.replaying:
            version, got = self.history[self.cursor]
            raise self._nondeterminism(
                f"the code waits in {join_set_id} for a response that has not arrived, but "
                f"the log continues at version {version} with {got.__struct_config__.tag}"
            )
        # Blocked where the old code was blocked: everything recorded was reproduced.
        raise self._abort(self.COMPATIBLE, f"waits for a response in {join_set_id}")

    def _constraint_violation(self, detail: str) -> Exception:
        if not self.replaying:
            # Past the history: the new code's own doing, on its own run (SPEC §9.3
            # fails an upgrade for nondeterminism only).
            return self._abort(self.COMPATIBLE, "the new code went past the end of the history")
        return super()._constraint_violation(detail)

    def _cancel_member(self, member: str, js: Any) -> None:
        raise self._abort(self.COMPATIBLE, "the new code closes a join set past the history")

    def log(self, level: str, message: str) -> None:
        """A dry run stores no logs (and must not read the stored ones: a read is what
        only a run past its history does)."""


def check_compatible(runner: Any, host: DryRunHost, params: list[Any]) -> tuple[bool, str]:
    """On a worker thread: replay against the new code. (compatible, reason if not)."""
    from engine.runtimes.outcome import WfAborted, WfTimedOut

    try:
        outcome = runner.run(host, params, spin_timeout=CHECK_SPIN_TIMEOUT)
        if host.aborted is None and isinstance(outcome, WfTimedOut):
            return False, (
                f"the new code computed for more than {CHECK_SPIN_TIMEOUT:g} s without a "
                "host call while replaying"
            )
        if host.aborted is None and isinstance(outcome, WfAborted):
            return False, "the replay was interrupted"
        if host.aborted is None:
            # It returned (or threw): closed as a run closes (may match history).
            leftover = host.close_on_return()
            if leftover is not None:
                return False, leftover
    except RunAborted:
        pass
    except Exception as e:  # a bug in a runtime or host: do not move the execution
        log.exception("upgrade check of %s failed", host.execution_id)
        return False, f"the replay failed: {e!r}"
    if host.aborted is not None:
        if host.aborted.kind == DryRunHost.COMPATIBLE:
            return True, ""
        if host.failure is not None:
            failure = host.failure
            if failure.kind == "nondeterminism_detected":
                return False, failure.detail or failure.reason
            return False, failure.reason  # "constraint violation: …"
        return False, f"the replay stopped: {host.aborted.kind} {host.aborted.detail}".strip()
    return True, ""  # it returned where its history ends, and closed as it was logged


def params_mismatch(target: LoadedComponent, ffqn: str, params: list[Any]) -> str | None:
    """Why the execution's stored params do not fit the new version's declared param
    types (None: they fit): a changed signature is an incompatible upgrade even when
    the code would replay."""
    info = target.functions.get(ffqn)
    if info is None:
        return f"the new version does not export {ffqn}"
    try:
        validate_params(info, params)
    except InvalidParams as e:
        return f"its params do not fit the new version's types: {e}"
    return None


def check_upgrade(target: LoadedComponent, host: DryRunHost, params: list[Any]) -> tuple[bool, str]:
    """On a worker thread: may the execution `host` replays continue on `target`? Its
    params must fit the declared types, and the code must reproduce its history.
    (compatible, reason if not)."""
    mismatch = params_mismatch(target, host.ffqn, params)
    if mismatch is not None:
        return False, mismatch
    return check_compatible(target.runner, host, params)


def dry_run_host(
    locked: LockedExecution,
    storage: Storage,
    registry: Registry,
    clock: Clock,
    loop: asyncio.AbstractEventLoop,
    target: LoadedComponent,
) -> DryRunHost:
    """A dry run of `locked` (its log and responses) against `target`."""
    return DryRunHost(
        locked=locked,
        storage=storage,
        registry=registry,
        clock=clock,
        loop=loop,
        component_id=target.component_id,
        executor_id="Exr_upgrade-check",
        deployment_id="",
        lock_expiry=timedelta(milliseconds=target.config.exec.lock_expiry_ms),
        strategy="await",
    )


def running_digest(events: Iterable[ev.StoredEvent]) -> str | None:
    """The component digest an execution ran on last, according to its log: its
    `created` or latest `locked`, or the target of a later successful upgrade."""
    digest: str | None = None
    for stored in events:
        match stored.event:
            case ev.Created(component_id=c) | ev.Locked(component_id=c):
                digest = c.digest
            case ev.ComponentUpgradeFinished(digest=d, outcome=ev.UpgradeSuccess()):
                digest = d
            case _:
                pass
    return digest


def history_writers(events: Iterable[ev.StoredEvent]) -> list[str]:
    """The component digests that wrote the execution's history, oldest first (each
    once per stretch): the one in force (its `created` or latest `locked`) at each
    history event, and the target of each successful upgrade. A `locked` by another
    version that wrote nothing does not count."""
    in_force: str | None = None
    writers: list[str] = []

    def wrote(digest: str | None) -> None:
        if digest is not None and (not writers or writers[-1] != digest):
            writers.append(digest)

    for stored in events:
        match stored.event:
            case ev.HistoryEvent():
                wrote(in_force)
            case ev.Created(component_id=c) | ev.Locked(component_id=c):
                in_force = c.digest
            case ev.ComponentUpgradeFinished(digest=d, outcome=ev.UpgradeSuccess()):
                in_force = d
                wrote(d)
            case _:
                pass
    return writers


def history_digest(events: Iterable[ev.StoredEvent]) -> str | None:
    """The digest that wrote the execution's history last (`history_writers`); None
    while it has no history (any version may start it)."""
    writers = history_writers(events)
    return writers[-1] if writers else None


def _last_upgrade(events: list[ev.StoredEvent]) -> ev.ComponentUpgradeFinished | None:
    for stored in reversed(events):
        if isinstance(stored.event, ev.ComponentUpgradeFinished):
            return stored.event
    return None


class Upgrader:
    """Checks executions against a new version and records the outcome."""

    def __init__(self, storage: Storage, clock: Clock, threads: ThreadPoolExecutor) -> None:
        self.storage = storage
        self.clock = clock
        self.threads = threads
        self._limit = asyncio.Semaphore(CHECK_CONCURRENCY)

    async def upgrade(
        self,
        execution: UnfinishedExecution,
        target: LoadedComponent,
        registry: Registry,
        deployment_id: str,
        previous_digest: str | None,
    ) -> UpgradeResult | None:
        """Move one execution to `target` (of the new `registry`) or pin it.

        `previous_digest` is the version that ran it until now when it is not pinned
        (None: take it from the log). None is returned when there is nothing to do:
        finished or cancelling meanwhile, already on that version, or already known to
        be incompatible with it."""
        async with self._limit:
            for _ in range(5):
                try:
                    return await self._upgrade_once(
                        execution, target, registry, deployment_id, previous_digest
                    )
                except VersionConflict:
                    continue  # it moved on while we replayed: check again
                except NotFound:
                    return None
            log.warning("upgrade of %s: the execution keeps changing", execution.execution_id)
            return None

    async def _upgrade_once(
        self,
        execution: UnfinishedExecution,
        target: LoadedComponent,
        registry: Registry,
        deployment_id: str,
        previous_digest: str | None,
    ) -> UpgradeResult | None:
        eid = execution.execution_id
        summary = await self.storage.get_summary(eid)
        events = await self.storage.get_events(eid)
        if summary.is_finished or summary.cancelling or not events:
            return None  # a cancelling workflow runs no guest code any more (SPEC §8)
        version = events[-1].version + 1
        digest = target.component_id.digest
        pinned = execution.pinned_digest
        ran_on = running_digest(events)
        if pinned is None and ran_on == digest:
            return None  # created by, or already upgraded to, this version
        current = pinned or previous_digest or ran_on
        last = _last_upgrade(events)
        if (
            last is not None
            and last.digest == digest
            and isinstance(last.outcome, ev.UpgradeFailed)
        ):
            # Already found incompatible with this very version (and pinned with it):
            # by an earlier reload, or by another engine while this one checked.
            return None
        if current == digest:
            if pinned is None:
                return None
            ok, reason = True, ""  # the version it is pinned to is the deployed one again
        else:
            created = events[0].event
            assert isinstance(created, ev.Created)
            responses = await self.storage.get_responses(eid)
            host = self._dry_run_host(eid, events, responses, summary, target, registry)
            loop = asyncio.get_running_loop()
            ok, reason = await loop.run_in_executor(
                self.threads, check_upgrade, target, host, created.params
            )
        event = ev.ComponentUpgradeFinished(
            digest, deployment_id, ev.UpgradeSuccess() if ok else ev.UpgradeFailed(reason)
        )
        pin = None if ok else current
        try:
            await self.storage.append_upgrade_finished(eid, version, event, pin, self.clock.now())
        except VersionConflict:
            raise
        except Conflict:
            return None  # finished meanwhile
        return UpgradeResult(
            eid, execution.ffqn, current, digest, "success" if ok else "failed", reason, pin
        )

    def _dry_run_host(
        self,
        eid: str,
        events: list[ev.StoredEvent],
        responses: list[ev.StoredResponse],
        summary: Any,
        target: LoadedComponent,
        registry: Registry,
    ) -> DryRunHost:
        created = events[0].event
        assert isinstance(created, ev.Created)
        now = self.clock.now()
        expires = now + timedelta(hours=1)  # never reached: nothing is locked or written
        locked = LockedExecution(
            execution_id=eid,
            ffqn=created.ffqn,
            params=created.params,
            next_version=events[-1].version + 1,
            run_id=new_run_id(),
            lock_expires_at=expires,
            parent=created.parent,
            summary=summary,
            events=events,
            responses=responses,
        )
        return dry_run_host(
            locked, self.storage, registry, self.clock, asyncio.get_running_loop(), target
        )


__all__ = [
    "DryRunHost",
    "UpgradeResult",
    "Upgrader",
    "check_compatible",
    "check_upgrade",
    "dry_run_host",
    "history_digest",
    "history_writers",
    "params_mismatch",
    "running_digest",
]
