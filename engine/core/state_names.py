"""The names of the execution states (SPEC §4), on their own: the REST client and the CLI
need them without loading the state machine."""

from __future__ import annotations

from typing import Literal, get_args

StateName = Literal[
    "pending_at", "locked", "blocked_by_join_set", "paused", "cancelling", "finished"
]
#: Every state name, in the order lists and counts show them.
STATE_NAMES: tuple[StateName, ...] = get_args(StateName)

#: How a finished execution ended: `ok`, `err` (the function's own error) or `failed`
#: (an execution failure: timed out, cancelled, nondeterminism, …).
ResultClass = Literal["ok", "err", "failed"]
RESULT_CLASSES: tuple[ResultClass, ...] = get_args(ResultClass)


def result_class(result_kind: str) -> ResultClass:
    """The class of a Finished state's `result_kind` (`ok`, `err`,
    `execution_failure:<kind>`). The storages compute the same in SQL."""
    if result_kind == "ok":
        return "ok"
    if result_kind == "err":
        return "err"
    return "failed"


__all__ = ["RESULT_CLASSES", "STATE_NAMES", "ResultClass", "StateName", "result_class"]
