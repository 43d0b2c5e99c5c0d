"""Cancellation (SPEC §8) and pause of running workflows (SPEC §4.3) on a real engine.

Activities are JS (`spin` never returns: only a cancellation or its lock expiry ends it)
and an `activity_stub` that nothing finishes but the test; workflows are JS. Locks are
long (10 s) so that "finished quickly" means "by the cancellation", not "at the lock
expiry".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine.core import events as ev
from engine.core.state import Cancelling, Paused, replay_stored, state_name
from engine.engine import Engine
from engine.errors import Conflict, InvalidParams, NotCancellable, NotFound
from engine.executors.cancellation import teardown_view
from engine.server.api import make_app
from tests.engine.conftest import StartEngine
from tests.fixtures.deployments import Deployment, ParamSpec, ms, seconds

SPIN = "test:wf/acts.spin"
QUICK = "test:wf/acts.quick"
APPROVE = "test:wf/approval.approve"

ACTS_JS = """
export function spin() { while (true) {} }
export function quick(n) { return n + 1; }
"""

# A non-cancellable child workflow: awaited by a cancelled parent.
PLAIN_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";
export default function plain() {
  obelisk.sleep({ milliseconds: 1500 });
  return "plain done";
}
"""

# A cancellable child workflow: blocked on a sleep, with a running activity in a join set.
CHILD_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";
export default function child() {
  const js = obelisk.createJoinSet();
  js.submit("test:wf/acts.spin", []);
  obelisk.sleep({ hours: 1 });
  return "child woke";
}
"""

PARENT_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";
export default function parent() {
  const a = obelisk.createJoinSet();                 // g:1
  a.submit("test:wf/acts.spin", []);                 //   an activity (running)
  a.submitDelay({ hours: 1 });                       //   a delay
  const b = obelisk.createJoinSet({ name: "b" });    // n:b
  b.submit("test:wf/wf.plain", []);                  //   awaited
  b.submit("test:wf/wf.child-cancellable", []);      //   cancelled, recursively
  b.submit("test:wf/approval.approve", ["x"]);       //   an activity (pending)
  obelisk.sleep({ hours: 1 });                       // o:3-sleep: blocks here
  return "parent woke";
}
"""

# Computes (locked, no host calls) until interrupted; strategy `interrupt` so that the
# join set and its request are in the log before the spin.
SPINNER_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";
export default function spinner() {
  const js = obelisk.createJoinSet();
  js.submit("test:wf/approval.approve", ["y"]);
  while (true) {}
}
"""

SLEEPER_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";
export default function sleeper() {
  try {
    obelisk.sleep({ hours: 1 });
    return "woke";
  } catch (e) {
    if (e.cancelled) return "cancelled";
    throw e;
  }
}
"""

# Pause while computing and while awaiting; the result depends on both children.
PAUSABLE_JS = """
import { quick } from "test:wf/acts";
import { approve } from "test:wf/approval";
export default function pausable(n) {
  let acc = 0;
  for (let i = 0; i < n; i++) { acc = (acc + i) % 1000; }
  const q = quick(acc);
  const ok = approve("order");
  return `${q}:${ok}`;
}
"""


def _activity(d: Deployment, name: str, export: str, params: list[ParamSpec], ret: str) -> None:
    d.activity_js(
        name,
        None,  # acts.js, in FILES
        location="acts.js",
        export=export,
        ffqn=f"test:wf/acts.{name}",
        params=params,
        return_type=ret,
        max_retries=0,
        exec={"lock_expiry": seconds(10), "tick_sleep": ms(20)},
    )


def _workflow(
    d: Deployment,
    name: str,
    file: str,
    params: list[ParamSpec] | None = None,
    strategy: str = "await",
    lock_expiry: int = 10,
) -> None:
    d.workflow_js(
        file,
        None,  # <file>.js, in FILES
        ffqn=f"test:wf/wf.{name}",
        params=params or [],
        return_type="result<string, string>",
        blocking_strategy=strategy,
        exec={"lock_expiry": seconds(lock_expiry), "tick_sleep": ms(20)},
    )


