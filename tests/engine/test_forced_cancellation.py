"""Forced cancellation on a real engine: the operator's way to end a workflow that is not
`-cancellable` (SPEC §8 refuses a plain cancel) and can never finish by itself: one that
computes forever without host calls, or waits forever on a child or a delay. Through the
engine facade, the REST API (real HTTP on loopback) and the `obelisk` CLI.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine.core import events as ev
from engine.core.state import state_name
from engine.engine import Engine
from engine.errors import Conflict, NotCancellable
from engine.server.api import make_app
from tests.engine.conftest import StartEngine
from tests.engine.test_cancellation import (
    APPROVE,
    CANCELLED,
    TOKEN,
    _workflow,
    history,
    legal,
    types,
    wait_state,
    wait_until,
)
from tests.fixtures.deployments import Deployment

# Not -cancellable: submits a child activity that nothing finishes and a child workflow
# that waits forever, then computes forever (strategy `interrupt`: the requests are in
# the log before the loop). Each run ends at the spin timeout, and is retried forever.
LOOPER_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";
export default function looper() {
  const js = obelisk.createJoinSet();
  js.submit("test:wf/approval.approve", ["z"]);
  js.submit("test:wf/wf.stuck", []);
  while (true) {}
}
"""

# Waits "forever" on a delay.
STUCK_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";
export default function stuck() {
  obelisk.sleep({ hours: 1 });
  return "woke";
}
"""


def _deployment() -> Deployment:
    d = Deployment()
    d.activity_stub(APPROVE, params=[("order", "string")], return_type="result<bool, string>")
    _workflow(d, "looper", "looper", strategy="interrupt")
    _workflow(d, "stuck", "stuck")
    _workflow(d, "stuck-cancellable", "stuck-c")
    return d


DEPLOYMENT = _deployment()
FILES = {"looper.js": LOOPER_JS, "stuck.js": STUCK_JS, "stuck-c.js": STUCK_JS}


@pytest.fixture
async def engine(start_engine: StartEngine) -> Engine:
    return await start_engine(DEPLOYMENT, files=FILES)


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[TestClient[Any, Any]]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with TestClient(TestServer(make_app(engine, TOKEN)), headers=headers) as c:
        yield c


def requests(events: list[ev.StoredEvent]) -> list[ev.CancellationRequested]:
    return [e.event for e in events if isinstance(e.event, ev.CancellationRequested)]


async def test_forced_cancel_ends_an_endless_loop_and_its_children(engine: Engine) -> None:
    eid = await engine.submit("test:wf/wf.looper", [])
    approve, stuck = f"{eid}.g:1_1", f"{eid}.g:1_2"

    async def looping() -> bool:
        requested = [
            h
            for h in history(await engine.storage.get_events(eid))
            if isinstance(h, ev.JoinSetRequest)
        ]
        return (
            len(requested) == 2
            and state_name((await engine.storage.get_row(eid)).state) == "locked"
        )

    await wait_until(engine, looping)
    await wait_state(engine, stuck, "blocked_by_join_set")

    with pytest.raises(NotCancellable, match="not cancellable"):
        await engine.cancel(eid)
    assert requests(await engine.storage.get_events(eid)) == []

    started = time.monotonic()
    await engine.cancel(eid, force=True)
    assert await engine.result(eid, timeout=8) == CANCELLED
    assert time.monotonic() - started < 8  # the run was interrupted, not left to its 10 s lock
    with pytest.raises(Conflict, match="already finished"):
        await engine.cancel(eid, force=True)

    events = await legal(engine, eid)
    assert requests(events) == [ev.CancellationRequested(forced=True)]
    tail = types(events)[types(events).index("cancellation_requested") :]
    assert tail[:2] == ["cancellation_requested", "unlocked"] and tail[-1] == "finished"
    assert "locked" not in tail  # never run again
    # Its pending children were cancelled: the activity, and the child workflow that is
    # not -cancellable either (forced too, or the parent would wait for it forever).
    assert await engine.result(approve, timeout=1) == CANCELLED
    assert await engine.result(stuck, timeout=1) == CANCELLED
    assert requests(await legal(engine, stuck)) == [ev.CancellationRequested(forced=True)]


async def test_forced_cancel_over_rest(engine: Engine, client: TestClient[Any, Any]) -> None:
    eid = await engine.submit("test:wf/wf.stuck", [])
    await wait_state(engine, eid, "blocked_by_join_set")

    r = await client.put(f"/v1/executions/{eid}/cancel")
    assert r.status == 422, await r.text()
    assert "force" in (await r.json())["error"]  # says how to end it anyway
    r = await client.put(f"/v1/executions/{eid}/cancel?force=maybe")
    assert r.status == 400, await r.text()
    assert "force" in (await r.json())["error"]

    r = await client.put(f"/v1/executions/{eid}/cancel?force=true")
    assert r.status == 200, await r.text()
    assert (await r.json())["state"]["type"] in ("cancelling", "finished")
    assert await engine.result(eid, timeout=8) == CANCELLED
    assert requests(await legal(engine, eid)) == [ev.CancellationRequested(forced=True)]
    r = await client.put(f"/v1/executions/{eid}/cancel?force=true")
    assert r.status == 409, await r.text()
    r = await client.get(f"/v1/executions/{eid}/events")
    assert {"type": "cancellation_requested", "forced": True} in [
        e["event"] for e in await r.json()
    ]

    # Forcing what is cancellable anyway is a plain cancel, and logged as one.
    other = await engine.submit("test:wf/wf.stuck-cancellable", [])
    await wait_state(engine, other, "blocked_by_join_set")
    r = await client.put(f"/v1/executions/{other}/cancel?force=true")
    assert r.status == 200, await r.text()
    assert await engine.result(other, timeout=8) == CANCELLED
    assert requests(await legal(engine, other)) == [ev.CancellationRequested(forced=False)]

    doc = await (await client.get("/openapi.json")).json()
    parameters = doc["paths"]["/v1/executions/{execution_id}/cancel"]["put"]["parameters"]
    assert "force" in [p["name"] for p in parameters]


async def test_forced_cancel_from_the_cli(
    engine: Engine,
    client: TestClient[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from engine.cli import main

    eid = await engine.submit("test:wf/wf.stuck", [])
    await wait_state(engine, eid, "blocked_by_join_set")
    monkeypatch.setenv("OBELISK_API_TOKEN", TOKEN)
    url = str(client.make_url("")).rstrip("/")
    cancel = ["execution", "cancel", eid, "--api-url", url]
    # The client is synchronous: run it on a thread while the loop serves the API.
    assert await asyncio.to_thread(main, cancel) == 1
    assert "not cancellable" in capsys.readouterr().err
    assert await asyncio.to_thread(main, [*cancel, "--force"]) == 0
    assert f"forced cancellation requested for {eid}: now" in capsys.readouterr().out
    assert await engine.result(eid, timeout=8) == CANCELLED
    assert requests(await legal(engine, eid)) == [ev.CancellationRequested(forced=True)]
    assert await asyncio.to_thread(main, [*cancel, "--force"]) == 1
    assert "already finished" in capsys.readouterr().err
