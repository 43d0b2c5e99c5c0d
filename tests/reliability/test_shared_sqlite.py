"""Two `obelisk server run` processes on one data dir (one SQLite file): every execution is
run to `finished` exactly once, and both engines do part of the work.

Each server wakes the other after its commits (`engine.storage.sqlite.peers`); the
executors' ticks (`exec.tick_sleep`, small here) are the safety net. Run with `-s` to see
the split between the two executors.
"""

from __future__ import annotations

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
    all_execution_ids,
    check_log,
    count_states,
    load_logs,
    new_ids,
    shape,
    submit_all,
    wait_until,
)

pytestmark = pytest.mark.slow

N = 500


def write_deployment(directory: Path) -> Path:
    return (
        Deployment()
        .activity_wasm(
            "fixtures",
            activity_component(),
            retry_exp_backoff=ms(10),
            exec={"lock_expiry": ms(1000), "tick_sleep": ms(20)},
        )
        .write(directory)
    )


def test_two_engines_on_one_sqlite_file_run_each_execution_once(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    t0 = time.monotonic()
    deployment = write_deployment(tmp_path)
    data_dir = tmp_path / "data"
    db = data_dir / DB_NAME
    # Both start at once on a fresh data dir: they race to create the schema too.
    a = ServerProcess(deployment, data_dir, tmp_path / "server-a.log")
    servers.append(a)
    b = ServerProcess(deployment, data_dir, tmp_path / "server-b.log")
    servers.append(b)
    a.wait_ready()
    b.wait_ready()
    t_ready = time.monotonic()

    subs = [
        Submission(execution_id, ffqn("add"), [i, 7], i + 7)
        for i, execution_id in enumerate(new_ids(N))
    ]
    by_id = {s.execution_id: s for s in subs}
    # Alternate between the servers, so both submit while both run.
    targets = [((a, b)[i % 2].url, s) for i, s in enumerate(subs)]
    outcome = submit_all(targets, threads=16)
    assert outcome.acknowledged == set(by_id), f"{len(outcome.failed)} submissions failed"
    wait_until(lambda: count_states(db)["finished"] == N, 60, "every execution to finish", 0.05)
    t_done = time.monotonic()
    assert a.stop() == 0, a.output()
    assert b.stop() == 0, b.output()
    for server in (a, b):
        assert not server.error_lines(), server.output()

    assert all_execution_ids(db) == set(by_id)
    logs = load_logs(db, by_id)
    finished_by: Counter[str] = Counter()
    locked_by: Counter[str] = Counter()
    for execution_id, log in logs.items():
        check_log(log, by_id[execution_id].expected)
        locks = log.of_type(ev.Locked)
        locked_by.update(lock.executor_id for lock in locks)
        finished_by[locks[-1].executor_id] += 1  # the run that holds the lock finishes
    assert len(finished_by) == 2, f"expected two executors, got {dict(finished_by)}"
    assert min(finished_by.values()) > 0, dict(finished_by)
    shapes = Counter(shape(log) for log in logs.values())
    print(
        f"\nshared sqlite: {N} executions finished by executor {dict(finished_by)}; locks "
        f"taken {dict(locked_by)}; log shapes {dict(shapes.most_common())}; seconds: start "
        f"{t_ready - t0:.1f}, submit and run {t_done - t_ready:.1f}"
    )