def _deployment() -> Deployment:
    d = Deployment()
    _activity(d, "spin", "spin", [], "result<string, string>")
    _activity(d, "quick", "quick", [("n", "u32")], "result<u32, string>")
    d.activity_stub(APPROVE, params=[("order", "string")], return_type="result<bool, string>")
    _workflow(d, "plain", "plain")
    _workflow(d, "child-cancellable", "child")
    _workflow(d, "parent-cancellable", "parent")
    _workflow(d, "parent", "parent-plain")
    _workflow(d, "spinner-cancellable", "spinner", strategy="interrupt")
    _workflow(d, "sleeper", "sleeper")
    # A short lock: after a pause of a warm run blocked on a join set, the execution is
    # pending only at that run's lock expiry (SPEC §4.2), even though the run is gone.
    _workflow(d, "pausable", "pausable", [("n", "u32")], lock_expiry=2)
    return d


DEPLOYMENT = _deployment()

FILES = {
    "acts.js": ACTS_JS,
    "plain.js": PLAIN_JS,
    "child.js": CHILD_JS,
    "parent.js": PARENT_JS,
    "parent-plain.js": PARENT_JS,
    "spinner.js": SPINNER_JS,
    "sleeper.js": SLEEPER_JS,
    "pausable.js": PAUSABLE_JS,
}

CANCELLED = ev.ExecutionFailure("cancelled", "cancellation requested")
TOKEN = "test-token-0123456789"


async def start(start_engine: StartEngine) -> Engine:
    return await start_engine(DEPLOYMENT, files=FILES)


@pytest.fixture
async def engine(start_engine: StartEngine) -> Engine:
    return await start(start_engine)


@pytest.fixture
async def client(engine: Engine) -> AsyncIterator[TestClient[Any, Any]]:
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with TestClient(TestServer(make_app(engine, TOKEN)), headers=headers) as c:
        yield c


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


async def wait_until(engine: Engine, what: Any, timeout: float = 10) -> Any:
    """Wait (on the change feed, not by polling) until `await what()` is truthy."""
    feed = engine.storage.changes()
    deadline = time.monotonic() + timeout
    while True:
        generation = feed.generation
        value = await what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await feed.wait_changed(generation, 0.2)


async def wait_state(engine: Engine, execution_id: str, state: str) -> None:
    async def reached() -> bool:
        return state_name((await engine.storage.get_row(execution_id)).state) == state

    await wait_until(engine, reached)


async def legal(engine: Engine, execution_id: str) -> list[ev.StoredEvent]:
    """The log and responses replay to the stored summary (no illegal append)."""
    events = await engine.storage.get_events(execution_id)
    responses = await engine.storage.get_responses(execution_id)
    assert replay_stored(events, responses) == await engine.storage.get_summary(execution_id)
    return events


def types(events: list[ev.StoredEvent]) -> list[str]:
    return [e.event.__struct_config__.tag for e in events]  # type: ignore[attr-defined,misc]


def history(events: list[ev.StoredEvent]) -> list[ev.HistoryEventKind]:
    return [e.event.event for e in events if isinstance(e.event, ev.HistoryEvent)]


def closing_join_nexts(events: list[ev.StoredEvent]) -> list[str]:
    return [h.join_set_id for h in history(events) if isinstance(h, ev.JoinNext) and h.closing]


def delay_ids(events: list[ev.StoredEvent]) -> list[str]:
    return [
        h.request.delay_id
        for h in history(events)
        if isinstance(h, ev.JoinSetRequest) and isinstance(h.request, ev.DelayRequest)
    ]


def finished_at(events: list[ev.StoredEvent]) -> Any:
    assert isinstance(events[-1].event, ev.Finished)
    return events[-1].created_at


# ---------------------------------------------------------------------------------------
# activities
# ---------------------------------------------------------------------------------------


