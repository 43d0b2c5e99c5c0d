"""The JSON views of the engine (SPEC §11): the shapes the REST API answers with, and
the functions that build them from what `Engine`'s methods answer.

One module for every front end: the REST API (`engine.server.api`) builds its answers
here, the REST client (`engine.client`) types what it receives with the same shapes, and
the console's embedded backend (`obelisk_tui.backend`) builds the very same answers
without HTTP, so that its screens cannot tell the two backends apart. Timestamps are
ISO 8601 UTC strings, e.g. "2025-01-31T12:00:00.123456Z". What a front end passes to
`Engine` and catches from it is `engine.api_types`.

Light on purpose (msgspec and `engine.core` only): the REST client and the CLI import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import msgspec

from engine.core import events as ev
from engine.core.state import STATE_NAMES, StateName

if TYPE_CHECKING:
    from engine.components import LoadedComponent
    from engine.engine import Engine
    from engine.executors.backtraces import PersistedBacktraces
    from engine.storage.contract import Backtrace, ComponentSource, ExecutionRow, StoredLog

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


# ---------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------


def _ts(value: Any) -> str:
    return str(msgspec.to_builtins(value))


def _opt_ts(value: Any) -> str | None:
    return None if value is None else _ts(value)


def execution_info(row: ExecutionRow) -> ExecutionInfo:
    info: ExecutionInfo = {
        "execution_id": row.execution_id,
        "ffqn": row.ffqn,
        "component_type": row.component_type,
        "state": ev.to_builtins(row.state),
        "created_at": _ts(row.created_at),
        "updated_at": _ts(row.updated_at),
        "next_version": row.next_version,
        "parent_id": row.parent_id,
        "scheduled_at": _opt_ts(row.scheduled_at),
        "lock_expires_at": _opt_ts(row.lock_expires_at),
        "temporary_event_count": row.temporary_event_count,
        "result": None if row.result is None else ev.result_to_json(row.result),
    }
    if row.children is not None:
        info["children"] = row.children
        info["last_event"] = row.last_event
    return info


def event_entries(stored: Sequence[ev.StoredEvent], with_backtrace: bool) -> list[EventEntry]:
    out: list[EventEntry] = []
    for e in stored:
        entry: EventEntry = {
            "version": e.version,
            "created_at": _ts(e.created_at),
            "event": ev.to_builtins(e.event),
        }
        if with_backtrace:
            entry["backtrace_id"] = e.backtrace_id
        out.append(entry)
    return out


def response_entries(stored: Sequence[ev.StoredResponse]) -> list[ResponseEntry]:
    return [
        {
            "cursor": r.cursor,
            "created_at": _ts(r.created_at),
            "response": ev.to_builtins(r.response),
        }
        for r in stored
    ]


def log_entries(lines: Sequence[StoredLog]) -> list[LogEntry]:
    return [
        {
            "id": line.id,
            "run_id": line.run_id,
            "created_at": _ts(line.created_at),
            "level": line.level,
            "stream": line.stream,
            "message": line.message,
        }
        for line in lines
    ]


def backtrace_info(execution_id: str, version: int, bt: Backtrace) -> BacktraceInfo:
    return {
        "execution_id": execution_id,
        "version": version,
        "backtrace_id": bt.backtrace_id,
        "component_digest": bt.component_digest,
        "frames": [
            {"file": f.file, "line": f.line, "column": f.column, "function": f.function}
            for f in bt.frames
        ],
    }


def component_source_info(source: ComponentSource) -> ComponentSourceInfo:
    return {"digest": source.digest, "file": source.file, "source": source.source}


def persist_backtraces_answer(done: PersistedBacktraces) -> PersistBacktracesAnswer:
    return {
        "execution_id": done.execution_id,
        "component_digest": done.component_digest,
        "history_events": done.history_events,
        "stored": done.stored,
    }


async def deployment_info(engine: Engine) -> DeploymentInfo:
    status = await engine.reload_status_now()
    return {
        "deployment_id": engine.deployment_id,
        "components": component_infos(engine.components),
        "reload": status.to_json(),
    }


def component_infos(components: Iterable[LoadedComponent]) -> list[ComponentInfo]:
    """The deployed components and their exported functions (`Engine.components`)."""
    out: list[ComponentInfo] = []
    for component in components:
        config = component.config
        exports: list[FunctionExport] = [
            {
                "ffqn": info.ffqn,
                "params": [{"name": p.name, "type": p.type_text} for p in info.params],
                "return_type": info.return_type_text,
            }
            for info in (component.functions[f] for f in component.ffqns)
        ]
        out.append(
            {
                "name": config.name,
                "type": config.type,
                "digest": component.component_id.digest,
                "location": None if config.location is None else str(config.location),
                "exports": exports,
            }
        )
    return out


__all__ = [
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
    "StateName",
    "SubmitAnswer",
    "backtrace_info",
    "component_infos",
    "component_source_info",
    "deployment_info",
    "event_entries",
    "execution_info",
    "lock_held",
    "log_entries",
    "persist_backtraces_answer",
    "response_entries",
    "upgrades_unchecked",
]
