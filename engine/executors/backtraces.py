"""Backtraces (SPEC §7.4): the guest stack of every host call that wrote history.

Recording happens in the `ReplayHost`: the runtime passes the stack with `set_stack`
before each host call that may write history, and the events that call writes are stored
with it (`AppendExtras.backtraces`, deduplicated by the storage). Replays write nothing,
so they never change the backtraces of existing events.

`persist_backtraces` (re)captures them for one execution: it replays the execution's log
against its current code (the version that runs it: the deployed one, or an old one
still loaded for executions pinned to it after a failed upgrade) in a dry run
(`upgrade.DryRunHost`:
answered from the history only, nothing written, stopped at the end of the history),
takes the stack of every history event the code reproduced (matched by position), and
replaces the execution's stored backtraces with them.

Sources: the text of every loaded component that has one (JS) is kept by digest
(`save_component_sources`, at start and after reloads), so a client can show the line of
a backtrace even after the file changed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from engine.components import LoadedComponent, Registry
from engine.core import events as ev
from engine.core.ids import new_run_id
from engine.core.records import Frame
from engine.errors import Conflict
from engine.executors.upgrade import DryRunHost, check_compatible, running_digest
from engine.runtimes.kinds import kind_of
from engine.storage.contract import ComponentSource, LockedExecution, Storage

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from engine.core.clock import Clock
    from engine.executors.base import BaseExecutor


class EngineParts(Protocol):
    """What backtraces need of the engine (`engine.engine.Engine` has it): executors do
    not import the facade above them."""

    @property
    def registry(self) -> Registry: ...
    @property
    def executors(self) -> Sequence[BaseExecutor]: ...
    @property
    def storage(self) -> Storage: ...
    @property
    def own_storage(self) -> Storage: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def deployment_id(self) -> str: ...
    @property
    def workflow_threads(self) -> Executor: ...


log = logging.getLogger("obelisk.backtraces")


# ---------------------------------------------------------------------------------------
# Component sources
# ---------------------------------------------------------------------------------------


def component_sources(components: Iterable[LoadedComponent]) -> list[ComponentSource]:
    """The sources of the components that have one (JS), by digest."""
    out: dict[str, ComponentSource] = {}
    for c in components:
        if c.source is not None and c.config.location is not None:
            digest = c.component_id.digest
            out[digest] = ComponentSource(digest, str(c.config.location), c.source)
    return list(out.values())


async def save_component_sources(storage: Storage, registry: Registry) -> None:
    await storage.save_component_sources(component_sources(registry.components))


def loaded_source(engine: EngineParts, digest: str) -> ComponentSource | None:
    """A source still in memory (deployed now, or an old version running pinned
    executions), for digests the database does not have (yet)."""
    candidates: list[LoadedComponent] = list(engine.registry.components)
    candidates += [e.component for e in engine.executors]
    for source in component_sources(candidates):
        if source.digest == digest:
            return source
    return None


async def get_component_source(engine: EngineParts, digest: str) -> ComponentSource | None:
    stored = await engine.storage.get_component_source(digest)
    return stored if stored is not None else loaded_source(engine, digest)


def source_saver(engine: EngineParts) -> Callable[[Any], None]:
    """A reload listener that keeps the sources of the newly deployed registry."""
    tasks: set[asyncio.Task[None]] = set()

    async def save() -> None:
        try:
            await save_component_sources(engine.own_storage, engine.registry)
        except Exception as e:  # the engine may be closing; the sources stay in memory
            log.warning("could not store component sources after a reload: %s", e)

    def on_reload(status: Any) -> None:
        if getattr(status, "trigger", None) == "start":
            return  # `Engine.start` stored this registry's sources before it started
        if getattr(status, "ok", True):
            task = asyncio.get_running_loop().create_task(save())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    return on_reload


# ---------------------------------------------------------------------------------------
# persist-backtraces
# ---------------------------------------------------------------------------------------


class BacktraceCapture(DryRunHost):
    """A dry run that remembers the stack the guest passed for each history event it
    reproduced: `captured` is (version, frames) in log order."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.captured: list[tuple[int, list[Frame]]] = []

    def _match(self, want: Any, matches: Any = None) -> ev.HistoryEventKind | None:
        got = super()._match(want, matches)
        if got is not None and self.stack:
            self.captured.append((self.history[self.cursor - 1][0], self.stack))
        return got