async def test_cancel_pending_activity(engine: Engine) -> None:
    later = engine.clock.now().replace(year=engine.clock.now().year + 1)
    eid = await engine.submit(QUICK, [1], scheduled_at=later)
    await engine.cancel(eid)
    assert await engine.result(eid, timeout=5) == CANCELLED
    assert types(await legal(engine, eid)) == ["created", "cancellation_requested", "finished"]
    with pytest.raises(Conflict, match="already finished"):
        await engine.cancel(eid)


async def in_guest_code(engine: Engine, *execution_ids: str) -> None:
    """Wait until the activities are locked, and a bit more: a cancellation that arrives
    while the JS sandbox is still being created ends the run as a trap, not as cancelled
    (`engine/runtimes/js/activity.py`, reported)."""
    for execution_id in execution_ids:
        await wait_state(engine, execution_id, "locked")
    await asyncio.sleep(0.3)


async def test_cancel_running_activity_is_quick(engine: Engine) -> None:
    eid = await engine.submit(SPIN, [])
    await in_guest_code(engine, eid)
    started = time.monotonic()
    await engine.cancel(eid)
    with pytest.raises(Conflict, match="already requested"):
        await engine.cancel(eid)
    assert await engine.result(eid, timeout=5) == CANCELLED
    assert time.monotonic() - started < 2  # the lock would expire after 10 s
    events = await legal(engine, eid)
    assert types(events) == ["created", "locked", "cancellation_requested", "finished"]


# ---------------------------------------------------------------------------------------
# workflows
# ---------------------------------------------------------------------------------------


async def test_cancel_non_cancellable_workflow(
    engine: Engine, client: TestClient[Any, Any]
) -> None:
    eid = await engine.submit("test:wf/wf.plain", [])
    with pytest.raises(NotCancellable, match="not cancellable"):
        await engine.cancel(eid)
    r = await client.put(f"/v1/executions/{eid}/cancel")
    assert r.status == 422
    assert "not cancellable" in (await r.json())["error"]
    assert await engine.result(eid, timeout=10) == ev.ResultOk("plain done")


async def test_cancel_cancellable_workflow_tears_down_its_join_sets(engine: Engine) -> None:
    eid = await engine.submit("test:wf/wf.parent-cancellable", [])
    await wait_state(engine, eid, "blocked_by_join_set")
    spin_a = f"{eid}.g:1_1"
    plain, child, approve = (f"{eid}.n:b_{i}" for i in (1, 2, 3))
    child_spin = f"{child}.g:1_1"
    await wait_state(engine, child, "blocked_by_join_set")
    await in_guest_code(engine, spin_a, child_spin)

    started = time.monotonic()
    await engine.cancel(eid)
    with pytest.raises(Conflict, match="already requested"):
        await engine.cancel(eid)
    with pytest.raises(Conflict, match="cancel"):
        await engine.pause(eid)

    # While the plain child workflow is awaited, the parent waits on a closing join_next.
    async def awaiting_plain() -> bool:
        state = (await engine.storage.get_row(eid)).state
        return (
            isinstance(state, Cancelling)
            and state_name(state.underlying) == "blocked_by_join_set"
            and getattr(state.underlying, "join_set_id", None) == "n:b"
            and getattr(state.underlying, "closing", False)
        )

    await wait_until(engine, awaiting_plain)
    assert (await engine.storage.get_summary(plain)).result is None

    assert await engine.result(eid, timeout=15) == CANCELLED
    assert time.monotonic() - started < 8  # nothing waited for a 10 s lock expiry

    # Activities and the cancellable child were cancelled, the plain child was awaited.
    for cancelled in (spin_a, approve, child, child_spin):
        assert await engine.result(cancelled, timeout=1) == CANCELLED, cancelled
    assert await engine.result(plain, timeout=1) == ev.ResultOk("plain done")

    events = await legal(engine, eid)
    # One closing join_next per member not awaited yet, later join sets first; the
    # blocking sleep's own join_next took the answer of its cancelled delay.
    assert closing_join_nexts(events) == ["n:b", "n:b", "n:b", "g:1", "g:1"]
    assert types(events)[-1] == "finished"
    assert finished_at(events) >= finished_at(await legal(engine, plain))
    i_cancel = types(events).index("cancellation_requested")
    assert "locked" not in types(events)[i_cancel:]  # not run again
    # Responses: members cancelled in reverse submission order, one join set at a time.
    responses = [r.response for r in await engine.storage.get_responses(eid)]
    sources = [
        r.child_execution_id if isinstance(r, ev.ChildExecutionFinished) else r.delay_id
        for r in responses
    ]
    sleep_delay, g1_delay = delay_ids(events)[1], delay_ids(events)[0]
    assert sources == [sleep_delay, approve, child, plain, g1_delay, spin_a]
    delay_outcomes = {r.delay_id: r.outcome for r in responses if isinstance(r, ev.DelayFinished)}
    assert delay_outcomes == {sleep_delay: "cancelled", g1_delay: "cancelled"}

    # The cancellable child was torn down the same way.
    child_events = await legal(engine, child)
    assert closing_join_nexts(child_events) == ["g:1"]
    assert types(child_events)[-1] == "finished"
    view = teardown_view(events, await engine.storage.get_responses(eid))
    assert view.finished and all(js.done for js in view.join_sets)


