"""Hot reload of the deployment and its component files, and workflow upgrades (SPEC §9.3).

`ReloadManager` (one per engine, `engine.reloader`) watches the deployment TOML and every
component file it names (`watchfiles`, in their directories, so that editors replacing a
file are seen too). On a change it re-reads the TOML and builds a new registry; the
components whose file, digest and settings did not change are reused as they are (not
recompiled, their executors keep running). Anything wrong — a malformed TOML, a missing
file, a component that does not compile, a JS module that does not load, two components
exporting one FFQN — leaves the previous registry and executors in force; the error is
logged and reported in the reload status. It never stops the engine.

A successful reload swaps the registry in the engine (new submissions use it), stops the
executors of removed and changed components (they release what they hold with
`unlocked("executor closing")`), checks every unfinished execution of a changed workflow
against its new code (`engine.executors.upgrade`), and then starts executors for the new
versions. Activities simply run the new code on their next attempt. Executions whose
upgrade failed are pinned to the version that wrote their history, and a
`PinnedWorkflowExecutor` of that old version runs them to the end; it is stopped once
none of its executions is left unfinished.

After a restart, versions that executions are pinned to are rebuilt from the stored
source or the compiled cache (`engine.old_versions`); a workflow file edited
while the engine was down is checked when its executions are next locked
(`WorkflowExecutor._runs_on_this_version`). Executions pinned to a version that cannot
be rebuilt, or of a workflow component removed from the deployment, wait (reported
under `pinned`) until a deployment brings that digest or that function back.
Engines sharing one database each watch and reload on their own; until all of them have
reloaded, one still running the old version checks an execution the new version wrote
when it locks it, the same way.

Clients are told about reloads through `ReloadManager.status()` (the last attempt: when,
ok or the error in full, component changes, upgrade outcomes) and `subscribe()` (every
later status, as an async iterator), exposed as `Engine.reload_status()` and
`Engine.reload_events()`, and as `GET /v1/deployment` in the REST API.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import watchfiles

from engine.components import (
    LoadedComponent,
    Registry,
    component_digest,
    index_registry,
    load_components,
)
from engine.core.ids import new_deployment_id
from engine.deployment import ComponentConfig, Deployment, load_deployment
from engine.errors import DeploymentError
from engine.executors.base import BaseExecutor
from engine.executors.upgrade import Upgrader, UpgradeResult
from engine.executors.workflow import WorkflowExecutor
from engine.runtimes.api import LoadContext
from engine.storage.contract import StorageError
from engine.views import UPGRADES_UNCHECKED

if TYPE_CHECKING:
    from engine.engine import Engine

log = logging.getLogger("obelisk.reload")

Trigger = Literal["start", "watch", "manual"]


# ---------------------------------------------------------------------------------------
# Status
# ---------------------------------------------------------------------------------------


class ComponentChange(msgspec.Struct, frozen=True):
    type: str
    name: str
    #: `reconfigured`: same code (digest), other settings in the TOML.
    change: Literal["added", "removed", "changed", "reconfigured"]
    old_digest: str | None = None
    new_digest: str | None = None


class PinnedVersion(msgspec.Struct, frozen=True):
    """An old component version that unfinished executions are pinned to."""

    digest: str
    executions: int
    #: Whether this process runs that version (else its executions wait).
    running: bool
    component: str | None = None


class OrphanedFunction(msgspec.Struct, frozen=True):
    """A function that no deployed component exports, with unfinished executions: they
    wait (pending, not run) until a deployment exports it again."""

    ffqn: str
    executions: int


class ReloadStatus(msgspec.Struct, frozen=True):
    """The outcome of the engine's start or of one reload attempt."""

    generation: int  # 0 at start, then one more per reload attempt
    at: datetime
    trigger: Trigger
    ok: bool
    #: The whole error when not ok; the previous deployment stays in force then.
    error: str | None
    #: The deployment in force after this attempt.
    deployment_id: str
    deployment_path: str
    changed_paths: list[str]
    changes: list[ComponentChange]
    upgrades: list[UpgradeResult]
    pinned: list[PinnedVersion]
    duration_ms: float
    #: Unfinished executions of functions the deployment in force does not export (at
    #: start: all of them; after a reload: of the functions it removed).
    orphaned: list[OrphanedFunction] = []

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = msgspec.to_builtins(self)
        return data


