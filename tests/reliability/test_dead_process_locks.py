"""SIGKILL a server whose locks expire in an hour, restart it at once: what the dead
process held is released by the new one's watcher at start (executor leases: files
`engine.storage.leases` with SQLite, advisory locks `engine.storage.postgres.leases`),
not an hour later — a running activity is retried, and a workflow that was waiting in
memory for a child continues as soon as the child's response is there."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core import events as ev
from engine.storage.postgres import PostgresStorage
from tests.fixtures.deployments import Deployment, ms, seconds
from tests.pg_cluster import drop_schema, schema_dsn
from tests.reliability.conftest import (
    DB_NAME,
    ExecutionLog,
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
DEPLOYMENT = (
    Deployment()
    .activity_js(
        "spin",
        SPIN_JS,
        ffqn="testing:dead/activity.spin",
        params=[("ms", "u32")],
        return_type="result<u32, string>",
        retry_exp_backoff=ms(10),
        exec={"lock_expiry": seconds(3600)},
    )
    .activity_stub(
        "testing:dead/approval.approve",
        params=[("order", "string")],
        return_type="result<bool, string>",
    )
    .workflow_js(
        "order",
        ORDER_JS,
        ffqn="testing:dead/workflows.order",
        params=[("order", "string")],
        return_type="result<string, string>",
        exec={"lock_expiry": seconds(3600)},
    )
    .workflow_js(
        "work",
        WORK_JS,
        ffqn="testing:dead/workflows.work",
        params=[("ms", "u32")],
        return_type="result<u32, string>",
        exec={"lock_expiry": seconds(3600)},
    )
)


class Database:
    """The shared database, observed from the test: SQLite file or PostgreSQL schema."""

    #: What the servers get to use it (besides `--data-dir`).
    server_args: list[str] = []

    def state(self, execution_id: str) -> str | None:
        raise NotImplementedError

    def child(self, parent: str) -> str | None:
        raise NotImplementedError

    def leases(self) -> set[str]:
        """The executors with a lease (alive, or dead and not forgotten yet)."""
        raise NotImplementedError

    def logs(self, ids: list[str]) -> dict[str, ExecutionLog]:
        raise NotImplementedError


class SqliteDatabase(Database):
    def __init__(self, data_dir: Path) -> None:
        self.db = data_dir / DB_NAME
        self.lease_dir = data_dir / f"{DB_NAME}-executors"

    def _query(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def state(self, execution_id: str) -> str | None:
        rows = self._query("SELECT state FROM executions WHERE execution_id = ?", execution_id)
        return str(rows[0][0]) if rows else None

    def child(self, parent: str) -> str | None:
        rows = self._query("SELECT execution_id FROM executions WHERE parent_id = ?", parent)
        return str(rows[0][0]) if rows else None

    def leases(self) -> set[str]:
        return {p.name for p in self.lease_dir.iterdir()} if self.lease_dir.exists() else set()

    def logs(self, ids: list[str]) -> dict[str, ExecutionLog]:
        return load_logs(self.db, ids)


class PostgresDatabase(Database):
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.server_args = ["--database-url", dsn]

    def _query(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        async def run() -> list[tuple[object, ...]]:
            storage = await PostgresStorage.open(self.dsn)
            try:
                return [tuple(r) for r in await storage._fetch(sql, *args)]
            finally:
                await storage.close()

        return asyncio.run(run())

    def state(self, execution_id: str) -> str | None:
        rows = self._query("SELECT state FROM executions WHERE execution_id = $1", execution_id)
        return str(rows[0][0]) if rows else None

    def child(self, parent: str) -> str | None:
        rows = self._query("SELECT execution_id FROM executions WHERE parent_id = $1", parent)
        return str(rows[0][0]) if rows else None

    def leases(self) -> set[str]:
        return {str(r[0]) for r in self._query("SELECT executor_id FROM executor_leases")}

    def logs(self, ids: list[str]) -> dict[str, ExecutionLog]:
        async def run() -> dict[str, ExecutionLog]:
            storage = await PostgresStorage.open(self.dsn)
            try:
                return {
                    eid: ExecutionLog(
                        eid, await storage.get_events(eid), await storage.get_responses(eid)
                    )
                    for eid in ids
                }
            finally:
                await storage.close()

        return asyncio.run(run())


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        yield SqliteDatabase(tmp_path / "data")
        return
    dsn = request.getfixturevalue("postgres_dsn")
    yield PostgresDatabase(schema_dsn(dsn, tmp_path))
    drop_schema(dsn, tmp_path)


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
    tmp_path: Path, servers: list[ServerProcess], database: Database
) -> None:
    deployment = DEPLOYMENT.write(tmp_path)
    data_dir = tmp_path / "data"
    db = database
    args = database.server_args

    first = ServerProcess(deployment, data_dir, tmp_path / "server-1.log", extra_args=args)
    servers.append(first)
    first.wait_ready()
    order, work = new_ids(2)
    submit(first.url, order, "testing:dead/workflows.order", ["o-1"])
    submit(first.url, work, "testing:dead/workflows.work", [1500])
    # The order waits in memory for its stub child; the work's child is running.
    wait_until(lambda: db.state(order) == "blocked_by_join_set", 30, "the order to block")
    wait_until(lambda: (c := db.child(work)) is not None and db.state(c) == "locked", 30, "spin")
    spin = db.child(work)
    approval = db.child(order)
    assert spin is not None and approval is not None
    dead_leases = db.leases()
    assert dead_leases  # one per executor of the first server
    first.kill()

    second = ServerProcess(deployment, data_dir, tmp_path / "server-2.log", extra_args=args)
    servers.append(second)
    second.wait_ready()
    stub(second.url, approval, {"ok": True})
    # Without the leases, both would wait an hour for the dead locks to expire.
    wait_until(lambda: db.state(order) == db.state(work) == "finished", 60, "both to finish", 0.05)
    wait_until(lambda: not dead_leases & db.leases(), 30, "dead leases forgotten")
    assert second.stop() == 0, second.output()
    assert not second.error_lines(), second.output()
    assert db.leases() == set()  # a clean stop removes its own

    logs = db.logs([order, work, spin, approval])
    assert logs[order].of_type(ev.Finished)[0].result == ev.ResultOk("approved")
    assert logs[work].of_type(ev.Finished)[0].result == ev.ResultOk(1500)
    # The workflows' dead runs lost their claims; the spin's dead lock timed out (a retry).
    assert [u.reason for u in logs[order].of_type(ev.Unlocked)] == ["executor died"]
    assert [u.reason for u in logs[work].of_type(ev.Unlocked)] == ["executor died"]
    assert len(logs[spin].of_type(ev.TemporarilyTimedOut)) == 1
    assert "released 3 execution(s) held by executors that died without stopping" in second.output()
