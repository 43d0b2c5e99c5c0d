"""The OpenAPI 3.1 document of the REST API (`GET /v1/openapi.json`): paths, parameters
with the bounds `engine.server.validation` enforces (one declaration for both), and
schemas of the JSON shapes of `engine.views`."""

from __future__ import annotations

from typing import Any

from engine.api_types import LIST_ORDERS
from engine.core.ids import DELAY_ID_PATTERN
from engine.server.validation import (
    BACKTRACE_VERSION,
    CHANGES_SINCE,
    DEPLOYMENT_AFTER,
    EVENTS_LENGTH,
    EVENTS_VERSION,
    EXECUTION_ID_SCHEMA,
    FOLLOW_TIMEOUT,
    LIST_LIMIT,
    LIST_OFFSET,
    LOGS_AFTER,
    LOGS_LIMIT,
    RESPONSES_AFTER,
    WAIT_TIMEOUT,
)
from engine.views import STATE_NAMES


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _array_of(name: str) -> dict[str, Any]:
    return {"type": "array", "items": _ref(name)}


def _ok(description: str, schema: dict[str, Any], status: str = "200") -> dict[str, Any]:
    return {
        status: {"description": description, "content": {"application/json": {"schema": schema}}}
    }


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "Bad request: malformed JSON, bad params, bad id or query parameter",
        401: "Missing or invalid bearer token",
        404: "Unknown execution id, delay id or FFQN",
        409: "Conflict with the execution's state",
        422: "The execution is not cancellable",
        425: "The execution has not finished yet",
        503: "The database's disk is full: try again once space is freed",
    }
    return {
        str(s): {
            "description": meaning[s],
            "content": {"application/json": {"schema": _ref("Error")}},
        }
        for s in (*statuses, 401)
    }


_ID_PARAM = {
    "name": "execution_id",
    "in": "path",
    "required": True,
    "description": "E_<ULID>, or a child id E_<ULID>.<join set>_<n>…",
    "schema": EXECUTION_ID_SCHEMA,
}


def _query(name: str, schema: dict[str, Any], description: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
        **extra,
    }


def _action(summary: str, *errors: int) -> dict[str, Any]:
    return {
        "put": {
            "summary": summary,
            "parameters": [_ID_PARAM],
            "responses": {
                **_ok("The execution after the change", _ref("Execution")),
                **_errors(400, 404, *errors, 503),
            },
        }
    }


def _cancel_action() -> dict[str, Any]:
    doc = _action(
        "Cancel an activity or a -cancellable workflow (any workflow with force)", 409, 422
    )
    doc["put"]["parameters"].append(
        {
            "name": "force",
            "in": "query",
            "required": False,
            "description": "End a workflow that is not -cancellable anyway (e.g. one stuck in "
            "an endless loop); recorded in its log as a forced cancellation_requested",
            "schema": {"type": "boolean", "default": False},
        }
    )
    return doc


