"""The execution log's events, history events and responses (SPEC §3) as typed values.

Everything here is a `msgspec.Struct`, encoded as JSON in the database and the API.
Ids are stored as strings (parse them with `engine.core.ids` where structure matters).
Tagged unions use a `"type"` field, e.g. `{"type": "locked", "executor_id": …}`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

import msgspec

# ---------------------------------------------------------------------------
# Results (SPEC §5.1)
# ---------------------------------------------------------------------------

FailureKind = Literal[
    "timed_out", "nondeterminism_detected", "cancelled", "out_of_fuel", "uncategorized"
]


class ResultOk(msgspec.Struct, frozen=True, tag="ok", tag_field="type"):
    value: Any = None


class ResultErr(msgspec.Struct, frozen=True, tag="err", tag_field="type"):
    value: Any = None


class ExecutionFailure(msgspec.Struct, frozen=True, tag="execution_failure", tag_field="type"):
    kind: FailureKind
    reason: str = ""
    detail: str = ""


ExecutionResult = ResultOk | ResultErr | ExecutionFailure


def result_kind(result: ExecutionResult) -> str:
    """`ok`, `err` or `execution_failure:<kind>` — the Finished state's summary."""
    if isinstance(result, ResultOk):
        return "ok"
    if isinstance(result, ResultErr):
        return "err"
    return f"execution_failure:{result.kind}"


def result_to_json(result: ExecutionResult) -> dict[str, Any]:
    """The §9.2 form: `{"ok": v}`, `{"err": v}`, `{"execution_failure": {...}}`."""
    if isinstance(result, ResultOk):
        return {"ok": result.value}
    if isinstance(result, ResultErr):
        return {"err": result.value}
    return {
        "execution_failure": {
            "kind": result.kind,
            "reason": result.reason,
            "detail": result.detail,
        }
    }


def result_from_json(value: Any) -> ExecutionResult:
    """Inverse of `result_to_json`; raises ValueError on anything else."""
    if isinstance(value, dict) and len(value) == 1:
        ((key, inner),) = value.items()
        if key == "ok":
            return ResultOk(inner)
        if key == "err":
            return ResultErr(inner)
        if key == "execution_failure" and isinstance(inner, dict):
            return msgspec.convert({"type": "execution_failure", **inner}, ExecutionFailure)
    raise ValueError('expected {"ok": value} or {"err": value}')


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------

#: A kind of component: its TOML section, e.g. `activity_wasm`, `workflow_js` (the kinds
#: are registered in `engine.runtimes.kinds`; the log only stores the name).
ComponentType = str

#: The kind whose executions are answered by hand (`stub`), never run.
STUB_TYPE = "activity_stub"


def is_workflow_type(component_type: str) -> bool:
    """Whether components of this kind are workflows. The one rule, from Obelisk's names
    (`workflow_*` / `activity_*`), which every kind's section follows
    (`engine.runtimes.kinds.register_kind` checks it)."""
    return component_type.startswith("workflow_")


def accepts_stub(component_type: str) -> bool:
    """Whether executions of this kind of component may be stubbed (SPEC: stub activities)."""
    return component_type == STUB_TYPE


class ComponentId(msgspec.Struct, frozen=True):
    type: ComponentType
    name: str
    digest: str

    @property
    def is_workflow(self) -> bool:
        return is_workflow_type(self.type)


class RetryConfig(msgspec.Struct, frozen=True):
    max_retries: int | None  # None = retry forever
    retry_exp_backoff_ms: int


# ---------------------------------------------------------------------------
# History events (SPEC §3.2)
# ---------------------------------------------------------------------------


class PersistRandomU64(msgspec.Struct, frozen=True, tag="random_u64", tag_field="type"):
    min: int
    max_inclusive: int


class PersistRandomString(msgspec.Struct, frozen=True, tag="random_string", tag_field="type"):
    min_len: int
    max_len_exclusive: int


class PersistExecutionId(msgspec.Struct, frozen=True, tag="execution_id", tag_field="type"):
    pass


PersistKind = PersistRandomU64 | PersistRandomString | PersistExecutionId


class ChildExecutionRequest(
    msgspec.Struct, frozen=True, tag="child_execution_request", tag_field="type"
):
    child_execution_id: str
    target_ffqn: str
    params: list[Any]


class ScheduleAtNow(msgspec.Struct, frozen=True, tag="now", tag_field="type"):
    pass


class ScheduleAtTime(msgspec.Struct, frozen=True, tag="at", tag_field="type"):
    at: datetime


class ScheduleAtIn(msgspec.Struct, frozen=True, tag="in", tag_field="type"):
    milliseconds: int


ScheduleAt = ScheduleAtNow | ScheduleAtTime | ScheduleAtIn


class DelayRequest(msgspec.Struct, frozen=True, tag="delay_request", tag_field="type"):
    delay_id: str
    expires_at: datetime
    schedule_at: ScheduleAt


JoinSetRequestKind = ChildExecutionRequest | DelayRequest


class Persist(msgspec.Struct, frozen=True, tag="persist", tag_field="type"):
    value: Any
    kind: PersistKind


class JoinSetCreate(msgspec.Struct, frozen=True, tag="join_set_create", tag_field="type"):
    join_set_id: str


class JoinSetRequest(msgspec.Struct, frozen=True, tag="join_set_request", tag_field="type"):
    join_set_id: str
    request: JoinSetRequestKind


