"""Workflow semantics end to end (SPEC §6.2–6.4, §7, §8): real engine, SQLite, JS workflows.

Structured concurrency (§7.3), join-next-try / too-many / await-next errors, stubs,
schedules, nondeterminism after an edit, crash/restart replay, determinism of random
values and clocks, lock extension and unloading. Waits are on results or conditions,
never fixed sleeps.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest

from engine.core import events as ev
from engine.core.clock import SteppingClock
from engine.core.state import BlockedByJoinSet, replay_stored, state_name
from engine.engine import Engine
from engine.storage.contract import ExecutionRow
from tests.engine.conftest import StartEngine
from tests.fixtures.deployments import Deployment, ParamSpec, ms

# ---------------------------------------------------------------------------
# Deployment helpers (also used by test_workflow_replay.py)
# ---------------------------------------------------------------------------

STEP_JS = """
export default function step(idx, sleepMillis) {
  const end = Date.now() + sleepMillis;
  while (Date.now() < end) { /* spin */ }
  return idx;
}
"""

ACTIVITIES = (
    Deployment()
    .activity_js(
        "step",
        None,  # step.js: STEP_JS, in each test's files
        ffqn="myapp:demo/activity.step",
        params=[("idx", "u32"), ("sleep-millis", "u32")],
        return_type="result<u32, string>",
        exec={"tick_sleep": ms(20)},
    )
    .activity_stub(
        "myapp:demo/stubs.answer",
        name="answer",
        params=[("q", "string")],
        return_type="result<string, string>",
    )
)


def workflow(
    name: str,
    *,
    function: str | None = None,
    interface: str = "myapp:demo/workflow",
    params: list[ParamSpec] | None = None,
    strategy: str = "await",
    lock_ms: int = 2000,
) -> Deployment:
    """A `[[workflow_js]]` section; the JS lives in `<name>.js`."""
    return Deployment().workflow_js(
        name,
        None,
        ffqn=f"{interface}.{function or kebab(name)}",
        params=params or [],
        return_type="result<string, string>",
        blocking_strategy=strategy,
        exec={"lock_expiry": ms(lock_ms), "tick_sleep": ms(20)},
    )


def kebab(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "-" + m.group(1).lower(), name)


def ffqn_of(name: str, interface: str = "myapp:demo/workflow") -> str:
    return f"{interface}.{kebab(name)}"


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 20.0, what: str = "condition"
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def row(engine: Engine, eid: str) -> ExecutionRow:
    return await engine.storage.get_row(eid)


async def state_of(engine: Engine, eid: str) -> str:
    return state_name((await row(engine, eid)).state)


async def wait_state(engine: Engine, eid: str, state: str, timeout: float = 20.0) -> None:
    async def check() -> bool:
        try:
            return await state_of(engine, eid) == state
        except Exception:
            return False

    await wait_until(check, timeout, f"{eid} to be {state}")


async def checked_log(engine: Engine, eid: str) -> list[ev.StoredEvent]:
    """The log, checked to be a legal sequence whose fold is the stored projection."""
    events = await engine.storage.get_events(eid)
    responses = await engine.storage.get_responses(eid)
    assert replay_stored(events, responses) == await engine.storage.get_summary(eid)
    return events


def history(events: list[ev.StoredEvent]) -> list[ev.HistoryEventKind]:
    return [e.event.event for e in events if isinstance(e.event, ev.HistoryEvent)]


def child_requests(events: list[ev.StoredEvent]) -> list[ev.ChildExecutionRequest]:
    return [
        h.request
        for h in history(events)
        if isinstance(h, ev.JoinSetRequest) and isinstance(h.request, ev.ChildExecutionRequest)
    ]


def version_of(events: list[ev.StoredEvent], pred: Callable[[ev.Event], bool]) -> list[int]:
    return [e.version for e in events if pred(e.event)]


def is_closing(e: ev.Event) -> bool:
    return isinstance(e, ev.HistoryEvent) and isinstance(e.event, ev.JoinNext) and e.event.closing


async def child_of(engine: Engine, eid: str, ffqn: str, n: int = 0, timeout: float = 20) -> str:
    """The id of the n-th child of `eid` targeting `ffqn`, once it was requested."""
    found: list[str] = []

    async def requested() -> bool:
        ids = [
            r.child_execution_id
            for r in child_requests(await engine.storage.get_events(eid))
            if r.target_ffqn == ffqn
        ]
        found[:] = ids
        return len(ids) > n

    await wait_until(requested, timeout, f"{eid} to request {ffqn}")
    return found[n]


def ok_json(result: ev.ExecutionResult) -> Any:
    assert isinstance(result, ev.ResultOk), result
    return json.loads(result.value)


STUB_EXT = (
    'import { answerSubmit, answerAwaitNext } from "myapp:demo-obelisk-ext/stubs";\n'
    'import { answerStub } from "myapp:demo-obelisk-stub/stubs";'
)
STEP_EXT = 'import { stepSubmit, stepAwaitNext } from "myapp:demo-obelisk-ext/activity";'
OBELISK = 'import * as obelisk from "obelisk:workflow@1.0.0";'

# ---------------------------------------------------------------------------
# §7.3 join sets and structured concurrency
# ---------------------------------------------------------------------------

TWO_DELAYS_JS = f"""
{OBELISK}
export default function twoDelays() {{
  const js = obelisk.createJoinSet();
  const slow = js.submitDelay({{ milliseconds: 400 }});
  const fast = js.submitDelay({{ milliseconds: 1 }});
  const first = js.joinNext();
  const second = js.joinNext();
  return JSON.stringify({{ slow, fast, order: [first.id, second.id],
    types: [first.type, second.type], cancelled: [first.cancelled, second.cancelled] }});
}}
"""


async def test_two_delays_in_one_join_set_complete_in_completion_order(
    start_engine: StartEngine,
) -> None:
    engine = await start_engine(
        ACTIVITIES + workflow("twoDelays"),
        files={"step.js": STEP_JS, "twoDelays.js": TWO_DELAYS_JS},
    )
    eid = await engine.submit(ffqn_of("twoDelays"), [])
    out = ok_json(await engine.result(eid, timeout=20))
    assert out["order"] == [out["fast"], out["slow"]]
    assert out["types"] == ["delay", "delay"]
    assert out["cancelled"] == [False, False]
    events = await checked_log(engine, eid)
    nexts = [h for h in history(events) if isinstance(h, ev.JoinNext)]
    assert [(n.join_set_id, n.closing) for n in nexts] == [("g:1", False), ("g:1", False)]
    responses = await engine.storage.get_responses(eid)
    assert [r.response for r in responses] == [
        ev.DelayFinished(out["fast"], "g:1", "ok"),
        ev.DelayFinished(out["slow"], "g:1", "ok"),
    ]
    assert isinstance(events[-1].event, ev.Finished)


SUBMIT_THEN_END_JS = f"""
{OBELISK}
{STUB_EXT}
export default function submitThenEnd(how) {{
  const js = obelisk.createJoinSet();
  const child = answerSubmit(js, "never answered");
  const delay = js.submitDelay({{ hours: 1 }});
  if (how === "trap") obelisk.sleep("not a duration");   // misuse of the host API: a trap
  if (how === "throw") throw new Error("boom");
  return JSON.stringify({{ child, delay }});
}}
"""


@pytest.mark.parametrize("how", ["return", "trap", "throw"])
async def test_submit_then_end_cancels_unawaited_members_before_finishing(
    start_engine: StartEngine, how: str
) -> None:
    toml = ACTIVITIES + workflow("submitThenEnd", params=[("how", "string")])
    engine = await start_engine(
        toml, files={"step.js": STEP_JS, "submitThenEnd.js": SUBMIT_THEN_END_JS}
    )
    eid = await engine.submit(ffqn_of("submitThenEnd"), [how])
    result = await engine.result(eid, timeout=20)
    child = f"{eid}.g:1_1"
    delay = f"Delay_{eid[2:]}.g:1_2"
    if how == "return":
        assert ok_json(result) == {"child": child, "delay": delay}
    elif how == "trap":
        assert isinstance(result, ev.ExecutionFailure) and result.kind == "uncategorized"
        assert "not a duration" in result.reason
    else:
        assert result == ev.ResultErr("boom")
    # The child activity was cancelled, the delay too: in reverse submission order.
    child_result = await engine.result(child, timeout=5)
    assert isinstance(child_result, ev.ExecutionFailure) and child_result.kind == "cancelled"
    responses = await engine.storage.get_responses(eid)
    assert [type(r.response) for r in responses] == [ev.DelayFinished, ev.ChildExecutionFinished]
    assert responses[0].response == ev.DelayFinished(delay, "g:1", "cancelled")
    # One closing join_next per member, all before `finished`.
    events = await checked_log(engine, eid)
    closing = version_of(events, is_closing)
    assert len(closing) == 2
    finished = version_of(events, lambda e: isinstance(e, ev.Finished))
    assert finished == [events[-1].version] and max(closing) < finished[0]
    child_finished = (await engine.storage.get_events(child))[-1]
    assert child_finished.created_at <= events[-1].created_at


NAMED_JS = f"""
{OBELISK}
{STUB_EXT}
export default function named() {{
  const a = obelisk.createJoinSet({{ name: "a" }});
  const b = obelisk.createJoinSet({{ name: "b" }});
  const ids = [answerSubmit(a, "a1"), answerSubmit(b, "b1"), answerSubmit(a, "a2"),
               answerSubmit(b, "b2")];
  return JSON.stringify({{ ids, a: a.id, b: b.id }});
}}
"""


async def test_named_join_sets_close_in_reverse_creation_then_submission_order(
    start_engine: StartEngine,
) -> None:
    engine = await start_engine(
        ACTIVITIES + workflow("named"), files={"step.js": STEP_JS, "named.js": NAMED_JS}
    )
    eid = await engine.submit(ffqn_of("named"), [])
    out = ok_json(await engine.result(eid, timeout=20))
    assert out["a"] == "n:a" and out["b"] == "n:b"
    a1, b1, a2, b2 = out["ids"]
    assert a1 == f"{eid}.n:a_1" and b2 == f"{eid}.n:b_2"
    responses = await engine.storage.get_responses(eid)
    order = [r.response.child_execution_id for r in responses]  # type: ignore[union-attr]
    assert order == [b2, b1, a2, a1]
    for child in order:
        result = await engine.result(child, timeout=5)
        assert isinstance(result, ev.ExecutionFailure) and result.kind == "cancelled"
    events = await checked_log(engine, eid)
    closing = [h.join_set_id for h in history(events) if isinstance(h, ev.JoinNext) and h.closing]
    assert closing == ["n:b", "n:b", "n:a", "n:a"]


SLEEPER_JS = f"""
{OBELISK}
export default function sleeper(ms) {{
  obelisk.sleep({{ milliseconds: ms }});
  return "slept " + ms;
}}
"""

CHILD_WORKFLOWS_JS = f"""
{OBELISK}
import {{ sleeperSubmit, sleeperCancellableSubmit }} from "myapp:demo-obelisk-ext/child";
export default function parentOfWorkflows() {{
  const js = obelisk.createJoinSet();
  const plain = sleeperSubmit(js, 200);
  const cancellable = sleeperCancellableSubmit(js, 3600000);
  return JSON.stringify({{ plain, cancellable }});
}}
"""


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_close_awaits_child_workflows_and_cancels_cancellable_ones(
    start_engine: StartEngine, strategy: str
) -> None:
    sleeper_params = [("ms", "u32")]
    toml = (
        ACTIVITIES
        + workflow("parentOfWorkflows", function="parent-of-workflows", strategy=strategy)
        + workflow("sleeper", interface="myapp:demo/child", params=sleeper_params)
        + workflow(
            "sleeperC",
            function="sleeper-cancellable",
            interface="myapp:demo/child",
            params=sleeper_params,
        )
    )
    files = {
        "step.js": STEP_JS,
        "parentOfWorkflows.js": CHILD_WORKFLOWS_JS,
        "sleeper.js": SLEEPER_JS,
        "sleeperC.js": SLEEPER_JS,
    }
    engine = await start_engine(toml, files=files)
    eid = await engine.submit(ffqn_of("parent-of-workflows"), [])
    out = ok_json(await engine.result(eid, timeout=20))
    assert await engine.result(out["plain"], timeout=1) == ev.ResultOk("slept 200")
    cancelled = await engine.result(out["cancellable"], timeout=1)
    assert isinstance(cancelled, ev.ExecutionFailure) and cancelled.kind == "cancelled"
    # The cancellable child was torn down (its sleep's delay, if it got that far, was
    # cancelled); its own log is legal.
    child_events = await checked_log(engine, out["cancellable"])
    assert any(isinstance(e.event, ev.CancellationRequested) for e in child_events)
    delays = [
        h.request.delay_id
        for h in history(child_events)
        if isinstance(h, ev.JoinSetRequest) and isinstance(h.request, ev.DelayRequest)
    ]
    child_responses = await engine.storage.get_responses(out["cancellable"])
    assert [r.response for r in child_responses] == [
        ev.DelayFinished(d, "o:1-sleep", "cancelled") for d in delays
    ]
    events = await checked_log(engine, eid)
    assert len(version_of(events, is_closing)) == 2
    responses = await engine.storage.get_responses(eid)
    # Reverse submission order: the cancellable child was dealt with first, and answered
    # first; the plain child finished on its own (after its 200 ms sleep).
    assert [r.response.child_execution_id for r in responses] == [  # type: ignore[union-attr]
        out["cancellable"],
        out["plain"],
    ]


CLOSED_SUBMIT_JS = f"""
{OBELISK}
{STUB_EXT}
export default function closedSubmit() {{
  const js = obelisk.createJoinSet();
  js.close();
  answerSubmit(js, "too late");
  return "unreachable";
}}
"""


CAUGHT = ('answerSubmit(js, "too late");', 'try { answerSubmit(js, "too late"); } catch (e) {}')


@pytest.mark.parametrize("caught", [False, True], ids=["uncaught", "caught"])
async def test_submitting_into_a_closed_join_set_is_uncategorized(
    start_engine: StartEngine, caught: bool
) -> None:
    """A constraint violation (SPEC §7.3): the code cannot catch it and go on."""
    source = CLOSED_SUBMIT_JS.replace(*CAUGHT) if caught else CLOSED_SUBMIT_JS
    engine = await start_engine(
        ACTIVITIES + workflow("closedSubmit"),
        files={"step.js": STEP_JS, "closedSubmit.js": source},
    )
    eid = await engine.submit(ffqn_of("closedSubmit"), [])
    result = await engine.result(eid, timeout=20)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "uncategorized"
    assert "closed" in result.reason
    events = await checked_log(engine, eid)
    assert child_requests(events) == []


# ---------------------------------------------------------------------------
# join-next-try, too many, await-next errors, stubs written by the workflow
# ---------------------------------------------------------------------------

JOIN_NEXT_TRY_JS = f"""
{OBELISK}
{STUB_EXT}
{STEP_EXT}
export default function tries() {{
  const out = [];
  const js = obelisk.createJoinSet();
  out.push(js.joinNextTry().type);                       // nothing submitted
  const child = answerSubmit(js, "q");
  const delay = js.submitDelay({{ milliseconds: 0 }});    // due at once
  const found = js.joinNextTry();
  out.push(found.type, found.id === delay);
  out.push(js.joinNextTry().type);                       // the stub child is outstanding
  answerStub(child, {{ ok: "stubbed" }});
  const next = js.joinNextTry();
  out.push(next.type, next.id === child, next.value);
  out.push(js.joinNextTry().type);
  out.push(js.joinNext().type);                          // awaiting more than submitted
  try {{ answerAwaitNext(js); }} catch (e) {{ out.push(e.name, e.value); }}
  const other = obelisk.createJoinSet();
  const stepId = stepSubmit(other, 7, 0);
  try {{ answerAwaitNext(other); }} catch (e) {{ out.push(e.name, e.value, other.lastId === stepId); }}
  try {{ answerAwaitNext(other); }} catch (e) {{ out.push(e.value); }}
  return JSON.stringify(out);
}}
"""


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_join_next_try_outcomes_too_many_and_await_next_errors(
    start_engine: StartEngine, strategy: str
) -> None:
    engine = await start_engine(
        ACTIVITIES + workflow("tries", strategy=strategy),
        files={"step.js": STEP_JS, "tries.js": JOIN_NEXT_TRY_JS},
    )
    eid = await engine.submit(ffqn_of("tries"), [])
    out = ok_json(await engine.result(eid, timeout=20))
    assert out == [
        "allProcessed",
        "delay",
        True,
        "pending",
        "child",
        True,
        "stubbed",
        "allProcessed",
        "allProcessed",
        "AwaitNextError",
        "all-processed",
        "AwaitNextError",
        {
            "function-mismatch": {
                "specified_function": "myapp:demo/stubs.answer",
                "actual_function": "myapp:demo/activity.step",
                "actual_id": f"{eid}.g:2_1",
            }
        },
        True,
        "all-processed",
    ]
    events = await checked_log(engine, eid)
    h = history(events)
    assert [x.outcome for x in h if isinstance(x, ev.JoinNextTry)] == [
        "all_processed",
        "found",
        "pending",
        "found",
        "all_processed",
    ]
    assert [(x.join_set_id, x.requested_ffqn) for x in h if isinstance(x, ev.JoinNextTooMany)] == [
        ("g:1", None),
        ("g:1", "myapp:demo/stubs.answer"),
        ("g:2", "myapp:demo/stubs.answer"),
    ]
    stubs = [x for x in h if isinstance(x, ev.Stub)]
    assert [(s.target_execution_id, s.outcome) for s in stubs] == [(f"{eid}.g:1_1", "written")]
    assert await engine.result(f"{eid}.g:1_1", timeout=1) == ev.ResultOk("stubbed")


STUB_WRITES_JS = f"""
{OBELISK}
{STUB_EXT}
{STEP_EXT}
export default function stubWrites() {{
  const out = [];
  const js = obelisk.createJoinSet();
  const child = answerSubmit(js, "q");
  answerStub(child, {{ ok: "first" }});
  answerStub(child, {{ ok: "first" }});                // the same value again: fine
  try {{ answerStub(child, {{ ok: "second" }}); }} catch (e) {{ out.push("conflict: " + e.message); }}
  out.push(answerAwaitNext(js));
  // Later steps make every earlier one a replay (strategy interrupt).
  const other = obelisk.createJoinSet();
  stepSubmit(other, 1, 0);
  out.push(stepAwaitNext(other));
  try {{ obelisk.stub(stepSubmit(other, 2, 0), {{ ok: 2 }}); }} catch (e) {{ out.push("not a stub"); }}
  return JSON.stringify(out);
}}
"""


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_stub_written_by_the_workflow_is_idempotent_and_conflicts_are_errors(
    start_engine: StartEngine, strategy: str
) -> None:
    engine = await start_engine(
        ACTIVITIES + workflow("stubWrites", strategy=strategy),
        files={"step.js": STEP_JS, "stubWrites.js": STUB_WRITES_JS},
    )
    eid = await engine.submit(ffqn_of("stubWrites"), [])
    out = ok_json(await engine.result(eid, timeout=20))
    assert len(out) == 4
    assert out[0].startswith("conflict: ") and "another result" in out[0]
    assert out[1:] == ["first", 1, "not a stub"]
    child = f"{eid}.g:1_1"
    assert await engine.result(child, timeout=1) == ev.ResultOk("first")
    events = await checked_log(engine, eid)
    stubs = [x for x in history(events) if isinstance(x, ev.Stub)]
    assert [(s.target_execution_id, s.outcome) for s in stubs] == [
        (child, "written"),
        (child, "written"),
        (child, "conflict"),
    ]
    assert stubs[0].result_hash == stubs[1].result_hash != stubs[2].result_hash
    # The child's log has exactly one `finished`.
    child_events = await checked_log(engine, child)
    assert [type(e.event) for e in child_events] == [ev.Created, ev.Finished]


AWAIT_STUB_JS = """
import { answer } from "myapp:demo/stubs";
export default function awaitStub() {
  return "got " + answer("question");
}
"""


async def test_stub_of_an_awaited_child_through_the_api(start_engine: StartEngine) -> None:
    engine = await start_engine(
        ACTIVITIES + workflow("awaitStub"),
        files={"step.js": STEP_JS, "awaitStub.js": AWAIT_STUB_JS},
    )
    eid = await engine.submit(ffqn_of("awaitStub"), [])
    child = await child_of(engine, eid, "myapp:demo/stubs.answer")
    assert child == f"{eid}.o:1-answer_1"
    await wait_state(engine, eid, "blocked_by_join_set")
    await engine.stub(child, {"ok": "yes"})
    await engine.stub(child, {"ok": "yes"})  # idempotent
    assert await engine.result(eid, timeout=20) == ev.ResultOk("got yes")
    await checked_log(engine, eid)


# ---------------------------------------------------------------------------
# schedule
# ---------------------------------------------------------------------------

SCHEDULE_JS = """
import { stepSchedule } from "myapp:demo-obelisk-schedule/activity";
export default function sched() {
  const later = stepSchedule({ minutes: 5 }, 1, 0);
  const now = stepSchedule("now", 2, 0);
  return JSON.stringify({ later, now });
}
"""


async def test_schedule_creates_top_level_executions(start_engine: StartEngine) -> None:
    engine = await start_engine(
        ACTIVITIES + workflow("sched"), files={"step.js": STEP_JS, "sched.js": SCHEDULE_JS}
    )
    eid = await engine.submit(ffqn_of("sched"), [])
    out = ok_json(await engine.result(eid, timeout=20))
    assert await engine.result(out["now"], timeout=20) == ev.ResultOk(2)
    events = await checked_log(engine, eid)
    h = history(events)
    schedules = [x for x in h if isinstance(x, ev.Schedule)]
    assert [(s.execution_id, s.target_ffqn) for s in schedules] == [
        (out["later"], "myapp:demo/activity.step"),
        (out["now"], "myapp:demo/activity.step"),
    ]
    assert schedules[0].schedule_at == ev.ScheduleAtIn(5 * 60_000)
    assert schedules[1].schedule_at == ev.ScheduleAtNow()
    persisted = [x.value for x in h if isinstance(x, ev.Persist)]
    assert persisted == [out["later"], out["now"]]
    for scheduled in (out["later"], out["now"]):
        created = await engine.storage.get_created(scheduled)
        assert created.scheduled_by == eid and created.parent is None
    later = await row(engine, out["later"])
    assert later.parent_id is None and state_name(later.state) == "pending_at"
    created = await engine.storage.get_created(out["later"])
    schedule_event = next(
        e
        for e in events
        if isinstance(e.event, ev.HistoryEvent) and isinstance(e.event.event, ev.Schedule)
    )
    delta = created.scheduled_at - schedule_event.created_at
    assert timedelta(minutes=4, seconds=59) < delta <= timedelta(minutes=5)


# ---------------------------------------------------------------------------
# nondeterminism after an edit (an upgrade check), crash/restart replay
# ---------------------------------------------------------------------------

EDIT_JS = """
import { step } from "myapp:demo/activity";
import { answer } from "myapp:demo/stubs";
export default function edited() {
  const a = step(1, 0);
  const b = answer("q");
  return a + "-" + b;
}
"""

EDITS = {
    "params": (EDIT_JS.replace("step(1, 0)", "step(2, 0)"), "[1, 0]", "[2, 0]"),
    "function": (EDIT_JS.replace('answer("q")', "String(step(5, 0))"), "o:2-answer", "o:2-step"),
}


async def start_edit_engine(start_engine: StartEngine, source: str) -> Engine:
    toml = ACTIVITIES + workflow("edited", lock_ms=400)
    return await start_engine(toml, files={"step.js": STEP_JS, "edited.js": source})


@pytest.mark.parametrize("edit", sorted(EDITS))
async def test_an_incompatible_edit_is_detected_as_nondeterminism(
    start_engine: StartEngine, edit: str
) -> None:
    """Edited while the engine was stopped: the replay of the log against the new code
    finds the mismatch (SPEC §7.1, the detail names the version and both sides); as an
    upgrade check it is `component_upgrade_finished{failed}` (SPEC §9.3), and the
    execution finishes on the code that wrote its history instead of failing."""
    engine = await start_edit_engine(start_engine, EDIT_JS)
    old_digest = engine.registry.function(ffqn_of("edited"))[1].component_id.digest
    eid = await engine.submit(ffqn_of("edited"), [])
    child = await child_of(engine, eid, "myapp:demo/stubs.answer")
    await wait_state(engine, eid, "blocked_by_join_set")
    await engine.stop()
    source, old_side, new_side = EDITS[edit]
    source = source.replace("const a =", 'console.warn("new code");\n  const a =')
    engine = await start_edit_engine(start_engine, source)
    await engine.stub(child, {"ok": "x"})
    assert await engine.result(eid, timeout=20) == ev.ResultOk("1-x")  # the old code's
    events = await checked_log(engine, eid)
    [upgrade] = [e.event for e in events if isinstance(e.event, ev.ComponentUpgradeFinished)]
    assert isinstance(upgrade.outcome, ev.UpgradeFailed)
    reason = upgrade.outcome.reason
    assert "version" in reason and old_side in reason and new_side in reason, reason
    locks = [e.event for e in events if isinstance(e.event, ev.Locked)]
    assert locks[-1].component_id.digest == old_digest
    # The new code wrote nothing (its check stores no logs either).
    assert len(child_requests(events)) == 2
    assert "new code" not in [line.message for line in await engine.storage.get_logs(eid)]


# A callee's declared params change while the engine is stopped: the workflow's own
# source (its digest) is the same, so no upgrade check runs, but its replay takes
# another path (the call's params no longer validate) and meets a mismatch.
RETYPED_JS = f"""
{OBELISK}
{STUB_EXT}
import {{ step }} from "myapp:demo/activity";
import {{ ans2 }} from "myapp:demo/stubs2";
export default function retyped() {{
  const js = obelisk.createJoinSet();
  answerSubmit(js, "held");
  js.submitDelay({{ hours: 1 }});
  let r;
  try {{ r = ans2("q"); }} catch (e) {{ r = "fallback:" + step(9, 0); }}
  return r;
}}
"""


def ans2_stub(param_type: str) -> Deployment:
    return Deployment().activity_stub(
        "myapp:demo/stubs2.ans2",
        name="ans2",
        params=[("q", param_type)],
        return_type="result<string, string>",
    )


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_nondeterminism_closes_the_join_sets_of_the_log(
    start_engine: StartEngine, strategy: str
) -> None:
    """SPEC §7.3: a child never outlives its parent, also when the parent fails with
    `nondeterminism_detected` — the join sets its log has are closed (members cancelled
    newest first, one closing `join_next` each) before `finished`, without its code."""
    files = {"step.js": STEP_JS, "retyped.js": RETYPED_JS}
    deployment = ACTIVITIES + workflow("retyped", strategy=strategy, lock_ms=500)
    engine = await start_engine(deployment + ans2_stub("string"), files=files)
    eid = await engine.submit(ffqn_of("retyped"), [])
    asked = await child_of(engine, eid, "myapp:demo/stubs2.ans2")
    assert asked == f"{eid}.o:1-ans2_1"  # one-off join sets are numbered on their own
    held = await child_of(engine, eid, "myapp:demo/stubs.answer")
    assert held == f"{eid}.g:1_1"
    await wait_state(engine, eid, "blocked_by_join_set")
    await engine.stop()

    engine = await start_engine(deployment + ans2_stub("u32"), files=files)
    await engine.stub(asked, {"ok": "x"})
    result = await engine.result(eid, timeout=20)
    assert isinstance(result, ev.ExecutionFailure), result
    assert result.kind == "nondeterminism_detected"
    assert result.detail is not None and "o:1-ans2" in result.detail, result.detail
    events = await checked_log(engine, eid)
    closing = [e.event.event for e in events if is_closing(e.event)]  # type: ignore[union-attr]
    assert [j.join_set_id for j in closing] == ["g:1", "g:1"]
    assert events[-1].version > version_of(events, is_closing)[-1]
    # Reverse submission order: the delay was answered (cancelled) first, then the child.
    responses = [r.response for r in await engine.storage.get_responses(eid)]
    assert isinstance(responses[-2], ev.DelayFinished) and responses[-2].outcome == "cancelled"
    assert isinstance(responses[-1], ev.ChildExecutionFinished)
    assert responses[-1].child_execution_id == held
    assert responses[-1].result == ev.ExecutionFailure("cancelled", "cancellation requested")
    assert state_name((await row(engine, held)).state) == "finished"


INNER_JS = """
import { answer } from "myapp:demo/stubs";
export default function inner() { return answer("inner"); }
"""
RETYPED_WITH_CHILD_WORKFLOW_JS = RETYPED_JS.replace(
    'answerSubmit(js, "held");', "innerSubmit(js);"
).replace(
    'import { step } from "myapp:demo/activity";',
    'import { step } from "myapp:demo/activity";\n'
    'import { innerSubmit } from "myapp:demo-obelisk-ext/workflow";',
)


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_nondeterminism_awaits_child_workflows_before_finishing(
    start_engine: StartEngine, strategy: str
) -> None:
    """The close after a nondeterminism awaits a child workflow that is not cancellable;
    each later run fails the same way and carries on from the log, until it answers."""
    files = {"step.js": STEP_JS, "retyped.js": RETYPED_WITH_CHILD_WORKFLOW_JS}
    files["inner.js"] = INNER_JS
    deployment = ACTIVITIES + workflow("inner") + workflow("retyped", strategy=strategy)
    engine = await start_engine(deployment + ans2_stub("string"), files=files)
    eid = await engine.submit(ffqn_of("retyped"), [])
    asked = await child_of(engine, eid, "myapp:demo/stubs2.ans2")
    inner = await child_of(engine, eid, ffqn_of("inner"))
    question = await child_of(engine, inner, "myapp:demo/stubs.answer")
    await wait_state(engine, eid, "blocked_by_join_set")
    await engine.stop()

    engine = await start_engine(deployment + ans2_stub("u32"), files=files)
    await engine.stub(asked, {"ok": "x"})

    async def closing_written() -> bool:
        return bool(version_of(await engine.storage.get_events(eid), is_closing))

    await wait_until(closing_written, what="the closing join_next")
    await wait_state(engine, eid, "blocked_by_join_set")
    assert (await row(engine, eid)).result is None  # not finished while its child runs
    await engine.stub(question, {"ok": "answered"})
    assert await engine.result(inner, timeout=20) == ev.ResultOk("answered")
    result = await engine.result(eid, timeout=20)
    assert isinstance(result, ev.ExecutionFailure), result
    assert result.kind == "nondeterminism_detected"
    events = await checked_log(engine, eid)
    assert len(version_of(events, is_closing)) == 2  # the delay's, then the child's


VIOLATES_AFTER_WRITING_JS = f"""
{OBELISK}
{STUB_EXT}
import {{ step }} from "myapp:demo/activity";
export default function violates() {{
  const js = obelisk.createJoinSet();
  answerSubmit(js, "held");
  js.submitDelay({{ hours: 1 }});
  step(1, 0);  // written (and, with `interrupt`, a new run) before the violation
  const closed = obelisk.createJoinSet();
  closed.close();
  try {{ answerSubmit(closed, "late"); }} catch (e) {{}}
  return "unreachable";
}}
"""


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_a_constraint_violation_closes_what_the_run_opened(
    start_engine: StartEngine, strategy: str
) -> None:
    """The join sets this very run created (not yet in the history it was given) are
    closed too before the violation finishes the workflow `uncategorized`."""
    engine = await start_engine(
        ACTIVITIES + workflow("violates", strategy=strategy),
        files={"step.js": STEP_JS, "violates.js": VIOLATES_AFTER_WRITING_JS},
    )
    eid = await engine.submit(ffqn_of("violates"), [])
    result = await engine.result(eid, timeout=20)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "uncategorized"
    assert result.reason == "constraint violation: join set g:2 is closed"
    events = await checked_log(engine, eid)
    closing = [e.event.event for e in events if is_closing(e.event)]  # type: ignore[union-attr]
    assert [j.join_set_id for j in closing] == ["g:1", "g:1"]
    held = f"{eid}.g:1_1"
    assert (await engine.result(held, timeout=5)) == ev.ExecutionFailure(
        "cancelled", "cancellation requested"
    )


LATE_VIOLATION_V1 = f"""
{OBELISK}
{STUB_EXT}
import {{ answer }} from "myapp:demo/stubs";
export default function edited() {{
  const js = obelisk.createJoinSet();
  js.close();
  return "v1:" + answer("q");
}}
"""
LATE_VIOLATION_V2 = LATE_VIOLATION_V1.replace(
    'return "v1:" + answer("q");', 'const r = answer("q");\n  answerSubmit(js, "late");'
)


async def test_an_edit_violating_only_past_the_history_is_a_compatible_upgrade(
    start_engine: StartEngine,
) -> None:
    """SPEC §9.3 fails an upgrade for nondeterminism only: new code that replays the
    whole history continues, and its later misuse fails its own run."""
    engine = await start_edit_engine(start_engine, LATE_VIOLATION_V1)
    eid = await engine.submit(ffqn_of("edited"), [])
    question = await child_of(engine, eid, "myapp:demo/stubs.answer")
    await wait_state(engine, eid, "blocked_by_join_set")
    await engine.stop()
    engine = await start_edit_engine(start_engine, LATE_VIOLATION_V2)
    await engine.stub(question, {"ok": "x"})
    result = await engine.result(eid, timeout=20)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "uncategorized", result
    events = await checked_log(engine, eid)
    [upgrade] = [e.event for e in events if isinstance(e.event, ev.ComponentUpgradeFinished)]
    assert isinstance(upgrade.outcome, ev.UpgradeSuccess)


MIXED_KINDS_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";
import { step } from "myapp:demo/activity";
import { answer } from "myapp:demo/stubs";
export default function mixedKinds() {
  obelisk.createJoinSet();
  const a = step(1, 0);
  const b = answer("q");
  return a + "-" + b + "-" + step(2, 0);
}
"""