def openapi_document(*, auth: bool = True) -> dict[str, Any]:
    """The OpenAPI 3.1 description of this API."""
    json_any: dict[str, Any] = {}
    timestamp = {"type": "string", "format": "date-time"}
    schemas: dict[str, Any] = {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string"}},
        },
        "Result": {
            "description": '{"ok": value}, {"err": value} or '
            '{"execution_failure": {"kind", "reason", "detail"}}',
            "type": "object",
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {
                "ok": json_any,
                "err": json_any,
                "execution_failure": {
                    "type": "object",
                    "properties": {
                        "kind": {
                            "enum": [
                                "timed_out",
                                "nondeterminism_detected",
                                "cancelled",
                                "out_of_fuel",
                                "uncategorized",
                            ]
                        },
                        "reason": {"type": "string"},
                        "detail": {"type": "string"},
                    },
                },
            },
        },
        "StubResult": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": 1,
            "properties": {"ok": json_any, "err": json_any},
        },
        "PendingState": {
            "description": "Tagged by `type`; paused and cancelling wrap an `underlying` state",
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"enum": list(STATE_NAMES)}},
        },
        "Execution": {
            "type": "object",
            "required": [
                "execution_id",
                "ffqn",
                "component_type",
                "state",
                "created_at",
                "updated_at",
                "next_version",
                "parent_id",
                "scheduled_at",
                "lock_expires_at",
                "temporary_event_count",
                "result",
            ],
            "properties": {
                "execution_id": {"type": "string"},
                "ffqn": {"type": "string"},
                "component_type": {"type": "string"},
                "state": _ref("PendingState"),
                "created_at": timestamp,
                "updated_at": timestamp,
                "next_version": {"type": "integer"},
                "parent_id": {"type": ["string", "null"]},
                "scheduled_at": {**timestamp, "type": ["string", "null"]},
                "lock_expires_at": {**timestamp, "type": ["string", "null"]},
                "temporary_event_count": {"type": "integer"},
                "result": {"oneOf": [_ref("Result"), {"type": "null"}]},
                "children": {"type": "integer", "description": "with `extras`"},
                "last_event": {"type": ["string", "null"], "description": "with `extras`"},
            },
        },
        "SubmitRequest": {
            "type": "object",
            "required": ["ffqn"],
            "additionalProperties": False,
            "properties": {
                "ffqn": {"type": "string", "examples": ["myapp:demo/activity.step"]},
                "params": {"type": "array", "description": "WIT values as JSON (SPEC §9.2)"},
                "execution_id": {
                    **EXECUTION_ID_SCHEMA,
                    "description": "E_<ULID>; generated if absent",
                },
            },
        },
        "SubmitAnswer": {
            "type": "object",
            "required": ["execution_id"],
            "properties": {"execution_id": {"type": "string"}},
        },
        "Event": {
            "type": "object",
            "required": ["version", "created_at", "event"],
            "properties": {
                "version": {"type": "integer"},
                "created_at": timestamp,
                "event": {"type": "object", "description": "tagged by `type`"},
                "backtrace_id": {"type": ["integer", "null"]},
            },
        },
        "Response": {
            "type": "object",
            "required": ["cursor", "created_at", "response"],
            "properties": {
                "cursor": {"type": "integer"},
                "created_at": timestamp,
                "response": {"type": "object", "description": "tagged by `type`"},
            },
        },
        "LogLine": {
            "type": "object",
            "required": ["id", "run_id", "created_at", "level", "stream", "message"],
            "properties": {
                "id": {"type": "integer"},
                "run_id": {"type": ["string", "null"]},
                "created_at": timestamp,
                "level": {"type": "string"},
                "stream": {"type": "string"},
                "message": {"type": "string"},
            },
        },
        "Backtrace": {
            "description": "The guest stack of the host call that wrote an event",
            "type": "object",
            "required": ["execution_id", "version", "backtrace_id", "component_digest", "frames"],
            "properties": {
                "execution_id": {"type": "string"},
                "version": {"type": "integer"},
                "backtrace_id": {"type": "integer"},
                "component_digest": {
                    "type": "string",
                    "description": "source: /v1/components/{digest}/source",
                },
                "frames": {
                    "type": "array",
                    "description": "innermost first",
                    "items": {
                        "type": "object",
                        "required": ["file", "line", "column", "function"],
                        "properties": {
                            "file": {"type": "string"},
                            "line": {"type": "integer"},
                            "column": {"type": "integer"},
                            "function": {"type": "string"},
                        },
                    },
                },
            },
        },
        "PersistedBacktraces": {
            "type": "object",
            "required": ["execution_id", "component_digest", "history_events", "stored"],
            "properties": {
                "execution_id": {"type": "string"},
                "component_digest": {"type": "string"},
                "history_events": {"type": "integer"},
                "stored": {"type": "integer", "description": "events that got a backtrace"},
            },
        },
        "ComponentSource": {
            "type": "object",
            "required": ["digest", "file", "source"],
            "properties": {
                "digest": {"type": "string"},
                "file": {"type": "string"},
                "source": {"type": "string"},
            },
        },
        "Component": {
            "type": "object",
            "required": ["name", "type", "digest", "location", "exports"],
            "properties": {
                "name": {"type": "string"},
                "type": {"type": "string"},
                "digest": {"type": "string"},
                "location": {"type": ["string", "null"]},
                "exports": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["ffqn", "params", "return_type"],
                        "properties": {
                            "ffqn": {"type": "string"},
                            "params": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "properties": {
                                        "name": {"type": "string"},
                                        "type": {"type": "string"},
                                    },
                                },
                            },
                            "return_type": {"type": ["string", "null"]},
                        },
                    },
                },
            },
        },
    }
    schemas["Count"] = {
        "type": "object",
        "required": ["count"],
        "properties": {"count": {"type": "integer"}},
    }
    schemas["Generation"] = {
        "type": "object",
        "required": ["generation"],
        "properties": {
            "generation": {"type": "integer", "description": "bumped by every commit of the server"}
        },
    }
    schemas["Stats"] = {
        "type": "object",
        "required": ["by_state"],
        "properties": {"by_state": {"type": "object", "additionalProperties": {"type": "integer"}}},
    }
    schemas["Deployment"] = {
        "type": "object",
        "required": ["deployment_id", "components", "reload"],
        "properties": {
            "deployment_id": {"type": "string"},
            "components": _array_of("Component"),
            "reload": {
                "type": "object",
                "description": "The start or the last reload attempt: `ok`, the whole "
                "`error` (the previous deployment stays in force), `changes` per component "
                "(added/removed/changed/reconfigured with digests), workflow `upgrades` "
                "(execution_id, from/to digest, outcome success|failed, reason) and "
                "`pinned` old versions that unfinished executions stay on, and "
                "`orphaned`: functions no deployed component exports, with their count of "
                "unfinished executions (they wait until a deployment exports them again)",
                "required": [
                    "generation",
                    "at",
                    "trigger",
                    "ok",
                    "error",
                    "deployment_id",
                    "changes",
                    "upgrades",
                    "pinned",
                ],
                "properties": {
                    "generation": {"type": "integer"},
                    "at": timestamp,
                    "trigger": {"enum": ["start", "watch", "manual"]},
                    "ok": {"type": "boolean"},
                    "error": {"type": ["string", "null"]},
                    "deployment_id": {"type": "string"},
                    "deployment_path": {"type": "string"},
                    "changed_paths": {"type": "array", "items": {"type": "string"}},
                    "changes": {"type": "array", "items": {"type": "object"}},
                    "upgrades": {"type": "array", "items": {"type": "object"}},
                    "pinned": {"type": "array", "items": {"type": "object"}},
                    "orphaned": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "ffqn": {"type": "string"},
                                "executions": {"type": "integer"},
                            },
                        },
                    },
                    "duration_ms": {"type": "number"},
                },
            },
        },
    }
    filter_params = [
        _query("ffqn", {"type": "string"}, "FFQN prefix"),
        _query(
            "state",
            {"type": "array", "items": {"enum": list(STATE_NAMES)}},
            "state name; repeat for several",
            explode=True,
        ),
        _query("hide_finished", {"type": "boolean"}, "leave out finished ones"),
        _query("top_level_only", {"type": "boolean"}, "leave out child executions"),
        _query("id_prefix", {"type": "string"}, "execution id prefix"),
    ]
    paths: dict[str, Any] = {
        "/v1/executions": {
            "get": {
                "summary": "List executions, newest first",
                "parameters": [
                    *filter_params,
                    _query("limit", LIST_LIMIT.schema(), "page size"),
                    _query(
                        "before",
                        EXECUTION_ID_SCHEMA,
                        "paging cursor: the last execution_id of the previous page",
                    ),
                    _query(
                        "offset",
                        LIST_OFFSET.schema(),
                        "paging by position: skip this many rows",
                    ),
                    _query(
                        "order",
                        {"enum": list(LIST_ORDERS), "default": "created_desc"},
                        "newest first, oldest first, or last change first",
                    ),
                    _query(
                        "extras",
                        {"type": "boolean"},
                        "add `children` (direct children) and `last_event` (its type)",
                    ),
                ],
                "responses": {**_ok("Executions", _array_of("Execution")), **_errors(400)},
            },
            "post": {
                "summary": "Submit a top-level execution",
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("SubmitRequest")}},
                },
                "responses": {
                    **_ok("Created", _ref("SubmitAnswer"), "201"),
                    **_errors(400, 404, 409, 503),
                },
            },
        },
        "/v1/executions/count": {
            "get": {
                "summary": "How many executions the list filters select",
                "parameters": filter_params,
                "responses": {**_ok("The count", _ref("Count")), **_errors(400)},
            }
        },
        "/v1/executions/{execution_id}": {
            "get": {
                "summary": "The result of an execution",
                "parameters": [
                    _ID_PARAM,
                    _query("follow", {"type": "boolean"}, "wait until it finishes"),
                    _query(
                        "timeout",
                        FOLLOW_TIMEOUT.schema(),
                        "with follow: give up (425) after this many seconds",
                    ),
                ],
                "responses": {**_ok("The result", _ref("Result")), **_errors(400, 404, 425)},
            }
        },
        "/v1/executions/{execution_id}/status": {
            "get": {
                "summary": "State, timestamps, version and result of an execution",
                "parameters": [_ID_PARAM],
                "responses": {**_ok("The execution", _ref("Execution")), **_errors(400, 404)},
            }
        },
        "/v1/executions/{execution_id}/events": {
            "get": {
                "summary": "A page of the execution log",
                "parameters": [
                    _ID_PARAM,
                    _query("version", EVENTS_VERSION.schema(), "first version"),
                    _query("length", EVENTS_LENGTH.schema(), "how many (all if absent)"),
                    _query("include_backtrace_id", {"type": "boolean"}, "add backtrace_id"),
                ],
                "responses": {**_ok("Events", _array_of("Event")), **_errors(400, 404)},
            }
        },
        "/v1/executions/{execution_id}/responses": {
            "get": {
                "summary": "Responses received by an execution (children, delays)",
                "parameters": [
                    _ID_PARAM,
                    _query(
                        "after",
                        RESPONSES_AFTER.schema(),
                        "only responses with a cursor greater than this",
                    ),
                ],
                "responses": {**_ok("Responses", _array_of("Response")), **_errors(400, 404)},
            }
        },
        "/v1/executions/{execution_id}/logs": {
            "get": {
                "summary": "Log lines (stdout, stderr, obelisk:log) of an execution",
                "parameters": [
                    _ID_PARAM,
                    _query("after", LOGS_AFTER.schema(), "only lines with an id greater than this"),
                    _query("limit", LOGS_LIMIT.schema(), "page size"),
                ],
                "responses": {**_ok("Log lines", _array_of("LogLine")), **_errors(400, 404)},
            }
        },
        "/v1/executions/{execution_id}/backtrace": {
            "get": {
                "summary": "The backtrace (guest stack) of the host call that wrote an event",
                "parameters": [
                    _ID_PARAM,
                    {
                        "name": "version",
                        "in": "query",
                        "required": True,
                        "description": "the event's version",
                        "schema": BACKTRACE_VERSION.schema(),
                    },
                ],
                "responses": {**_ok("The backtrace", _ref("Backtrace")), **_errors(400, 404)},
            }
        },
        "/v1/executions/{execution_id}/backtraces": {
            "put": {
                "summary": "Replay a JS workflow execution against its deployed code, "
                "writing no history, and store the backtraces of its events",
                "parameters": [_ID_PARAM],
                "responses": {
                    **_ok("What was stored", _ref("PersistedBacktraces")),
                    **_errors(400, 404, 409, 503),
                },
            }
        },
        "/v1/executions/{execution_id}/pause": _action("Pause an execution", 409),
        "/v1/executions/{execution_id}/unpause": _action("Unpause a paused execution", 409),
        "/v1/executions/{execution_id}/cancel": _cancel_action(),
        "/v1/delays/{delay_id}/cancel": {
            "put": {
                "summary": "Cancel a delay: its workflow gets delay_finished(cancelled)",
                "parameters": [
                    {
                        "name": "delay_id",
                        "in": "path",
                        "required": True,
                        "description": "Delay_<ULID>.<join set>_<n>…",
                        "schema": {"type": "string", "pattern": DELAY_ID_PATTERN},
                    }
                ],
                "responses": {
                    **_ok("The workflow that owns the delay", _ref("Execution")),
                    **_errors(400, 404, 409, 503),
                },
            }
        },
        "/v1/executions/{execution_id}/stub": {
            "put": {
                "summary": "Write the result of an activity_stub execution (idempotent)",
                "parameters": [_ID_PARAM],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("StubResult")}},
                },
                "responses": {
                    **_ok("The execution after the change", _ref("Execution")),
                    **_errors(400, 404, 409, 503),
                },
            }
        },
        "/v1/components": {
            "get": {
                "summary": "Deployed components and their exported functions",
                "responses": {**_ok("Components", _array_of("Component")), **_errors()},
            }
        },
        "/v1/deployment": {
            "get": {
                "summary": "The deployment in force and the outcome of its last hot reload",
                "parameters": [
                    _query(
                        "after",
                        DEPLOYMENT_AFTER.schema(),
                        "long poll: answer once a reload with a greater `generation` "
                        "happened (or at the timeout)",
                    ),
                    _query(
                        "timeout",
                        WAIT_TIMEOUT.schema(),
                        "with after: seconds to wait at most",
                    ),
                ],
                "responses": {**_ok("Deployment", _ref("Deployment")), **_errors(400)},
            }
        },
        "/v1/stats": {
            "get": {
                "summary": "Executions per state",
                "responses": {**_ok("Counts", _ref("Stats")), **_errors()},
            }
        },
        "/v1/changes": {
            "get": {
                "summary": "Long poll: answers once anything was written after `since`",
                "parameters": [
                    _query(
                        "since",
                        CHANGES_SINCE.schema(),
                        "the generation the client has seen (-1: answer at once)",
                    ),
                    _query(
                        "timeout",
                        WAIT_TIMEOUT.schema(),
                        "seconds to wait at most",
                    ),
                ],
                "responses": {**_ok("The current generation", _ref("Generation")), **_errors(400)},
            }
        },
        "/v1/components/{digest}/source": {
            "get": {
                "summary": "The source text of a (JS) component version, by digest",
                "parameters": [
                    {
                        "name": "digest",
                        "in": "path",
                        "required": True,
                        "description": "sha256:…",
                        "schema": {"type": "string"},
                    },
                ],
                "responses": {**_ok("The source", _ref("ComponentSource")), **_errors(404)},
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3.1 document"}, **_errors()},
            }
        },
    }
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "Obelisk (Python) API",
            "version": "1",
            "description": "Durable executions: submit, inspect, pause, cancel, stub. "
            'Errors are {"error": message}.',
        },
        "servers": [{"url": "/"}],
        "paths": paths,
        "components": {"schemas": schemas},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc


__all__ = ["openapi_document"]
