"""Three `obelisk server run` processes, each in its own network namespace (a host of its
own, reaching PostgreSQL over a veth pair), share one PostgreSQL database. A mixed
workload of JS activities and JS workflows (`await` and `interrupt`, children in join
sets) is submitted to all three; one process is SIGKILLed while it holds locks. Then:
every execution finished exactly once with the right result, every log is a legal
sequence (`replay_stored`, children included), and the survivors took over the dead
process's executions (released through its dead executor leases, or at the latest
when its locks expired).

Without network namespaces (not root, no `ip`), the servers are plain processes on
loopback; the test says so in its output.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from engine.core import events as ev
from engine.storage.contract import ListFilter
from engine.storage.postgres import PostgresStorage
from tests.fixtures.deployments import Deployment, ms
from tests.pg_cluster import Cluster, ClusterUnavailable, create_cluster, postgres_required
from tests.reliability.conftest import (
    ExecutionLog,
    ServerProcess,
    Submission,
    new_ids,
    submit_all,
    wait_until,
)
from tests.reliability.test_workflow_crash_recovery import (
    STEP,
    STEP_EXT_IFC,
    STEP_IFC,
    STEP_JS,
    check_tree,
    parallel_js,
    serial_js,
)

pytestmark = pytest.mark.slow

HOSTS = 3
PARALLEL = "testing:multi/workflows.parallel"
SERIAL = "testing:multi/workflows-interrupt.serial"


def write_deployment(directory: Path) -> Path:
    workflow_exec = {"lock_expiry": ms(2000), "tick_sleep": ms(100)}
    return (
        Deployment()
        .activity_js(
            "step",
            STEP_JS,
            ffqn=STEP,
            params=[("idx", "u32"), ("sleep-millis", "u32")],
            return_type="result<u32, string>",
            max_retries=1000,  # retries are for the SIGKILL, never let them run out
            retry_exp_backoff=ms(10),
            exec={
                "lock_expiry": ms(1500),
                "tick_sleep": ms(100),
                "max_inflight": 4,
                "batch_size": 4,
            },
        )
        .workflow_js(
            "parallel",
            parallel_js(STEP_EXT_IFC),
            ffqn=PARALLEL,
            params=[("base", "u32"), ("n", "u32")],
            return_type="result<u32, string>",
            blocking_strategy="await",
            exec=workflow_exec,
        )
        .workflow_js(
            "serial",
            serial_js(STEP_IFC),
            ffqn=SERIAL,
            params=[("base", "u32"), ("n", "u32")],
            return_type="result<u32, string>",
            blocking_strategy="interrupt",
            exec=workflow_exec,
        )
        .write(directory)
    )


# ---------------------------------------------------------------------------------------
# Hosts: network namespaces with a veth pair each
# ---------------------------------------------------------------------------------------


@dataclass
class Host:
    name: str
    prefix: list[str]  # runs a command on this host
    address: str  # the host's own address (its API listens there)
    db_address: str  # PostgreSQL as this host reaches it


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def hosts(n: int) -> Iterator[tuple[list[Host], str]]:
    """`n` hosts, and a note on what they are. Each namespace gets a veth pair on a
    /30 of its own (10.231.<pid % 200>.<4k>…): its side .2, the default side .1."""
    tag = f"{os.getpid() % 10000}"
    subnet = 10 + os.getpid() % 200
    made: list[str] = []
    try:
        found: list[Host] = []
        for k in range(n):
            ns = f"obk{tag}h{k}"
            outer, inner = f"obk{tag}o{k}", f"obk{tag}i{k}"
            base = 4 * k
            host_ip, ns_ip = f"10.231.{subnet}.{base + 1}", f"10.231.{subnet}.{base + 2}"
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("addr", "add", f"{host_ip}/30", "dev", outer)
            _ip("link", "set", outer, "up")
            _ip("-n", ns, "addr", "add", f"{ns_ip}/30", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            found.append(Host(ns, ["ip", "netns", "exec", ns], ns_ip, host_ip))
        yield found, f"{n} network namespaces (veth pairs on 10.231.{subnet}.0/24)"
    except (OSError, subprocess.CalledProcessError) as e:
        if made:
            for ns in made:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            made.clear()
        reason = e.stderr.strip() if isinstance(e, subprocess.CalledProcessError) else str(e)
        plain = [Host(f"process-{k}", [], "127.0.0.1", "127.0.0.1") for k in range(n)]
        yield (
            plain,
            (f"plain processes on loopback: network namespaces could not be made ({reason})"),
        )
    finally:
        for ns in made:  # deleting a namespace deletes its veth pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


# ---------------------------------------------------------------------------------------
# The database, observed from the test
# ---------------------------------------------------------------------------------------


async def _states(dsn: str) -> dict[str, int]:
    conn = await asyncpg.connect(dsn)
    try:
        return {
            r[0]: int(r[1])
            for r in await conn.fetch("SELECT state, count(*) FROM executions GROUP BY state")
        }
    except asyncpg.UndefinedTableError:
        return {}
    finally:
        await conn.close()


def states(dsn: str) -> dict[str, int]:
    return asyncio.run(_states(dsn))


async def _locks_held(dsn: str, executor_ids: set[str]) -> int:
    """Executions whose current lock (or blocked run) belongs to `executor_ids`."""
    storage = await PostgresStorage.open(dsn)
    try:
        rows = await storage.list_executions(
            ListFilter(states=["locked", "blocked_by_join_set"], limit=10000)
        )
        held = 0
        for row in rows:
            s = await storage.get_summary(row.execution_id)
            u = s.underlying
            exr = getattr(u, "executor_id", None) or getattr(
                getattr(u, "blocked_run", None), "executor_id", None
            )
            held += exr in executor_ids
        return held
    finally:
        await storage.close()


async def _load(dsn: str) -> dict[str, ExecutionLog]:
    storage = await PostgresStorage.open(dsn)
    try:
        ids = [r.execution_id for r in await storage.list_executions(ListFilter(limit=100000))]
        logs = {}
        for eid in ids:
            logs[eid] = ExecutionLog(
                eid, await storage.get_events(eid), await storage.get_responses(eid)
            )
        return logs
    finally:
        await storage.close()


def executor_ids(server: ServerProcess) -> set[str]:
    return set(re.findall(r"executor \S+ started: (Exr_\w+)", server.output()))


# ---------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------


def test_three_hosts_share_postgres_and_survive_a_sigkill(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    rng = random.Random(int(os.environ.get("RELIABILITY_SEED") or random.randrange(2**32)))
    deployment = write_deployment(tmp_path)
    with hosts(HOSTS) as (machines, note):
        print(f"\nmulti-host test: {note}", flush=True)
        addresses = sorted({"127.0.0.1", *(h.db_address for h in machines)})
        try:
            cluster: Cluster = create_cluster(addresses=addresses)
        except ClusterUnavailable as e:
            if postgres_required():
                pytest.fail(f"PostgreSQL cannot be started: {e}", pytrace=False)
            pytest.skip(f"PostgreSQL cannot be started: {e}")
        try:
            run(tmp_path, deployment, machines, cluster, servers, rng)
        finally:
            for server in servers:
                if server.alive:
                    server.kill()
            cluster.remove()


def run(
    tmp_path: Path,
    deployment: Path,
    machines: list[Host],
    cluster: Cluster,
    servers: list[ServerProcess],
    rng: random.Random,
) -> None:
    t0 = time.monotonic()
    admin = cluster.dsn()
    for k, host in enumerate(machines):
        server = ServerProcess(
            deployment,
            tmp_path / f"data-{k}",  # each host its own data dir: nothing shared but the DB
            tmp_path / f"server-{k}.log",
            extra_args=["--database-url", cluster.dsn(host=host.db_address)],
            prefix=host.prefix,
            host=host.address,
        )
        servers.append(server)
    for server in servers:
        server.wait_ready(60)
    for server in servers:
        assert "Database: postgresql://postgres@" in server.output()
    t_ready = time.monotonic()

    # 40 parallel workflows (4 children each), 20 serial `interrupt` workflows (3 steps),
    # 80 plain activities: 40*5 + 20*4 + 80 = 360 executions.
    plan = [(PARALLEL, 4)] * 40 + [(SERIAL, 3)] * 20 + [(STEP, 0)] * 80
    rng.shuffle(plan)
    subs: list[Submission] = []
    for i, (eid, (ffqn, n)) in enumerate(zip(new_ids(len(plan)), plan, strict=True)):
        base = 1000 * i
        if ffqn == STEP:
            subs.append(Submission(eid, ffqn, [base, 5], base))
        else:
            subs.append(Submission(eid, ffqn, [base, n], sum(base + j for j in range(n))))
    total = sum(1 if s.ffqn == STEP else 1 + s.params[1] for s in subs)
    targets = [(servers[i % len(servers)].url, s) for i, s in enumerate(subs)]
    outcome = submit_all(targets, threads=6)
    assert outcome.acknowledged == {s.execution_id for s in subs}, outcome.failed

    # SIGKILL the first host while it holds locks, a quarter of the way through.
    victim = servers[0]
    victim_executors = executor_ids(victim)
    assert len(victim_executors) == 3, victim.output()
    wait_until(
        lambda: (
            states(admin).get("finished", 0) >= total // 4
            and asyncio.run(_locks_held(admin, victim_executors)) > 0
        ),
        60,
        "a quarter finished, with the victim holding locks",
        0.05,
    )
    held = asyncio.run(_locks_held(admin, victim_executors))
    at_kill = states(admin)
    victim.kill()
    t_kill = time.monotonic()
    print(f"[{t_kill - t0:5.1f} s] SIGKILL {machines[0].name}: {at_kill}, {held} held by it")

    wait_until(
        lambda: states(admin).get("finished", 0) >= total, 120, "every execution to finish", 0.1
    )
    t_done = time.monotonic()
    for server in servers[1:]:
        assert server.stop() == 0, server.output()
    errors = [line for s in servers[1:] for line in s.error_lines()]
    assert not errors, "\n".join(errors[:20])

    logs = asyncio.run(_load(admin))
    assert len(logs) == total
    seen: set[str] = set()
    for sub in subs:
        check_tree(logs, sub.execution_id, sub.expected, seen)
    assert seen == set(logs)

    # Handed over: locked by the victim, then (after a lock expiry) finished by another.
    handed_over = 0
    for log in logs.values():
        locks = [e.event for e in log.events if isinstance(e.event, ev.Locked)]
        victim_locked = any(lk.executor_id in victim_executors for lk in locks)
        if victim_locked and locks[-1].executor_id not in victim_executors:
            handed_over += 1
    assert handed_over >= 1, "no execution of the killed process was taken over"
    survivors = set().union(*(executor_ids(s) for s in servers[1:]))
    finishers = {
        [e.event for e in log.events if isinstance(e.event, ev.Locked)][-1].executor_id
        for log in logs.values()
        if any(isinstance(e.event, ev.Locked) for e in log.events)
    }
    assert finishers & survivors, "the survivors finished nothing"
    print(
        f"multi-host: {len(subs)} submitted, {total} executions on {len(machines)} hosts "
        f"({machines[0].name} killed holding {held} locks); {handed_over} taken over by the "
        f"survivors. Seconds: start {t_ready - t0:.1f}, to kill {t_kill - t_ready:.1f}, "
        f"kill to all finished {t_done - t_kill:.1f}"
    )
