"""The synchronous host API a workflow runtime (JS or WASM) calls from its guest thread.

A runtime turns guest calls (`obelisk.createJoinSet()`, `step(i)`, `stepSubmit(js, …)`)
into calls of a `WorkflowHost`. The host answers them from the execution's history when
replaying, or writes new history (SPEC §7.1). Every method may block the calling thread
(waiting for a response, or for the database), never the event loop.

A method may raise `RunAborted`: the run must stop as soon as possible and its outcome is
discarded (the host has already decided what to write: blocked with `interrupt`, lock
lost, nondeterminism, cancellation…). Runtimes must not let guest code swallow it for
good: after the first `RunAborted`, every later host call raises it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from engine.core.records import Frame


class RunAborted(Exception):
    """Stop the guest now; the host has taken care of the execution's state."""


class WorkflowCallError(Exception):
    """A guest called the host API wrongly (unknown FFQN, bad params, closed join set…).

    Runtimes surface it as a guest exception (JS `Error`), which, uncaught, ends the
    workflow with `execution_failure{uncategorized}` naming the problem.
    """


@dataclass(frozen=True, slots=True)
class ChildResponse:
    """A finished child: `result` is the §9.2 form `{"ok": v}` / `{"err": v}` /
    `{"execution_failure": {...}}`."""

    execution_id: str
    ffqn: str
    result: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DelayResponse:
    delay_id: str
    outcome: Literal["ok", "cancelled"]


JoinNextAnswer = ChildResponse | DelayResponse


@dataclass(frozen=True, slots=True)
class AllProcessed:
    """Nothing is left to await in the join set."""


@dataclass(frozen=True, slots=True)
class Pending:
    """`join_next_try`: requests are outstanding but no response has arrived yet."""


@dataclass(frozen=True, slots=True)
class FunctionMismatch:
    """`…AwaitNext`: the next response belongs to another function (it is consumed)."""

    response: ChildResponse
    requested_ffqn: str


#: A duration in milliseconds from now, an absolute time (unix ms), or "now".
ScheduleAtArg = Literal["now"] | tuple[Literal["in"], int] | tuple[Literal["at"], int]


class WorkflowHost(Protocol):
    execution_id: str

    # -- determinism -------------------------------------------------------------
    def now_ms(self) -> int:
        """The workflow's clock (unix ms), recorded in the log."""
        ...

    def random_u64(self, min_: int, max_inclusive: int) -> int: ...

    def random_string(self, min_len: int, max_len_exclusive: int) -> str: ...

    def execution_id_generate(self) -> str: ...

    # -- join sets -------------------------------------------------------------------
    def join_set_create(self, name: str | None = None) -> str:
        """A generated (`g:N`) or named (`n:name`) join set; returns its id."""
        ...

    def submit(self, join_set_id: str, ffqn: str, params: list[Any]) -> str:
        """Submit a child execution into the join set; returns the derived child id."""
        ...

    def submit_delay(self, join_set_id: str, schedule_at: ScheduleAtArg) -> str:
        """Submit a delay into the join set; returns the delay id."""
        ...

    def join_next(
        self, join_set_id: str, requested_ffqn: str | None = None
    ) -> JoinNextAnswer | AllProcessed | FunctionMismatch:
        """Wait for the next response in completion order (blocks the guest thread)."""
        ...

    def join_next_try(self, join_set_id: str) -> JoinNextAnswer | Pending | AllProcessed: ...

    def join_set_close(self, join_set_id: str) -> None: ...

    def get_result(self, child_execution_id: str) -> dict[str, Any]:
        """The result of a child whose response was already processed."""
        ...

    # -- conveniences built on the above -----------------------------------------------
    def call(self, ffqn: str, params: list[Any]) -> dict[str, Any]:
        """Direct call: one-off join set, submit, blocking join next, close."""
        ...

    def sleep(self, schedule_at: ScheduleAtArg, name: str | None = None) -> int | None:
        """Persistent sleep; returns the wake-up time (unix ms), None when cancelled."""
        ...

    def schedule(self, ffqn: str, params: list[Any], schedule_at: ScheduleAtArg) -> str:
        """Fire-and-forget top-level execution; returns its id."""
        ...

    def stub(self, execution_id: str, result: dict[str, Any]) -> None: ...

    # -- not history ---------------------------------------------------------------------
    def log(self, level: str, message: str) -> None: ...

    def set_stack(self, frames: list[Frame]) -> None:
        """The guest stack of the host call about to be made (for backtraces)."""
        ...

    def function_exists(self, ffqn: str) -> bool: ...

    def interfaces(self) -> dict[str, dict[str, FunctionShape]]:
        """Deployed exported interfaces `ns:pkg/ifc` → function name → shape, to build
        the importable modules (and their -obelisk-ext/-schedule/-stub variants)."""
        ...


@dataclass(frozen=True, slots=True)
class FunctionShape:
    ffqn: str
    param_names: tuple[str, ...]
    is_workflow: bool
