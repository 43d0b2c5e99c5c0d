"""The embeddable engine: storage + components + executors + timers, behind one facade.

The REST API, the CLI's server and the console all drive the engine through `Engine`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from engine import affinity
from engine.components import LoadedComponent, LoadProgress, Registry, load_registry
from engine.core import events as ev
from engine.core.clock import Clock, SystemClock
from engine.core.ids import DelayId, ExecutionId, IdError, new_deployment_id
from engine.core.state_names import RESULT_CLASSES, STATE_NAMES
from engine.deployment import load_deployment
from engine.errors import Conflict, InvalidParams, NotFound
from engine.executors.activity import ActivityExecutor
from engine.executors.backtraces import (
    PersistedBacktraces,
    get_component_source,
    persist_backtraces,
    save_component_sources,
    source_saver,
)
from engine.executors.base import BaseExecutor
from engine.executors.cancellation import CancellationDriver
from engine.executors.pool import RunPool
from engine.executors.timers import TimersWatcher
from engine.executors.workflow import PinnedWorkflowExecutor, WorkflowExecutor
from engine.processes import Helpers
from engine.reload import ReloadManager, ReloadStatus, ReloadSubscription
from engine.runtimes.api import LoadContext
from engine.runtimes.kinds import kind_of
from engine.runtimes.wasm.activity import WasmEngine
from engine.storage.contract import (
    Backtrace,
    ComponentSource,
    CreateRequest,
    DirectLock,
    ExecutionRow,
    ListFilter,
    Storage,
    StorageError,
    StoredLog,
    VersionConflict,
)
from engine.storage.data_files import private_dir, private_file
from engine.storage.select import OpenedStorage, StorageChoice, choose_storage

log = logging.getLogger("obelisk.engine")

#: Component types that get no executor (stubs are finished by someone else).


class Engine:
    def __init__(
        self,
        storage: Storage,
        registry: Registry,
        clock: Clock,
        data_dir: Path,
        wasm_engine: Any,
        *,
        own_storage: Storage | None = None,
        new_id: Callable[[], ExecutionId] = ExecutionId.generate,
    ) -> None:
        #: Every execution, for the API and the console (several SQLite files when the
        #: data dir is sharded: `engine.storage.sharded`). Front ends use the methods
        #: below, never the storage itself.
        self.storage = storage
        #: This process's work: what its executors, timers and upgrades see.
        self.own_storage = own_storage or storage
        self.registry = registry
        self.clock = clock
        self.data_dir = data_dir
        self.wasm_engine = wasm_engine
        self.deployment_id = new_deployment_id()
        #: A new top-level execution id (`OpenedStorage.new_id`).
        self._new_id = new_id
        # Activity runs: few threads while runs are short, up to 64 when they block.
        self.threads = RunPool(
            max_workers=64,
            thread_name_prefix="obelisk-run",
            initializer=lambda: affinity.pin("free"),
        )
        # Workflow runs block their thread while awaiting children (strategy `await`).
        self.workflow_threads = ThreadPoolExecutor(
            max_workers=256,
            thread_name_prefix="obelisk-wf",
            initializer=lambda: affinity.pin("turns"),
        )
        self._split_threads = False
        self.executors: list[BaseExecutor] = []
        self.watcher = TimersWatcher(self.own_storage, clock)
        self.run_executors = True
        #: Hot reload of the deployment and workflow upgrades (SPEC §9.3).
        self.reloader = ReloadManager(self, registry.deployment.path)
        self.canceller = CancellationDriver(self.own_storage, clock)
        #: The other engine processes (`Engine.start(processes=N)`).
        self.helpers: Helpers | None = None

    # -- lifecycle ---------------------------------------------------------------------
    @classmethod
    async def start(
        cls,
        deployment_path: str | os.PathLike[str],
        data_dir: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        run_executors: bool = True,
        run_watcher: bool = True,
        watch: bool = True,
        database_url: str | None = None,
        cpu_affinity: affinity.Mode = "off",
        processes: int = 1,
        shard: int | None = None,
        on_progress: LoadProgress | None = None,
        finish_later: bool = False,
    ) -> Engine:
        """Load the deployment, open the database, start executors and the watcher.

        The database is SQLite in `data_dir` unless `database_url` names a PostgreSQL
        database (`postgresql://user:password@host:port/dbname[?schema=NAME]`), which
        several engines on several hosts may share (`engine.storage.postgres`).

        With `watch`, the deployment TOML and its component files are watched and
        reloaded on change (`engine.reload`). `cpu_affinity="split"` places this
        process's threads (`engine.affinity`: process-wide, for the process's owner).
        `processes` > 1 starts that many engine processes in all (`engine.processes`):
        this one and helpers, each on a CPU of its own (then `cpu_affinity` "split"
        places this process on its CPU instead). With SQLite each process works on a
        file of its own, a shard (`engine.storage.sharded`): a data dir that has shards
        is always served by as many processes, whatever `processes` says. `shard`: the
        engine of a helper, on that shard alone (`engine.storage.select`).
        Raises DeploymentError / StorageError with a message naming the culprit; nothing
        is started when anything fails. `on_progress` hears of each component as it loads
        (`engine.components.LoadProgress`: a console shows a first start's compiling).
        With `finish_later`, what serving does not wait for — the start's count of
        executions of functions the deployment does not export, and the file watcher's
        start — begins on `finish_start()` (or 2 s later: `ReloadManager.start`).
        """
        data = Path(data_dir)
        choice = choose_storage(data, database_url=database_url, shard=shard, processes=processes)
        deployment = load_deployment(deployment_path)
        _make_private_data_dir(data)
        wasm_engine = WasmEngine()
        registry = await load_registry(deployment, wasm_engine, data / "cache", on_progress)
        # After compiling (its threads keep every CPU), before the storage's writer.
        cpus = affinity.process_cpus(choice.processes) if choice.processes > 1 else None
        if cpus is not None and cpu_affinity == "split":
            split = affinity.configure_one(cpus[0])
        else:
            split = affinity.configure(cpu_affinity)
        try:
            opened = await _open_storage(choice, registry)
        except BaseException:
            if split:  # nothing started: the caller's thread gets its CPUs back
                affinity.configure("off")
            raise
        engine = cls(
            opened.storage,
            registry,
            clock or SystemClock(),
            data,
            wasm_engine,
            own_storage=opened.own,
            new_id=opened.new_id,
        )
        engine._split_threads = split
        engine.reloader.add_listener(source_saver(engine))  # and after each reload
        engine.run_executors = run_executors
        try:
            await engine._start_parts(run_executors, run_watcher, watch, finish_later)
        except BaseException as e:
            # Stop what did start (executors, watcher, threads, the storage's writer):
            # left running, they keep the process from exiting.
            await engine.stop()
            choice.undo()
            damaged = choice.damaged(e)
            if damaged is not None:
                raise damaged from None
            raise
        if choice.processes > 1 and run_executors:
            # Once this one has opened (and migrated) the database.
            helpers = await engine._start_helpers(
                choice, Path(deployment_path).resolve(), cpus if split else None
            )
            # New submissions skip a shard whose process is down (being restarted):
            # shard 0 is this process's, shard i helper i - 1's.
            opened.set_available(lambda index: index == 0 or helpers.alive(index - 1))
        return engine

    async def _start_parts(
        self, run_executors: bool, run_watcher: bool, watch: bool, finish_later: bool = False
    ) -> None:
        """Executors, the timers watcher, the cancellation driver and the reloader."""
        if run_executors:
            self._start_executors()
        if run_watcher:
            self.watcher.start()
            self.canceller.start()
        await self.reloader.start(watch=watch, defer=finish_later)

    def finish_start(self) -> None:
        """Begin what `start(finish_later=True)` left for later (a console: once its
        first rows are drawn)."""
        self.reloader.finish_start()

    async def _start_helpers(
        self, choice: StorageChoice, deployment_path: Path, cpus: list[set[int]] | None
    ) -> Helpers:
        """The other engine processes (`engine.processes`); this engine is stopped when
        they fail to start."""
        self.helpers = helpers = Helpers(
            deployment_path,
            choice.data_dir.resolve(),
            cpus,
            choice.processes - 1,
            choice.database_url,
            sharded=choice.shards > 1,
        )
        try:
            await helpers.start()
        except BaseException:
            await self.stop()
            choice.undo()
            raise
        return helpers

    @staticmethod
    def private_data_file(data_dir: Path, name: str) -> Path:
        """`data_dir / name`, made (with the data dir) readable by the owner only, like
        the engine's own files: a front end's log there may hold executions' data."""
        private_dir(data_dir)
        path = data_dir / name
        private_file(path)
        return path

    @property
    def cache_dir(self) -> Path:
        """Compiled components, by digest."""
        return self.data_dir / "cache"

    @property
    def load_context(self) -> LoadContext:
        """What loading a component (or rebuilding an old version) uses here."""
        return LoadContext(self.wasm_engine, self.cache_dir, self.storage.get_component_source)

    def make_executor(
        self, component: LoadedComponent, registry: Registry, *, pinned: bool = False
    ) -> BaseExecutor | None:
        """A (not started) executor for `component`; None for components that get none.
        `pinned`: an old workflow version that runs only the executions pinned to it."""
        if not kind_of(component.config.type).executed or component.runner is None:
            return None
        if component.config.is_workflow:
            cls = PinnedWorkflowExecutor if pinned else WorkflowExecutor
            executor = cls(
                self.own_storage,
                component,
                self.clock,
                self.workflow_threads,
                registry=registry,
                deployment_id=self.deployment_id,
                direct_locks=self.direct_lock,
            )
            executor.on_pinned = self.reloader.revive_soon
            return executor
        return ActivityExecutor(self.own_storage, component, self.clock, self.threads)

    def direct_lock(self, ffqn: str, now: datetime) -> DirectLock | None:
        """A lock for a child of `ffqn` being created at `now`, taken by this engine's
        activity executor of it when that one is idle (any thread; see
        `ActivityExecutor.reserve`)."""
        for executor in list(self.executors):
            if isinstance(executor, ActivityExecutor) and ffqn in executor.ffqns:
                return executor.reserve(now)
        return None

    def _start_executors(self) -> None:
        for component in self.registry.components:
            executor = self.make_executor(component, self.registry)
            if executor is not None:
                executor.start()
                self.executors.append(executor)

    async def stop(self) -> None:
        if self.helpers is not None:
            await self.helpers.stop()  # first: they release what they hold
            self.helpers = None
        await self.reloader.stop()
        await self.watcher.stop()
        await self.canceller.stop()
        await asyncio.gather(*(e.stop() for e in self.executors))
        self.executors.clear()
        await self.storage.close()
        self.threads.shutdown(wait=False, cancel_futures=True)
        self.workflow_threads.shutdown(wait=False, cancel_futures=True)
        if self._split_threads:
            affinity.configure("off")

    # -- reads (the API and the console: `engine.views` renders them) --------------------
    async def list_executions(self, flt: ListFilter) -> list[ExecutionRow]:
        """A page of executions: filters, order and paging of `flt`."""
        return await self.storage.list_executions(flt)

    async def count_executions(self, flt: ListFilter) -> int:
        """How many executions `flt` selects (its limit, offset and order ignored)."""
        return await self.storage.count_executions(flt)

    async def counts_by_state(self, *, results: bool = False) -> dict[str, int]:
        """Executions per state name (overlays as their own states), every state named;
        with `results`, also the finished per result class (`ok`, `err`, `failed`), in
        the same storage query (it reads the finished rows' summaries: dearer)."""
        counts = await self.storage.count_by_state(results=results)
        names = (*STATE_NAMES, *RESULT_CLASSES) if results else STATE_NAMES
        return {name: counts.get(name, 0) for name in names}

    async def descendants(self, execution_id: str, limit: int = 1000) -> list[ExecutionRow]:
        """Children, grandchildren, … of an execution, oldest first, with their extras
        (children count, last event)."""
        flt = ListFilter(
            id_prefix=execution_id + ".", order="created_asc", limit=limit, with_extras=True
        )
        return await self.storage.list_executions(flt)

    async def wait_changed(self, since: int, timeout: float) -> int:
        """The commit generation once it differs from `since` (or after `timeout` s)."""
        return await self.storage.changes().wait_changed(since, timeout)

    async def status(self, execution_id: str) -> ExecutionRow:
        """State, timestamps, version and result. NotFound for an unknown id."""
        return await self.storage.get_row(execution_id)

    async def _exists(self, execution_id: str) -> None:
        """NotFound for an unknown id: reads of a log answer an empty page for one."""
        await self.storage.get_summary(execution_id)

    async def events(
        self, execution_id: str, from_version: int = 0, length: int | None = None
    ) -> list[ev.StoredEvent]:
        """The log from `from_version` (`length` events, all when None). NotFound for an
        unknown id, whatever the range."""
        stored = await self.storage.get_events(execution_id, from_version, length)
        if not stored:
            await self._exists(execution_id)
        return stored

    async def responses(self, execution_id: str, after: int = 0) -> list[ev.StoredResponse]:
        """Responses (children, delays) with a cursor above `after`. NotFound for an
        unknown id."""
        stored = await self.storage.get_responses(execution_id, after)
        if not stored:
            await self._exists(execution_id)
        return stored

    async def logs(self, execution_id: str, after: int = 0, limit: int = 1000) -> list[StoredLog]:
        """Log lines with an id above `after`. NotFound for an unknown id."""
        lines = await self.storage.get_logs(execution_id, after, limit)
        if not lines:
            await self._exists(execution_id)
        return lines

    async def backtrace(self, execution_id: str, version: int) -> Backtrace | None:
        """The backtrace of the host call that wrote that event; None when it has none.
        NotFound for an unknown id."""
        return await self.storage.get_backtrace(execution_id, version)

    async def component_source(self, digest: str) -> ComponentSource | None:
        """The source of a (JS) component version by digest, deployed or saved; None
        when none is known."""
        return await get_component_source(self, digest)

    async def persist_backtraces(self, execution_id: str) -> PersistedBacktraces:
        """Replay a JS workflow execution against its deployed code (writing no history)
        and store the backtraces of its events."""
        return await persist_backtraces(self, execution_id)

    # -- components ----------------------------------------------------------------------
    @property
    def components(self) -> list[LoadedComponent]:
        return self.registry.components

    # -- hot reload (SPEC §9.3) ----------------------------------------------------------
    def reload_status(self) -> ReloadStatus:
        """The last reload attempt (or the start): ok or the error, changes, upgrades."""
        return self.reloader.status()

    async def reload_status_now(self) -> ReloadStatus:
        """`reload_status()`, with its `pinned` versions and `orphaned` functions counted
        now (their executions finish after the reload that reported them)."""
        return await self.reloader.current_status()

    def reload_events(self) -> ReloadSubscription:
        """Every later reload status, as an async iterator (subscribed from this call)."""
        return self.reloader.subscribe()

    async def wait_reload(self, after_generation: int, timeout: float) -> ReloadStatus:
        """The first reload status with a generation above `after_generation`, waiting up
        to `timeout` seconds for it (then the current one)."""
        with self.reloader.subscribe() as events:  # before the check: none is missed
            current = self.reloader.status()
            if current.generation > after_generation:
                return current
            try:
                async with asyncio.timeout(timeout):
                    async for status in events:
                        if status.generation > after_generation:
                            return status
            except TimeoutError:
                pass
        return self.reloader.status()

    async def reload(self) -> ReloadStatus:
        """Reload the deployment now (the watcher does it on file changes)."""
        return await self.reloader.reload("manual")

    # -- commands ------------------------------------------------------------------------
    async def submit(
        self,
        ffqn: str,
        params: Any,
        *,
        execution_id: str | None = None,
        scheduled_at: datetime | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> str:
        """Create a top-level execution. UnknownFunction (404), InvalidParams (400),
        Conflict (409: the id exists with other params)."""
        _, component = self.registry.function(ffqn)
        checked = self.registry.validate_params(ffqn, params)
        if execution_id is None:
            eid = self._new_id()  # sharded: balanced over the shards
        else:
            try:
                eid = ExecutionId.parse(execution_id)
            except IdError as e:
                raise InvalidParams(str(e)) from None
            if not eid.is_top_level:
                raise InvalidParams(f"{execution_id} is a child id; submit a top-level E_<ULID>")
        now = self.clock.now()
        created = ev.Created(
            ffqn=ffqn,
            params=checked,
            scheduled_at=scheduled_at or now,
            component_id=component.component_id,
            deployment_id=self.deployment_id,
            metadata=metadata or {},
        )
        await self.storage.create(CreateRequest(str(eid), created), now)
        return str(eid)

    async def pause(self, execution_id: str) -> None:
        await self.storage.pause(execution_id, self.clock.now())

    async def unpause(self, execution_id: str) -> None:
        await self.storage.unpause(execution_id, self.clock.now())

    async def cancel(self, execution_id: str, force: bool = False) -> None:
        """Request a cancellation (SPEC §8). `force` also ends a workflow that is not
        `-cancellable` (one stuck in an endless loop): recorded in its log as forced."""
        await self.storage.request_cancellation(execution_id, self.clock.now(), force)

    async def cancel_delay(self, delay_id: str) -> str:
        """Answer a delay with `delay_finished(cancelled)` (SPEC §8); returns the id of
        the execution that owns it. InvalidParams (400) for a malformed id, NotFound (404)
        for an unknown delay, Conflict (409) when it already finished."""
        try:
            owner = str(DelayId.parse(delay_id).owner()[0])
        except IdError as e:
            raise InvalidParams(str(e)) from None
        await self.storage.cancel_delay(delay_id, self.clock.now())
        return owner

    async def stub(self, execution_id: str, result: Any) -> None:
        """Finish an `activity_stub` execution with `{"ok": v}` / `{"err": v}`.

        Writing the same result again is accepted (idempotent); another result is 409.
        """
        try:
            parsed = ev.result_from_json(result)
        except ValueError as e:
            raise InvalidParams(f"stub result: {e}") from None
        if isinstance(parsed, ev.ExecutionFailure):
            raise InvalidParams('stub result must be {"ok": value} or {"err": value}')
        for _ in range(10):
            s = await self.storage.get_summary(execution_id)
            if not ev.accepts_stub(s.component_type):
                raise Conflict(f"execution {execution_id} ({s.ffqn}) is not an activity_stub")
            if s.result is not None:
                if s.result == parsed:
                    return
                raise Conflict(f"execution {execution_id} is already finished with another result")
            info, _ = self.registry.function(s.ffqn)
            if info.return_type is not None:
                from engine.wit.codec import WitValueError, validate_json

                try:
                    validate_json(ev.result_to_json(parsed), info.return_type, "result")
                except WitValueError as e:
                    raise InvalidParams(f"stub result for {s.ffqn}: {e}") from None
            try:
                await self.storage.append(
                    execution_id, s.next_version, [ev.Finished(parsed)], self.clock.now()
                )
                return
            except VersionConflict:
                continue
        raise Conflict(f"execution {execution_id} keeps changing; try again")

    async def result(self, execution_id: str, timeout: float | None = None) -> ev.ExecutionResult:
        return await self.storage.wait_for_finished(execution_id, timeout)


def _make_private_data_dir(data: Path) -> None:
    """The data dir and its compiled cache (and the SQLite database): the owner's only."""
    try:
        private_dir(data)
        private_dir(data / "cache")
    except OSError as e:
        raise StorageError(f"cannot use the data directory {data}: {e.strerror or e}") from None


async def _open_storage(choice: StorageChoice, registry: Registry) -> OpenedStorage:
    """Open the chosen storage and save the deployed components' sources in it (kept by
    digest: backtraces show their lines even after the file changed). Nothing is left
    open, and no new shard file left behind, when that fails; a damaged SQLite file is
    named (`DamagedDatabase`)."""
    try:
        opened = await choice.open()
        try:
            await save_component_sources(opened.own, registry)
        except BaseException:
            await opened.storage.close()
            raise
    except BaseException as e:
        choice.undo()
        damaged = choice.damaged(e)
        if damaged is not None:
            raise damaged from None
        raise
    return opened


__all__ = ["Engine", "NotFound"]
