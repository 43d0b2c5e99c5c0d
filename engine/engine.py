"""The embeddable engine: storage + components + executors + timers, behind one facade.

The REST API, the CLI's server and the console all drive the engine through `Engine`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from engine import affinity
from engine.components import LoadedComponent, Registry, load_registry
from engine.core import events as ev
from engine.core.clock import Clock, SystemClock
from engine.core.ids import DelayId, ExecutionId, IdError, new_deployment_id
from engine.deployment import load_deployment
from engine.errors import Conflict, InvalidParams, NotFound
from engine.executors.activity import ActivityExecutor
from engine.executors.base import BaseExecutor
from engine.executors.cancellation import CancellationDriver
from engine.executors.pool import RunPool
from engine.executors.timers import TimersWatcher
from engine.executors.workflow import PinnedWorkflowExecutor, WorkflowExecutor
from engine.processes import Helpers
from engine.reload import ReloadManager, ReloadStatus, ReloadSubscription
from engine.runtimes.api import LoadContext
from engine.runtimes.kinds import kind_of
from engine.storage.contract import (
    CreateRequest,
    DirectLock,
    Storage,
    StorageError,
    VersionConflict,
)
from engine.storage.data_files import DamagedDatabase, is_damage, private_dir
from engine.storage.sharded import (
    ShardedStorage,
    existing_shards,
    open_shards,
    remove_empty_shards,
    shard_path,
)

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
    ) -> None:
        #: Every execution, for the API and the console (`ShardedStorage` when the
        #: executions are in several SQLite files: `engine.storage.sharded`).
        self.storage = storage
        #: This process's work: what its executors, timers and upgrades see.
        self.own_storage = own_storage or storage
        self.registry = registry
        self.clock = clock
        self.data_dir = data_dir
        self.wasm_engine = wasm_engine
        self.deployment_id = new_deployment_id()
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
        engine of a helper, on that shard alone.
        Raises DeploymentError / StorageError with a message naming the culprit; nothing
        is started when anything fails.
        """
        from engine.runtimes.wasm.activity import WasmEngine

        if processes < 1:
            raise ValueError(f"processes must be at least 1, not {processes}")
        data = Path(data_dir)
        shards = existing = 1
        if not database_url and shard is None:
            existing = existing_shards(data)
            shards = max(processes, existing)
            processes = shards
        deployment = load_deployment(deployment_path)
        try:  # the compiled cache (and the SQLite database) live there: the owner's only
            private_dir(data)
            private_dir(data / "cache")
        except OSError as e:
            raise StorageError(f"cannot use the data directory {data}: {e.strerror or e}") from None
        wasm_engine = WasmEngine()
        registry = await load_registry(deployment, wasm_engine, data / "cache")
        # After compiling (its threads keep every CPU), before the storage's writer.
        cpus = affinity.process_cpus(processes) if processes > 1 else None
        if cpus is not None and cpu_affinity == "split":
            split = affinity.configure_one(cpus[0])
        else:
            split = affinity.configure(cpu_affinity)
        storage: Storage
        own: Storage
        try:
            if database_url:
                from engine.storage.postgres import PostgresStorage

                storage = own = await PostgresStorage.open(database_url)
            else:
                storage, own = await open_shards(data, shard, shards)
            try:
                # Kept by digest: backtraces show their lines even after the file changed.
                from engine.executors.backtraces import save_component_sources, source_saver

                await save_component_sources(own, registry)
            except BaseException:
                await storage.close()
                raise
        except BaseException as e:
            if split:  # nothing started: the caller's thread gets its CPUs back
                affinity.configure("off")
            remove_empty_shards(data, existing, shards)
            if is_damage(e):
                raise DamagedDatabase(sqlite_paths(data, shard, shards), e) from None
            raise
        engine = cls(storage, registry, clock or SystemClock(), data, wasm_engine, own_storage=own)
        engine._split_threads = split
        engine.reloader.add_listener(source_saver(engine))  # and after each reload
        engine.run_executors = run_executors
        try:
            if run_executors:
                engine._start_executors()
            if run_watcher:
                engine.watcher.start()
                engine.canceller.start()
            await engine.reloader.start(watch=watch)
        except BaseException as e:
            # Stop what did start (executors, watcher, threads, the storage's writer):
            # left running, they keep the process from exiting.
            await engine.stop()
            remove_empty_shards(data, existing, shards)
            if is_damage(e) and not database_url:
                raise DamagedDatabase(sqlite_paths(data, shard, shards), e) from None
            raise
        if processes > 1 and run_executors:
            # Once this one has opened (and migrated) the database.
            engine.helpers = helpers = Helpers(
                Path(deployment_path).resolve(),
                data.resolve(),
                cpus if split else None,
                processes - 1,
                database_url,
                sharded=shards > 1,
            )
            try:
                await helpers.start()
            except BaseException:
                await engine.stop()
                remove_empty_shards(data, existing, shards)
                raise
            if isinstance(storage, ShardedStorage):
                # New submissions skip a shard whose process is down (being restarted).
                storage.available = lambda index: index == 0 or helpers.alive(index - 1)
        return engine

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
            # Sharded: an id whose shard is the next in turn (balanced submissions).
            eid = (
                self.storage.generate_id()
                if isinstance(self.storage, ShardedStorage)
                else ExecutionId.generate()
            )
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


def sqlite_paths(data_dir: Path, shard: int | None, shards: int) -> list[Path]:
    """The SQLite files an engine on `data_dir` opened (`Engine.start`'s arguments)."""
    if shard is not None:
        return [shard_path(data_dir, shard)]
    return [shard_path(data_dir, index) for index in range(shards)]


__all__ = ["Engine", "NotFound"]