class ReloadSubscription:
    """Every reload status published after the subscription was made, in order.

    `async for status in engine.reload_events(): …`; `close()` (or `with`) to stop."""

    def __init__(self, manager: ReloadManager) -> None:
        self._manager = manager
        self._queue: asyncio.Queue[ReloadStatus | None] = asyncio.Queue()
        self._closed = False
        manager._subscribers.add(self)

    def _put(self, status: ReloadStatus | None) -> None:
        if not self._closed:
            self._queue.put_nowait(status)

    def __aiter__(self) -> ReloadSubscription:
        return self

    async def __anext__(self) -> ReloadStatus:
        if self._closed and self._queue.empty():
            raise StopAsyncIteration
        status = await self._queue.get()
        if status is None:
            self._closed = True
            raise StopAsyncIteration
        return status

    async def wait_for(
        self, predicate: Callable[[ReloadStatus], bool], timeout: float = 30.0
    ) -> ReloadStatus:
        """The next status satisfying `predicate` (TimeoutError after `timeout` s)."""
        async with asyncio.timeout(timeout):
            async for status in self:
                if predicate(status):
                    return status
        raise TimeoutError("the reload subscription was closed")

    def close(self) -> None:
        self._manager._subscribers.discard(self)
        self._put(None)

    def __enter__(self) -> ReloadSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------
# Building a registry, reusing what did not change
# ---------------------------------------------------------------------------------------


def _same_settings(a: ComponentConfig, b: ComponentConfig) -> bool:
    # `section` is only a label (it numbers the sections): moving one is no change.
    return dataclasses.replace(a, section="") == dataclasses.replace(b, section="")


async def build_registry(
    deployment: Deployment, wasm_engine: Any, cache_dir: Path, previous: Registry | None
) -> Registry:
    """Like `engine.components.load_registry`, with the same checks and errors, but a
    component of `previous` with the same type, name, digest and settings is reused as
    is (same object: not recompiled; its executor keeps running)."""
    old = {(c.config.type, c.config.name): c for c in (previous.components if previous else [])}
    configs = list(deployment.components)
    try:
        digests = await asyncio.gather(*(asyncio.to_thread(component_digest, c) for c in configs))
    except DeploymentError as e:
        raise DeploymentError(f"{deployment.path}: {e}") from None
    reused: dict[int, LoadedComponent] = {}
    for i, (config, digest) in enumerate(zip(configs, digests, strict=True)):
        prev = old.get((config.type, config.name))
        if (
            prev is not None
            and prev.component_id.digest == digest
            and _same_settings(prev.config, config)
        ):
            reused[i] = prev
    fresh = [c for i, c in enumerate(configs) if i not in reused]
    loaded = await load_components(deployment, fresh, LoadContext(wasm_engine, cache_dir))
    fresh_iter = iter(loaded)
    components = [reused[i] if i in reused else next(fresh_iter) for i in range(len(configs))]
    return await index_registry(deployment, components)


def diff_registries(old: Registry, new: Registry) -> list[ComponentChange]:
    before = {(c.config.type, c.config.name): c for c in old.components}
    after = {(c.config.type, c.config.name): c for c in new.components}
    changes: list[ComponentChange] = []
    for key, c in after.items():
        prev = before.get(key)
        digest = c.component_id.digest
        if prev is None:
            changes.append(ComponentChange(key[0], key[1], "added", None, digest))
        elif prev is not c:
            old_digest = prev.component_id.digest
            kind: Literal["changed", "reconfigured"] = (
                "reconfigured" if old_digest == digest else "changed"
            )
            changes.append(ComponentChange(key[0], key[1], kind, old_digest, digest))
    for key, c in before.items():
        if key not in after:
            changes.append(ComponentChange(key[0], key[1], "removed", c.component_id.digest))
    return changes


