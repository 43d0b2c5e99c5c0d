"""The REST API (SPEC §11) against a real engine on a temporary data dir.

The deployment has only `activity_stub` components, so every execution stays pending
until the test writes its result: states are deterministic and nothing runs behind the
test's back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine.core import events as ev
from engine.core.ids import ExecutionId
from engine.core.records import LogLine
from engine.engine import Engine
from engine.server.api import make_app, openapi_document
from engine.storage.contract import CreateRequest, ListFilter
from tests.fixtures.deployments import Deployment, seconds

TOKEN = "test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
APPROVE = "myapp:demo/approval.approve"
COUNT = "myapp:demo/approval.count"

DEPLOYMENT = (
    Deployment()
    .activity_stub(APPROVE, params=[("order", "string")], return_type="result<bool, string>")
    .activity_stub(
        COUNT,
        name="counter",
        params=[("n", "u32"), ("tags", "list<string>")],
        return_type="result<u32, string>",
    )
)


def write_deployment(directory: Path) -> Path:
    return DEPLOYMENT.write(directory)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    e = await Engine.start(write_deployment(tmp_path), tmp_path / "data")
    try:
        yield e
    finally:
        await e.stop()


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(make_app(engine, TOKEN)), headers=AUTH) as c:
        yield c


async def expect_error(response: Any, status: int, *fragments: str) -> str:
    assert response.status == status, await response.text()
    assert response.content_type == "application/json"
    body = await response.json()
    assert set(body) == {"error"}, body
    message: str = body["error"]
    for fragment in fragments:
        assert fragment in message, message
    assert "Traceback" not in message
    return message


async def submit(client: TestClient[Any, Any], ffqn: str = APPROVE, params: Any = None) -> str:
    body = {"ffqn": ffqn, "params": ["o-1"] if params is None else params}
    r = await client.post("/v1/executions", json=body)
    assert r.status == 201, await r.text()
    eid: str = (await r.json())["execution_id"]
    return eid


def unknown_id() -> str:
    return str(ExecutionId.generate())


# ---------------------------------------------------------------------------------------
# Authentication
# ---------------------------------------------------------------------------------------


async def test_missing_token_is_401_on_every_endpoint(client: TestClient[Any, Any]) -> None:
    eid = unknown_id()
    for method, path in [
        ("GET", "/v1/executions"),
        ("POST", "/v1/executions"),
        ("GET", f"/v1/executions/{eid}"),
        ("GET", f"/v1/executions/{eid}/status"),
        ("GET", f"/v1/executions/{eid}/events"),
        ("GET", f"/v1/executions/{eid}/responses"),
        ("GET", f"/v1/executions/{eid}/logs"),
        ("PUT", f"/v1/executions/{eid}/pause"),
        ("PUT", f"/v1/executions/{eid}/unpause"),
        ("PUT", f"/v1/executions/{eid}/cancel"),
        ("PUT", f"/v1/executions/{eid}/stub"),
        ("GET", "/v1/components"),
        ("GET", "/openapi.json"),
    ]:
        r = await client.request(method, path, headers={"Authorization": ""})
        await expect_error(r, 401, "token")
        assert r.headers["WWW-Authenticate"] == "Bearer"


async def test_wrong_token_is_401(client: TestClient[Any, Any]) -> None:
    for header in (f"Bearer {TOKEN}x", "Bearer", "Bearer  "):
        r = await client.get("/v1/components", headers={"Authorization": header})
        await expect_error(r, 401, "invalid bearer token")
    for header in (f"Basic {TOKEN}", TOKEN):
        r = await client.get("/v1/components", headers={"Authorization": header})
        await expect_error(r, 401, "the Authorization header is not `Bearer <token>`")
    r = await client.get("/v1/components", headers={"Authorization": f"bearer {TOKEN}"})
    assert r.status == 200


async def test_authentication_off(engine: Engine) -> None:
    async with TestClient(TestServer(make_app(engine, None))) as c:
        r = await c.get("/v1/components")
        assert r.status == 200
        doc = await (await c.get("/openapi.json")).json()
        assert "security" not in doc


# ---------------------------------------------------------------------------------------
# Submit
# ---------------------------------------------------------------------------------------


async def test_submit_and_status(client: TestClient[Any, Any]) -> None:
    r = await client.post("/v1/executions", json={"ffqn": APPROVE, "params": ["o-1"]})
    assert r.status == 201
    eid = (await r.json())["execution_id"]
    assert ExecutionId.parse(eid).is_top_level
    assert r.headers["Location"] == f"/v1/executions/{eid}"

    status = await (await client.get(f"/v1/executions/{eid}/status")).json()
    assert status["execution_id"] == eid
    assert status["ffqn"] == APPROVE
    assert status["component_type"] == "activity_stub"
    assert status["state"]["type"] == "pending_at"
    assert status["state"]["scheduled_at"] == status["scheduled_at"]
    assert status["next_version"] == 1
    assert status["parent_id"] is None
    assert status["result"] is None
    assert status["lock_expires_at"] is None
    assert status["temporary_event_count"] == 0
    assert status["created_at"].endswith("Z")


async def test_submit_with_execution_id_is_idempotent(client: TestClient[Any, Any]) -> None:
    eid = unknown_id()
    body = {"ffqn": APPROVE, "params": ["a"], "execution_id": eid}
    for _ in range(2):
        r = await client.post("/v1/executions", json=body)
        assert r.status == 201
        assert (await r.json()) == {"execution_id": eid}
    other = {**body, "params": ["b"]}
    await expect_error(await client.post("/v1/executions", json=other), 409)


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b'{"ffqn": "x", "params": [', 400, "malformed JSON"),
        (b"", 400, "missing JSON request body"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"params": []}', 400, "`ffqn` is missing"),
        (b'{"ffqn": 42}', 400, "`ffqn` is missing or not a string"),
        (
            b'{"ffqn": "' + APPROVE.encode() + b'", "params": {"order": "x"}}',
            400,
            "must be a JSON array",
        ),
        (
            b'{"ffqn": "' + APPROVE.encode() + b'", "params": ["x"], "prams": 1}',
            400,
            "unknown field(s) prams",
        ),
        (b'{"ffqn": "' + APPROVE.encode() + b'", "params": [42]}', 400, "params[0] (order)"),
        (b'{"ffqn": "' + APPROVE.encode() + b'", "params": []}', 400, "takes 1 parameter"),
        (b'{"ffqn": "' + APPROVE.encode() + b'", "params": ["a", "b"]}', 400, "got 2"),
        (b'{"ffqn": "' + COUNT.encode() + b'", "params": [1, ["a", 2]]}', 400, "tags"),
        (b'{"ffqn": "' + COUNT.encode() + b'", "params": [-1, []]}', 400, "(n)"),
        (
            b'{"ffqn": "' + APPROVE.encode() + b'", "params": ["x"], "execution_id": "E_nope"}',
            400,
            "invalid execution id",
        ),
        (
            b'{"ffqn": "' + APPROVE.encode() + b'", "params": ["x"], "execution_id": 7}',
            400,
            "`execution_id` must be a string",
        ),
        (b'{"ffqn": "myapp:demo/approval.nope", "params": []}', 404, "myapp:demo/approval.nope"),
        (b'{"ffqn": "not an ffqn", "params": []}', 404, "is not an FFQN"),
    ],
)
async def test_submit_bad_input(
    client: TestClient[Any, Any], body: bytes, status: int, fragment: str
) -> None:
    r = await client.post("/v1/executions", data=body, headers={"Content-Type": "application/json"})
    await expect_error(r, status, fragment)
    listed = await (await client.get("/v1/executions")).json()
    assert listed == [], "a rejected submission must not create anything"


async def test_submit_child_id_is_rejected(client: TestClient[Any, Any]) -> None:
    child = unknown_id() + ".g:1_1"
    r = await client.post(
        "/v1/executions", json={"ffqn": APPROVE, "params": ["x"], "execution_id": child}
    )
    await expect_error(r, 400, "child id")


# ---------------------------------------------------------------------------------------
# Result
# ---------------------------------------------------------------------------------------


async def test_result_unfinished_is_425_then_ok(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    await expect_error(await client.get(f"/v1/executions/{eid}"), 425, "not finished")
    r = await client.put(f"/v1/executions/{eid}/stub", json={"ok": True})
    assert r.status == 200
    r = await client.get(f"/v1/executions/{eid}")
    assert r.status == 200
    assert await r.json() == {"ok": True}


async def test_result_err(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    assert (await client.put(f"/v1/executions/{eid}/stub", json={"err": "rejected"})).status == 200
    assert await (await client.get(f"/v1/executions/{eid}")).json() == {"err": "rejected"}


async def test_result_execution_failure(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    assert (await client.put(f"/v1/executions/{eid}/cancel")).status == 200
    result = await (await client.get(f"/v1/executions/{eid}")).json()
    assert result["execution_failure"]["kind"] == "cancelled"
    assert set(result["execution_failure"]) == {"kind", "reason", "detail"}


async def test_result_follow_returns_when_stub_is_written(
    client: TestClient[Any, Any], engine: Engine
) -> None:
    eid = await submit(client)
    follow = asyncio.create_task(client.get(f"/v1/executions/{eid}?follow=true"))
    await asyncio.sleep(0.3)
    assert not follow.done()
    r = await client.put(f"/v1/executions/{eid}/stub", json={"ok": False})
    assert r.status == 200
    response = await asyncio.wait_for(follow, 2)
    assert response.status == 200
    assert await response.json() == {"ok": False}


async def test_result_follow_finished_and_timeout(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    r = await client.get(f"/v1/executions/{eid}", params={"follow": "true", "timeout": "0.2"})
    await expect_error(r, 425, "did not finish within 0.2 s")
    await client.put(f"/v1/executions/{eid}/stub", json={"ok": True})
    r = await client.get(f"/v1/executions/{eid}", params={"follow": "1"})
    assert await r.json() == {"ok": True}
    for bad in ("-1", "x", "nan", "inf"):
        r = await client.get(f"/v1/executions/{eid}", params={"follow": "true", "timeout": bad})
        await expect_error(r, 400, "timeout")
    r = await client.get(f"/v1/executions/{eid}", params={"follow": "maybe"})
    await expect_error(r, 400, "follow")


async def test_unknown_and_malformed_ids(client: TestClient[Any, Any]) -> None:
    eid = unknown_id()
    child = eid + ".g:1_1"
    for suffix in ("", "/status", "/events", "/events?version=3", "/responses", "/logs"):
        await expect_error(await client.get(f"/v1/executions/{eid}{suffix}"), 404, eid)
        await expect_error(await client.get(f"/v1/executions/{child}{suffix}"), 404, child)
        await expect_error(
            await client.get(f"/v1/executions/E_123{suffix}"), 400, "invalid execution id"
        )
    await expect_error(
        await client.get(f"/v1/executions/{eid}", params={"follow": "true"}), 404, eid
    )
    for action in ("pause", "unpause", "cancel"):
        await expect_error(await client.put(f"/v1/executions/{eid}/{action}"), 404, eid)
        await expect_error(await client.put(f"/v1/executions/x/{action}"), 400, "invalid")
    await expect_error(await client.put(f"/v1/executions/{eid}/stub", json={"ok": 1}), 404, eid)
    await expect_error(await client.put("/v1/executions/x/stub", json={"ok": 1}), 400, "invalid")


# ---------------------------------------------------------------------------------------
# Events, responses, logs
# ---------------------------------------------------------------------------------------


async def test_events_with_paging(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    await client.put(f"/v1/executions/{eid}/pause")
    await client.put(f"/v1/executions/{eid}/unpause")
    await client.put(f"/v1/executions/{eid}/stub", json={"ok": True})
    events = await (await client.get(f"/v1/executions/{eid}/events")).json()
    assert [e["version"] for e in events] == [0, 1, 2, 3]
    assert [e["event"]["type"] for e in events] == ["created", "paused", "unpaused", "finished"]
    assert events[0]["event"]["params"] == ["o-1"]
    assert events[0]["event"]["ffqn"] == APPROVE
    assert events[3]["event"]["result"] == {"type": "ok", "value": True}
    assert all(set(e) == {"version", "created_at", "event"} for e in events)

    page = await (await client.get(f"/v1/executions/{eid}/events?version=1&length=2")).json()
    assert [e["version"] for e in page] == [1, 2]
    assert await (await client.get(f"/v1/executions/{eid}/events?version=9")).json() == []
    with_bt = await (
        await client.get(f"/v1/executions/{eid}/events?length=1&include_backtrace_id=true")
    ).json()
    assert with_bt[0]["backtrace_id"] is None
    for query in ("version=-1", "version=x", "length=0", "length=1.5"):
        await expect_error(
            await client.get(f"/v1/executions/{eid}/events?{query}"), 400, "query parameter"
        )


async def test_responses(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    r = await client.get(f"/v1/executions/{eid}/responses")
    assert r.status == 200
    assert await r.json() == []
    await expect_error(await client.get(f"/v1/executions/{eid}/responses?after=-2"), 400, "after")


async def test_logs(client: TestClient[Any, Any], engine: Engine) -> None:
    eid = await submit(client)
    lines = [LogLine("info", f"line {i}", "stdout") for i in range(5)]
    await engine.storage.append_logs(eid, None, lines, engine.clock.now())
    logs = await (await client.get(f"/v1/executions/{eid}/logs")).json()
    assert [x["message"] for x in logs] == [f"line {i}" for i in range(5)]
    assert set(logs[0]) == {"id", "run_id", "created_at", "level", "stream", "message"}
    assert logs[0]["stream"] == "stdout"
    assert logs[0]["level"] == "info"
    after = logs[1]["id"]
    page = await (await client.get(f"/v1/executions/{eid}/logs?after={after}&limit=2")).json()
    assert [x["message"] for x in page] == ["line 2", "line 3"]
    await expect_error(await client.get(f"/v1/executions/{eid}/logs?limit=0"), 400, "limit")
    other = await submit(client)
    assert await (await client.get(f"/v1/executions/{other}/logs")).json() == []


# ---------------------------------------------------------------------------------------
# Pause, unpause, cancel, stub
# ---------------------------------------------------------------------------------------


async def test_pause_and_unpause(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    r = await client.put(f"/v1/executions/{eid}/pause")
    assert r.status == 200
    state = (await r.json())["state"]
    assert state["type"] == "paused"
    assert state["underlying"]["type"] == "pending_at"
    await expect_error(await client.put(f"/v1/executions/{eid}/pause"), 409, "already paused")
    r = await client.put(f"/v1/executions/{eid}/unpause")
    assert r.status == 200
    assert (await r.json())["state"]["type"] == "pending_at"
    await expect_error(await client.put(f"/v1/executions/{eid}/unpause"), 409, "not paused")


async def test_pause_finished_is_409(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    await client.put(f"/v1/executions/{eid}/stub", json={"ok": True})
    await expect_error(await client.put(f"/v1/executions/{eid}/pause"), 409, "finished")
    await expect_error(await client.put(f"/v1/executions/{eid}/unpause"), 409, "finished")


async def test_cancel(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    r = await client.put(f"/v1/executions/{eid}/cancel")
    assert r.status == 200
    info = await r.json()
    assert info["state"] == {
        "type": "finished",
        "version": 2,
        "finished_at": info["state"]["finished_at"],
        "result_kind": "execution_failure:cancelled",
    }
    assert info["result"]["execution_failure"]["kind"] == "cancelled"
    await expect_error(await client.put(f"/v1/executions/{eid}/cancel"), 409, "finished")
    await expect_error(await client.put(f"/v1/executions/{eid}/pause"), 409, "finished")


async def test_cancel_not_cancellable_workflow_is_422(
    client: TestClient[Any, Any], engine: Engine
) -> None:
    # Workflow executions created at the storage level (no JS needed): the API maps the
    # storage's NotCancellable to 422, and a -cancellable workflow goes to Cancelling.
    # `test_workflow_with_a_stub_child` covers the 422 with a real JS workflow.
    now = engine.clock.now()
    for name, status in (("serial", 422), ("serial-cancellable", 200)):
        eid = unknown_id()
        created = ev.Created(
            ffqn=f"myapp:demo/workflow.{name}",
            params=[],
            scheduled_at=now,
            component_id=ev.ComponentId("workflow_js", "serial", "sha256:" + "0" * 64),
            deployment_id=engine.deployment_id,
        )
        await engine.storage.create(CreateRequest(eid, created), now)
        r = await client.put(f"/v1/executions/{eid}/cancel")
        if status == 422:
            await expect_error(r, 422, "not cancellable")
        else:
            assert r.status == 200
            # The cancellation driver finishes it at once (it has no join sets to close).
            assert (await r.json())["state"]["type"] in ("cancelling", "finished")
            await expect_error(await client.put(f"/v1/executions/{eid}/cancel"), 409, "already")
            await expect_error(await client.put(f"/v1/executions/{eid}/pause"), 409)
            result = await engine.result(eid, timeout=5)
            assert result == ev.ExecutionFailure("cancelled", "cancellation requested")


async def test_stub(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    r = await client.put(f"/v1/executions/{eid}/stub", json={"ok": True})
    assert r.status == 200
    info = await r.json()
    assert info["state"]["type"] == "finished"
    assert info["result"] == {"ok": True}
    # The same result again is accepted; another one is a conflict.
    assert (await client.put(f"/v1/executions/{eid}/stub", json={"ok": True})).status == 200
    await expect_error(
        await client.put(f"/v1/executions/{eid}/stub", json={"ok": False}), 409, "another result"
    )
    await expect_error(
        await client.put(f"/v1/executions/{eid}/stub", json={"err": "x"}), 409, "another result"
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"ok": ', "malformed JSON"),
        (b"", "missing JSON request body"),
        (b"[true]", '{"ok": value} or {"err": value}'),
        (b'{"ok": true, "err": "x"}', '{"ok": value} or {"err": value}'),
        (b'{"execution_failure": {"kind": "cancelled"}}', '{"ok": value} or {"err": value}'),
        (b'{"ok": "yes"}', "expected bool"),
        (b'{"err": 5}', "expected string"),
    ],
)
async def test_stub_bad_input(client: TestClient[Any, Any], body: bytes, fragment: str) -> None:
    eid = await submit(client)
    r = await client.put(f"/v1/executions/{eid}/stub", data=body)
    await expect_error(r, 400, fragment)
    status = await (await client.get(f"/v1/executions/{eid}/status")).json()
    assert status["state"]["type"] == "pending_at"


# ---------------------------------------------------------------------------------------
# List
# ---------------------------------------------------------------------------------------


async def test_list_filters_and_paging(client: TestClient[Any, Any]) -> None:
    approvals = [await submit(client, APPROVE, [f"o-{i}"]) for i in range(3)]
    counts = [await submit(client, COUNT, [i, ["t"]]) for i in range(2)]
    await client.put(f"/v1/executions/{approvals[0]}/stub", json={"ok": True})
    await client.put(f"/v1/executions/{counts[0]}/pause")

    async def ids(query: str = "") -> list[str]:
        r = await client.get(f"/v1/executions{query}")
        assert r.status == 200, await r.text()
        return [row["execution_id"] for row in await r.json()]

    everything = await ids()
    assert everything == [*reversed(counts), *reversed(approvals)], "newest first"
    assert await ids(f"?ffqn={COUNT}") == list(reversed(counts))
    assert await ids("?ffqn=myapp:demo/approval.a") == list(reversed(approvals))
    assert await ids("?ffqn=other:") == []
    assert set(await ids("?hide_finished=true")) == set(everything) - {approvals[0]}
    assert await ids("?state=finished") == [approvals[0]]
    assert await ids("?state=paused") == [counts[0]]
    assert set(await ids("?state=paused&state=finished")) == {counts[0], approvals[0]}
    assert len(await ids("?state=pending_at")) == 3
    assert await ids("?top_level_only=true") == everything
    assert await ids(f"?id_prefix={approvals[1]}") == [approvals[1]]
    assert approvals[2] in await ids(f"?id_prefix={approvals[2][:12]}")
    assert await ids("?id_prefix=E_Z") == []

    page1 = await ids("?limit=2")
    page2 = await ids(f"?limit=2&before={page1[-1]}")
    page3 = await ids(f"?limit=2&before={page2[-1]}")
    assert page1 + page2 + page3 == everything

    rows = await (await client.get("/v1/executions?limit=1")).json()
    assert set(rows[0]) == {
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
    }

    for query, fragment in [
        ("?state=running", "unknown state"),
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?limit=ten", "limit"),
        ("?before=nope", "before"),
        ("?hide_finished=perhaps", "hide_finished"),
    ]:
        await expect_error(await client.get(f"/v1/executions{query}"), 400, fragment)


# ---------------------------------------------------------------------------------------
# Components, OpenAPI, plumbing
# ---------------------------------------------------------------------------------------


async def test_components(client: TestClient[Any, Any]) -> None:
    components = await (await client.get("/v1/components")).json()
    by_name = {c["name"]: c for c in components}
    assert set(by_name) == {APPROVE, "counter"}
    counter = by_name["counter"]
    assert counter["type"] == "activity_stub"
    assert counter["digest"].startswith("sha256:") and len(counter["digest"]) == 71
    assert counter["location"] is None
    assert counter["exports"] == [
        {
            "ffqn": COUNT,
            "params": [{"name": "n", "type": "u32"}, {"name": "tags", "type": "list<string>"}],
            "return_type": "result<u32, string>",
        }
    ]


async def test_openapi(client: TestClient[Any, Any]) -> None:
    r = await client.get("/openapi.json")
    assert r.status == 200
    doc = await r.json()
    assert doc["openapi"] == "3.1.0"
    assert doc == openapi_document(auth=True)
    assert set(doc["paths"]) == {
        "/v1/executions",
        "/v1/executions/{execution_id}",
        "/v1/executions/{execution_id}/status",
        "/v1/executions/{execution_id}/events",
        "/v1/executions/{execution_id}/responses",
        "/v1/executions/{execution_id}/logs",
        "/v1/executions/{execution_id}/backtrace",
        "/v1/executions/{execution_id}/backtraces",
        "/v1/executions/{execution_id}/pause",
        "/v1/executions/{execution_id}/unpause",
        "/v1/executions/{execution_id}/cancel",
        "/v1/executions/{execution_id}/stub",
        "/v1/delays/{delay_id}/cancel",
        "/v1/components",
        "/v1/deployment",
        "/v1/components/{digest}/source",
        "/v1/executions/count",
        "/v1/stats",
        "/v1/changes",
        "/openapi.json",
    }
    # Every route of the app is documented, with the methods it accepts.
    app_routes = {
        (route.method.lower(), route.resource.canonical)
        for route in client.app.router.routes()  # type: ignore[union-attr]
        if route.resource is not None and route.method != "HEAD"
    }
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert app_routes == documented
    refs = {
        v.removeprefix("#/components/schemas/")
        for v in _walk(doc)
        if isinstance(v, str) and v.startswith("#/components/schemas/")
    }
    assert refs <= set(doc["components"]["schemas"])


def _walk(value: Any) -> list[Any]:
    out = [value]
    if isinstance(value, dict):
        for v in value.values():
            out += _walk(v)
    elif isinstance(value, list):
        for v in value:
            out += _walk(v)
    return out


async def test_unknown_endpoint_and_method(client: TestClient[Any, Any]) -> None:
    await expect_error(await client.get("/v1/nothing"), 404, "no such endpoint: GET /v1/nothing")
    r = await client.delete("/v1/executions")
    await expect_error(r, 405, "DELETE")
    assert "GET" in r.headers["Allow"]


async def test_unexpected_error_is_500_without_traceback(
    client: TestClient[Any, Any],
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(execution_id: str) -> None:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(engine, "pause", broken)
    eid = await submit(client)
    message = await expect_error(await client.put(f"/v1/executions/{eid}/pause"), 500)
    assert "secret internals" not in message
    assert "RuntimeError" in message
    assert "secret internals" in caplog.text


# ---------------------------------------------------------------------------------------
# A real WASM activity end to end
# ---------------------------------------------------------------------------------------


@pytest.fixture
async def wasm_client(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    from tests.fixtures.components import activity_component

    deployment = (
        Deployment()
        .activity_wasm(
            "fixtures", activity_component(), max_retries=0, exec={"lock_expiry": seconds(2)}
        )
        .write(tmp_path)
    )
    e = await Engine.start(deployment, tmp_path / "data")
    try:
        async with TestClient(TestServer(make_app(e, TOKEN)), headers=AUTH) as c:
            yield c
    finally:
        await e.stop()


async def test_wasm_activity_through_the_api(wasm_client: TestClient[Any, Any]) -> None:
    c = wasm_client
    components = await (await c.get("/v1/components")).json()
    assert [x["type"] for x in components] == ["activity_wasm"]
    assert components[0]["location"].endswith(".wasm")
    exports = {f["ffqn"]: f for f in components[0]["exports"]}
    assert exports["testing:fixtures/activity.add"] == {
        "ffqn": "testing:fixtures/activity.add",
        "params": [{"name": "a", "type": "u64"}, {"name": "b", "type": "u64"}],
        "return_type": "result<u64, string>",
    }

    eid = await submit(c, "testing:fixtures/activity.add", [2, 40])
    r = await c.get(f"/v1/executions/{eid}", params={"follow": "true", "timeout": "10"})
    assert await r.json() == {"ok": 42}
    events = await (await c.get(f"/v1/executions/{eid}/events")).json()
    assert [e["event"]["type"] for e in events] == ["created", "locked", "finished"]

    eid = await submit(c, "testing:fixtures/activity.print", ["hello from wasm"])
    r = await c.get(f"/v1/executions/{eid}", params={"follow": "true", "timeout": "10"})
    assert await r.json() == {"ok": None}
    logs = await (await c.get(f"/v1/executions/{eid}/logs")).json()
    assert [(x["stream"], x["message"]) for x in logs] == [("stdout", "hello from wasm")]
    assert logs[0]["run_id"].startswith("Run_")

    # A running activity cannot be paused, but it can be cancelled.
    eid = await submit(c, "testing:fixtures/activity.spin", [])
    for _ in range(100):
        status = await (await c.get(f"/v1/executions/{eid}/status")).json()
        if status["state"]["type"] == "locked":
            break
        await asyncio.sleep(0.02)
    assert status["state"]["type"] == "locked"
    assert status["lock_expires_at"] is not None
    await expect_error(await c.put(f"/v1/executions/{eid}/pause"), 409, "cancel it instead")
    assert (await c.put(f"/v1/executions/{eid}/cancel")).status == 200
    r = await c.get(f"/v1/executions/{eid}", params={"follow": "true", "timeout": "10"})
    assert (await r.json())["execution_failure"]["kind"] == "cancelled"


# ---------------------------------------------------------------------------------------
# A JS workflow waiting on a stub child
# ---------------------------------------------------------------------------------------

CHECKOUT = "myapp:demo/workflow.checkout"
CHECKOUT_JS = """
import { approve } from "myapp:demo/approval";
export default function checkout(order) {
  return approve(order) ? "approved" : "rejected";
}
"""
WORKFLOW_DEPLOYMENT = DEPLOYMENT + Deployment().workflow_js(
    "checkout",
    CHECKOUT_JS,
    ffqn=CHECKOUT,
    params=[("order", "string")],
    return_type="result<string, string>",
)


def write_workflow_deployment(directory: Path) -> Path:
    return WORKFLOW_DEPLOYMENT.write(directory)


@pytest.fixture
async def workflow_client(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    e = await Engine.start(write_workflow_deployment(tmp_path), tmp_path / "data")
    try:
        async with TestClient(TestServer(make_app(e, TOKEN)), headers=AUTH) as c:
            yield c
    finally:
        await e.stop()


async def wait_for_state(c: TestClient[Any, Any], eid: str, state: str) -> dict[str, Any]:
    for _ in range(250):
        info: dict[str, Any] = await (await c.get(f"/v1/executions/{eid}/status")).json()
        if info["state"]["type"] == state:
            return info
        await asyncio.sleep(0.02)
    raise AssertionError(f"{eid} never reached {state}: {info['state']}")


async def test_workflow_with_a_stub_child(workflow_client: TestClient[Any, Any]) -> None:
    c = workflow_client
    eid = await submit(c, CHECKOUT, ["order-7"])
    info = await wait_for_state(c, eid, "blocked_by_join_set")
    assert info["component_type"] == "workflow_js"
    assert info["state"]["join_set_id"] == "o:1-approve"

    # The child is listed with its parent; top_level_only hides it.
    rows = await (await c.get("/v1/executions")).json()
    (child,) = [r for r in rows if r["parent_id"] == eid]
    child_id = child["execution_id"]
    assert child_id == f"{eid}.o:1-approve_1"
    assert child["ffqn"] == APPROVE
    top = await (await c.get("/v1/executions?top_level_only=true")).json()
    assert [r["execution_id"] for r in top] == [eid]

    # Not a -cancellable workflow: 422. A blocked workflow can be paused.
    await expect_error(await c.put(f"/v1/executions/{eid}/cancel"), 422, "not cancellable")
    r = await c.put(f"/v1/executions/{eid}/pause")
    assert r.status == 200
    assert (await r.json())["state"]["underlying"]["type"] == "blocked_by_join_set"

    # The child's result arrives while the parent is paused; the parent then continues.
    follow = asyncio.create_task(c.get(f"/v1/executions/{eid}?follow=true&timeout=10"))
    r = await c.put(f"/v1/executions/{child_id}/stub", json={"ok": True})
    assert r.status == 200
    responses = await (await c.get(f"/v1/executions/{eid}/responses")).json()
    assert len(responses) == 1
    assert responses[0]["cursor"] == 1
    assert responses[0]["response"] == {
        "type": "child_execution_finished",
        "child_execution_id": child_id,
        "join_set_id": "o:1-approve",
        "finished_version": 1,
        "result": {"type": "ok", "value": True},
    }
    assert await (await c.get(f"/v1/executions/{eid}/responses?after=1")).json() == []
    info = await (await c.get(f"/v1/executions/{eid}/status")).json()
    assert info["state"]["type"] == "paused"
    assert info["state"]["underlying"]["type"] == "pending_at"
    assert not follow.done()
    assert (await c.put(f"/v1/executions/{eid}/unpause")).status == 200
    response = await asyncio.wait_for(follow, 10)
    assert await response.json() == {"ok": "approved"}

    events = await (await c.get(f"/v1/executions/{eid}/events")).json()
    history = [e["event"]["event"]["type"] for e in events if e["event"]["type"] == "history_event"]
    assert "join_set_request" in history


# -- console support: positions, orders, counts, extras, long polls ----------------------


async def test_list_offset_order_extras_and_count(client: TestClient[Any, Any]) -> None:
    ids = [await submit(client, params=[f"o-{i}"]) for i in range(5)]
    await submit(client, COUNT, [1, []])
    r = await client.get("/v1/executions", params={"ffqn": APPROVE, "offset": "1", "limit": "2"})
    assert [x["execution_id"] for x in await r.json()] == [ids[3], ids[2]]
    r = await client.get("/v1/executions", params={"ffqn": APPROVE, "order": "created_asc"})
    rows = await r.json()
    assert [x["execution_id"] for x in rows] == ids
    assert "children" not in rows[0] and "last_event" not in rows[0]
    r = await client.put(f"/v1/executions/{ids[0]}/pause")
    assert r.status == 200
    r = await client.get("/v1/executions", params={"order": "updated_desc", "extras": "true"})
    rows = await r.json()
    assert rows[0]["execution_id"] == ids[0]  # the last change first
    assert (rows[0]["children"], rows[0]["last_event"]) == (0, "paused")
    assert {x["last_event"] for x in rows[1:]} == {"created"}
    r = await client.get("/v1/executions/count", params={"ffqn": APPROVE})
    assert await r.json() == {"count": 5}
    r = await client.get("/v1/executions/count", params=[("state", "paused")])
    assert await r.json() == {"count": 1}
    r = await client.get("/v1/executions", params={"order": "sideways"})
    await expect_error(r, 400, "unknown order 'sideways'", "created_desc")
    r = await client.get("/v1/executions/count", params={"state": "asleep"})
    await expect_error(r, 400, "unknown state 'asleep'")
    r = await client.get("/v1/executions", params={"offset": "-1"})
    await expect_error(r, 400, "offset")


async def test_stats(client: TestClient[Any, Any]) -> None:
    r = await client.get("/v1/stats")
    assert (await r.json())["by_state"]["pending_at"] == 0
    eid = await submit(client)
    await submit(client)
    await client.put(f"/v1/executions/{eid}/pause")
    by_state = (await (await client.get("/v1/stats")).json())["by_state"]
    assert by_state == {
        "pending_at": 1,
        "locked": 0,
        "blocked_by_join_set": 0,
        "paused": 1,
        "cancelling": 0,
        "finished": 0,
    }


async def test_changes_long_poll(client: TestClient[Any, Any]) -> None:
    now = (await (await client.get("/v1/changes", params={"since": "-1"})).json())["generation"]
    # Nothing written: the poll answers at its timeout with the same generation.
    r = await client.get("/v1/changes", params={"since": str(now), "timeout": "0.05"})
    assert (await r.json())["generation"] == now
    # timeout=0 answers at once (not after the default 25 s).
    zero = client.get("/v1/changes", params={"since": str(now), "timeout": "0"})
    assert (await (await asyncio.wait_for(zero, 10)).json())["generation"] == now
    waiting = asyncio.ensure_future(client.get("/v1/changes", params={"since": str(now)}))
    await asyncio.sleep(0)
    assert not waiting.done()
    await submit(client)
    r = await asyncio.wait_for(waiting, 10)
    assert (await r.json())["generation"] > now


async def test_deployment_long_poll_answers_after_a_reload(
    client: TestClient[Any, Any], engine: Engine, tmp_path: Path
) -> None:
    first = await (await client.get("/v1/deployment")).json()
    g = first["reload"]["generation"]
    r = await client.get("/v1/deployment", params={"after": str(g), "timeout": "0.05"})
    assert (await r.json())["reload"]["generation"] == g  # timed out: the current one
    zero = client.get("/v1/deployment", params={"after": str(g), "timeout": "0"})
    assert (await (await asyncio.wait_for(zero, 10)).json())["reload"]["generation"] == g
    waiting = asyncio.ensure_future(client.get("/v1/deployment", params={"after": str(g)}))
    await asyncio.sleep(0)
    (tmp_path / "deployment.toml").write_text("[[activity_stub]]\nffqn = 3\n")
    r = await asyncio.wait_for(waiting, 20)
    status = (await r.json())["reload"]
    assert status["generation"] > g and status["ok"] is False
    assert "deployment.toml: [[activity_stub]] #1" in status["error"]


# ---------------------------------------------------------------------------------------
# Request size
# ---------------------------------------------------------------------------------------


async def test_params_of_several_mebibytes_are_accepted(client: TestClient[Any, Any]) -> None:
    big = "x" * (3 * 2**20)  # above aiohttp's 1 MiB default
    eid = await submit(client, params=[big])
    r = await client.get(f"/v1/executions/{eid}/status")
    assert r.status == 200, await r.text()


async def test_a_body_over_the_limit_names_the_limit(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import engine.server.api as api

    monkeypatch.setattr(api, "MAX_REQUEST_BODY", 2**20)
    async with TestClient(TestServer(make_app(engine, TOKEN)), headers=AUTH) as c:
        r = await c.post("/v1/executions", json={"ffqn": APPROVE, "params": ["x" * 2**21]})
        await expect_error(r, 413, "request body too large", "the limit is 1 MiB")


async def test_params_over_the_limit_are_400_naming_it_and_create_nothing(
    client: TestClient[Any, Any],
) -> None:
    from engine.limits import MAX_PARAMS_BYTES

    big = "x" * MAX_PARAMS_BYTES  # with its quotes and brackets, just over the limit
    r = await client.post("/v1/executions", json={"ffqn": APPROVE, "params": [big]})
    await expect_error(r, 400, f"params of {APPROVE} are too large", "the limit is 4 MiB")
    r = await client.get("/v1/executions/count")
    assert await r.json() == {"count": 0}


async def test_the_engine_facade_refuses_params_over_the_limit(engine: Engine) -> None:
    from engine.errors import InvalidParams
    from engine.limits import MAX_PARAMS_BYTES

    with pytest.raises(InvalidParams) as refused:
        await engine.submit(APPROVE, ["é" * (MAX_PARAMS_BYTES // 2)])  # 2 bytes each
    assert str(refused.value).startswith(f"params of {APPROVE} are too large: 4,194,308 bytes")
    assert str(refused.value).endswith("(the limit is 4 MiB)")
    assert await engine.storage.count_executions(ListFilter()) == 0


async def test_a_stopping_server_does_not_wait_for_long_polls(tmp_path: Path) -> None:
    """A client following an unfinished execution must not hold the server's stop (a
    service manager would SIGKILL it): the follow is cut after a short grace."""
    import aiohttp

    from engine.server.run import start_server

    server = await start_server(
        write_deployment(tmp_path), tmp_path / "data", "127.0.0.1", 0, TOKEN
    )
    async with aiohttp.ClientSession(headers=AUTH) as session:
        r = await session.post(
            f"{server.url}/v1/executions", json={"ffqn": APPROVE, "params": ["x"]}
        )
        eid = (await r.json())["execution_id"]
        follow = asyncio.ensure_future(
            session.get(f"{server.url}/v1/executions/{eid}?follow=true&timeout=600")
        )
        await asyncio.sleep(0.2)  # let it reach the server (if not, this test passes anyway)
        assert not follow.done()
        await asyncio.wait_for(server.stop(), 30)  # not the 600 s the polls asked for
        with contextlib.suppress(aiohttp.ClientError):
            (await follow).close()