async def test_same_workflow_without_cancellable_suffix_is_not_cancellable(
    engine: Engine,
) -> None:
    eid = await engine.submit("test:wf/wf.parent", [])
    await wait_state(engine, eid, "blocked_by_join_set")
    with pytest.raises(NotCancellable):
        await engine.cancel(eid)


async def test_cancel_locked_workflow_releases_its_run_at_once(engine: Engine) -> None:
    eid = await engine.submit("test:wf/wf.spinner-cancellable", [])
    approve = f"{eid}.g:1_1"

    async def spinning() -> bool:
        events = await engine.storage.get_events(eid)
        return state_name((await engine.storage.get_row(eid)).state) == "locked" and any(
            isinstance(h, ev.JoinSetRequest) for h in history(events)
        )

    await wait_until(engine, spinning)
    started = time.monotonic()
    await engine.cancel(eid)
    assert await engine.result(eid, timeout=5) == CANCELLED
    assert time.monotonic() - started < 3  # not at the 10 s lock expiry
    assert await engine.result(approve, timeout=1) == CANCELLED
    events = await legal(engine, eid)
    tail = types(events)[types(events).index("cancellation_requested") :]
    assert tail == ["cancellation_requested", "unlocked", "history_event", "finished"]
    unlocked = events[-3].event
    assert isinstance(unlocked, ev.Unlocked) and unlocked.reason == "cancelled"
    assert closing_join_nexts(events) == ["g:1"]


async def test_cancel_supersedes_pause(engine: Engine) -> None:
    eid = await engine.submit("test:wf/wf.child-cancellable", [])
    await wait_state(engine, eid, "blocked_by_join_set")
    await in_guest_code(engine, f"{eid}.g:1_1")
    await engine.pause(eid)
    assert isinstance((await engine.storage.get_row(eid)).state, Paused)
    await engine.cancel(eid)
    assert await engine.result(eid, timeout=5) == CANCELLED
    assert await engine.result(f"{eid}.g:1_1", timeout=1) == CANCELLED
    events = await legal(engine, eid)
    tail = types(events)[types(events).index("paused") :]
    assert tail == ["paused", "cancellation_requested", "history_event", "finished"]
    assert closing_join_nexts(events) == ["g:1"]
    with pytest.raises(Conflict, match="finished"):
        await engine.unpause(eid)


# ---------------------------------------------------------------------------------------
# delays
# ---------------------------------------------------------------------------------------


