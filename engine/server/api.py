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

from engine.answers import (
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
from engine.server.openapi import openapi_document
from engine.server.validation import (
    BACKTRACE_VERSION,
    CHANGES_SINCE,
    DEPLOYMENT_AFTER,
    EVENTS_LENGTH,
    EVENTS_VERSION,
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
    RESULT_CLASSES,
    STATE_NAMES,
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
    results = query.getall("result", [])
    for r in results:
        if r not in RESULT_CLASSES:
            raise ApiProblem(
                400, f"unknown result {r!r} (expected one of: {', '.join(RESULT_CLASSES)})"
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
        results=tuple(results) or None,
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
    """Executions per state (with overlays as their own states), for dashboards; with
    `results=true`, the finished also per result class (`by_result`: ok, err, failed)."""
    if not bool_query(request, "results"):
        return _json({"by_state": await request.app[ENGINE_KEY].counts_by_state()})
    counts = await request.app[ENGINE_KEY].counts_by_state(results=True)
    return _json(
        {
            "by_state": {name: counts[name] for name in STATE_NAMES},
            "by_result": {name: counts[name] for name in RESULT_CLASSES},
        }
    )


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


__all__ = ["ENGINE_KEY", "TOKEN_KEY", "ApiProblem", "make_app", "openapi_document"]
