"""Property: random workflow programs replay deterministically (SPEC §7.1, issue #3).

A *program* is a short list of operations — create a join set, call an activity
directly, submit an activity / a never-answered stub / a delay (0–20 ms) into a join
set, join-next, join-next-try, a random u64, a schedule — interpreted by one JS
workflow (`interp.js`) that takes the program as its parameter, so one engine serves
every example. Each program also contains a *gate*: a direct call of a stub that the
test answers, so that an execution can be caught mid-way.

For every program:

* it runs three times on a real engine: with `await`, with `interrupt` (every blocking
  step unloads the instance and the rest is a replay), and once more with an engine
  restart while it waits at the gate. All three return the same result and write the
  same sequence of history event kinds and deterministic keys (the execution's own id
  factored out; generated values and clock readings left out); every log is legal;
  no child is requested twice;
* each finished log, replayed in process against its stored responses, reproduces
  its whole history and its result without writing anything;
* the program with one operation dropped or changed (three such, drawn), replayed
  against the first log, is detected as nondeterministic.

The generator keeps programs runnable and their observable answers certain: a
join-next is only drawn when a response can arrive (never only stubs left), a
join-next-try only when its outcome is certain (nothing left; a 0 ms delay answered
at submission not yet consumed; only stubs left).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from engine.core import events as ev
from engine.core.state import BlockedByJoinSet, IllegalAppend
from engine.engine import Engine
from engine.executors.replay_host import ReplayHost
from engine.runtimes.js.workflow import WfOk
from engine.runtimes.workflow_host import RunAborted
from engine.storage.contract import LockedExecution
from tests.engine.conftest import StartEngine
from tests.engine.test_workflow_semantics import (
    ACTIVITIES,
    STEP_JS,
    checked_log,
    child_requests,
    history,
    wait_until,
    workflow,
)

INTERP_JS = """
import * as obelisk from "obelisk:workflow@1.0.0";
import { step } from "myapp:demo/activity";
import { answer } from "myapp:demo/stubs";
import { stepSubmit } from "myapp:demo-obelisk-ext/activity";
import { answerSubmit } from "myapp:demo-obelisk-ext/stubs";
import { stepSchedule } from "myapp:demo-obelisk-schedule/activity";

