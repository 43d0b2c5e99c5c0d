"""Bad input the REST API must refuse with a 400 naming it, never a 5xx: JSON nested
too deeply, ids with enormous indexes, numbers out of the bounds the OpenAPI document
declares (walked here, so that the document and the validation cannot drift apart)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine.core.ids import EXECUTION_ID_PATTERN, ExecutionId, IdError
from engine.engine import Engine
from engine.server.api import make_app, openapi_document
from tests.server.test_api import (
    APPROVE,
    AUTH,
    TOKEN,
    expect_error,
    submit,
    unknown_id,
    write_deployment,
)


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


HUGE = "9" * 5000


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


@pytest.mark.parametrize("depth", [1_100, 100_000])
async def test_json_nested_too_deeply_is_400(client: TestClient[Any, Any], depth: int) -> None:
    r = await client.post(
        "/v1/executions", data=b'{"ffqn": "a:b/c.d", "params": ' + nested(depth) + b"}"
    )
    await expect_error(r, 400, "request body", "nested too deeply")
    eid = await submit(client)
    r = await client.put(f"/v1/executions/{eid}/stub", data=b'{"ok": ' + nested(depth) + b"}")
    await expect_error(r, 400, "request body", "nested too deeply")


async def test_json_nested_just_below_the_limit_is_no_5xx(client: TestClient[Any, Any]) -> None:
    """What the decoder does accept reaches the params check, which refuses it."""
    eid = await submit(client)
    for depth in (200, 500, 900):
        body = b'{"ffqn": "' + APPROVE.encode() + b'", "params": [' + nested(depth) + b"]}"
        r = await client.post("/v1/executions", data=body)
        assert r.status < 500, await r.text()
        r = await client.put(f"/v1/executions/{eid}/stub", data=b'{"ok": ' + nested(depth) + b"}")
        assert r.status < 500, await r.text()


def test_an_index_with_too_many_digits_is_an_id_error() -> None:
    top = str(ExecutionId.generate())
    with pytest.raises(IdError, match="more than 18 digits"):
        ExecutionId.parse(f"{top}.g:1_{HUGE}")
    largest = f"{top}.g:1_{'9' * 18}"
    assert str(ExecutionId.parse(largest)) == largest
    assert re.fullmatch(EXECUTION_ID_PATTERN, largest)
    assert not re.fullmatch(EXECUTION_ID_PATTERN, largest + "9")


async def test_child_id_with_a_huge_index_is_400(client: TestClient[Any, Any]) -> None:
    child = f"{unknown_id()}.g:1_{HUGE}"
    for method, path in [
        ("GET", f"/v1/executions/{child}"),
        ("GET", f"/v1/executions/{child}/status"),
        ("GET", f"/v1/executions/{child}/events"),
        ("PUT", f"/v1/executions/{child}/cancel"),
        ("GET", f"/v1/executions?before={child}"),
    ]:
        r = await client.request(method, path)
        message = await expect_error(r, 400, "digits")
        assert len(message) < 500, message  # the id is shortened, not echoed 5,000 digits
    r = await client.put(f"/v1/delays/Delay_{unknown_id()[2:]}.n:x_{HUGE}/cancel")
    await expect_error(r, 400, "invalid delay id", "digits")
    r = await client.post(
        "/v1/executions", json={"ffqn": APPROVE, "params": ["o-1"], "execution_id": child}
    )
    await expect_error(r, 400, "digits")


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("offset=99999999999999999999999", "offset"),
        (f"offset={HUGE}", "offset"),
        ("limit=-1", "limit"),
        ("offset=1e3", "offset"),
    ],
)
async def test_list_numbers_out_of_bounds_are_400(
    client: TestClient[Any, Any], query: str, name: str
) -> None:
    for path in ("/v1/executions", "/v1/executions/count"):
        r = await client.get(f"{path}?{query}")
        await expect_error(r, 400, f"`{name}`")


async def test_negative_timeouts_are_400(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    for path in (
        f"/v1/executions/{eid}?follow=true&timeout=-1",
        f"/v1/executions/{eid}?timeout=-1",
        "/v1/changes?timeout=-1",
        "/v1/changes?since=0&timeout=1e400",
        "/v1/deployment?after=0&timeout=-1",
        "/v1/deployment?timeout=nan",
    ):
        r = await client.get(path)
        await expect_error(r, 400, "`timeout`")


def _numeric_parameters() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(method, path, name, schema) of every numeric query parameter with bounds."""
    out = []
    for path, item in openapi_document().get("paths", {}).items():
        for method, operation in item.items():
            for param in operation.get("parameters", []):
                schema = param.get("schema", {})
                if param["in"] == "query" and schema.get("type") in ("integer", "number"):
                    out.append((method, path, param["name"], schema))
    return out


