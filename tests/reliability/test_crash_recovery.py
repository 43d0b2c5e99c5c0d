"""SIGKILL the server while ~1,000 activity executions are in flight, restart it on the same
data dir, and check that nothing was lost, nothing finished twice, every log is legal.

Run with `-s` to see the numbers (seed, state at the kill, retries after the restart); set
`RELIABILITY_SEED` to replay a given kill moment.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from engine.core import events as ev
from tests.fixtures.components import activity_component, ffqn
from tests.fixtures.deployments import Deployment, ms
from tests.reliability.conftest import (
    DB_NAME,
    ServerProcess,
    Submission,
    SubmitOutcome,
    all_execution_ids,
    check_log,
    count_states,
    describe,
    ids_in_state,
    load_logs,
    new_ids,
    shape,
    submit_all,
    wait_until,
)

pytestmark = pytest.mark.slow

N = 1000
#: Every JS_EVERY-th execution is the CPU-bound JS activity, the rest are WASM `add`.
JS_EVERY = 10
WORK_FFQN = "testing:reliability/work.work"

WORK_JS = """
export function work(n) {
  let x = 0;
  for (let i = 0; i < n; i++) { x = (x + i * 7) % 1000003; }
  return x;
}
"""


def work(n: int) -> int:
    """What `WORK_JS` returns."""
    x = 0
    for i in range(n):
        x = (x + i * 7) % 1000003
    return x


def write_deployment(directory: Path) -> Path:
    common = {"lock_expiry": ms(1000), "tick_sleep": ms(50)}
    return (
        Deployment()
        .activity_wasm("fixtures", activity_component(), retry_exp_backoff=ms(10), exec=common)
        .activity_js(
            "work",
            WORK_JS,
            export="work",
            ffqn=WORK_FFQN,
            params=[("n", "u32")],
            return_type="result<u32, string>",
            retry_exp_backoff=ms(10),
            exec={"max_inflight": 4, "batch_size": 4, **common},
        )
        .write(directory)
    )


def submissions(rng: random.Random) -> list[Submission]:
    subs = []
    for i, execution_id in enumerate(new_ids(N)):
        if i % JS_EVERY == 0:
            n = rng.randrange(100_000, 300_000)
            subs.append(Submission(execution_id, WORK_FFQN, [n], work(n)))
        else:
            subs.append(Submission(execution_id, ffqn("add"), [i, 1000], i + 1000))
    return subs


def test_sigkill_with_executions_in_flight_loses_nothing(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    seed = int(os.environ.get("RELIABILITY_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    kill_after = rng.randrange(100, 601)
    deployment = write_deployment(tmp_path)
    data_dir = tmp_path / "data"
    db = data_dir / DB_NAME
    t0 = time.monotonic()
    subs = submissions(rng)
    by_id = {s.execution_id: s for s in subs}

    # 1. Start, submit everything from a background thread, SIGKILL once `kill_after`
    #    executions have finished and some are locked (running right now).
    first = ServerProcess(deployment, data_dir, tmp_path / "server-1.log")
    servers.append(first)
    first.wait_ready()
    t_ready = time.monotonic()
    stop_submitting = threading.Event()
    outcome = SubmitOutcome()

    def submitter() -> None:
        nonlocal outcome
        outcome = submit_all([(first.url, s) for s in subs], threads=32, stop=stop_submitting)

    thread = threading.Thread(target=submitter, daemon=True)
    thread.start()

    def kill_moment() -> bool:
        states = count_states(db)
        return states["finished"] >= kill_after and states["locked"] > 0

    wait_until(kill_moment, 60, f"{kill_after} finished executions")
    first.kill()
    t_kill = time.monotonic()
    stop_submitting.set()
    thread.join(60)
    assert not thread.is_alive()

    at_kill = count_states(db)
    locked_at_kill = ids_in_state(db, "locked")
    unacknowledged = set(by_id) - outcome.acknowledged
    assert all_execution_ids(db) >= outcome.acknowledged, "an acknowledged submission was lost"

    # 2. Restart on the same data dir; re-submit what was never acknowledged (idempotent:
    #    it may or may not have been committed before the kill); wait for everything.
    second = ServerProcess(deployment, data_dir, tmp_path / "server-2.log")
    servers.append(second)
    second.wait_ready()
    t_restarted = time.monotonic()
    retry_outcome = submit_all([(second.url, by_id[e]) for e in sorted(unacknowledged)])
    assert retry_outcome.acknowledged == unacknowledged, retry_outcome.failed
    wait_until(lambda: count_states(db)["finished"] == N, 60, "every execution to finish", 0.05)
    t_done = time.monotonic()
    assert second.stop() == 0, second.output()
    assert not second.error_lines(), second.output()

    # 3. Check every log with the engine's storage and state function.
    assert all_execution_ids(db) == set(by_id)
    logs = load_logs(db, by_id)
    for execution_id, log in logs.items():
        check_log(log, by_id[execution_id].expected)
    retried = {e for e, log in logs.items() if len(log.of_type(ev.Locked)) > 1}
    timed_out = {e for e, log in logs.items() if log.of_type(ev.TemporarilyTimedOut)}
    for execution_id in locked_at_kill:
        # The dead server's lock expired and was handled by the new server's watcher.
        log = logs[execution_id]
        assert execution_id in timed_out, describe(log)
    print(
        f"\ncrash recovery (seed {seed}): killed after >= {kill_after} finished; at the kill "
        f"{sum(at_kill.values())} of {N} submitted and committed, {at_kill['finished']} finished, "
        f"{N - at_kill['finished']} unfinished ({at_kill['locked']} locked, "
        f"{at_kill['pending_at']} pending, {N - sum(at_kill.values())} not yet created); "
        f"{len(unacknowledged)} submissions re-sent; after the restart {len(retried)} needed "
        f"a retry ({len(timed_out)} with temporarily_timed_out); log shapes "
        f"{dict(Counter(shape(log) for log in logs.values()).most_common())}; seconds: "
        f"prepare {t_ready - t0:.1f}, run until kill {t_kill - t_ready:.1f}, restart "
        f"{t_restarted - t_kill:.1f}, finish {t_done - t_restarted:.1f}, "
        f"check {time.monotonic() - t_done:.1f}"
    )
