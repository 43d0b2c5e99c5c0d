"""The functions that build the JSON views (`engine.views`) from what `Engine`'s methods
answer: the REST API (`engine.server.api`) and the console's embedded backend
(`obelisk_tui.backend`) answer with the very same shapes through them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from engine.core import events as ev
from engine.views import (
    BacktraceInfo,
    ComponentInfo,
    ComponentSourceInfo,
    DeploymentInfo,
    EventEntry,
    ExecutionInfo,
    FunctionExport,
    LogEntry,
    PersistBacktracesAnswer,
    ResponseEntry,
)

if TYPE_CHECKING:
    from engine.components import LoadedComponent
    from engine.engine import Engine
    from engine.executors.backtraces import PersistedBacktraces
    from engine.storage.contract import Backtrace, ComponentSource, ExecutionRow, StoredLog


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
    "backtrace_info",
    "component_infos",
    "component_source_info",
    "event_entries",
    "execution_info",
    "log_entries",
    "persist_backtraces_answer",
    "response_entries",
]
