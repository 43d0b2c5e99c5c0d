"""The seam between the engine and its runtimes: open this module first.

A *runtime* runs guest code (a WASM component under wasmtime, a JS module in a QuickJS
sandbox). The executors reach it only through the two runner interfaces here:

- `ActivityRunner.run(ffqn, params, ctx)` runs one attempt of an activity and returns a
  `RunOutcome` (`RunOk`, `RunErr`, `RunTrap`, `RunTimedOut`, `RunCancelled`); it never
  raises for what the guest does. `RunContext` is everything else a run gets: its
  deadline, its cancellation flag, where its log lines go, its environment and its
  network policy.
- `WorkflowRunner.run(host, params, ffqn=…, spin_timeout=…)` runs a workflow against a
  `WorkflowHost` (`engine.runtimes.workflow_host`: the replay host answers from the
  log or writes new history) and returns a `WorkflowOutcome` (`WfOk`, `WfErr`, `WfTrap`,
  `WfAborted`, `WfTimedOut`).

A *kind of component* (`ComponentKind`: `activity_wasm`, `workflow_js`, …) ties a
`deployment.toml` section to a runtime: its keys, how a file becomes exported functions
and a runner (`load`), its digest, what a hot reload or an old pinned version needs.
Kinds are registered in `engine.runtimes.kinds`; adding one is a module with a
`ComponentKind` and one line there (or a `register_kind` call).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from engine.core import events as ev
from engine.core.records import LogLine, LogSink
from engine.runtimes.config import ComponentConfig, Param
from engine.runtimes.outcome import (
    RunCancelled,
    RunErr,
    RunOk,
    RunOutcome,
    RunTimedOut,
    RunTrap,
    WfAborted,
    WfErr,
    WfOk,
    WfTimedOut,
    WfTrap,
    WorkflowOutcome,
)
from engine.runtimes.workflow_host import FunctionShape, WorkflowHost
from engine.wit.types import WitType, format_wit_type

if TYPE_CHECKING:
    from engine.runtimes.wasm.activity import WasmEngine

__all__ = [
    "ActivityRunner",
    "ComponentConfig",
    "ComponentKind",
    "FunctionInfo",
    "LoadContext",
    "LoadedComponent",
    "LogLine",
    "LogSink",
    "Param",
    "RunCancelled",
    "RunContext",
    "RunErr",
    "RunOk",
    "RunOutcome",
    "RunTimedOut",
    "RunTrap",
    "StoredSource",
    "WfAborted",
    "WfErr",
    "WfOk",
    "WfTimedOut",
    "WfTrap",
    "WorkflowHost",
    "WorkflowOutcome",
    "WorkflowRunner",
    "declared_function",
    "interfaces_of",
]


# -- runners ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunContext:
    """What one activity run gets besides its params."""

    #: A `time.monotonic()` instant: the run is interrupted then (`RunTimedOut`).
    deadline: float
    #: Set from any thread when the execution's cancellation is requested (`RunCancelled`).
    cancel: threading.Event
    #: Called on the run's thread for every line the guest logs or prints.
    log: LogSink
    #: The guest's environment variables (`env_vars`).
    env: Mapping[str, str]
    #: The network policy: host patterns an outgoing HTTP request may reach
    #: (`allowed_host`); empty: none.
    allowed_hosts: tuple[str, ...] = ()


class ActivityRunner(Protocol):
    """Runs attempts of the activities of one component, on worker threads (several at
    once). Synchronous: it blocks its thread for the run."""

    def run(self, ffqn: str, params: list[Any], ctx: RunContext) -> RunOutcome:
        """One attempt of `ffqn` with §9.2 JSON `params`; never raises for guest faults."""
        ...


class WorkflowRunner(Protocol):
    """Runs the workflows of one component against a host, on worker threads."""

    def run(
        self,
        host: WorkflowHost,
        params: list[Any],
        *,
        ffqn: str | None = None,
        spin_timeout: float | None = None,
    ) -> WorkflowOutcome:
        """Run `ffqn` (default: the function `host` runs) once against `host`, which
        replays the log and records what is new. Never raises for guest faults; a guest
        computing `spin_timeout` seconds without a host call is stopped (`WfTimedOut`)."""
        ...

    def interrupt(self, execution_id: str | None = None) -> None:
        """Stop the runs in progress (all, or `execution_id`'s) from any thread: their
        outcome is `WfAborted`."""
        ...


# -- loaded components --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class FunctionInfo:
    """One exported function of a deployed component."""

    ffqn: str
    params: tuple[Param, ...]
    return_type: WitType | None
    component_name: str
    component_type: str

    @property
    def return_type_text(self) -> str | None:
        return None if self.return_type is None else format_wit_type(self.return_type)


def declared_function(config: ComponentConfig) -> FunctionInfo:
    """The one function a `deployment.toml` section declares (`ffqn`, `params`, …)."""
    assert config.ffqn is not None
    return FunctionInfo(config.ffqn, config.params, config.return_type, config.name, config.type)


def interfaces_of(functions: Mapping[str, FunctionInfo]) -> dict[str, dict[str, FunctionShape]]:
    """The deployed functions by interface, as a workflow's imports see them."""
    out: dict[str, dict[str, FunctionShape]] = {}
    for ffqn, info in functions.items():
        ifc, _, fn = ffqn.rpartition(".")
        out.setdefault(ifc, {})[fn] = FunctionShape(
            ffqn, tuple(p.name for p in info.params), ev.is_workflow_type(info.component_type)
        )
    return out


@dataclass(slots=True)
class LoadedComponent:
    """A component loaded from its file: its id (kind, name, digest), its functions and
    the runner of its kind (None for kinds that are not run, e.g. stubs)."""

    config: ComponentConfig
    component_id: ev.ComponentId
    functions: dict[str, FunctionInfo]
    runner: ActivityRunner | WorkflowRunner | None = None
    #: Its source text, for kinds that keep it (backtraces, old versions: `StoredSource`).
    source: str | None = None

    @property
    def ffqns(self) -> list[str]:
        return sorted(self.functions)

    @property
    def activity_runner(self) -> ActivityRunner:
        assert self.runner is not None and not self.config.is_workflow, self.config.section
        return self.runner  # type: ignore[return-value]  # (no `cast`: a call per run)

    @property
    def workflow_runner(self) -> WorkflowRunner:
        assert self.runner is not None and self.config.is_workflow, self.config.section
        return self.runner  # type: ignore[return-value]  # (no `cast`: a call per run)


class StoredSource(Protocol):
    """The source text of a version of a component, as the storage keeps it."""

    @property
    def source(self) -> str: ...

    @property
    def file(self) -> str: ...


@dataclass(frozen=True, slots=True)
class LoadContext:
    """What loading a component may use: the shared wasmtime engine (compiled code is
    cached by digest under `cache_dir`) and, for rebuilding an old version, the stored
    source of a digest."""

    wasm_engine: WasmEngine
    cache_dir: Path
    stored_source: Callable[[str], Awaitable[StoredSource | None]] | None = None


# -- kinds of components ------------------------------------------------------------------
class ComponentKind(ABC):
    """One kind of component: a `deployment.toml` section and what it takes to load,
    reload and run what it declares. Instances are stateless and registered once
    (`engine.runtimes.kinds`)."""

    #: The TOML section and the component type in the log (`activity_*` / `workflow_*`).
    section: ClassVar[str]
    #: The TOML keys a section of this kind may have.
    keys: ClassVar[frozenset[str]]
    #: The function is declared in the TOML (`ffqn`, `params`, `return_type`), not read
    #: from the file (JS, stubs).
    declares_function: ClassVar[bool] = False
    #: A `location` file is required.
    has_location: ClassVar[bool] = True
    #: Executions are run by an executor (stubs: answered by hand).
    executed: ClassVar[bool] = True
    #: Workflows of this kind can show backtraces replayed from their stored source.
    backtraces: ClassVar[bool] = False
    #: What an old version is rebuilt from, for messages ("source", "compiled code").
    old_version_from: ClassVar[str] = ""

    @property
    def role(self) -> Literal["activity", "workflow"]:
        return "workflow" if ev.is_workflow_type(self.section) else "activity"

    def prepare(self, cache_dir: Path) -> None:
        """Before components of this kind are loaded (once per load, on a worker thread):
        e.g. compile a shared interpreter. Must be idempotent."""
        return None

    def digest(self, config: ComponentConfig, data: bytes) -> str:
        """The component's digest (SPEC §2) from its file's bytes (b"" without a file),
        computed without loading it: a reload compares digests to reuse what is loaded."""
        from engine.runtimes.digests import file_digest

        return file_digest(data)

    @abstractmethod
    def load(self, config: ComponentConfig, data: bytes, ctx: LoadContext) -> LoadedComponent:
        """The component from its file (on a worker thread: compiling takes a while).
        Raises `DeploymentError` naming the section and key."""

    def check(self, component: LoadedComponent, functions: Mapping[str, FunctionInfo]) -> None:
        """Check the component against every deployed function (a workflow's imports).
        Raises `DeploymentError`."""
        return None

    async def rebuild(
        self, config: ComponentConfig, digest: str, ctx: LoadContext
    ) -> LoadedComponent | None:
        """An old version (`digest`) of the component `config` declares, for executions
        pinned to it (workflows): None when this engine does not have what it takes."""
        return None
