"""SIGKILL the server 10 times while 200 JS workflows run (serial, parallel, sleep, nested
child workflows; `await` and `interrupt`), restarting it each time on the same data dir,
then check that every workflow finished with the result of an uninterrupted run, that
every log (events + responses, children included) is legal, and that no child was
requested or finished twice.

Run with `-s` to see the numbers (seed, kill moments, replays, time to finish); set
`RELIABILITY_SEED` to replay a given sequence of kill moments.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.core import events as ev
from engine.core.state import IllegalAppend, replay_stored
from tests.fixtures.deployments import Deployment, ms
from tests.reliability.conftest import (
    DB_NAME,
    ExecutionLog,
    ServerProcess,
    Submission,
    SubmitOutcome,
    all_execution_ids,
    count_states,
    describe,
    load_logs,
    new_ids,
    submit_all,
    wait_until,
)

pytestmark = pytest.mark.slow

N = 200
KILLS = 10
STEP = "testing:crash/activity.step"
AWAIT = "testing:crash/workflows"
INTERRUPT = "testing:crash/workflows-interrupt"
NESTED = "testing:crash/nested"

STEP_JS = """
// A little work: some arithmetic, for at least `sleepMillis` ms of wall-clock time.
export default function step(idx, sleepMillis) {
  const until = Date.now() + sleepMillis;
  let x = 0;
  do {
    for (let i = 0; i < 3000; i++) { x = (x + i * 7) % 1000003; }
  } while (Date.now() < until);
  return x >= 0 ? idx : 0;
}
"""


def serial_js(ifc: str) -> str:
    return f"""
import {{ step }} from "{ifc}";
export default function serial(base, n) {{
  let acc = 0;
  for (let i = 0; i < n; i++) {{
    acc += Number(step(base + i, 1));
  }}
  return acc;
}}
"""


def parallel_js(ext_ifc: str) -> str:
    return f"""
import {{ stepSubmit, stepAwaitNext }} from "{ext_ifc}";
import * as obelisk from "obelisk:workflow@1.0.0";
export default function parallel(base, n) {{
  const js = obelisk.createJoinSet();
  for (let i = 0; i < n; i++) {{
    stepSubmit(js, base + i, 1);
  }}
  let acc = 0;
  for (let i = 0; i < n; i++) {{
    acc += Number(stepAwaitNext(js));
  }}
  return acc;
}}
"""


def sleepy_js(ifc: str) -> str:
    return f"""
import {{ step }} from "{ifc}";
import * as obelisk from "obelisk:workflow@1.0.0";
export default function sleepy(base, n) {{
  let acc = 0;
  for (let i = 0; i < n; i++) {{
    obelisk.sleep({{ milliseconds: 20 + 10 * i }});
    acc += Number(step(base + i, 1));
  }}
  return acc;
}}
"""


def nested_js(child_ifc: str) -> str:
    return f"""