@dataclass(frozen=True, slots=True)
class PersistedBacktraces:
    execution_id: str
    #: The code that was replayed (its source: `GET /v1/components/{digest}/source`).
    component_digest: str
    #: History events in the log (all of them were reproduced by the code).
    history_events: int
    #: Events that got a backtrace (the others were written without a guest call, e.g.
    #: the implicit close of join sets when the function returned).
    stored: int


def _current_code(
    engine: EngineParts, ffqn: str, events: list[ev.StoredEvent]
) -> tuple[LoadedComponent, Registry]:
    """The code that runs the execution now, with the registry it runs in: an old version
    still loaded for pinned executions when the log says it ran on that one, else the
    deployed one."""
    _, deployed = engine.registry.function(ffqn)
    digest = running_digest(events)
    if digest is not None and digest != deployed.component_id.digest:
        for executor in engine.executors:
            c = executor.component
            if c.component_id.digest == digest and ffqn in c.functions:
                return c, getattr(executor, "registry", engine.registry)
    return deployed, engine.registry


async def persist_backtraces(engine: EngineParts, execution_id: str) -> PersistedBacktraces:
    """Replay the execution (finished or not) against its current code without writing
    history, and store the backtraces of its events, replacing the older ones.

    NotFound: unknown execution. UnknownFunction: its function is not deployed any more.
    Conflict: not a JS workflow, or its log does not replay against the deployed code."""
    storage = engine.storage
    summary = await storage.get_summary(execution_id)
    events = await storage.get_events(execution_id)
    responses = await storage.get_responses(execution_id)
    component, registry = _current_code(engine, summary.ffqn, events)
    if not kind_of(component.config.type).backtraces or component.runner is None:
        raise Conflict(
            f"execution {execution_id} ({summary.ffqn}) is not a JS workflow: "
            "only workflow_js executions have backtraces"
        )
    created = events[0].event
    assert isinstance(created, ev.Created)
    below_version = events[-1].version + 1
    now = engine.clock.now()
    locked = LockedExecution(
        execution_id=execution_id,
        ffqn=created.ffqn,
        params=created.params,
        next_version=below_version,
        run_id=new_run_id(),
        lock_expires_at=now + timedelta(hours=1),  # never used: nothing is written
        parent=created.parent,
        summary=summary,
        events=events,
        responses=responses,
    )
    host = BacktraceCapture(
        locked=locked,
        storage=storage,
        registry=registry,
        clock=engine.clock,
        loop=asyncio.get_running_loop(),
        component_id=component.component_id,
        executor_id="Exr_persist-backtraces",
        deployment_id=engine.deployment_id,
        lock_expiry=timedelta(milliseconds=component.config.exec.lock_expiry_ms),
        strategy="await",
    )
    ok, reason = await asyncio.get_running_loop().run_in_executor(
        engine.workflow_threads, check_compatible, component.runner, host, created.params
    )
    if not ok:
        raise Conflict(
            f"cannot capture the backtraces of execution {execution_id}: its log does not "
            f"replay against the current code of {summary.ffqn} "
            f"({component.component_id.digest}): {reason}"
        )
    digest = component.component_id.digest
    await storage.save_component_sources(component_sources([component]))
    stored = await storage.replace_backtraces(execution_id, digest, host.captured, below_version)
    history = sum(1 for e in events if isinstance(e.event, ev.HistoryEvent))
    log.info("persisted %d backtraces of %s (%s)", stored, execution_id, digest)
    return PersistedBacktraces(execution_id, digest, history, stored)


__all__ = [
    "BacktraceCapture",
    "PersistedBacktraces",
    "component_sources",
    "get_component_source",
    "loaded_source",
    "persist_backtraces",
    "save_component_sources",
    "source_saver",
]