async def test_a_log_numbered_across_kinds_still_replays(
    start_engine: StartEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Logs written before join sets were numbered per kind (`g:1`, `o:2-step`, …) are
    recognised and continued in their own numbering."""
    from engine.executors.replay_host import ReplayHost

    files = {"step.js": STEP_JS, "mixedKinds.js": MIXED_KINDS_JS}
    deployment = ACTIVITIES + workflow("mixedKinds")
    with monkeypatch.context() as m:  # the engine as it numbered before
        m.setattr(ReplayHost, "_logged_across_kinds", lambda self, kind, name: True)
        engine = await start_engine(deployment, files=files)
        eid = await engine.submit(ffqn_of("mixedKinds"), [])
        question = await child_of(engine, eid, "myapp:demo/stubs.answer")
        assert question == f"{eid}.o:3-answer_1"
        await wait_state(engine, eid, "blocked_by_join_set")
        await engine.stop()
    engine = await start_engine(deployment, files=files)
    await engine.stub(question, {"ok": "x"})
    assert await engine.result(eid, timeout=20) == ev.ResultOk("1-x-2")
    events = await checked_log(engine, eid)
    assert [r.child_execution_id for r in child_requests(events)][-1] == f"{eid}.o:4-step_1"


CAUGHT_THEN_WAITS_JS = f"""
{OBELISK}
{STUB_EXT}
import {{ answer }} from "myapp:demo/stubs";
export default function caughtThenWaits() {{
  const js = obelisk.createJoinSet();
  js.close();
  let caught = "no";
  try {{ answerSubmit(js, "late"); }} catch (e) {{ caught = "yes"; }}
  return caught + "-" + answer("q");
}}
"""


async def test_a_log_that_caught_a_closed_join_set_error_still_replays(
    start_engine: StartEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Engines before 2026-12-04 let the code catch it: such a log replays (catchable
    again while replaying), and only new code past the history gets the violation."""
    from engine.executors.replay_host import ReplayHost
    from engine.runtimes.workflow_host import WorkflowCallError

    files = {"step.js": STEP_JS, "caughtThenWaits.js": CAUGHT_THEN_WAITS_JS}
    deployment = ACTIVITIES + workflow("caughtThenWaits")
    with monkeypatch.context() as m:  # the engine as it was
        m.setattr(ReplayHost, "_constraint_violation", lambda self, d: WorkflowCallError(d))
        engine = await start_engine(deployment, files=files)
        eid = await engine.submit(ffqn_of("caughtThenWaits"), [])
        question = await child_of(engine, eid, "myapp:demo/stubs.answer")
        await wait_state(engine, eid, "blocked_by_join_set")
        await engine.stop()
    engine = await start_engine(deployment, files=files)
    await engine.stub(question, {"ok": "x"})
    assert await engine.result(eid, timeout=20) == ev.ResultOk("yes-x")


RETURNS_EARLY_JS = RETYPED_JS.replace('r = "fallback:" + step(9, 0);', 'return "early";')


async def test_history_left_over_at_return_is_named_as_such(start_engine: StartEngine) -> None:
    """SPEC §7.1: the function returned with recorded history left over — the detail says
    so (not a mismatch of the implicit close), and the join sets are closed."""
    files = {"step.js": STEP_JS, "retyped.js": RETURNS_EARLY_JS}
    deployment = ACTIVITIES + workflow("retyped", lock_ms=500)
    engine = await start_engine(deployment + ans2_stub("string"), files=files)
    eid = await engine.submit(ffqn_of("retyped"), [])
    asked = await child_of(engine, eid, "myapp:demo/stubs2.ans2")
    await wait_state(engine, eid, "blocked_by_join_set")
    await engine.stop()

    engine = await start_engine(deployment + ans2_stub("u32"), files=files)
    await engine.stub(asked, {"ok": "x"})
    result = await engine.result(eid, timeout=20)
    assert isinstance(result, ev.ExecutionFailure) and result.kind == "nondeterminism_detected"
    assert result.detail is not None
    assert result.detail.startswith("the function returned, but the log continues at version")
    assert "o:1-ans2" in result.detail, result.detail
    events = await checked_log(engine, eid)
    assert len(version_of(events, is_closing)) == 2


async def test_an_edit_adding_console_logs_replays_fine(start_engine: StartEngine) -> None:
    engine = await start_edit_engine(start_engine, EDIT_JS)
    eid = await engine.submit(ffqn_of("edited"), [])
    child = await child_of(engine, eid, "myapp:demo/stubs.answer")
    await wait_state(engine, eid, "blocked_by_join_set")
    before = history(await engine.storage.get_events(eid))
    await engine.stop()
    logged = EDIT_JS.replace(
        "const a = step(1, 0);", 'console.log("before");\n  const a = step(1, 0);'
    ).replace("return a", 'console.info("after", a, b);\n  return a')
    engine = await start_edit_engine(start_engine, logged)
    await engine.stub(child, {"ok": "x"})
    assert await engine.result(eid, timeout=20) == ev.ResultOk("1-x")
    events = await checked_log(engine, eid)
    assert history(events)[: len(before)] == before
    messages = [line.message for line in await engine.storage.get_logs(eid)]
    assert "before" in messages and "after 1 x" in messages


RESTART_JS = """
import { step } from "myapp:demo/activity";
import { answer } from "myapp:demo/stubs";
export default function restarted() {
  // Each step outlasts the writer's linger (2 ms): with `interrupt`, every one unloads.
  let acc = 0;
  for (let i = 1; i <= 3; i++) acc += step(i, 10);
  const s = answer("q");
  for (let i = 4; i <= 6; i++) acc += step(i, 10);
  return acc + "-" + s + "-" + Date.now() % 1;
}
"""


def history_keys(events: list[ev.StoredEvent], eid: str) -> list[Any]:
    """History kinds and deterministic keys, with the execution's own id factored out."""
    out: list[Any] = []
    for h in history(events):
        d = ev.to_builtins(h)
        d.pop("run_expires_at", None)
        if isinstance(h, ev.Persist):
            d.pop("value")
        if isinstance(h, ev.JoinSetRequest) and isinstance(h.request, ev.DelayRequest):
            d["request"].pop("expires_at")
        out.append(json.loads(json.dumps(d).replace(eid[2:], "<ID>")))
    return out


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_restart_while_blocked_replays_to_the_same_result(
    start_engine: StartEngine, strategy: str
) -> None:
    toml = ACTIVITIES + workflow("restarted", strategy=strategy, lock_ms=400)
    files = {"step.js": STEP_JS, "restarted.js": RESTART_JS}
    engine = await start_engine(toml, files=files)
    # An uninterrupted reference run.
    ref = await engine.submit(ffqn_of("restarted"), [])
    await engine.stub(await child_of(engine, ref, "myapp:demo/stubs.answer"), {"ok": "s"})
    assert await engine.result(ref, timeout=20) == ev.ResultOk("21-s-0")
    # A run interrupted by a restart while it awaits the stub.
    eid = await engine.submit(ffqn_of("restarted"), [])
    child = await child_of(engine, eid, "myapp:demo/stubs.answer")
    await wait_state(engine, eid, "blocked_by_join_set")
    await engine.stop()
    engine = await start_engine(toml, files=files)
    await engine.stub(child, {"ok": "s"})
    assert await engine.result(eid, timeout=20) == ev.ResultOk("21-s-0")
    ref_events = await checked_log(engine, ref)
    events = await checked_log(engine, eid)
    assert history_keys(events, eid) == history_keys(ref_events, ref)
    requested = [r.child_execution_id for r in child_requests(events)]
    assert len(requested) == len(set(requested)) == 7
    for c in requested:
        c_events = await checked_log(engine, c)
        assert sum(isinstance(e.event, ev.Created) for e in c_events) == 1
        assert sum(isinstance(e.event, ev.Finished) for e in c_events) == 1
    runs = {e.event.run_id for e in events if isinstance(e.event, ev.Locked)}
    if strategy == "interrupt":
        # Every blocking step unloads the instance: each continuation is a new run.
        assert len(runs) >= 7
    else:
        assert len(runs) >= 2


async def test_a_blocked_run_stopped_with_its_engine_does_not_hold_up_the_next_one(
    start_engine: StartEngine,
) -> None:
    """An `await` run blocked on a child keeps a claim until its lock expires (an hour
    here): the warm run may continue first. Stopping the engine ends the run, and its
    `unlocked("executor closing")` drops the claim, so that after a restart the child's
    response makes the workflow due at once."""
    toml = ACTIVITIES + workflow("restarted", strategy="await", lock_ms=3_600_000)
    files = {"step.js": STEP_JS, "restarted.js": RESTART_JS}
    engine = await start_engine(toml, files=files)
    eid = await engine.submit(ffqn_of("restarted"), [])
    child = await child_of(engine, eid, "myapp:demo/stubs.answer")
    await wait_state(engine, eid, "blocked_by_join_set")
    await engine.stop()
    engine = await start_engine(toml, files=files)
    last = (await engine.storage.get_events(eid))[-1].event
    assert last == ev.Unlocked(last.backoff_expires_at, "executor closing")  # type: ignore[union-attr]
    state = (await engine.storage.get_summary(eid)).state
    assert isinstance(state, BlockedByJoinSet) and state.blocked_run is None
    await engine.stub(child, {"ok": "s"})
    assert await engine.result(eid, timeout=20) == ev.ResultOk("21-s-0")
    await checked_log(engine, eid)


async def test_interrupt_and_await_write_the_same_history(start_engine: StartEngine) -> None:
    toml = (
        ACTIVITIES
        + workflow("restarted", strategy="await")
        + workflow("restartedI", function="restarted-i", strategy="interrupt")
    )
    files = {"step.js": STEP_JS, "restarted.js": RESTART_JS, "restartedI.js": RESTART_JS}
    engine = await start_engine(toml, files=files)
    ids = [
        await engine.submit(ffqn_of("restarted"), []),
        await engine.submit(ffqn_of("restarted-i"), []),
    ]
    for eid in ids:
        await engine.stub(await child_of(engine, eid, "myapp:demo/stubs.answer"), {"ok": "s"})
    results = [await engine.result(eid, timeout=20) for eid in ids]
    assert results == [ev.ResultOk("21-s-0")] * 2
    keys = [history_keys(await checked_log(engine, eid), eid) for eid in ids]
    assert keys[0] == keys[1]


# ---------------------------------------------------------------------------
# random values, generated ids, clocks
# ---------------------------------------------------------------------------

RANDOM_JS = f"""
{OBELISK}
import {{ answer }} from "myapp:demo/stubs";
export default function randoms() {{
  const v = {{
    u: obelisk.randomU64(0, 1000000),
    big: String(obelisk.randomU64Inclusive(0n, 18446744073709551615n)),
    s: obelisk.randomString(5, 10),
    id: obelisk.executionIdGenerate(),
    now: Date.now(),
    date: new Date().toISOString(),
    m: Math.random(),
  }};
  console.log(JSON.stringify(v));
  v.answer = answer("q");
  v.after = Date.now() >= v.now;
  return JSON.stringify(v);
}}
"""


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_random_values_ids_and_clocks_replay_identically(
    start_engine: StartEngine, strategy: str
) -> None:
    toml = ACTIVITIES + workflow("randoms", strategy=strategy, lock_ms=400)
    files = {"step.js": STEP_JS, "randoms.js": RANDOM_JS}
    engine = await start_engine(toml, files=files)
    first = await engine.submit(ffqn_of("randoms"), [])
    child = await child_of(engine, first, "myapp:demo/stubs.answer")
    await wait_state(engine, first, "blocked_by_join_set")
    logged = json.loads((await engine.storage.get_logs(first))[0].message)
    await engine.stop()
    engine = await start_engine(toml, files=files)
    await engine.stub(child, {"ok": "a"})
    out = ok_json(await engine.result(first, timeout=20))
    assert out.pop("answer") == "a" and out.pop("after") is True
    assert out == logged  # the replay after the restart saw the same values
    # The replayed run logged the same line again: it is stored once.
    messages = [json.loads(line.message) for line in await engine.storage.get_logs(first)]
    assert messages == [logged]
    events = await checked_log(engine, first)
    persisted = [(type(h.kind), h.value) for h in history(events) if isinstance(h, ev.Persist)]
    assert persisted == [
        (ev.PersistRandomU64, out["u"]),
        (ev.PersistRandomU64, int(out["big"])),
        (ev.PersistRandomString, out["s"]),
        (ev.PersistExecutionId, out["id"]),
    ]
    delays = [
        h.request
        for h in history(events)
        if isinstance(h, ev.JoinSetRequest) and isinstance(h.request, ev.DelayRequest)
    ]
    assert int(delays[0].expires_at.timestamp() * 1000) == out["now"]
    # Another execution gets other values.
    second = await engine.submit(ffqn_of("randoms"), [])
    await engine.stub(await child_of(engine, second, "myapp:demo/stubs.answer"), {"ok": "a"})
    other = ok_json(await engine.result(second, timeout=20))
    assert other["id"] != out["id"] and other["m"] != out["m"] and other["s"] != out["s"]


# ---------------------------------------------------------------------------
# lock extension (§6.2) and unloading
# ---------------------------------------------------------------------------

MANY_STEPS_JS = f"""
{OBELISK}
import {{ step }} from "myapp:demo/activity";
export default function manySteps(n) {{
  let acc = 0;
  for (let i = 0; i < n; i++) {{
    acc += step(i, 12);  // 40 steps outlast the 400 ms lock, however fast the rest is
    // Compute a little between host calls, with non-blocking calls in between.
    let x = 0;
    for (let k = 0; k < 20000; k++) x += k % 7;
    acc += obelisk.randomU64(0, 1) * 0 + (x > 0 ? 0 : 1);
  }}
  return String(acc);
}}
"""


async def test_a_busy_workflow_extends_its_short_lock(start_engine: StartEngine) -> None:
    toml = ACTIVITIES + workflow(
        "manySteps", function="many-steps", params=[("n", "u32")], lock_ms=400
    )
    engine = await start_engine(toml, files={"step.js": STEP_JS, "manySteps.js": MANY_STEPS_JS})
    eid = await engine.submit(ffqn_of("many-steps"), [40])
    assert await engine.result(eid, timeout=30) == ev.ResultOk(str(sum(range(40))))
    events = await checked_log(engine, eid)
    locks: dict[str, list[ev.StoredEvent]] = {}
    for e in events:
        if isinstance(e.event, ev.Locked):
            locks.setdefault(e.event.run_id, []).append(e)
    # The run extends its own lock as it goes (a step whose activity takes longer than
    # the lock may unload it: a new run then replays and goes on, never a timeout).
    longest = max(locks.values(), key=len)
    assert len(longest) > 1
    assert longest[-1].created_at - longest[0].created_at > timedelta(milliseconds=400)
    kinds = {type(e.event) for e in events}
    assert not kinds & {ev.TemporarilyTimedOut, ev.TemporarilyFailed}


REPLAY_ONLY_JS = f"""
{OBELISK}
export default function bursts(n) {{
  // Many non-blocking host calls and some computing: no response is ever awaited.
  let acc = 0;
  for (let i = 0; i < n; i++) {{
    let x = 0;
    for (let k = 0; k < 40000; k++) x += k % 3;
    acc += obelisk.randomU64(0, 10) >= 0 ? 1 : 0;
  }}
  return String(acc);
}}
"""


async def test_non_blocking_host_calls_extend_the_lock(start_engine: StartEngine) -> None:
    toml = ACTIVITIES + workflow("bursts", params=[("n", "u32")], lock_ms=400)
    # Every clock reading moves time 10 ms on: 60 host calls span more than the 400 ms
    # lock however fast the machine computes, so the run must extend it.
    engine = await start_engine(
        toml,
        files={"step.js": STEP_JS, "bursts.js": REPLAY_ONLY_JS},
        clock=SteppingClock(0.01),
    )
    eid = await engine.submit(ffqn_of("bursts"), [60])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("60")
    events = await checked_log(engine, eid)
    locks = [e for e in events if isinstance(e.event, ev.Locked)]
    assert len({e.event.run_id for e in locks}) == 1  # type: ignore[union-attr]
    kinds = {type(e.event) for e in events}
    assert not kinds & {ev.TemporarilyTimedOut, ev.Unlocked, ev.TemporarilyFailed}
    assert len(locks) > 1, "the run did not extend its lock"


async def test_await_past_the_lock_expiry_unloads_and_a_new_run_replays(
    start_engine: StartEngine,
) -> None:
    toml = ACTIVITIES + workflow("awaitStub", lock_ms=300)
    engine = await start_engine(toml, files={"step.js": STEP_JS, "awaitStub.js": AWAIT_STUB_JS})
    eid = await engine.submit(ffqn_of("awaitStub"), [])
    child = await child_of(engine, eid, "myapp:demo/stubs.answer")
    await wait_state(engine, eid, "blocked_by_join_set")
    (executor,) = [e for e in engine.executors if e.name == "awaitStub"]

    async def unloaded() -> bool:
        return not executor._inflight

    await wait_until(unloaded, 5, "the warm run to give up")
    assert await state_of(engine, eid) == "blocked_by_join_set"
    await engine.stub(child, {"ok": "late"})
    assert await engine.result(eid, timeout=20) == ev.ResultOk("got late")
    events = await checked_log(engine, eid)
    runs = [e.event.run_id for e in events if isinstance(e.event, ev.Locked)]
    assert len(set(runs)) == 2
    assert len(child_requests(events)) == 1


SPIN_JS = """
export default function spin() {
  while (true) { /* never calls the host */ }
}
"""


async def test_a_spinning_workflow_is_stopped_and_retried_not_failed(
    start_engine: StartEngine,
) -> None:
    toml = ACTIVITIES + workflow("spin", lock_ms=200)
    engine = await start_engine(toml, files={"step.js": STEP_JS, "spin.js": SPIN_JS})
    eid = await engine.submit(ffqn_of("spin"), [])

    async def timed_out_twice() -> bool:
        events = await engine.storage.get_events(eid)
        return sum(isinstance(e.event, ev.TemporarilyTimedOut) for e in events) >= 2

    await wait_until(timed_out_twice, 15, "two temporary timeouts")
    summary = await engine.storage.get_summary(eid)
    assert summary.result is None
    await checked_log(engine, eid)
