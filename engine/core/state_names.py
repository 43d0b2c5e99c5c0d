"""The names of the execution states (SPEC §4), on their own: the REST client and the CLI
need them without loading the state machine."""

from __future__ import annotations

from typing import Literal, get_args

StateName = Literal[
    "pending_at", "locked", "blocked_by_join_set", "paused", "cancelling", "finished"
]
#: Every state name, in the order lists and counts show them.
STATE_NAMES: tuple[StateName, ...] = get_args(StateName)

__all__ = ["STATE_NAMES", "StateName"]
