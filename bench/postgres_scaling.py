"""PostgreSQL: throughput with 1, 2 and 3 `obelisk server run` processes on one database.

    .venv/bin/python -m bench.postgres_scaling [--servers 1,2,3] [--only activity,parallel]
        [--activities 4000] [--workflows 200] [--children 10] [--repeat 1]
        [--database-url URL] [--json]

Without `--database-url` a throw-away cluster is started (`tests/pg_cluster.py`, durable:
fsync and synchronous_commit on, as in production) and removed at the end. Every run gets
a fresh schema and N fresh server processes (each its own data dir); the bench process
submits the whole workload through an engine that runs no executors, with `scheduled_at`
a moment after the last submit, so that the servers start on a full backlog at the same
instant. The clock runs from that instant until every execution is `finished` (a count
query every 50 ms). Workloads (the WAT activity `testing:fixtures/activity.add` of
`bench.workflow_throughput`: cheap, the work is the engine's):

* `activity` — `--activities` executions of the activity: executions/s.
* `parallel` — `--workflows` JS workflows `fanout(--children)` (children submitted into
  one join set, awaited in completion order): executions/s (workflows and children) and
  steps/s (children).

Also reported: CPU seconds of the server processes and of PostgreSQL (the postmaster and
its backends) during the run, logical transactions per commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.workflow_throughput import FANOUT, machine, write_deployment

ACTIVITY = "testing:fixtures/activity.add"
OBELISK = Path(sys.executable).parent / "obelisk"
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float:
    """utime + stime (+ of reaped children) of a process, in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / TICKS


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def postgres_cpu(postmaster: int | None) -> float:
    if postmaster is None:
        return 0.0
    return _cpu_of(postmaster) + sum(_cpu_of(p) for p in _children(postmaster))


class Server:
    def __init__(self, deployment: Path, data_dir: Path, url: str, log: Path) -> None:
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [
                str(OBELISK),
                "server",
                "run",
                "--deployment",
                str(deployment),
                "--data-dir",
                str(data_dir),
                "--database-url",
                url,
                "--api-listen",
                "127.0.0.1:0",
                "--allow-unauthenticated-api",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)
            if "API listening on" in line:
                self.ready.set()
        self.ready.set()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


async def _finished(conn: Any) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM executions WHERE state = 'finished'"))


async def one_run(
    base_url: str,
    schema: str,
    servers: int,
    workload: str,
    args: argparse.Namespace,
    tmp: Path,
    postmaster: int | None,
) -> dict[str, Any]:
    import asyncpg

    from engine.engine import Engine
    from engine.storage.postgres import parse_dsn

    url = base_url + ("&" if "?" in base_url else "?") + f"schema={schema}"
    deployment = write_deployment(tmp)
    procs = [
        Server(deployment, tmp / f"data-{k}", url, tmp / f"server-{k}.log") for k in range(servers)
    ]
    try:
        for p in procs:
            if not p.ready.wait(120) or p.proc.poll() is not None:
                raise RuntimeError(f"server did not start: see {p.log.name}")
        client = await Engine.start(
            deployment,
            tmp / "client",
            database_url=url,
            run_executors=False,
            run_watcher=False,
            watch=False,
        )
        try:
            # Due a moment after the last submit (submitting runs at ~1,000/s here).
            count = args.activities if workload == "activity" else args.workflows
            due = client.clock.now() + timedelta(seconds=3 + count / 500)
            if workload == "activity":
                total = args.activities
                steps = total
                for start in range(0, total, 500):
                    await asyncio.gather(
                        *(
                            client.submit(ACTIVITY, [i, 1], scheduled_at=due)
                            for i in range(start, min(total, start + 500))
                        )
                    )
            else:
                steps = args.workflows * args.children
                total = args.workflows + steps
                await asyncio.gather(
                    *(
                        client.submit(FANOUT, [args.children], scheduled_at=due)
                        for _ in range(args.workflows)
                    )
                )
            if client.clock.now() >= due:
                raise RuntimeError("submitting took longer than planned: the backlog was not full")
        finally:
            await client.stop()
        target = parse_dsn(url)
        conn = await asyncpg.connect(target.dsn, server_settings={"search_path": schema})
        try:
            # Everything is due at one instant: the servers start on a full backlog together.
            await asyncio.sleep(max(0.0, (due - client.clock.now()).total_seconds()))
            cpu0 = [_cpu_of(p.proc.pid) for p in procs]
            pg0 = postgres_cpu(postmaster)
            t0 = time.perf_counter()
            while await _finished(conn) < total:
                await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - t0
            cpu = sum(_cpu_of(p.proc.pid) - c for p, c in zip(procs, cpu0, strict=True))
            pg = postgres_cpu(postmaster) - pg0
            commits = await conn.fetchval(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
        finally:
            await conn.close()
    finally:
        for p in procs:
            p.stop()
    return {
        "workload": workload,
        "servers": servers,
        "executions": total,
        "steps": steps,
        "seconds": round(elapsed, 3),
        "executions_per_s": round(total / elapsed, 1),
        "steps_per_s": round(steps / elapsed, 1),
        "server_cpu_s": round(cpu, 2),
        "postgres_cpu_s": round(pg, 2),
        "db_commits_total": commits,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--servers", default="1,2,3")
    p.add_argument("--only", default="activity,parallel")
    p.add_argument("--activities", type=int, default=4000)
    p.add_argument("--workflows", type=int, default=200)
    p.add_argument("--children", type=int, default=10)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--database-url")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    cluster = None
    postmaster: int | None = None
    if args.database_url:
        base = args.database_url
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.pg_cluster import create_cluster

        cluster = create_cluster(durable=True)
        base = cluster.dsn()
        postmaster = int((cluster.data_dir / "postmaster.pid").read_text().split()[0])
    results: list[dict[str, Any]] = []
    try:
        for _ in range(args.repeat):
            for workload in args.only.split(","):
                for n in (int(x) for x in args.servers.split(",")):
                    with tempfile.TemporaryDirectory(prefix="obelisk-bench-") as d:
                        schema = f"bench_{workload}_{n}_{os.getpid()}_{len(results)}"
                        r = asyncio.run(
                            one_run(base, schema, n, workload, args, Path(d), postmaster)
                        )
                    results.append(r)
                    if not args.json:
                        print(
                            f"{workload:9} {n} server(s): {r['executions']} executions in "
                            f"{r['seconds']:.2f} s = {r['executions_per_s']:.0f} exec/s, "
                            f"{r['steps_per_s']:.0f} steps/s; CPU s: servers "
                            f"{r['server_cpu_s']}, PostgreSQL {r['postgres_cpu_s']}",
                            flush=True,
                        )
    finally:
        if cluster is not None:
            cluster.remove()
    if args.json:
        print(json.dumps({"machine": machine(), "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