import {{ parallel }} from "{child_ifc}";
export default function nested(base, n) {{
  const a = Number(parallel(base, n));
  const b = Number(parallel(base + 100, n));
  return a + b;
}}
"""


STEP_IFC = "testing:crash/activity"
STEP_EXT_IFC = "testing:crash-obelisk-ext/activity"

#: (ffqn, file, source, blocking strategy)
WORKFLOWS: list[tuple[str, str, str, str]] = [
    (f"{AWAIT}.serial", "serial.js", serial_js(STEP_IFC), "await"),
    (f"{AWAIT}.parallel", "parallel.js", parallel_js(STEP_EXT_IFC), "await"),
    (f"{AWAIT}.sleepy", "sleepy.js", sleepy_js(STEP_IFC), "await"),
    (f"{INTERRUPT}.serial", "serial.js", serial_js(STEP_IFC), "interrupt"),
    (f"{INTERRUPT}.parallel", "parallel.js", parallel_js(STEP_EXT_IFC), "interrupt"),
    (f"{INTERRUPT}.sleepy", "sleepy.js", sleepy_js(STEP_IFC), "interrupt"),
    (f"{NESTED}.nested", "nested.js", nested_js(AWAIT), "await"),
    (f"{NESTED}.nested-interrupt", "nested-interrupt.js", nested_js(INTERRUPT), "interrupt"),
]
STRATEGY = {ffqn: strategy for ffqn, _, _, strategy in WORKFLOWS}

#: What is submitted: (ffqn, how many, steps). Serial and parallel make 10 steps; sleep
#: interleaves 3 persistent sleeps with 3 steps; nested calls `parallel` (4 steps) twice
#: through its import. A quarter uses the `interrupt` strategy. ~1,400 JS activity
#: executions in all (each a fresh JS sandbox, ~10-20 ms of CPU: the bulk of the time).
MIX = [
    (f"{AWAIT}.serial", 30, 10),
    (f"{AWAIT}.parallel", 30, 10),
    (f"{AWAIT}.sleepy", 50, 3),
    (f"{NESTED}.nested", 40, 4),
    (f"{INTERRUPT}.serial", 10, 10),
    (f"{INTERRUPT}.parallel", 10, 10),
    (f"{INTERRUPT}.sleepy", 15, 3),
    (f"{NESTED}.nested-interrupt", 15, 4),
]
assert sum(count for _, count, _ in MIX) == N


def expected_result(ffqn: str, base: int, n: int) -> int:
    """What an uninterrupted run returns (`step` returns its index)."""
    if ffqn.rsplit(".", 1)[1].startswith("nested"):
        return sum(base + i for i in range(n)) + sum(base + 100 + i for i in range(n))
    return sum(base + i for i in range(n))


def executions_of(ffqn: str, n: int) -> int:
    """Executions one workflow creates, itself included (activities, child workflows)."""
    if ffqn.rsplit(".", 1)[1].startswith("nested"):
        return 1 + 2 * (1 + n)
    return 1 + n


def write_deployment(directory: Path) -> Path:
    d = Deployment().activity_js(
        "step",
        STEP_JS,
        ffqn=STEP,
        params=[("idx", "u32"), ("sleep-millis", "u32")],
        return_type="result<u32, string>",
        # Retries are for the SIGKILLs (a killed run is retried after its lock expires),
        # not for the step itself, which always succeeds: never let them run out.
        max_retries=1000,
        retry_exp_backoff=ms(10),
        exec={
            "lock_expiry": ms(1000),
            "tick_sleep": ms(50),
            # Each JS run is a fresh sandbox (~15 ms of CPU): a few at a time on a small
            # machine, so that a step is not timed out by the load itself.
            "max_inflight": 4,
            "batch_size": 4,
        },
    )
    for ffqn, file, source, strategy in WORKFLOWS:
        d.workflow_js(
            ffqn.replace(":", "-").replace("/", "-").replace(".", "-"),
            source,
            location=file,
            ffqn=ffqn,
            params=[("base", "u32"), ("n", "u32")],
            return_type="result<u32, string>",
            blocking_strategy=strategy,
            exec={
                # About a restart's duration: the dead server's locks have expired when the
                # new one is up; an `await` run waiting longer than this for a child is
                # unloaded (replayed later).
                "lock_expiry": ms(2000),
                "tick_sleep": ms(50),
                "batch_size": 16,
            },
        )
    return d.write(directory)


def submissions(rng: random.Random) -> list[Submission]:
    plan = [(ffqn, n) for ffqn, count, n in MIX for _ in range(count)]
    rng.shuffle(plan)
    return [
        Submission(execution_id, ffqn, [1000 * i, n], expected_result(ffqn, 1000 * i, n))
        for i, (execution_id, (ffqn, n)) in enumerate(zip(new_ids(N), plan, strict=True))
    ]


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------


def history(log: ExecutionLog) -> list[ev.HistoryEventKind]:
    return [e.event.event for e in log.events if isinstance(e.event, ev.HistoryEvent)]


def child_requests(log: ExecutionLog) -> list[ev.ChildExecutionRequest]:
    return [
        h.request
        for h in history(log)
        if isinstance(h, ev.JoinSetRequest) and isinstance(h.request, ev.ChildExecutionRequest)
    ]


def dump(log: ExecutionLog) -> str:
    """Events and responses in write order, for a failure message."""
    lines = [
        f"  v{e.version} {e.created_at.isoformat()} {ev.to_builtins(e.event)}" for e in log.events
    ] + [
        f"  r{r.cursor} {r.created_at.isoformat()} {ev.to_builtins(r.response)}"
        for r in log.responses
    ]
    return "\n".join(sorted(lines, key=lambda line: line.split()[1]))


def check_execution(log: ExecutionLog) -> ev.Finished:
    """Any execution: versions 0..n-1, one `created` first, one `finished` last, and a
    legal sequence of events and responses (the engine's own state function)."""
    eid = log.execution_id
    assert log.events, f"{eid}: no events"
    versions = [e.version for e in log.events]
    assert versions == list(range(len(versions))), f"{eid}: versions {versions}"
    assert isinstance(log.events[0].event, ev.Created), describe(log)
    assert len(log.of_type(ev.Created)) == 1, f"{eid}: two created: {describe(log)}"
    finished = log.of_type(ev.Finished)
    assert len(finished) == 1, f"{eid}: {len(finished)} finished events: {describe(log)}"
    assert isinstance(log.events[-1].event, ev.Finished), f"{eid}: finished is not last"
    try:
        summary = replay_stored(log.events, log.responses)
    except IllegalAppend as e:
        raise AssertionError(f"{eid}: illegal log: {e}\n{dump(log)}") from None
    assert summary.next_version == len(log.events)
    assert summary.result == finished[0].result
    cursors = [r.cursor for r in log.responses]
    assert cursors == list(range(1, len(cursors) + 1)), f"{eid}: response cursors {cursors}"
    return finished[0]


def check_tree(logs: dict[str, ExecutionLog], eid: str, expected: object, seen: set[str]) -> None:
    """A workflow and, recursively, its children: result, no child requested twice, each
    child created by exactly this parent and finished exactly once, with exactly one
    response in the parent for it, carrying that child's result."""
    log = logs[eid]
    seen.add(eid)
    finished = check_execution(log)
    if expected is not None:
        assert finished.result == ev.ResultOk(expected), f"{eid}: {finished.result!r}"
    requests = child_requests(log)
    ids = [r.child_execution_id for r in requests]
    assert len(ids) == len(set(ids)), f"{eid}: a child requested twice: {Counter(ids)}"
    responses = Counter(
        r.response.child_execution_id
        for r in log.responses
        if isinstance(r.response, ev.ChildExecutionFinished)
    )
    assert set(responses) == set(ids), f"{eid}: responses {responses} vs requests {ids}"
    assert all(n == 1 for n in responses.values()), f"{eid}: duplicate responses {responses}"
    by_child = {
        r.response.child_execution_id: r.response
        for r in log.responses
        if isinstance(r.response, ev.ChildExecutionFinished)
    }
    for request in requests:
        child = request.child_execution_id
        assert child in logs, f"{eid}: requested child {child} does not exist"
        created = logs[child].events[0].event
        assert isinstance(created, ev.Created)
        assert created.parent == (eid, by_child[child].join_set_id)
        assert created.ffqn == request.target_ffqn and created.params == request.params
        check_tree(logs, child, None, seen)
        assert by_child[child].result == logs[child].of_type(ev.Finished)[0].result


@dataclass
class Runs:
    """Runs of the workflows (a new run replays the log from the start)."""

    runs: int = 0
    timed_out: int = 0  # lock expired without progress: temporarily_timed_out
    made_progress: int = 0  # lock expired after progress: unlocked("made progress")


def count_runs(log: ExecutionLog, runs: Runs) -> None:
    run_ids = []
    for e in log.events:
        if isinstance(e.event, ev.Locked) and (not run_ids or run_ids[-1] != e.event.run_id):
            run_ids.append(e.event.run_id)
        elif isinstance(e.event, ev.TemporarilyTimedOut):
            runs.timed_out += 1
        elif isinstance(e.event, ev.Unlocked) and e.event.reason == "made progress":
            runs.made_progress += 1
    runs.runs += len(run_ids)


# ---------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------


def test_sigkill_ten_times_while_workflows_run(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    seed = int(os.environ.get("RELIABILITY_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    deployment = write_deployment(tmp_path)
    data_dir = tmp_path / "data"
    db = data_dir / DB_NAME
    subs = submissions(rng)
    by_id = {s.execution_id: s for s in subs}
    total = sum(executions_of(s.ffqn, s.params[1]) for s in subs)
    # Kill once `finished` executions reach each of KILLS random points spread over the
    # first ~80 % of the work (and at least a few more than at the restart, so that the
    # run always advances), then after a random extra delay.
    kill_points = sorted(rng.randrange(total // 50, total * 4 // 5) for _ in range(KILLS))
    t0 = time.monotonic()

    server = ServerProcess(deployment, data_dir, tmp_path / "server-1.log")
    servers.append(server)
    server.wait_ready()
    t_first_ready = time.monotonic()
    stop_submitting = threading.Event()
    outcome = SubmitOutcome()
    first_url = server.url

    def submitter() -> None:
        nonlocal outcome
        outcome = submit_all([(first_url, s) for s in subs], threads=8, stop=stop_submitting)

    thread = threading.Thread(target=submitter, daemon=True)
    thread.start()

    moments: list[str] = []
    startups: list[float] = []
    for k, point in enumerate(kill_points):
        at_start = count_states(db)["finished"]
        target = max(point, at_start + rng.randrange(3, 20))
        wait_until(
            lambda target=target, server=server: (
                count_states(db)["finished"] >= target or not server.alive
            ),
            60,
            f"{target} finished executions before kill {k + 1}",
            0.01,
        )
        time.sleep(rng.uniform(0, 0.25))
        assert server.alive, server.output()
        states = count_states(db)
        server.kill()
        moments.append(
            f"{states['finished']}/{total} finished, {states['locked']} locked, "
            f"{states['blocked_by_join_set']} blocked"
        )
        print(f"[{time.monotonic() - t0:5.1f} s] kill {k + 1}: {moments[-1]}", flush=True)
        if k == 0:
            stop_submitting.set()
            thread.join(60)
            assert not thread.is_alive()
            # Re-send what was never acknowledged: the id makes it idempotent.
            unacknowledged = set(by_id) - outcome.acknowledged
            assert all_execution_ids(db) >= outcome.acknowledged, "an acknowledged submit was lost"
        t_start = time.monotonic()
        server = ServerProcess(deployment, data_dir, tmp_path / f"server-{k + 2}.log")
        servers.append(server)
        server.wait_ready()
        startups.append(time.monotonic() - t_start)
        if k == 0:
            retry = submit_all([(server.url, by_id[e]) for e in sorted(unacknowledged)])
            assert retry.acknowledged == unacknowledged, retry.failed

    t_last_restart = time.monotonic()
    wait_until(
        lambda: count_states(db)["finished"] >= total, 120, "every execution to finish", 0.05
    )
    t_done = time.monotonic()
    assert count_states(db)["finished"] == total
    assert server.stop() == 0, server.output()
    errors = [line for s in servers for line in s.error_lines()]
    assert not errors, "\n".join(errors[:20])

    # Every execution: top-level workflows, their child workflows, every activity.
    ids = all_execution_ids(db)
    logs = load_logs(db, ids)
    seen: set[str] = set()
    for sub in subs:
        check_tree(logs, sub.execution_id, sub.expected, seen)
    assert seen == ids, f"executions outside the workflow trees: {sorted(ids - seen)[:5]}"
    assert len(ids) == total

    runs = {strategy: Runs() for strategy in ("await", "interrupt")}
    workflows = 0
    for log in logs.values():
        created = log.events[0].event
        assert isinstance(created, ev.Created)
        if created.ffqn in STRATEGY:
            workflows += 1
            count_runs(log, runs[STRATEGY[created.ffqn]])
    kinds = Counter(s.ffqn.rsplit(".", 1)[1] for s in subs)
    print(
        f"\nworkflow crash recovery (seed {seed}): {N} workflows {dict(kinds)}, "
        f"{workflows} workflow executions, {total} executions in all; {KILLS} SIGKILLs at "
        + "; ".join(moments)
        + ". Workflow runs (each new run replays the log): "
        + ", ".join(
            f"{s} {r.runs} runs of {sum(1 for x in logs.values() if STRATEGY.get(x.events[0].event.ffqn) == s)} "  # type: ignore[attr-defined]
            f"executions ({r.timed_out} temporarily_timed_out, {r.made_progress} "
            f"unlocked made-progress)"
            for s, r in runs.items()
        )
        + f". Seconds: first start {t_first_ready - t0:.1f}, restarts "
        f"{min(startups):.1f}–{max(startups):.1f}, first start to last kill "
        f"{t_last_restart - t_first_ready:.1f}, last restart to all finished "
        f"{t_done - t_last_restart:.1f}, check {time.monotonic() - t_done:.1f}"
    )
