"""A real engine on a temporary SQLite file with real JS components, and the console on it.

`console_engine` starts the engine; `open_console(engine)` runs `ObeliskApp` headless
(Textual's `run_test`) on the embedded backend, in the test's own event loop. `until`
waits for a condition of the UI or of the engine, with a deadline (no fixed sleeps).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot

from engine.engine import Engine
from engine.views import ExecutionInfo
from obelisk_tui.app import ObeliskApp
from obelisk_tui.backend import ConsoleBackend, EmbeddedBackend
from tests.fixtures.deployments import Deployment, ms, seconds

STEP_JS = """
export default function step(idx) { return idx * 10; }
"""

SPIN_JS = """
export default function spin(ms) {
  const end = Date.now() + ms;
  while (Date.now() < end) { /* a long-running activity */ }
  return ms;
}
"""

FANOUT_JS = """
import { stepSubmit, stepAwaitNext } from "test:console-obelisk-ext/activity";
import * as obelisk from "obelisk:workflow@1.0.0";

export default function fanout(n) {
  const js = obelisk.createJoinSet();
  for (let i = 0; i < n; i++) {
    stepSubmit(js, i); // the submitting line
  }
  let acc = 0;
  for (let i = 0; i < n; i++) acc += stepAwaitNext(js);
  console.log(`fan-out of ${n} adds up to ${acc}`);
  return String(acc);
}
"""

ORDER_JS = """
import { approve } from "test:console/approval";

export default function order(id) {
  console.log(`order ${id} waits for approval`);
  return approve(id) ? `order ${id} approved` : `order ${id} rejected`;
}
"""

STEP = "test:console/activity.step"
SPIN = "test:console/activity.spin"
APPROVE = "test:console/approval.approve"
FANOUT = "test:console/workflow.fanout"
ORDER = "test:console/workflow.order-cancellable"

DEPLOYMENT = (
    Deployment()
    .activity_js(
        "step",
        STEP_JS,
        ffqn=STEP,
        params=[("idx", "u32")],
        return_type="result<u32, string>",
        exec={"tick_sleep": ms(20)},
    )
    .activity_js(
        "spin",
        SPIN_JS,
        ffqn=SPIN,
        params=[("ms", "u32")],
        return_type="result<u32, string>",
        max_retries=0,
        exec={"lock_expiry": seconds(60)},
    )
    .activity_stub(
        APPROVE, name="approval", params=[("order", "string")], return_type="result<bool, string>"
    )
    .workflow_js(
        "fanout",
        FANOUT_JS,
        ffqn=FANOUT,
        params=[("n", "u32")],
        return_type="result<string, string>",
        exec={"tick_sleep": ms(20)},
    )
    .workflow_js(
        "order",
        ORDER_JS,
        ffqn=ORDER,
        params=[("id", "string")],
        return_type="result<string, string>",
        exec={"lock_expiry": seconds(2), "tick_sleep": ms(20)},
    )
)
SIZE = (160, 45)


def write_deployment(directory: Path) -> Path:
    return DEPLOYMENT.write(directory)


@asynccontextmanager
async def engine_in(directory: Path) -> AsyncIterator[Engine]:
    """An engine on the test deployment, written in `directory` with its data."""
    engine = await Engine.start(write_deployment(directory), directory / "data")
    try:
        yield engine
    finally:
        await engine.stop()


@pytest.fixture
async def console_engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with engine_in(tmp_path) as engine:
        yield engine


OpenConsole = Callable[..., Any]


IDLE_CHECK_S = 0.005  # how long the main thread is watched at a time
IDLE_CPU_S = IDLE_CHECK_S / 20  # under this much CPU in that time: idle (Textual's ratio)
IDLE_WAIT_MAX_S = 0.1


async def _main_thread_idle(min_sleep: float = 0.02, max_sleep: float = 1) -> None:
    """Textual's `wait_for_idle` for a process with an engine in it: waits until the event
    loop's thread, not the whole process, stops working, for at most `IDLE_WAIT_MAX_S`."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        cpu = time.thread_time()
        await asyncio.sleep(IDLE_CHECK_S)
        elapsed = loop.time() - start
        if elapsed >= min(max_sleep, IDLE_WAIT_MAX_S):
            return
        if elapsed > min_sleep and time.thread_time() - cpu < IDLE_CPU_S:
            return


@pytest.fixture(autouse=True)
def _pilot_waits_for_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Textual's Pilot waits after every key until the *process* is idle (under 1 ms of CPU
    in 20 ms, `textual._wait.wait_for_idle`), for up to 1 s, and `App._press_keys` twice
    more. With an engine embedded in the test process (its guest, writer and epoch
    threads) that is seldom true: every typed key cost up to ~3 s of waiting, most of the
    console tests' time. The Pilot also waits for every widget of the screen to have
    handled its messages (`_wait_for_screen`), and the tests wait for what they check
    with `until`."""
    import textual.app
    import textual.pilot

    monkeypatch.setattr(textual.app, "wait_for_idle", _main_thread_idle)
    monkeypatch.setattr(textual.pilot, "wait_for_idle", _main_thread_idle)


@asynccontextmanager
async def open_console(
    engine: Engine | None = None,
    *,
    backend: ConsoleBackend | None = None,
    size: tuple[int, int] = SIZE,
    now: Callable[[], datetime] | None = None,
    notifications: bool = False,
) -> AsyncIterator[tuple[ObeliskApp, Pilot[None]]]:
    """The console on `engine` (embedded) or on `backend`, connected and on its home screen.
    `notifications`: toasts are drawn (Textual's tests leave them out of the screen)."""

    async def connect() -> ConsoleBackend:
        if backend is not None:
            return backend
        assert engine is not None
        return EmbeddedBackend(engine, label="test", owns_engine=False)

    app = ObeliskApp(connect, what="test", now=now)
    async with app.run_test(size=size, notifications=notifications) as pilot:
        from obelisk_tui.screens.executions import ExecutionsScreen

        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="home screen")
        yield app, pilot
        # The console survives a screen's exception (`ObeliskApp._handle_exception`):
        # a test must still see it.
        assert app.screen_errors == [], f"the console survived errors: {app.screen_errors!r}"


async def until(
    pilot: Pilot[None],
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout: float = 15.0,
    what: str = "a condition",
    explain: Callable[[], str] | None = None,
) -> None:
    """Until `predicate()` holds, polling; `explain()` says what was there instead when
    it times out (for a failure that comes only now and then)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(
                f"timed out waiting for {what}" + (f": {explain()}" if explain else "")
            )
        await pilot.pause(0.02)


class GatedBackend(EmbeddedBackend):
    """The embedded backend whose `status` reads wait for the test to open a gate: the
    detail screen's load is held in the middle of its reads (as a slow disk or a busy
    engine holds it) while the operator leaves the screen."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(engine, label="test", owns_engine=False)
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0

    async def status(self, execution_id: str) -> ExecutionInfo:
        self.waiting += 1
        try:
            await self.gate.wait()
        finally:
            self.waiting -= 1
        return await super().status(execution_id)


def screen_text(app: ObeliskApp) -> str:
    """What the terminal shows now (the current screen with its overlays), as plain text."""
    update = app.screen._compositor.render_full_update()
    lines = []
    for strips in update.strips:
        lines.append(
            "".join(strip.text for strip in ([strips] if hasattr(strips, "text") else strips))
        )  # type: ignore[attr-defined]
    return "\n".join(lines)