class JoinNext(msgspec.Struct, frozen=True, tag="join_next", tag_field="type"):
    join_set_id: str
    run_expires_at: datetime
    requested_ffqn: str | None = None
    closing: bool = False


JoinNextTryOutcome = Literal["found", "pending", "all_processed"]


class JoinNextTry(msgspec.Struct, frozen=True, tag="join_next_try", tag_field="type"):
    join_set_id: str
    outcome: JoinNextTryOutcome


class JoinNextTooMany(msgspec.Struct, frozen=True, tag="join_next_too_many", tag_field="type"):
    join_set_id: str
    requested_ffqn: str | None = None


class Schedule(msgspec.Struct, frozen=True, tag="schedule", tag_field="type"):
    execution_id: str
    schedule_at: ScheduleAt
    target_ffqn: str


class Stub(msgspec.Struct, frozen=True, tag="stub", tag_field="type"):
    target_execution_id: str
    result_hash: str
    outcome: Literal["written", "conflict"]


HistoryEventKind = (
    Persist
    | JoinSetCreate
    | JoinSetRequest
    | JoinNext
    | JoinNextTry
    | JoinNextTooMany
    | Schedule
    | Stub
)

# ---------------------------------------------------------------------------
# Events (SPEC §3.1)
# ---------------------------------------------------------------------------


class Created(msgspec.Struct, frozen=True, tag="created", tag_field="type"):
    ffqn: str
    params: list[Any]
    scheduled_at: datetime
    component_id: ComponentId
    deployment_id: str
    parent: tuple[str, str] | None = None  # (execution id, join set id)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    scheduled_by: str | None = None


class Locked(msgspec.Struct, frozen=True, tag="locked", tag_field="type"):
    component_id: ComponentId
    executor_id: str
    run_id: str
    lock_expires_at: datetime
    retry_config: RetryConfig


class Unlocked(msgspec.Struct, frozen=True, tag="unlocked", tag_field="type"):
    backoff_expires_at: datetime
    reason: str


class TemporarilyFailed(msgspec.Struct, frozen=True, tag="temporarily_failed", tag_field="type"):
    backoff_expires_at: datetime
    reason: str
    detail: str = ""


class TemporarilyTimedOut(
    msgspec.Struct, frozen=True, tag="temporarily_timed_out", tag_field="type"
):
    backoff_expires_at: datetime


class Finished(msgspec.Struct, frozen=True, tag="finished", tag_field="type"):
    result: ExecutionResult


class HistoryEvent(msgspec.Struct, frozen=True, tag="history_event", tag_field="type"):
    event: HistoryEventKind


class Paused(msgspec.Struct, frozen=True, tag="paused", tag_field="type"):
    pass


class Unpaused(msgspec.Struct, frozen=True, tag="unpaused", tag_field="type"):
    pass


class CancellationRequested(
    msgspec.Struct,
    frozen=True,
    tag="cancellation_requested",
    tag_field="type",
    omit_defaults=True,  # a plain request is stored as before: old logs decode unchanged
):
    #: An operator forced the cancellation of a workflow that is not `-cancellable`
    #: (SPEC §8 would refuse it): e.g. one stuck in an endless loop.
    forced: bool = False


class UpgradeSuccess(msgspec.Struct, frozen=True, tag="success", tag_field="type"):
    pass


class UpgradeFailed(msgspec.Struct, frozen=True, tag="failed", tag_field="type"):
    reason: str


class ComponentUpgradeFinished(
    msgspec.Struct, frozen=True, tag="component_upgrade_finished", tag_field="type"
):
    digest: str
    deployment_id: str
    outcome: UpgradeSuccess | UpgradeFailed


Event = (
    Created
    | Locked
    | Unlocked
    | TemporarilyFailed
    | TemporarilyTimedOut
    | Finished
    | HistoryEvent
    | Paused
    | Unpaused
    | CancellationRequested
    | ComponentUpgradeFinished
)


class StoredEvent(msgspec.Struct, frozen=True):
    """An event as it sits in the log: its version (index) and when it was written."""

    version: int
    created_at: datetime
    event: Event
    backtrace_id: int | None = None


# ---------------------------------------------------------------------------
# Responses (SPEC §3.3)
# ---------------------------------------------------------------------------


class ChildExecutionFinished(
    msgspec.Struct, frozen=True, tag="child_execution_finished", tag_field="type"
):
    child_execution_id: str
    join_set_id: str
    finished_version: int
    result: ExecutionResult


class DelayFinished(msgspec.Struct, frozen=True, tag="delay_finished", tag_field="type"):
    delay_id: str
    join_set_id: str
    outcome: Literal["ok", "cancelled"] = "ok"


Response = ChildExecutionFinished | DelayFinished


class StoredResponse(msgspec.Struct, frozen=True):
    cursor: int
    created_at: datetime
    response: Response


def response_join_set(response: Response) -> str:
    return response.join_set_id


# ---------------------------------------------------------------------------
# JSON codec
# ---------------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(Event)
_response_decoder = msgspec.json.Decoder(Response)


# The codec's own methods, not functions around them: the writer encodes ~10 values per
# workflow step, and a wrapper is one more Python call each.
encode: Callable[[Any], bytes] = _encoder.encode
decode_event: Callable[[bytes | str], Event] = _event_decoder.decode
decode_response: Callable[[bytes | str], Response] = _response_decoder.decode


def to_builtins(value: Any) -> Any:
    """A JSON-ready structure (dicts/lists/str) for the API."""
    return msgspec.to_builtins(value)
