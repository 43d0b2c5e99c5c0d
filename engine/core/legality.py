"""Which steering commands apply to an execution (SPEC §4.3, §8): pause, unpause, cancel.

Pure decisions, one function per rule, each returning the refusal (an error to raise or
to show) or None when the command applies. The storage backends raise what these return
(`engine.storage.common` builds the events around them); the workflow host and the
cancellation driver ask `is_cancellable`; the console asks the same functions before it
offers a key, so that it never re-decides (and words) a rule differently.
"""

from __future__ import annotations

from engine.core.errors import Conflict, NotCancellable

#: SPEC §8: a workflow is cancellable when its function name ends with this.
CANCELLABLE_SUFFIX = "-cancellable"


def function_name(ffqn: str) -> str:
    """The function of an FFQN (`ns:pkg/ifc.fn` → `fn`)."""
    return ffqn.rsplit(".", 1)[-1]


def is_cancellable(ffqn: str, is_workflow: bool) -> bool:
    """SPEC §8: activities, and workflows whose function name ends in `-cancellable`
    (others only by force: `cancel_refusal`)."""
    return not is_workflow or function_name(ffqn).endswith(CANCELLABLE_SUFFIX)


def cancel_refusal(
    execution_id: str,
    ffqn: str,
    *,
    is_workflow: bool,
    finished: bool,
    cancelling: bool,
    force: bool = False,
) -> NotCancellable | Conflict | None:
    """Why `execution_id` may not be cancelled now (SPEC §8), or None when it may: the
    one rule of the storage backends (which raise the error), the API and CLI (through
    them) and the console (which shows its message before asking).

    `force` lifts only the `-cancellable` rule: an operator's way to end a workflow that
    can never finish (an endless loop retried forever). A finished execution or a second
    request is a conflict, forced or not."""
    if not force and not is_cancellable(ffqn, is_workflow):
        return NotCancellable(
            f"execution {execution_id} ({ffqn}) is not cancellable: only activities and "
            "workflows whose function name ends in -cancellable can be cancelled (a forced "
            "cancel ends it anyway)"
        )
    if finished:
        return Conflict(f"execution {execution_id} is already finished")
    if cancelling:
        return Conflict(f"cancellation of execution {execution_id} was already requested")
    return None


def cancel_is_forced(ffqn: str, is_workflow: bool, force: bool) -> bool:
    """Whether a cancellation is recorded as forced: only where the force was needed
    (forcing what is cancellable anyway is a plain cancel, stored as before forced
    cancels existed)."""
    return force and not is_cancellable(ffqn, is_workflow)


def _subject(execution_id: str, subject: str | None) -> str:
    """How a refusal names the execution: `execution <id>` unless the caller words it
    (the console names executions by their id alone)."""
    return f"execution {execution_id}" if subject is None else subject


def pause_refusal(
    execution_id: str,
    *,
    finished: bool,
    cancelling: bool,
    paused: bool,
    running_activity: bool,
    subject: str | None = None,
) -> Conflict | None:
    """Why `execution_id` may not be paused now (SPEC §4.3), or None when it may.
    `running_activity`: an activity whose run holds it (a locked workflow may be paused:
    its run is released first). Cancel supersedes pause. `subject`: see `_subject`."""
    who = _subject(execution_id, subject)
    if finished:
        return Conflict(f"{who} is already finished")
    if cancelling:
        return Conflict(f"{who} is being cancelled and cannot be paused")
    if paused:
        return Conflict(f"{who} is already paused")
    if running_activity:
        return Conflict(
            f"cannot pause {who}: a running activity cannot be paused "
            "(cancel it instead, or pause it between runs)"
        )
    return None


def unpause_refusal(
    execution_id: str, *, finished: bool, paused: bool, subject: str | None = None
) -> Conflict | None:
    """Why `execution_id` may not be unpaused now, or None when it may."""
    who = _subject(execution_id, subject)
    if finished:
        return Conflict(f"{who} is already finished")
    if not paused:
        return Conflict(f"{who} is not paused")
    return None


__all__ = [
    "CANCELLABLE_SUFFIX",
    "cancel_is_forced",
    "cancel_refusal",
    "function_name",
    "is_cancellable",
    "pause_refusal",
    "unpause_refusal",
]