export default function interp(program) {
  const sets = [];
  const out = [];
  const set = (i) => {
    if (sets.length === 0) throw new Error("no join set");
    return sets[i % sets.length];
  };
  for (const op of JSON.parse(program)) {
    switch (op[0]) {
      case "create": sets.push(obelisk.createJoinSet()); break;
      case "call": out.push(step(op[1], 0)); break;
      case "gate": out.push(answer("gate")); break;
      case "submit": stepSubmit(set(op[1]), op[2], 0); break;
      case "stub": answerSubmit(set(op[1]), "never"); break;
      case "delay": set(op[1]).submitDelay({ milliseconds: op[2] }); break;
      case "next": out.push(set(op[1]).joinNext().type === "allProcessed" ? "none" : "answer"); break;
      case "try": {
        const t = set(op[1]).joinNextTry().type;
        out.push(t === "pending" || t === "allProcessed" ? t : "found");
        break;
      }
      case "random": out.push(obelisk.randomU64(0, op[1]) < op[1]); break;
      case "schedule":
        out.push(stepSchedule(op[1] ? { milliseconds: op[1] } : "now", op[2], 0).startsWith("E_"));
        break;
      default: throw new Error("unknown op " + op[0]);
    }
  }
  return JSON.stringify(out);
}
"""

STRATEGIES = {"await": "interp", "interrupt": "interp-interrupt"}
TOML = (
    ACTIVITIES
    + workflow("interp", params=[("program", "string")], strategy="await", lock_ms=300)
    + workflow(
        "interpI",
        function="interp-interrupt",
        params=[("program", "string")],
        strategy="interrupt",
        lock_ms=300,
    )
)
FILES = {"step.js": STEP_JS, "interp.js": INTERP_JS, "interpI.js": INTERP_JS}
ANSWER = "myapp:demo/stubs.answer"

# ---------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------


@dataclass
class _Set:
    submitted: int = 0
    arrivable: int = 0  # members whose response will come (activities, delays)
    certain: int = 0  # members answered at submission (0 ms delays)
    consumed: int = 0


Op = list[Any]


@st.composite
def programs(draw: st.DrawFn) -> list[Op]:
    n = draw(st.integers(1, 10))
    gate_at = draw(st.integers(0, n))
    sets: list[_Set] = []
    ops: list[Op] = []

    def target() -> tuple[int, _Set]:
        i = draw(st.integers(0, 3))
        if not sets:
            sets.append(_Set())
            ops.append(["create"])
        return i, sets[i % len(sets)]

    for k in range(n + 1):
        if k == gate_at:
            ops.append(["gate"])
        if k == n:
            break
        kind = draw(
            st.sampled_from(
                ["create", "call", "submit", "stub", "delay", "next", "try", "random", "schedule"]
            )
        )
        if kind == "create":
            sets.append(_Set())
            ops.append(["create"])
        elif kind == "call":
            ops.append(["call", draw(st.integers(0, 99))])
        elif kind in ("submit", "stub", "delay"):
            i, s = target()
            s.submitted += 1
            if kind == "submit":
                s.arrivable += 1
                ops.append(["submit", i, draw(st.integers(0, 99))])
            elif kind == "stub":
                ops.append(["stub", i])
            else:
                ms = draw(st.integers(0, 20))
                s.arrivable += 1
                s.certain += ms == 0
                ops.append(["delay", i, ms])
        elif kind == "next":
            i, s = target()
            if s.consumed < s.arrivable:
                s.consumed += 1
            elif s.consumed != s.submitted:
                continue  # only stubs left: it would wait forever
            ops.append(["next", i])
        elif kind == "try":
            i, s = target()
            if s.consumed < s.certain:
                s.consumed += 1  # found
            elif not (s.consumed == s.submitted or s.arrivable <= s.consumed):
                continue  # the outcome would depend on timing
            ops.append(["try", i])
        elif kind == "random":
            ops.append(["random", draw(st.integers(1, 1000))])
        else:
            ops.append(["schedule", draw(st.sampled_from([0, 5, 60_000])), draw(st.integers(0, 9))])
    return ops


def alterations(program: list[Op]) -> list[list[Op]]:
    """Every program with one operation dropped, or one argument changed (each changes
    the history the program writes)."""
    out: list[list[Op]] = []
    for i, op in enumerate(program):
        out.append(program[:i] + program[i + 1 :])
        changed: Op | None = None
        match op:
            case ["call", n]:
                changed = ["call", n + 1]
            case ["submit", js, n]:
                changed = ["submit", js, n + 1]
            case ["delay", js, ms]:
                changed = ["delay", js, ms + 1]
            case ["random", m]:
                changed = ["random", m + 1]
            case ["schedule", ms, n]:
                changed = ["schedule", 0 if ms else 5, n]
            case ["gate"]:
                changed = ["call", 0]
        if changed is not None:
            out.append([*program[:i], changed, *program[i + 1 :]])
    return out


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def keys(events: list[ev.StoredEvent], eid: str) -> list[Any]:
    """Kinds and deterministic keys of the history; generated values (persisted values,
    scheduled ids, clock-derived expiry times) left out, the execution's id factored out."""
    out: list[Any] = []
    for h in history(events):
        d = ev.to_builtins(h)
        d.pop("run_expires_at", None)
        if isinstance(h, ev.Persist):
            d.pop("value")
        if isinstance(h, ev.Schedule):
            d.pop("execution_id")
        if isinstance(h, ev.JoinSetRequest) and isinstance(h.request, ev.DelayRequest):
            d["request"].pop("expires_at")
        out.append(json.loads(json.dumps(d).replace(eid[2:], "<ID>")))
    return out


async def gate_of(engine: Engine, eid: str) -> str:
    found: list[str] = []

    async def requested() -> bool:
        found[:] = [
            r.child_execution_id
            for r in child_requests(await engine.storage.get_events(eid))
            if r.target_ffqn == ANSWER and r.params == ["gate"]
        ]
        return bool(found)

    await wait_until(requested, 20, f"{eid} to reach its gate")
    return found[0]


async def wait_at_gate(engine: Engine, eid: str, gate: str) -> None:
    join_set = gate.rsplit(".", 1)[1].rsplit("_", 1)[0]

    async def blocked() -> bool:
        state = (await engine.storage.get_row(eid)).state
        return isinstance(state, BlockedByJoinSet) and state.join_set_id == join_set

    await wait_until(blocked, 20, f"{eid} to wait at its gate")


async def legal_log(engine: Engine, eid: str) -> list[ev.StoredEvent]:
    try:
        return await checked_log(engine, eid)
    except IllegalAppend as e:
        events = await engine.storage.get_events(eid)
        responses = await engine.storage.get_responses(eid)
        lines = [f"{x.version} {x.created_at.time()} {x.event}" for x in events]
        lines += [f"response {r.cursor} {r.created_at.time()} {r.response}" for r in responses]
        raise AssertionError(f"illegal log of {eid}: {e}\n" + "\n".join(lines)) from None


