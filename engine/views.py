"""The JSON views of the engine (SPEC §11): the shapes the REST API answers with, and
the functions that build them from what `Engine`'s methods answer.

One module for every front end: the REST API (`engine.server.api`) builds its answers
here, the REST client (`engine.client`) types what it receives with the same shapes, and
the console's embedded backend (`obelisk_tui.backend`) builds the very same answers
without HTTP (both with `engine.answers`), so that its screens cannot tell the two
backends apart. Timestamps are
ISO 8601 UTC strings, e.g. "2025-01-31T12:00:00.123456Z". What a front end passes to
`Engine` and catches from it is `engine.api_types`.

Light on purpose (no msgspec, nothing of the engine but the state names): the REST
client and the CLI import it at start.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, NotRequired, TypedDict

from engine.core.state_names import RESULT_CLASSES, STATE_NAMES, ResultClass, StateName

# ---------------------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------------------


class ExecutionInfo(TypedDict):
    """One execution: a row of `GET /v1/executions`, or `GET /v1/executions/{id}/status`."""

    execution_id: str
    ffqn: str
    component_type: str
    #: The pending state with its overlays, tagged by "type": pending_at, locked,
    #: blocked_by_join_set, paused{underlying}, cancelling{underlying}, finished.
    state: dict[str, Any]
    created_at: str
    updated_at: str
    #: The version the next appended event gets (= number of events in the log).
    next_version: int
    parent_id: str | None
    scheduled_at: str | None
    lock_expires_at: str | None
    temporary_event_count: int
    #: `{"ok": v}`, `{"err": v}` or `{"execution_failure": {kind, reason, detail}}`.
    result: dict[str, Any] | None
    #: Only in lists asked with `extras`: direct children, type of the last event.
    children: NotRequired[int]
    last_event: NotRequired[str | None]


class SubmitAnswer(TypedDict):
    execution_id: str


class EventEntry(TypedDict):
    version: int
    created_at: str
    #: The event tagged by "type" (created, locked, finished, history_event, …).
    event: dict[str, Any]
    backtrace_id: NotRequired[int | None]


class ResponseEntry(TypedDict):
    cursor: int
    created_at: str
    response: dict[str, Any]


class LogEntry(TypedDict):
    id: int
    run_id: str | None
    created_at: str
    level: str
    stream: str
    message: str


class ParamInfo(TypedDict):
    name: str
    type: str


class FunctionExport(TypedDict):
    ffqn: str
    params: list[ParamInfo]
    return_type: str | None


class ComponentInfo(TypedDict):
    name: str
    type: str
    digest: str
    location: str | None
    exports: list[FunctionExport]


class FrameInfo(TypedDict):
    file: str
    line: int
    column: int
    function: str


class BacktraceInfo(TypedDict):
    """The guest stack (innermost frame first) of the host call that wrote one event."""

    execution_id: str
    version: int
    backtrace_id: int
    #: The code that ran: its source is `ApiClient.component_source(component_digest)`.
    component_digest: str
    frames: list[FrameInfo]


class ComponentSourceInfo(TypedDict):
    digest: str
    file: str
    source: str


class DeploymentInfo(TypedDict):
    deployment_id: str
    components: list[ComponentInfo]
    #: The start or the last reload attempt (`engine.reload.ReloadStatus.to_json`):
    #: generation, at, trigger, ok, error, changes, upgrades, pinned, duration_ms, ….
    reload: dict[str, Any]


#: How a reload's error starts when the new deployment is in force and only its workflow
#: upgrade checks failed (`engine.reload`): not "the previous version stays".
UPGRADES_UNCHECKED = "the deployment is in force, but its workflow upgrades failed"


def upgrades_unchecked(reload: Mapping[str, Any]) -> bool:
    """Whether a failed reload (`DeploymentInfo.reload`) is in force all the same."""
    return str(reload.get("error") or "").startswith(UPGRADES_UNCHECKED)


def lock_held(info: ExecutionInfo, now: datetime) -> bool:
    """Whether the execution's `lock_expires_at` is worth showing: a locked one's always
    (an expired one says so), a blocked workflow's only while a run still holds it."""
    state: Mapping[str, Any] = info["state"]
    while state.get("type") in ("paused", "cancelling") and isinstance(
        state.get("underlying"), dict
    ):
        state = state["underlying"]
    expires = info["lock_expires_at"]
    if state.get("type") != "blocked_by_join_set" or expires is None:
        return True
    return datetime.fromisoformat(expires.replace("Z", "+00:00")) > now


class PersistBacktracesAnswer(TypedDict):
    execution_id: str
    component_digest: str
    #: History events in the log, all reproduced by the code.
    history_events: int
    #: Events that got a backtrace.
    stored: int


class ErrorBody(TypedDict):
    error: str


__all__ = [
    "RESULT_CLASSES",
    "STATE_NAMES",
    "UPGRADES_UNCHECKED",
    "BacktraceInfo",
    "ComponentInfo",
    "ComponentSourceInfo",
    "DeploymentInfo",
    "ErrorBody",
    "EventEntry",
    "ExecutionInfo",
    "FrameInfo",
    "FunctionExport",
    "LogEntry",
    "ParamInfo",
    "PersistBacktracesAnswer",
    "ResponseEntry",
    "ResultClass",
    "StateName",
    "SubmitAnswer",
    "lock_held",
    "upgrades_unchecked",
]