def _deployment_files(deployment: Deployment) -> set[Path]:
    return {c.location for c in deployment.components if c.location is not None}


def _named_locations(toml_path: Path) -> set[Path]:
    """Best effort, for a deployment that failed to load: the files its TOML names (so
    that creating a missing one triggers the next reload)."""
    try:
        doc = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    out: set[Path] = set()
    for tables in doc.values():
        if isinstance(tables, list):
            for table in tables:
                if isinstance(table, dict) and isinstance(table.get("location"), str):
                    out.add((toml_path.parent / table["location"]).resolve())
    return out


Fingerprint = tuple[int, int] | None


def _fingerprint(path: Path) -> Fingerprint:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


# ---------------------------------------------------------------------------------------
# The manager
# ---------------------------------------------------------------------------------------


class ReloadManager:
    """Watches the deployment, reloads it, upgrades workflows, reports (see module doc)."""

    #: watchfiles: wait this long for more changes after one (ms), at most `DEBOUNCE_MS`.
    STEP_MS = 50
    DEBOUNCE_MS = 1000
    #: While old versions run for pinned executions: how often to look for finished ones.
    RETIRE_INTERVAL = 1.0

    def __init__(self, engine: Engine, deployment_path: Path) -> None:
        self.engine = engine
        self.deployment_path = deployment_path.resolve()
        self.upgrader = Upgrader(engine.own_storage, engine.clock, engine.workflow_threads)
        self._lock = asyncio.Lock()
        self._subscribers: set[ReloadSubscription] = set()
        self._listeners: list[Callable[[ReloadStatus], None]] = []
        self._pinned: dict[str, BaseExecutor] = {}
        self._generation = 0
        self._status = self._make_status("start", True, None, time.monotonic())
        self._extra_watch: set[Path] = set()
        self._fingerprints: dict[Path, Fingerprint] = {}
        self._watch_task: asyncio.Task[None] | None = None
        self._watching = asyncio.Event()
        self._retire_task: asyncio.Task[None] | None = None
        self._revive_task: asyncio.Task[None] | None = None
        self._revive_again = False
        self._stopping = False
        #: A deferred start's report and watcher (`start(defer=True)`), and what lets it go.
        self._start_task: asyncio.Task[None] | None = None
        self._finish_start = asyncio.Event()

    # -- public ---------------------------------------------------------------------------
    def status(self) -> ReloadStatus:
        return self._status

    async def current_status(self) -> ReloadStatus:
        """The last status, with `pinned` and `orphaned` counted now (after a deferred
        start's report: the answer names what the start found)."""
        await self.finished_start()
        status = msgspec.structs.replace(self._status, pinned=await self._pinned_summary())
        return await self._with_orphaned(status, self.engine.registry, ())

    def subscribe(self) -> ReloadSubscription:
        return ReloadSubscription(self)

    def add_listener(self, callback: Callable[[ReloadStatus], None]) -> None:
        """Call `callback(status)` (on the event loop) after every reload attempt."""
        self._listeners.append(callback)

    @property
    def pinned_executors(self) -> dict[str, BaseExecutor]:
        return dict(self._pinned)

    async def start(self, *, watch: bool, defer: bool = False) -> None:
        """Report the start (reconciling executions pinned by an earlier process), then
        watch the files when `watch`.

        With `defer`, the report's count of unfinished executions of functions the
        deployment does not export (a scan of every unfinished execution) and the
        watcher's start are left to a task that begins on `finish_start()` (a front end
        calls it once it has drawn what it needs first) or `FINISH_START_AFTER` seconds
        later. The reconciling stays here: pinned executions get their executors before
        `start` returns. Reloads wait for the deferred report (it holds the lock, taken
        here), so none is published before it, and `current_status()` waits for it; a
        file edited meanwhile is reloaded once the watcher starts (`_changed_since_load`)."""
        t0 = time.monotonic()
        self._fingerprints = self._snapshot(self._watched_files())
        upgrades: list[UpgradeResult] = []
        if self.engine.run_executors:
            try:
                async with self._lock:
                    upgrades = await self._reconcile_pinned()
                    await self._revive_pinned(self.engine.registry)
                    await self._retire_pinned()
            except StorageError as e:
                log.error("checking pinned executions at start: %s", e)
        pinned = await self._pinned_summary()
        status = self._make_status("start", True, None, t0, upgrades=upgrades, pinned=pinned)
        if defer:
            await self._lock.acquire()  # released by the task once it has reported
            self._start_task = asyncio.create_task(
                self._deferred_start(status, watch), name="deferred start report"
            )
            return
        await self._report_start(status)
        if watch:
            self._watch_task = asyncio.create_task(self._watch_loop(), name="deployment watcher")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await self._watching.wait()

    #: A deferred start's report begins at the latest this many seconds after the start.
    FINISH_START_AFTER = 2.0

    def finish_start(self) -> None:
        """Let a deferred start's report and watcher begin now (`start(defer=True)`)."""
        self._finish_start.set()

    async def finished_start(self) -> None:
        """Once a deferred start has reported (at once when the start was not deferred)."""
        task = self._start_task
        if task is not None and not task.done():
            self._finish_start.set()
            await asyncio.shield(task)

    async def _report_start(self, status: ReloadStatus) -> None:
        orphaned = await self._orphaned(self.engine.registry, None)
        self._publish(msgspec.structs.replace(status, orphaned=orphaned))

    async def _deferred_start(self, status: ReloadStatus, watch: bool) -> None:
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.FINISH_START_AFTER):
                    await self._finish_start.wait()
            await self._report_start(status)
        finally:
            self._lock.release()
            if watch and not self._stopping:
                self._watch_task = asyncio.create_task(
                    self._watch_loop(), name="deployment watcher"
                )

    async def stop(self) -> None:
        self._stopping = True
        for task in (self._start_task, self._watch_task, self._retire_task, self._revive_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for sub in list(self._subscribers):
            sub.close()

    async def reload(
        self, trigger: Trigger = "manual", changed_paths: Sequence[str] = ()
    ) -> ReloadStatus:
        """Re-read the deployment and apply it (or report why not). Never raises for a
        bad deployment; reloads are serialized."""
        async with self._lock:
            return await self._reload(trigger, list(changed_paths))

    # -- reload ---------------------------------------------------------------------------
    async def _reload(self, trigger: Trigger, changed_paths: list[str]) -> ReloadStatus:
        t0 = time.monotonic()
        engine = self.engine
        old = engine.registry
        fingerprints = self._snapshot(self._watched_files())
        try:
            deployment = await asyncio.to_thread(load_deployment, self.deployment_path)
            for path in _deployment_files(deployment) - fingerprints.keys():
                fingerprints[path] = _fingerprint(path)
            self._fingerprints = fingerprints
            new = await build_registry(deployment, engine.wasm_engine, engine.cache_dir, old)
        except Exception as e:
            self._fingerprints = fingerprints
            self._extra_watch = _named_locations(self.deployment_path)
            if isinstance(e, DeploymentError):
                error = str(e)
            else:
                log.exception("reloading %s", self.deployment_path)
                error = f"unexpected error while loading the deployment: {e!r}"
            log.error("deployment reload failed, the previous deployment stays in force: %s", error)
            pinned = await self._pinned_summary()
            status = self._make_status(trigger, False, error, t0, changed_paths, pinned=pinned)
            return self._publish(await self._with_orphaned(status, old, ()))
        self._extra_watch = set()
        changes = diff_registries(old, new)
        if not changes:
            pinned = await self._pinned_summary()
            status = self._make_status(trigger, True, None, t0, changed_paths, pinned=pinned)
            return self._publish(await self._with_orphaned(status, old, ()))
        engine.deployment_id = new_deployment_id()
        engine.registry = new
        upgrades: list[UpgradeResult] = []
        upgrade_error: str | None = None
        if engine.run_executors:
            upgrades, upgrade_error = await self._apply(old, new)
        pinned = await self._pinned_summary()
        status = self._make_status(
            trigger,
            upgrade_error is None,
            upgrade_error,
            t0,
            changed_paths,
            changes,
            upgrades,
            pinned,
        )
        status = await self._with_orphaned(status, new, old.functions.keys() - new.functions.keys())
        log.info(
            "deployment reloaded (%s): %s%s",
            engine.deployment_id,
            ", ".join(f"{c.change} {c.type} {c.name}" for c in changes),
            "".join(
                f"; upgrade of {u.execution_id} {u.outcome}" + (f": {u.reason}" if u.reason else "")
                for u in upgrades
            ),
        )
        return self._publish(status)

    async def _apply(self, old: Registry, new: Registry) -> tuple[list[UpgradeResult], str | None]:
        """Swap executors; upgrade workflows in between (nothing runs them meanwhile).
        Returns the upgrades, and an error when they could not all be checked."""
        engine = self.engine
        kept = {id(c) for c in new.components}
        pinned = set(self._pinned.values())
        current = [e for e in engine.executors if e not in pinned]
        stopping = [e for e in current if id(e.component) not in kept]
        await self._stop_executors(stopping)
        error = None
        try:
            upgrades = await self._upgrade_workflows(old, new)
        except StorageError as e:
            # The new version runs anyway: the deployment is in force, and a storage
            # that fails this cannot lock executions for it either.
            upgrades = []
            error = f"{UPGRADES_UNCHECKED}: {e}"
            log.error("%s", error)
        running = {id(e.component) for e in engine.executors if e not in pinned}
        for executor in engine.executors:
            if executor not in pinned and isinstance(executor, WorkflowExecutor):
                executor.registry = new
                executor.deployment_id = engine.deployment_id
        for component in new.components:
            if id(component) not in running:
                self._start_executor(component, new)
        # Executions that failed their upgrade keep running on the version they were on.
        for upgrade in upgrades:
            digest = upgrade.pinned_digest
            if digest is None or digest in self._pinned:
                continue
            old_component = next(
                (c for c in old.components if c.component_id.digest == digest), None
            )
            if old_component is not None and old_component.config.is_workflow:
                old_executor = self._start_executor(old_component, old, pinned=True)
                if old_executor is not None:
                    self._pinned[digest] = old_executor
        with contextlib.suppress(StorageError):
            await self._revive_pinned(new)
            await self._retire_pinned()
        return upgrades, error

    def _start_executor(
        self, component: LoadedComponent, registry: Registry, *, pinned: bool = False
    ) -> BaseExecutor | None:
        executor = self.engine.make_executor(component, registry, pinned=pinned)
        if executor is not None:
            executor.start()
            self.engine.executors.append(executor)
        return executor

    async def _stop_executors(self, executors: Iterable[BaseExecutor]) -> None:
        executors = list(executors)
        results = await asyncio.gather(*(e.stop() for e in executors), return_exceptions=True)
        for executor, result in zip(executors, results, strict=True):
            if isinstance(result, BaseException):
                log.error("stopping executor %s: %r", executor.name, result)
            with contextlib.suppress(ValueError):
                self.engine.executors.remove(executor)

    async def _upgrade_workflows(self, old: Registry, new: Registry) -> list[UpgradeResult]:
        """Check the unfinished executions of every changed workflow (SPEC §9.3)."""
        unchanged = {id(c) for c in old.components} & {id(c) for c in new.components}
        ffqns: set[str] = set()
        for c in (*old.components, *new.components):
            if c.config.is_workflow and id(c) not in unchanged:
                ffqns.update(c.ffqns)
        if not ffqns:
            return []
        rows = await self.engine.own_storage.unfinished_executions(sorted(ffqns))
        jobs = []
        for row in rows:
            target = new.functions.get(row.ffqn)
            if target is None or not target[1].config.is_workflow:
                continue  # removed: waits until a deployment exports it again
            component = target[1]
            if id(component) in unchanged and row.pinned_digest is None:
                continue  # the code that runs it did not change
            before = old.functions.get(row.ffqn)
            previous = None if before is None else before[1].component_id.digest
            jobs.append(
                self.upgrader.upgrade(row, component, new, self.engine.deployment_id, previous)
            )
        results = await asyncio.gather(*jobs, return_exceptions=True)
        out: list[UpgradeResult] = []
        for result in results:
            if isinstance(result, BaseException):
                log.error("workflow upgrade: %r", result)
            elif result is not None:
                out.append(result)
        return out

    async def _reconcile_pinned(self) -> list[UpgradeResult]:
        """At start: executions pinned by an earlier process move to the deployed
        version if it is theirs again or if it passes their upgrade check."""
        registry = self.engine.registry
        jobs = []
        for row in await self.engine.own_storage.unfinished_executions(pinned_only=True):
            target = registry.functions.get(row.ffqn)
            if target is not None and target[1].config.is_workflow:
                jobs.append(
                    self.upgrader.upgrade(row, target[1], registry, self.engine.deployment_id, None)
                )
        results = await asyncio.gather(*jobs, return_exceptions=True)
        out: list[UpgradeResult] = []
        for result in results:
            if isinstance(result, BaseException):
                log.error("workflow upgrade at start: %r", result)
            elif result is not None:
                out.append(result)
        return out

    # -- old versions -----------------------------------------------------------------------
    def revive_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Thread-safe (`loop`: the engine's): an execution was just pinned to a version
        that may not be loaded (a workflow executor found, when it locked it, that its
        history does not replay on the deployed code): make sure an executor runs it."""
        if not self._stopping:
            loop.call_soon_threadsafe(self._start_revive)

    def _start_revive(self) -> None:
        if self._stopping or (self._revive_task is not None and not self._revive_task.done()):
            self._revive_again = True
            return
        self._revive_again = False
        self._revive_task = asyncio.create_task(self._revive_later(), name="revive old versions")

    async def _revive_later(self) -> None:
        again = True
        while again and not self._stopping:
            try:
                async with self._lock:
                    await self._revive_pinned(self.engine.registry)
                    await self._retire_pinned()
            except StorageError as e:
                log.error("starting old workflow versions: %s", e)
            again, self._revive_again = self._revive_again, False

    async def _revive_pinned(self, registry: Registry) -> None:
        """Start an executor for every version that unfinished executions are pinned to
        and that no executor runs (after a restart, or pinned when locked): rebuilt from
        the stored source or the compiled cache (`engine.old_versions`)."""
        from engine.old_versions import rebuild_old_version

        deployed = {c.component_id.digest for c in registry.components}
        wanted: dict[str, str] = {}
        for row in await self.engine.own_storage.unfinished_executions(pinned_only=True):
            digest = row.pinned_digest
            if digest is not None and digest not in self._pinned and digest not in deployed:
                wanted.setdefault(digest, row.ffqn)
        for digest, ffqn in wanted.items():
            component = await rebuild_old_version(self.engine.load_context, digest, ffqn, registry)
            if component is not None and not self._stopping:
                executor = self._start_executor(component, registry, pinned=True)
                if executor is not None:
                    self._pinned[digest] = executor

    async def _with_orphaned(
        self, status: ReloadStatus, registry: Registry, removed: Iterable[str]
    ) -> ReloadStatus:
        """`status` with `orphaned`: the functions this reload removed (warned about) and
        those the previous status listed, counted again (any reload, even one that
        failed or changed nothing, keeps reporting what still waits)."""
        removed = set(removed)
        earlier = {o.ffqn for o in self._status.orphaned} - removed
        orphaned = await self._orphaned(registry, removed) if removed else []
        if earlier:
            orphaned += await self._orphaned(registry, earlier, warn=False)
        return msgspec.structs.replace(status, orphaned=sorted(orphaned, key=lambda o: o.ffqn))

    async def _orphaned(
        self, registry: Registry, ffqns: Iterable[str] | None, *, warn: bool = True
    ) -> list[OrphanedFunction]:
        """Unfinished executions of `ffqns` (None: of any function) that `registry` does
        not export, by function; logged as a warning."""
        wanted = None if ffqns is None else sorted(ffqns)
        if wanted == []:
            return []
        try:
            # Every shard's (`engine.storage`): a report, not this process's work.
            rows = await self.engine.storage.unfinished_executions(wanted)
        except StorageError as e:
            log.error("counting executions of removed functions: %s", e)
            return []
        counts: dict[str, int] = {}
        for row in rows:
            if row.ffqn not in registry.functions:
                counts[row.ffqn] = counts.get(row.ffqn, 0) + 1
        out = [OrphanedFunction(f, n) for f, n in sorted(counts.items())]
        if warn:
            for o in out:
                log.warning(
                    "%d unfinished execution(s) of %s, which this engine's deployment does "
                    "not export: they wait until a deployment exports it again (or another "
                    "engine sharing the database that exports it runs them)",
                    o.executions,
                    o.ffqn,
                )
        return out

    async def _pinned_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in await self.engine.own_storage.unfinished_executions(pinned_only=True):
            assert row.pinned_digest is not None
            counts[row.pinned_digest] = counts.get(row.pinned_digest, 0) + 1
        return counts

    async def _pinned_summary(self) -> list[PinnedVersion]:
        try:
            counts = await self._pinned_counts()
        except StorageError as e:
            log.error("counting pinned executions: %s", e)
            return []
        out = []
        for digest, n in sorted(counts.items()):
            executor = self._pinned.get(digest)
            name = None
            if executor is not None:
                name = f"{executor.component.config.type} {executor.component.config.name}"
            out.append(PinnedVersion(digest, n, executor is not None, name))
        return out

    async def _retire_pinned(self) -> None:
        """Stop old versions that no unfinished execution is pinned to any more, and
        those whose function no deployed workflow exports (their executions wait, like
        every execution of a removed function); keep checking while any runs."""
        if not self._pinned:
            return
        await self._retire_unused()
        if self._pinned and (self._retire_task is None or self._retire_task.done()):
            self._retire_task = asyncio.create_task(self._retire_loop(), name="retire old versions")

    async def _retire_unused(self) -> None:
        registry = self.engine.registry
        removed = [
            d
            for d, executor in self._pinned.items()
            if not any(
                (target := registry.functions.get(ffqn)) is not None
                and target[1].config.is_workflow
                for ffqn in executor.component.ffqns
            )
        ]
        counts = await self._pinned_counts()
        unused = [d for d in self._pinned if counts.get(d, 0) == 0 and d not in removed]
        if removed or unused:
            await self._retire(removed + unused)
        for digest in removed:
            log.warning(
                "old workflow version %s stopped: no deployed workflow exports its function; "
                "the executions pinned to it wait until one does",
                digest,
            )
        for digest in unused:
            log.info(
                "old workflow version %s retired: no unfinished execution is pinned to it", digest
            )

    async def _retire(self, digests: list[str]) -> None:
        # Out of `pinned_executors` only once stopped and out of `engine.executors`.
        await self._stop_executors([self._pinned[d] for d in digests])
        for d in digests:
            self._pinned.pop(d, None)

    async def _retire_loop(self) -> None:
        while self._pinned and not self._stopping:
            await asyncio.sleep(self.RETIRE_INTERVAL)
            try:
                async with self._lock:
                    if not self._pinned:
                        return
                    await self._retire_unused()
            except StorageError as e:
                log.error("checking old workflow versions: %s", e)

    # -- watching ---------------------------------------------------------------------------
    def _watched_files(self) -> set[Path]:
        return (
            {self.deployment_path}
            | _deployment_files(self.engine.registry.deployment)
            | self._extra_watch
        )

    @staticmethod
    def _snapshot(paths: Iterable[Path]) -> dict[Path, Fingerprint]:
        return {p: _fingerprint(p) for p in paths}

    def _changed_since_load(self) -> list[str]:
        return sorted(str(p) for p, fp in self._fingerprints.items() if _fingerprint(p) != fp)

    async def _watch_loop(self) -> None:
        failures = 0
        while not self._stopping:
            files = self._watched_files()
            try:
                await self._watch(files)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:  # e.g. out of inotify watches: retry, then poll
                failures += 1
                log.error("watching the deployment files failed: %r", e)
                self._watching.set()
                await asyncio.sleep(min(5.0, 0.2 * failures))

    async def _watch(self, files: set[Path]) -> None:
        """Watch `files` (their directories) until the watched set changes."""
        names = {os.fspath(p) for p in files}
        dirs = sorted({os.fspath(p.parent) for p in files if p.parent.is_dir()})
        if not dirs:
            raise FileNotFoundError(f"no directory to watch for {self.deployment_path}")
        stop = asyncio.Event()
        changes = watchfiles.awatch(
            *dirs,
            watch_filter=lambda _change, path: os.path.abspath(path) in names,
            debounce=self.DEBOUNCE_MS,
            step=self.STEP_MS,
            stop_event=stop,
            recursive=False,
            ignore_permission_denied=True,
        )
        pending = asyncio.ensure_future(anext(changes))
        try:
            await asyncio.sleep(0)  # awatch has started its watcher
            missed = self._changed_since_load()  # edited before the watcher started
            self._watching.set()
            if missed:
                await self.reload("watch", missed)
            while self._watched_files() == files:
                batch = await pending
                paths = sorted({os.path.abspath(p) for _, p in batch})
                log.info("deployment files changed: %s", ", ".join(paths))
                await self.reload("watch", paths)
                pending = asyncio.ensure_future(anext(changes))
        finally:
            stop.set()
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                await pending
            with contextlib.suppress(Exception):
                await changes.aclose()

    # -- status -------------------------------------------------------------------------------
    def _make_status(
        self,
        trigger: Trigger,
        ok: bool,
        error: str | None,
        t0: float,
        changed_paths: list[str] | None = None,
        changes: list[ComponentChange] | None = None,
        upgrades: list[UpgradeResult] | None = None,
        pinned: list[PinnedVersion] | None = None,
    ) -> ReloadStatus:
        return ReloadStatus(
            generation=self._generation,
            at=self.engine.clock.now(),
            trigger=trigger,
            ok=ok,
            error=error,
            deployment_id=self.engine.deployment_id,
            deployment_path=str(self.deployment_path),
            changed_paths=changed_paths or [],
            changes=changes or [],
            upgrades=upgrades or [],
            pinned=pinned or [],
            duration_ms=round((time.monotonic() - t0) * 1000, 3),
        )

    def _publish(self, status: ReloadStatus) -> ReloadStatus:
        if status.trigger != "start":
            self._generation += 1
            status = msgspec.structs.replace(status, generation=self._generation)
        self._status = status
        for sub in list(self._subscribers):
            sub._put(status)
        for callback in list(self._listeners):
            try:
                callback(status)
            except Exception:
                log.exception("reload listener failed")
        return status


__all__ = [
    "ComponentChange",
    "OrphanedFunction",
    "PinnedVersion",
    "ReloadManager",
    "ReloadStatus",
    "ReloadSubscription",
    "build_registry",
    "diff_registries",
]
