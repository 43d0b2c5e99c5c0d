"""The demo's traffic generator steers only what it submitted (an operator's order and
its approval are the operator's), and shows `cancelling` early: it cancels one of its
long steps while it runs, every few steering rounds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.build_components import COMPONENTS, REPO_ROOT, ensure_built
from engine.core import events as ev
from engine.core.state import state_name
from engine.engine import Engine
from obelisk_tui import demo_traffic
from obelisk_tui.backend import EmbeddedBackend
from obelisk_tui.demo_traffic import DemoTraffic
from tests.fixtures import components as fx

DEMO = REPO_ROOT / "demo" / "deployment.toml"
ORDER = "myapp:demo/workflow.order-cancellable"


@pytest.fixture
async def demo(tmp_path: Path) -> AsyncIterator[Engine]:
    for name in COMPONENTS:
        await asyncio.to_thread(ensure_built, name)
    engine = await Engine.start(DEMO, fx.share_compiled_cache(tmp_path / "data"))
    try:
        yield engine
    finally:
        await engine.stop()


async def eventually(check: object, what: str, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():  # type: ignore[operator]
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)  # polling the engine's state: no event to wait on


async def test_the_generator_leaves_the_operators_executions_alone_and_cancels_its_own(
    demo: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = demo
    mine = await engine.submit(ORDER, ["operator-1"])
    approval = f"{mine}.o:1-approve_1"

    async def blocked() -> bool:
        return state_name((await engine.storage.get_row(mine)).state) == "blocked_by_join_set"

    await eventually(blocked, "the operator's order to wait for its approval")
    monkeypatch.setattr(demo_traffic, "CANCEL_EVERY", 2)
    traffic = DemoTraffic(EmbeddedBackend(engine, label="demo", owns_engine=False), rate=20, seed=7)
    # Orders and approvals every round: the generator has some of its own to steer.
    monkeypatch.setattr(
        demo_traffic,
        "MIX",
        [m for m in demo_traffic.MIX if m[1] in (ORDER, "myapp:demo/activity.step")],
    )
    traffic.start()
    try:

        async def cancelled_a_step() -> bool:
            for eid in list(traffic.submitted):
                row = await engine.storage.get_row(eid)
                if (
                    row.ffqn == "myapp:demo/activity.step"
                    and isinstance(row.result, ev.ExecutionFailure)
                    and row.result.kind == "cancelled"
                ):
                    return True
            return False

        async def steered_its_own_orders() -> bool:
            answered = 0
            for eid in list(traffic.submitted):
                row = await engine.storage.get_row(eid)
                if row.ffqn == ORDER and state_name(row.state) in ("finished", "paused"):
                    answered += 1
            return answered >= 2

        await eventually(cancelled_a_step, "a step of the generator's cancelled")
        await eventually(steered_its_own_orders, "the generator to steer its own orders")
    finally:
        await traffic.stop()
    assert mine not in traffic.submitted
    # The operator's order still waits for the operator's answer, untouched.
    assert state_name((await engine.storage.get_row(mine)).state) == "blocked_by_join_set"
    approval_row = await engine.storage.get_row(approval)
    assert approval_row.result is None and state_name(approval_row.state) == "pending_at"
    events = [e.event for e in await engine.storage.get_events(mine)]
    assert not any(isinstance(e, ev.Paused | ev.CancellationRequested) for e in events)
