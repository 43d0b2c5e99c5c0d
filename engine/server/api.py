"""The REST API (SPEC §11): JSON under `/v1`, bearer-token auth, JSON errors.

`make_app(engine, token)` builds the aiohttp application; `engine.server.run` serves it.
Every error is `{"error": message}` with its status: 400 bad request (params, JSON, ids,
query), 401 no/bad token, 404 unknown execution/FFQN/endpoint, 409 conflict, 422 not
cancellable, 425 not finished yet, 503 the database's disk is full (logged at most once
per 10 s), 500 anything unexpected (logged, never a traceback).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
from aiohttp import web

from engine.api_types import (
    LIST_ORDERS,
    REFUSALS,
    RETRY_AFTER_FULL,
    DeploymentError,
    ListFilter,
    StorageError,
    StorageFull,
    error_status,
    report_disk_full,
)
from engine.core import events as ev
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
    ApiProblem,
    bool_query,
    execution_id,
    json_body,
)
from engine.views import (
    STATE_NAMES,
    backtrace_info,
    component_infos,
    component_source_info,
    deployment_info,
    event_entries,
    execution_info,
    log_entries,
    persist_backtraces_answer,
    response_entries,
)

if TYPE_CHECKING:
    from engine.engine import Engine

log = logging.getLogger("obelisk.api")

ENGINE_KEY: web.AppKey[Engine] = web.AppKey("engine")
TOKEN_KEY: web.AppKey[str | None] = web.AppKey("token")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# ---------------------------------------------------------------------------------------
# Application
# ---------------------------------------------------------------------------------------


MAX_REQUEST_BODY = 64 * 2**20
"""Largest request body (a submit's params, a stub's value): the same order as what a
JS sandbox can hold, far above aiohttp's 1 MiB default."""


def make_app(engine: Engine, token: str | None) -> web.Application:
    """The API application; `token=None` turns authentication off."""
    app = web.Application(
        middlewares=[_error_middleware, _auth_middleware], client_max_size=MAX_REQUEST_BODY
    )
    app[ENGINE_KEY] = engine
    app[TOKEN_KEY] = token
    app.router.add_get("/openapi.json", _openapi)
    app.router.add_get("/v1/executions", _list_executions)
    app.router.add_post("/v1/executions", _submit)
    app.router.add_get("/v1/executions/count", _count_executions)  # ids start with E_
    app.router.add_get("/v1/executions/{execution_id}", _result)
    app.router.add_get("/v1/executions/{execution_id}/status", _status)
    app.router.add_get("/v1/executions/{execution_id}/events", _events)
    app.router.add_get("/v1/executions/{execution_id}/responses", _responses)
    app.router.add_get("/v1/executions/{execution_id}/logs", _logs)
    app.router.add_get("/v1/executions/{execution_id}/backtrace", _backtrace)
    app.router.add_put("/v1/executions/{execution_id}/backtraces", _persist_backtraces)
    app.router.add_put("/v1/executions/{execution_id}/pause", _pause)
    app.router.add_put("/v1/executions/{execution_id}/unpause", _unpause)
    app.router.add_put("/v1/executions/{execution_id}/cancel", _cancel)
    app.router.add_put("/v1/executions/{execution_id}/stub", _stub)
    app.router.add_put("/v1/delays/{delay_id}/cancel", _cancel_delay)
    app.router.add_get("/v1/components", _components)
    app.router.add_get("/v1/components/{digest}/source", _component_source)
    app.router.add_get("/v1/deployment", _deployment)
    app.router.add_get("/v1/stats", _stats)
    app.router.add_get("/v1/changes", _changes)
    return app


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(data),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return _json({"error": message}, status, headers)


@web.middleware
async def _error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiProblem as e:
        headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
        return _error(e.status, e.message, headers)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        if isinstance(e, web.HTTPNotFound):
            message = f"no such endpoint: {request.method} {request.path}"
        elif isinstance(e, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(e.allowed_methods))
            message = f"method {request.method} is not allowed on {request.path} (use {allowed})"
        elif isinstance(e, web.HTTPRequestEntityTooLarge):
            message = f"request body too large (the limit is {MAX_REQUEST_BODY // 2**20} MiB)"
        else:
            message = e.reason
        headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
        return _error(e.status, message, headers or None)
    except REFUSALS as e:
        return _error(error_status(e), str(e))
    except StorageFull as e:  # not the request's fault: try again once space is freed
        report_disk_full(log, e)
        return _error(503, str(e), {"Retry-After": f"{RETRY_AFTER_FULL:g}"})
    except (StorageError, DeploymentError) as e:
        log.error("%s %s failed: %s", request.method, request.path, e)
        return _error(500, str(e))
    except Exception as e:
        log.exception("%s %s failed", request.method, request.path)
        return _error(500, f"internal server error ({type(e).__name__}); see the server log")