def test_every_numeric_parameter_declares_both_bounds() -> None:
    params = _numeric_parameters()
    assert len(params) >= 12, params
    for method, path, name, schema in params:
        assert "minimum" in schema and "maximum" in schema, (method, path, name, schema)


async def test_the_openapi_bounds_are_the_validation_bounds(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    for method, path, name, schema in _numeric_parameters():
        url = path.replace("{execution_id}", eid)
        lo, hi = schema["minimum"], schema["maximum"]
        step = 1 if schema["type"] == "integer" else 0.001
        for outside in (lo - step, hi + step):
            text = str(outside) if step == 1 else repr(float(outside))
            r = await client.request(method, url, params={name: text})
            await expect_error(r, 400, f"`{name}`")
        # Inside: both bounds; `timeout=0` makes a long poll answer at once (elsewhere
        # it is ignored), so a timeout itself is tried at its lowest only.
        for inside in (lo,) if name == "timeout" else (lo, hi):
            query = (
                {name: str(inside)} if name == "timeout" else {name: str(inside), "timeout": "0"}
            )
            r = await client.request(method, url, params=query)
            assert r.status != 400 and r.status < 500, (method, url, query, await r.text())


def test_cli_refuses_params_nested_too_deeply(capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before any request is made: no server needed."""
    from engine.cli import main

    deep = "[" * 20_000 + "]" * 20_000
    for argv in (["submit", APPROVE, deep], ["stub", unknown_id(), '{"ok": ' + deep + "}"]):
        capsys.readouterr()
        assert main(["execution", *argv]) == 2
        err = capsys.readouterr().err
        assert "nested too deeply" in err and "Traceback" not in err, err


#: Values a client may send by mistake (or on purpose), for every parameter of every
#: operation: no answer may be a 5xx. (A bounded, deterministic stand-in for a schema
#: fuzzer: the same cases every run, in a second or two.)
HOSTILE = [
    "",
    "-1",
    "0",
    "1",
    "1.5",
    "-0",
    " 1",
    "0x10",
    "1e400",
    "nan",
    "inf",
    "true",
    "[",
    "%",
    "_",
    "\x00",
    "é",
    "E_",
    "9" * 30,
    str(2**63),
    str(-(2**63) - 1),
    HUGE,
]


async def test_hostile_values_are_never_a_5xx(client: TestClient[Any, Any]) -> None:
    eid = await submit(client)
    failures = []
    sent = 0
    for path, item in openapi_document()["paths"].items():
        for method, operation in item.items():
            names = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
            for value in HOSTILE:
                ids = [eid]
                if "{" in path and len(value) < 100:  # hostile ids too (URLs stay short)
                    ids += [
                        value,
                        f"{eid}.{value}",
                        f"{eid}.g:1_{value}",
                        f"Delay_{eid[2:]}.{value}",
                    ]
                for id_ in ids:
                    url = re.sub(r"\{[a-z_]+\}", lambda _, i=id_: i, path)
                    for name in names or [None]:
                        query = {} if name is None else {name: value}
                        if name not in (None, "timeout"):
                            query["timeout"] = "0"  # a long poll answers at once
                        body = b'{"ffqn": "' + value.encode() + b'"}' if method != "get" else None
                        r = await client.request(method, url, params=query, data=body)
                        sent += 1
                        if r.status >= 500:
                            failures.append((method, url[:80], query, r.status, await r.text()))
    assert sent > 1000
    assert not failures, failures[:10]