async def test_cancel_delay_from_the_api(engine: Engine, client: TestClient[Any, Any]) -> None:
    eid = await engine.submit("test:wf/wf.sleeper", [])
    await wait_state(engine, eid, "blocked_by_join_set")
    (delay,) = delay_ids(await engine.storage.get_events(eid))
    assert delay.startswith("Delay_") and delay.endswith(".o:1-sleep_1")

    r = await client.put(f"/v1/delays/{delay}/cancel")
    assert r.status == 200, await r.text()
    assert (await r.json())["execution_id"] == eid
    assert await engine.result(eid, timeout=10) == ev.ResultOk("cancelled")
    (response,) = [r.response for r in await engine.storage.get_responses(eid)]
    assert response == ev.DelayFinished(delay, "o:1-sleep", "cancelled")
    await legal(engine, eid)

    r = await client.put(f"/v1/delays/{delay}/cancel")
    assert r.status == 409, await r.text()
    r = await client.put(f"/v1/delays/{delay.replace('_1', '_2')}/cancel")
    assert r.status == 404, await r.text()
    r = await client.put("/v1/delays/Delay_nope/cancel")
    assert r.status == 400, await r.text()


async def test_cancel_delay_from_the_cli(
    engine: Engine,
    client: TestClient[Any, Any],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from engine.cli import main

    eid = await engine.submit("test:wf/wf.sleeper", [])
    await wait_state(engine, eid, "blocked_by_join_set")
    (delay,) = delay_ids(await engine.storage.get_events(eid))
    monkeypatch.setenv("OBELISK_API_TOKEN", TOKEN)
    url = str(client.make_url("")).rstrip("/")
    # The client is synchronous: run it on a thread while the loop serves the API.
    assert await asyncio.to_thread(main, ["delay", "cancel", delay, "--api-url", url]) == 0
    assert f"cancelled delay {delay}: {eid}" in capsys.readouterr().out
    assert await engine.result(eid, timeout=10) == ev.ResultOk("cancelled")
    assert await asyncio.to_thread(main, ["delay", "cancel", delay, "--api-url", url]) == 1
    assert "already finished" in capsys.readouterr().err


async def test_cancel_delay_errors(engine: Engine) -> None:
    with pytest.raises(InvalidParams):
        await engine.cancel_delay("E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC")
    with pytest.raises(NotFound):
        await engine.cancel_delay("Delay_01JKX3M7V9Q2R8T5W0Y4Z6A1BC.o:1-sleep_1")


# ---------------------------------------------------------------------------------------
# pause of a running workflow (SPEC §4.3)
# ---------------------------------------------------------------------------------------


async def test_pause_running_workflow(engine: Engine) -> None:
    n = 1_000_000  # a few hundred milliseconds of computing
    eid = await engine.submit("test:wf/wf.pausable", [n])
    await wait_state(engine, eid, "locked")
    await engine.pause(eid)  # while it computes: its run is released and stopped
    events = await legal(engine, eid)
    assert types(events)[-2:] == ["unlocked", "paused"]
    paused_version = len(events)
    await asyncio.sleep(0.5)
    assert len(await legal(engine, eid)) == paused_version  # the run wrote nothing more
    await engine.unpause(eid)

    quick, approve = f"{eid}.o:1-quick_1", f"{eid}.o:2-approve_1"
    acc = n * (n - 1) // 2 % 1000

    async def awaiting_approval() -> bool:
        state = (await engine.storage.get_row(eid)).state
        return getattr(state, "join_set_id", None) == "o:2-approve"

    await wait_until(engine, awaiting_approval)  # a warm run awaits the stub child
    assert await engine.result(quick, timeout=1) == ev.ResultOk(acc + 1)
    await engine.pause(eid)
    state = (await engine.storage.get_row(eid)).state
    assert isinstance(state, Paused) and state_name(state.underlying) == "blocked_by_join_set"
    await engine.stub(approve, {"ok": True})

    async def response_arrived() -> bool:
        s = (await engine.storage.get_row(eid)).state
        return isinstance(s, Paused) and state_name(s.underlying) == "pending_at"

    await wait_until(engine, response_arrived)
    version = len(await legal(engine, eid))
    await asyncio.sleep(0.5)
    assert len(await legal(engine, eid)) == version  # not advanced while paused
    await engine.unpause(eid)
    assert await engine.result(eid, timeout=15) == ev.ResultOk(f"{acc + 1}:true")
    events = await legal(engine, eid)
    assert types(events).count("paused") == types(events).count("unpaused") == 2


# ---------------------------------------------------------------------------------------
# The driver against logs written directly (crash safety, idempotence, lock expiry)
# ---------------------------------------------------------------------------------------

WF_ID = ev.ComponentId("workflow_js", "parent", "sha256:" + "0" * 64)
ACT_ID = ev.ComponentId("activity_js", "quick", "sha256:" + "1" * 64)
# No executor serves these: nothing but the driver (and the test) writes to them.
P_FFQN, W_FFQN, C_FFQN, A_FFQN = (
    "test:direct/wf.parent-cancellable",
    "test:direct/wf.plain",
    "test:direct/wf.child-cancellable",
    "test:direct/acts.quick",
)


async def direct_parent(
    engine: Engine, *, blocked: bool, lock_expiry: float = 60
) -> dict[str, str]:
    """A cancellable parent whose (gone) run wrote: g:1 = [activity A, delay D], n:b =
    [plain workflow W, cancellable workflow C], then either blocked on n:b or died while
    holding its lock."""
    from datetime import timedelta

    from engine.core.ids import ExecutionId, JoinSetId
    from engine.storage.contract import AppendExtras, CreateRequest

    storage, now = engine.storage, engine.clock.now()
    p = ExecutionId.generate()
    g1, nb = JoinSetId("g", "1"), JoinSetId("n", "b")
    ids = {
        "P": str(p),
        "A": str(p.child(g1, 1)),
        "D": str(p.delay(g1, 2)),
        "W": str(p.child(nb, 1)),
        "C": str(p.child(nb, 2)),
    }

    def created(ffqn: str, component: ev.ComponentId, parent: str | None = None) -> ev.Created:
        js = None if parent is None else (ids["P"], parent)
        return ev.Created(ffqn, [], now, component, engine.deployment_id, js)

    await storage.create(CreateRequest(ids["P"], created(P_FFQN, WF_ID)), now)
    [locked] = await storage.lock_pending(
        ffqns=[P_FFQN],
        batch_size=1,
        now=now,
        component_id=WF_ID,
        executor_id="Exr_01JKX3M7V9Q2R8T5W0Y4Z6A1BC",
        run_id="Run_01JKX3M7V9Q2R8T5W0Y4Z6A1BC",
        lock_expires_at=now + timedelta(seconds=lock_expiry),
        retry_config=ev.RetryConfig(None, 100),
    )
    hour = now + timedelta(hours=1)

    def child(js: JoinSetId, key: str, ffqn: str) -> ev.HistoryEvent:
        return ev.HistoryEvent(
            ev.JoinSetRequest(str(js), ev.ChildExecutionRequest(ids[key], ffqn, []))
        )

    history = [
        ev.HistoryEvent(ev.JoinSetCreate(str(g1))),
        child(g1, "A", A_FFQN),
        ev.HistoryEvent(
            ev.JoinSetRequest(str(g1), ev.DelayRequest(ids["D"], hour, ev.ScheduleAtIn(3600000)))
        ),
        ev.HistoryEvent(ev.JoinSetCreate(str(nb))),
        child(nb, "W", W_FFQN),
        child(nb, "C", C_FFQN),
    ]
    if blocked:
        history.append(ev.HistoryEvent(ev.JoinNext(str(nb), locked.lock_expires_at)))
    creates = [
        CreateRequest(ids["A"], created(A_FFQN, ACT_ID, str(g1))),
        CreateRequest(ids["W"], created(W_FFQN, WF_ID, str(nb))),
        CreateRequest(ids["C"], created(C_FFQN, WF_ID, str(nb))),
    ]
    await storage.append(ids["P"], locked.next_version, history, now, AppendExtras(creates=creates))
    return ids


async def test_driver_is_idempotent_and_restartable(start_engine: StartEngine) -> None:
    from engine.executors.cancellation import CancellationDriver

    engine = await start_engine(DEPLOYMENT, files=FILES, run_executors=False, run_watcher=False)
    storage = engine.storage
    ids = await direct_parent(engine, blocked=True)
    await engine.cancel(ids["P"])

    async def snapshot() -> list[Any]:
        return [
            [await storage.get_events(eid), await storage.get_responses(eid)]
            for eid in (ids["P"], ids["C"], ids["A"])
        ]

    async def settle() -> list[ev.StoredEvent]:
        """Passes of brand-new drivers (an engine restarted between any two passes)
        until nothing changes any more: a pass with nothing to do writes nothing."""
        before = await snapshot()
        for _ in range(20):
            await CancellationDriver(storage, engine.clock).tick()
            after = await snapshot()
            if after == before:
                return await storage.get_events(ids["P"])
            before = after
        raise AssertionError("the driver keeps writing")

    # The driver tears n:b down: C is cancelled (and, having no join sets, finished,
    # which answers P's blocked join_next), W is awaited with one closing join_next; g:1
    # waits for n:b to be closed.
    events = await settle()
    tags = types(events)
    assert tags[tags.index("cancellation_requested") :] == [
        "cancellation_requested",
        "history_event",
    ]
    assert closing_join_nexts(events) == ["n:b"]
    assert await engine.result(ids["C"], timeout=1) == CANCELLED
    assert not (await storage.get_summary(ids["W"])).cancelling  # awaited, not cancelled
    assert (await storage.get_summary(ids["A"])).result is None  # g:1 is not closed yet
    # W finishes by itself: g:1 is torn down (delay, then activity) and P finishes.
    w = await storage.get_summary(ids["W"])
    now = engine.clock.now()
    await storage.append(ids["W"], w.next_version, [ev.Finished(ev.ResultOk("w"))], now)
    events = await settle()
    assert closing_join_nexts(events) == ["n:b", "g:1", "g:1"]
    assert await engine.result(ids["P"], timeout=1) == CANCELLED
    assert await engine.result(ids["A"], timeout=1) == CANCELLED
    sources = [
        r.response.child_execution_id
        if isinstance(r.response, ev.ChildExecutionFinished)
        else r.response.delay_id
        for r in await storage.get_responses(ids["P"])
    ]
    assert sources == [ids["C"], ids["W"], ids["D"], ids["A"]]
    await legal(engine, ids["P"])
    await legal(engine, ids["C"])
    assert await settle() == events  # finished: nothing more, ever


async def test_expired_lock_of_a_cancelling_workflow_is_released_for_the_teardown(
    start_engine: StartEngine,
) -> None:
    """The engine died while a cancellable workflow was locked; its lock expires. The
    driver releases it (at the expiry, before the timers watcher would finish it without
    closing its join sets) and tears it down."""
    engine = await start_engine(DEPLOYMENT, files=FILES, run_executors=False, run_watcher=False)
    ids = await direct_parent(engine, blocked=False, lock_expiry=0.4)
    engine.watcher.start()
    engine.canceller.start()
    await asyncio.sleep(0.1)  # both idle: the driver learns of the cancellation by a wake-up
    await engine.cancel(ids["P"])
    w = await engine.storage.get_summary(ids["W"])
    await engine.storage.append(
        ids["W"], w.next_version, [ev.Finished(ev.ResultOk("w"))], engine.clock.now()
    )
    assert await engine.result(ids["P"], timeout=10) == CANCELLED
    events = await legal(engine, ids["P"])
    unlocked = [e.event for e in events if isinstance(e.event, ev.Unlocked)]
    assert unlocked == [ev.Unlocked(unlocked[0].backoff_expires_at, "cancelled")]
    assert closing_join_nexts(events) == ["n:b", "n:b", "g:1", "g:1"]
    for key in ("A", "C"):
        assert await engine.result(ids[key], timeout=1) == CANCELLED