@web.middleware
async def _auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[TOKEN_KEY]
    if token is not None:
        header = request.headers.get("Authorization")
        if header is None:
            raise ApiProblem(401, "missing bearer token: send `Authorization: Bearer <token>`")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            raise ApiProblem(401, "the Authorization header is not `Bearer <token>`")
        if not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise ApiProblem(401, "invalid bearer token")
    return await handler(request)


# ---------------------------------------------------------------------------------------
# Request parsing
# ---------------------------------------------------------------------------------------


def _execution_id(request: web.Request) -> str:
    return execution_id(request.match_info["execution_id"])


# ---------------------------------------------------------------------------------------
# Handlers
# ---------------------------------------------------------------------------------------


def _list_filter(request: web.Request) -> ListFilter:
    """The filter, order and page of a list (or count) request's query."""
    query = request.query
    states = query.getall("state", [])
    for s in states:
        if s not in STATE_NAMES:
            raise ApiProblem(
                400, f"unknown state {s!r} (expected one of: {', '.join(STATE_NAMES)})"
            )
    before = query.get("before") or None
    if before is not None:
        before = execution_id(before, "query parameter `before`")
    order = query.get("order") or "created_desc"
    if order not in LIST_ORDERS:
        raise ApiProblem(
            400, f"unknown order {order!r} (expected one of: {', '.join(LIST_ORDERS)})"
        )
    limit = LIST_LIMIT.parse(request)
    offset = LIST_OFFSET.parse(request)
    assert limit is not None and offset is not None
    return ListFilter(
        ffqn_prefix=query.get("ffqn") or None,
        states=tuple(states) or None,
        hide_finished=bool_query(request, "hide_finished"),
        top_level_only=bool_query(request, "top_level_only"),
        id_prefix=query.get("id_prefix") or None,
        limit=limit,
        before_id=before,
        offset=offset,
        order=order,  # type: ignore[arg-type]  # checked against LIST_ORDERS above
        with_extras=bool_query(request, "extras"),
    )


