"""SIGKILL a server whose locks expire in an hour, restart it at once: what the dead
process held is released by the new one's watcher at start (`engine.storage.leases`),
not an hour later — a running activity is retried, and a workflow that was waiting in
memory for a child continues as soon as the child's response is there."""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from pathlib import Path

import pytest

from engine.core import events as ev
from tests.reliability.conftest import (
    DB_NAME,
    ServerProcess,
    load_logs,
    new_ids,
    submit,
    wait_until,
)

pytestmark = pytest.mark.slow

SPIN_JS = """
export default function spin(ms) {
  const until = Date.now() + ms;
  let x = 0;
  do { for (let i = 0; i < 1000; i++) { x = (x + i) % 7; } } while (Date.now() < until);
  return ms;
}
"""
ORDER_JS = """
import { approve } from "testing:dead/approval";
export default function order(o) { return approve(o) ? "approved" : "rejected"; }
"""
WORK_JS = """
import { spin } from "testing:dead/activity";
export default function work(ms) { return Number(spin(ms)); }
"""
DEPLOYMENT = """
[[activity_js]]
name = "spin"
location = "spin.js"
ffqn = "testing:dead/activity.spin"
params = [{ name = "ms", type = "u32" }]
return_type = "result<u32, string>"
retry_exp_backoff.milliseconds = 10
exec.lock_expiry.seconds = 3600

[[activity_stub]]
ffqn = "testing:dead/approval.approve"
params = [{ name = "order", type = "string" }]
return_type = "result<bool, string>"

[[workflow_js]]
name = "order"
location = "order.js"
ffqn = "testing:dead/workflows.order"
params = [{ name = "order", type = "string" }]
return_type = "result<string, string>"
exec.lock_expiry.seconds = 3600

[[workflow_js]]
name = "work"
location = "work.js"
ffqn = "testing:dead/workflows.work"
params = [{ name = "ms", type = "u32" }]
return_type = "result<u32, string>"
exec.lock_expiry.seconds = 3600
"""


def query(db: Path, sql: str, *args: object) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def state(db: Path, execution_id: str) -> str | None:
    rows = query(db, "SELECT state FROM executions WHERE execution_id = ?", execution_id)
    return str(rows[0][0]) if rows else None


def child(db: Path, parent: str) -> str | None:
    rows = query(db, "SELECT execution_id FROM executions WHERE parent_id = ?", parent)
    return str(rows[0][0]) if rows else None


def stub(url: str, execution_id: str, result: object) -> None:
    request = urllib.request.Request(
        f"{url}/v1/executions/{execution_id}/stub",
        data=json.dumps(result).encode(),
        headers={"Content-Type": "application/json"},
        method="PUT",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 200


def test_a_restarted_server_releases_what_the_killed_one_held_at_once(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    for name, source in (("spin.js", SPIN_JS), ("order.js", ORDER_JS), ("work.js", WORK_JS)):
        (tmp_path / name).write_text(source)
    deployment = tmp_path / "deployment.toml"
    deployment.write_text(DEPLOYMENT)
    data_dir = tmp_path / "data"
    db = data_dir / DB_NAME
    leases = data_dir / f"{DB_NAME}-executors"

    first = ServerProcess(deployment, data_dir, tmp_path / "server-1.log")
    servers.append(first)
    first.wait_ready()
    order, work = new_ids(2)
    submit(first.url, order, "testing:dead/workflows.order", ["o-1"])
    submit(first.url, work, "testing:dead/workflows.work", [1500])
    # The order waits in memory for its stub child; the work's child is running.
    wait_until(lambda: state(db, order) == "blocked_by_join_set", 30, "the order to block")
    wait_until(lambda: (c := child(db, work)) is not None and state(db, c) == "locked", 30, "spin")
    spin = child(db, work)
    approval = child(db, order)
    assert spin is not None and approval is not None
    dead_leases = set(p.name for p in leases.iterdir())
    assert dead_leases  # one file per executor of the first server
    first.kill()

    second = ServerProcess(deployment, data_dir, tmp_path / "server-2.log")
    servers.append(second)
    second.wait_ready()
    stub(second.url, approval, {"ok": True})
    # Without the leases, both would wait an hour for the dead locks to expire.
    wait_until(
        lambda: state(db, order) == state(db, work) == "finished", 60, "both to finish", 0.05
    )
    wait_until(
        lambda: not dead_leases & {p.name for p in leases.iterdir()}, 30, "dead leases forgotten"
    )
    assert second.stop() == 0, second.output()
    assert not second.error_lines(), second.output()
    assert list(leases.iterdir()) == []  # a clean stop removes its own

    logs = load_logs(db, [order, work, spin, approval])
    assert logs[order].of_type(ev.Finished)[0].result == ev.ResultOk("approved")
    assert logs[work].of_type(ev.Finished)[0].result == ev.ResultOk(1500)
    # The workflows' dead runs lost their claims; the spin's dead lock timed out (a retry).
    assert [u.reason for u in logs[order].of_type(ev.Unlocked)] == ["executor died"]
    assert [u.reason for u in logs[work].of_type(ev.Unlocked)] == ["executor died"]
    assert len(logs[spin].of_type(ev.TemporarilyTimedOut)) == 1
    assert "released 3 execution(s) held by the executors of a process that died" in second.output()
