"""The demo deployment (`demo/deployment.toml`) builds and runs: one execution of each kind.

Builds every component of `engine.build_components.COMPONENTS` the way the set-up command
does (cached by input hash), starts an `Engine` on the demo deployment and runs the
Python-built WASM activity, the WAT-built WASM activity, a JS activity and the stub.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.build_components import COMPONENTS, REPO_ROOT, ensure_built
from engine.core import events as ev
from engine.engine import Engine
from tests.engine.test_js_activities import legal
from tests.fixtures import components as fx

DEMO = REPO_ROOT / "demo" / "deployment.toml"


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Engine]:
    for name in COMPONENTS:
        built = await asyncio.to_thread(ensure_built, name)
        assert built.is_file() and built.parent == REPO_ROOT / "demo" / "build"
    engine = await Engine.start(DEMO, fx.share_compiled_cache(tmp_path / "data"))
    try:
        yield engine
    finally:
        await engine.stop()


async def logs(engine: Engine, execution_id: str) -> list[tuple[str, str, str]]:
    return [(x.level, x.stream, x.message) for x in await engine.storage.get_logs(execution_id)]


async def test_demo_components_are_all_deployed(demo: Engine) -> None:
    by_name = {c.config.name: c for c in demo.components}
    assert by_name["activity_py"].config.type == "activity_wasm"
    assert by_name["activity_wat"].config.type == "activity_wasm"
    assert by_name["activity_wat"].ffqns == [
        "myapp:demo/wat.add",
        "myapp:demo/wat.fail-until",
        "myapp:demo/wat.greet",
    ]
    assert {c.config.type for c in demo.components} >= {
        "activity_wasm",
        "activity_js",
        "activity_stub",
    }


async def test_python_built_wasm_activity(demo: Engine) -> None:
    eid = await demo.submit("myapp:demo/activity.step", [3, 0])
    assert await demo.result(eid, timeout=30) == ev.ResultOk(3)
    assert ("info", "stdout", "step 3 done") in await logs(demo, eid)
    await legal(demo, eid)


async def test_wat_built_wasm_activity(demo: Engine) -> None:
    eid = await demo.submit("myapp:demo/wat.add", [2, 40])
    assert await demo.result(eid, timeout=10) == ev.ResultOk(42)
    assert await logs(demo, eid) == [("info", "log", "add: computing a + b")]

    eid = await demo.submit("myapp:demo/wat.greet", ["demo"])
    assert await demo.result(eid, timeout=10) == ev.ResultOk("Hello, demo!")
    assert await logs(demo, eid) == [("info", "stdout", "Hello, demo!")]

    # err until the wall clock passes `until`: retried with the deployment's 100 ms backoff.
    until = int(time.time() * 1000) + 250
    eid = await demo.submit("myapp:demo/wat.fail-until", [until])
    result = await demo.result(eid, timeout=10)
    assert isinstance(result, ev.ResultOk) and result.value >= until
    events = await demo.storage.get_events(eid)
    failures = [e.event for e in events if isinstance(e.event, ev.TemporarilyFailed)]
    assert failures and {f.reason for f in failures} == {"returned err"}
    assert {f.detail for f in failures} == {'"too early, will be retried"'}
    assert ("warn", "log", "too early, will be retried") in await logs(demo, eid)
    await legal(demo, eid)


async def test_js_activity(demo: Engine) -> None:
    eid = await demo.submit("myapp:demo/greeter.greet", ["demo"])
    assert await demo.result(eid, timeout=10) == ev.ResultOk("Hello, demo!")
    assert await logs(demo, eid) == [("info", "log", "greeting demo")]


async def test_stub_activity(demo: Engine) -> None:
    eid = await demo.submit("myapp:demo/approval.approve", ["order-1"])
    await demo.stub(eid, {"ok": True})
    assert await demo.result(eid, timeout=1) == ev.ResultOk(True)
