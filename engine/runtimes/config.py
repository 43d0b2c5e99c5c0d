"""A component's settings as `deployment.toml` declares them (SPEC §9.1): plain records,
parsed by `engine.deployment`, read by the kinds of components (`engine.runtimes.kinds`)
and the executors."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.core.events import is_workflow_type
from engine.wit.types import WitType


@dataclass(frozen=True, slots=True)
class ExecConfig:
    batch_size: int = 5
    lock_expiry_ms: int = 1000
    tick_sleep_ms: int = 200
    #: How many executions of this component may run at once in this process.
    max_inflight: int = 64


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: WitType
    type_text: str


@dataclass(frozen=True, slots=True)
class ComponentConfig:
    type: str  # its kind: a section of `engine.runtimes.kinds`
    name: str
    location: Path | None
    section: str  # e.g. `[[activity_wasm]] #1 "step"`, for error messages
    ffqn: str | None = None
    params: tuple[Param, ...] = ()
    return_type: WitType | None = None
    return_type_text: str | None = None
    env_vars: dict[str, str] = field(default_factory=dict)
    max_retries: int | None = 5
    retry_exp_backoff_ms: int = 100
    exec: ExecConfig = ExecConfig()
    allowed_hosts: tuple[str, ...] = ()
    blocking_strategy: str = "await"
    export: str | None = None

    @property
    def is_workflow(self) -> bool:
        return is_workflow_type(self.type)