class _NoWrites:
    """A storage for in-process replays: any use of it is a failure."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a replay of a finished log used the storage: {name}")


def replay_in_process(
    engine: Engine,
    loop: asyncio.AbstractEventLoop,
    eid: str,
    ffqn: str,
    params: list[Any],
    events: list[ev.StoredEvent],
    responses: list[ev.StoredResponse],
) -> tuple[Any, ReplayHost]:
    """Replay a finished execution's log against `params` without a database."""
    _, component = engine.registry.function(ffqn)
    far = datetime.now(UTC) + timedelta(days=1)
    locked = LockedExecution(
        execution_id=eid,
        ffqn=ffqn,
        params=params,
        next_version=len(events),
        run_id="Run_replay",
        lock_expires_at=far,
        parent=None,
        summary=None,  # type: ignore[arg-type]
        events=events,
        responses=responses,
    )
    host = ReplayHost(
        locked=locked,
        storage=_NoWrites(),  # type: ignore[arg-type]
        registry=engine.registry,
        clock=engine.clock,
        loop=loop,
        component_id=component.component_id,
        executor_id="Exr_replay",
        deployment_id=engine.deployment_id,
        lock_expiry=timedelta(days=1),
        strategy="interrupt",
    )
    outcome = component.runner.run(host, params)
    if host.aborted is None:
        with contextlib.suppress(RunAborted):  # a mismatch while closing: in host.failure
            host.close_all()
    return outcome, host


# ---------------------------------------------------------------------------
# The property
# ---------------------------------------------------------------------------

#: The running engine of a test function (hypothesis runs its examples in one call of
#: the function-scoped fixture): each example restarts it once, the next one goes on.
_ENGINES: dict[int, Engine] = {}


async def start(start_engine: StartEngine) -> Engine:
    engine = await start_engine(TOML, files=FILES)
    # Delays of a few milliseconds: do not wait for the watcher's usual leeway.
    engine.watcher.LEEWAY = timedelta(0)
    _ENGINES[id(start_engine)] = engine
    return engine


@pytest.mark.slow  # ~35 s: 30 programs, each run three times around an engine restart
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    program=programs(),
    restart_strategy=st.sampled_from(sorted(STRATEGIES)),
    pick=st.randoms(use_true_random=False),
)
async def test_random_programs_replay_deterministically(
    start_engine: StartEngine, program: list[Op], restart_strategy: str, pick: random.Random
) -> None:
    note(f"program: {json.dumps(program)}")
    altered = alterations(program)
    await check_program(
        start_engine, program, restart_strategy, pick.sample(altered, min(3, len(altered)))
    )


async def check_program(
    start_engine: StartEngine, program: list[Op], restart_strategy: str, altered: list[list[Op]]
) -> None:
    loop = asyncio.get_running_loop()
    engine = _ENGINES.get(id(start_engine)) or await start(start_engine)
    params = [json.dumps(program)]
    runs = [
        ("await", await engine.submit("myapp:demo/workflow.interp", params)),
        ("interrupt", await engine.submit("myapp:demo/workflow.interp-interrupt", params)),
    ]
    restarted_ffqn = f"myapp:demo/workflow.{STRATEGIES[restart_strategy]}"
    restarted = await engine.submit(restarted_ffqn, params)
    for _, eid in runs:
        await engine.stub(await gate_of(engine, eid), {"ok": "open"})
    gate = await gate_of(engine, restarted)
    await wait_at_gate(engine, restarted, gate)
    results = [await engine.result(eid, timeout=20) for _, eid in runs]
    await engine.stop()
    engine = await start(start_engine)
    await engine.stub(gate, {"ok": "open"})
    results.append(await engine.result(restarted, timeout=20))
    runs.append((restart_strategy, restarted))

    assert isinstance(results[0], ev.ResultOk), results[0]
    assert results == [results[0]] * 3
    logs = [await legal_log(engine, eid) for _, eid in runs]
    all_keys = [keys(events, eid) for (_, eid), events in zip(runs, logs, strict=True)]
    assert all_keys[1] == all_keys[0]
    assert all_keys[2] == all_keys[0]
    for events in logs:
        requested = [r.child_execution_id for r in child_requests(events)]
        assert len(requested) == len(set(requested))
        assert isinstance(events[-1].event, ev.Finished)

    # Replayed in process against the stored responses: the same history and result.
    for (strategy, eid), events in zip(runs, logs, strict=True):
        responses = await engine.storage.get_responses(eid)
        ffqn = f"myapp:demo/workflow.{STRATEGIES[strategy]}"
        outcome, host = await asyncio.to_thread(
            replay_in_process, engine, loop, eid, ffqn, params, events, responses
        )
        assert host.aborted is None and host.failure is None, host.aborted
        assert host.leftover_history() is None
        assert outcome == WfOk(results[0].value)  # type: ignore[union-attr]

    # A changed program replayed against the first log is nondeterministic.
    eid = runs[0][1]
    events = logs[0]
    responses = await engine.storage.get_responses(eid)
    for changed in altered:
        outcome, host = await asyncio.to_thread(
            replay_in_process,
            engine,
            loop,
            eid,
            "myapp:demo/workflow.interp",
            [json.dumps(changed)],
            events,
            responses,
        )
        detected = (
            host.failure is not None and host.failure.kind == "nondeterminism_detected"
        ) or (host.aborted is None and host.leftover_history() is not None)
        assert detected, f"not detected: {json.dumps(changed)} ({outcome}, {host.aborted})"