async def _list_executions(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    rows = await engine.list_executions(_list_filter(request))
    return _json([execution_info(r) for r in rows])


async def _count_executions(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return _json({"count": await engine.count_executions(_list_filter(request))})


async def _stats(request: web.Request) -> web.Response:
    """Executions per state (with overlays as their own states), for dashboards."""
    return _json({"by_state": await request.app[ENGINE_KEY].counts_by_state()})


async def _changes(request: web.Request) -> web.Response:
    """Long poll: answer once anything was committed after generation `since` (or after
    `timeout` seconds), with the current generation. Clients refresh on a new value."""
    since = CHANGES_SINCE.parse(request)
    timeout = WAIT_TIMEOUT.parse(request)
    assert since is not None and timeout is not None
    generation = await request.app[ENGINE_KEY].wait_changed(since, timeout)
    return _json({"generation": generation})


_SUBMIT_KEYS = ("ffqn", "params", "execution_id")


async def _submit(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await json_body(request)
    if not isinstance(body, dict):
        raise ApiProblem(400, 'request body must be a JSON object {"ffqn": …, "params": […]}')
    unknown = sorted(set(body) - set(_SUBMIT_KEYS))
    if unknown:
        raise ApiProblem(
            400, f"unknown field(s) {', '.join(unknown)} (expected: {', '.join(_SUBMIT_KEYS)})"
        )
    ffqn = body.get("ffqn")
    if not isinstance(ffqn, str) or not ffqn:
        raise ApiProblem(400, "field `ffqn` is missing or not a string")
    params = body.get("params", [])
    if not isinstance(params, list):
        raise ApiProblem(400, "field `params` must be a JSON array")
    execution_id = body.get("execution_id")
    if execution_id is not None and not isinstance(execution_id, str):
        raise ApiProblem(400, "field `execution_id` must be a string")
    eid = await engine.submit(ffqn, params, execution_id=execution_id)
    return _json({"execution_id": eid}, 201, {"Location": f"/v1/executions/{eid}"})


async def _result(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    eid = _execution_id(request)
    timeout = FOLLOW_TIMEOUT.parse(request)  # checked even without `follow`: no surprise
    if bool_query(request, "follow"):
        try:
            result = await engine.result(eid, timeout)
        except TimeoutError:
            raise ApiProblem(425, f"execution {eid} did not finish within {timeout:g} s") from None
        return _json(ev.result_to_json(result))
    row = await engine.status(eid)
    if row.result is None:
        state = row.state.__struct_config__.tag
        raise ApiProblem(425, f"execution {eid} is not finished yet (state: {state})")
    return _json(ev.result_to_json(row.result))


async def _status(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    return _json(execution_info(await engine.status(_execution_id(request))))


async def _events(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    eid = _execution_id(request)
    version = EVENTS_VERSION.parse(request)
    length = EVENTS_LENGTH.parse(request)
    with_backtrace = bool_query(request, "include_backtrace_id")
    assert version is not None
    stored = await engine.events(eid, version, length)  # 404 for an unknown id
    return _json(event_entries(stored, with_backtrace))


async def _responses(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    eid = _execution_id(request)
    after = RESPONSES_AFTER.parse(request)
    assert after is not None
    return _json(response_entries(await engine.responses(eid, after)))


async def _logs(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    eid = _execution_id(request)
    after = LOGS_AFTER.parse(request)
    limit = LOGS_LIMIT.parse(request)
    assert after is not None and limit is not None
    return _json(log_entries(await engine.logs(eid, after, limit)))


async def _backtrace(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    eid = _execution_id(request)
    version = BACKTRACE_VERSION.parse_required(request)
    bt = await engine.backtrace(eid, version)  # 404 for an unknown id
    if bt is None:
        raise ApiProblem(404, f"execution {eid} has no backtrace for version {version}")
    return _json(backtrace_info(eid, version, bt))


async def _persist_backtraces(request: web.Request) -> web.Response:
    done = await request.app[ENGINE_KEY].persist_backtraces(_execution_id(request))
    return _json(persist_backtraces_answer(done))


async def _pause(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    eid = _execution_id(request)
    await engine.pause(eid)
    return _json(execution_info(await engine.status(eid)))


async def _unpause(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    eid = _execution_id(request)
    await engine.unpause(eid)
    return _json(execution_info(await engine.status(eid)))


async def _cancel(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    eid = _execution_id(request)
    await engine.cancel(eid, force=bool_query(request, "force"))
    return _json(execution_info(await engine.status(eid)))


async def _cancel_delay(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    owner = await engine.cancel_delay(request.match_info["delay_id"])
    return _json(execution_info(await engine.status(owner)))


async def _stub(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    eid = _execution_id(request)
    body = await json_body(request)
    if not (isinstance(body, dict) and len(body) == 1 and next(iter(body)) in ("ok", "err")):
        raise ApiProblem(400, 'request body must be {"ok": value} or {"err": value}')
    await engine.stub(eid, body)
    return _json(execution_info(await engine.status(eid)))


async def _components(request: web.Request) -> web.Response:
    return _json(component_infos(request.app[ENGINE_KEY].components))


async def _deployment(request: web.Request) -> web.Response:
    """The deployment in force and the outcome of the last reload (SPEC §9.3)."""
    engine = request.app[ENGINE_KEY]
    after = DEPLOYMENT_AFTER.parse(request)
    timeout = WAIT_TIMEOUT.parse(request)  # checked even without `after`: no surprise
    if after is not None:  # long poll for the next reload
        assert timeout is not None
        await engine.wait_reload(after, timeout)
    return _json(await deployment_info(engine))


async def _component_source(request: web.Request) -> web.Response:
    digest = request.match_info["digest"]
    source = await request.app[ENGINE_KEY].component_source(digest)
    if source is None:
        raise ApiProblem(404, f"no source is known for component {digest}")
    return _json(component_source_info(source))


async def _openapi(request: web.Request) -> web.Response:
    return _json(openapi_document(auth=request.app[TOKEN_KEY] is not None))


# ---------------------------------------------------------------------------------------
# OpenAPI 3.1
# ---------------------------------------------------------------------------------------


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


__all__ = [
    "ApiProblem",
    "make_app",
    "openapi_document",
]
