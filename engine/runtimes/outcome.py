"""What one attempt of a function run, or one run of a workflow, returns to the executor.

Runners (WASM, JS) are synchronous and run in worker threads; they return one of
these values and never raise for guest faults. The executor (not the runner) maps an
outcome to an event with the retry rules of the state machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.records import LogLevel, LogLine, LogSink, LogStream

__all__ = [
    "LogLevel",
    "LogLine",
    "LogSink",
    "LogStream",
    "RunCancelled",
    "RunErr",
    "RunOk",
    "RunOutcome",
    "RunTimedOut",
    "RunTrap",
    "WfAborted",
    "WfErr",
    "WfOk",
    "WfTimedOut",
    "WfTrap",
    "WorkflowOutcome",
]


@dataclass(frozen=True, slots=True)
class RunOk:
    """The function returned `ok(value)`; `value` is §9.2 JSON (None for `ok` without payload)."""

    value: Any


@dataclass(frozen=True, slots=True)
class RunErr:
    """The function returned `err(value)`.

    `permanent` is true when the err value is a variant case whose name contains
    "permanent" (such errors are not retried).
    """

    value: Any
    permanent: bool = False


@dataclass(frozen=True, slots=True)
class RunTrap:
    """The guest trapped, threw where it may not, or could not be instantiated."""

    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RunTimedOut:
    """The deadline passed before the guest returned (it was interrupted)."""


@dataclass(frozen=True, slots=True)
class RunCancelled:
    """The run was interrupted because cancellation was requested."""


RunOutcome = RunOk | RunErr | RunTrap | RunTimedOut | RunCancelled


# -- workflows ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WfOk:
    """The function returned; `value` is JSON (None for `undefined`)."""

    value: Any


@dataclass(frozen=True, slots=True)
class WfErr:
    """The function threw; `value` is the err value (see the module docstring)."""

    value: Any


@dataclass(frozen=True, slots=True)
class WfTrap:
    """Misuse of the host API, or an engine failure: `execution_failure{uncategorized}`."""

    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class WfAborted:
    """The host raised `RunAborted`, or `interrupt()` was called: discard the run."""


@dataclass(frozen=True, slots=True)
class WfTimedOut:
    """The guest computed longer than `spin_timeout` without a host call."""


WorkflowOutcome = WfOk | WfErr | WfTrap | WfAborted | WfTimedOut
