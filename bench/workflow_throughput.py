"""Workflow benchmarks: JS workflows calling a trivial WASM activity on an embedded `Engine`.

    .venv/bin/python -m bench.workflow_throughput [--only serial,many,fanout,replay,interrupt]
        [--steps 1000] [--workflows 100] [--per-workflow 10] [--children 1000]
        [--interrupt-steps 10,50,100,200,500] [--cpu-affinity split|off] [--default-gc]
        [--repeat 1] [--data-dir DIR] [--json]

Every scenario gets a fresh data directory (SQLite WAL, synchronous=FULL) and a fresh
engine (`cpu_affinity="split"` unless `--cpu-affinity off`: `engine.affinity`; the
collector thresholds of `obelisk server run`, `engine.gc_tuning`, unless `--default-gc`)
with one deployment: the WAT activity `testing:fixtures/activity.add(a, b)` (from
`tests.fixtures.components`, cheap: the work is the engine's) and JS workflows

* `bench:wf/workflows.serial(n)` — `n` sequential direct calls `add(acc, 1)` → `n`;
* `bench:wf/workflows.fanout(n)` — `n` `addSubmit` into one join set, then `n`
  `addAwaitNext` in completion order → the sum;
* `bench:wf/workflows-interrupt.serial(n)` — `serial` with `blocking_strategy = "interrupt"`
  (every response replays the workflow from the start: quadratic).

Scenarios (each after a small warm-up workflow that is not measured):

* `serial` — one workflow, `--steps` sequential calls (`await`): steps/s.
* `many` — `--workflows` workflows × `--per-workflow` calls, submitted at once: steps/s.
* `many-shared` — `many` on an engine of two processes (`Engine.start(processes=2)`: a
  helper engine, each process with a SQLite shard of its own: `engine.storage.sharded`),
  each on a CPU of its own (not by default). Its storage stats are the first process's;
  its CPU is both processes' (every scenario's CPU is this process's and its children's).
* `fanout` — one workflow with `--children` children in one join set: end-to-end time.
* `replay` — a `--steps`-step workflow in a child process that is SIGKILLed once most of
  its steps are done; right after the kill a second process starts the engine (its
  watcher releases the dead process's locks at start) and waits for the result. Reported: engine start-up, restart → finished
  (start-up included and not), and the new run alone (its `locked` → `finished`).
* `interrupt` — `serial` with the interrupt strategy for each N of `--interrupt-steps`.

Times are wall-clock from the first submit to the last result; `storage.stats` gives the
logical transactions and physical (fsynced) commits of each scenario (group commit: many
logical transactions per commit).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import platform
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.procs import tree_cpu

ACTIVITY_IFC = "testing:fixtures/activity"
SERIAL = "bench:wf/workflows.serial"
FANOUT = "bench:wf/workflows.fanout"
SERIAL_INTERRUPT = "bench:wf/workflows-interrupt.serial"
#: `Engine.start(cpu_affinity=...)` of every engine of the run (`--cpu-affinity`).
CPU_AFFINITY: Any = "split"

SERIAL_JS = f"""
import {{ add }} from "{ACTIVITY_IFC}";
export default function serial(n) {{
  let acc = 0;
  for (let i = 0; i < n; i++) {{
    acc = Number(add(acc, 1));
  }}
  return acc;
}}
"""

FANOUT_JS = """
import { addSubmit, addAwaitNext } from "testing:fixtures-obelisk-ext/activity";
import * as obelisk from "obelisk:workflow@1.0.0";
export default function fanout(n) {
  const js = obelisk.createJoinSet();
  for (let i = 0; i < n; i++) {
    addSubmit(js, i, 1);
  }
  let acc = 0;
  for (let i = 0; i < n; i++) {
    acc += Number(addAwaitNext(js));
  }
  return acc;
}
"""


def write_deployment(directory: Path, *, lock_expiry_ms: int = 10_000) -> Path:
    from tests.fixtures.components import activity_component

    (directory / "serial.js").write_text(SERIAL_JS)
    (directory / "fanout.js").write_text(FANOUT_JS)
    workflow = f"""
params = [{{ name = "n", type = "u32" }}]
return_type = "result<u64, string>"
exec.lock_expiry.milliseconds = {lock_expiry_ms}
exec.max_inflight = 128
exec.batch_size = 32
"""
    deployment = directory / "deployment.toml"
    deployment.write_text(
        f"""
[[activity_wasm]]
name = "fixtures"
location = "{activity_component()}"
exec.lock_expiry.seconds = 10
exec.max_inflight = 64
exec.batch_size = 32

[[workflow_js]]
name = "serial"
location = "serial.js"
ffqn = "{SERIAL}"
blocking_strategy = "await"
{workflow}
[[workflow_js]]
name = "fanout"
location = "fanout.js"
ffqn = "{FANOUT}"
blocking_strategy = "await"
{workflow}
[[workflow_js]]
name = "serial-interrupt"
location = "serial.js"
ffqn = "{SERIAL_INTERRUPT}"
blocking_strategy = "interrupt"
{workflow}
"""
    )
    return deployment


# ---------------------------------------------------------------------------------------
# In-process scenarios
# ---------------------------------------------------------------------------------------


def _ok(result: Any, expected: Any) -> None:
    from engine.core.events import ResultOk

    if result != ResultOk(expected):
        raise SystemExit(f"unexpected result {result!r}, wanted ok({expected!r})")


async def _measured(
    data_dir: Path,
    body: Callable[[Any], Awaitable[dict[str, Any]]],
    *,
    processes: int = 1,
    warm_up: int = 1,
) -> dict[str, Any]:
    """Start an engine on a fresh data dir, warm up, run `body`, add storage stats.
    `warm_up` serial workflows at once (several: every process of the engine gets some)."""
    from engine.engine import Engine

    deployment = write_deployment(data_dir)
    t_start = time.perf_counter()
    engine = await Engine.start(
        deployment, data_dir / "data", cpu_affinity=CPU_AFFINITY, processes=processes
    )
    startup = time.perf_counter() - t_start
    try:
        # Warm-up (not measured): first instantiations, first commits.
        warm = await asyncio.gather(*(engine.submit(SERIAL, [3]) for _ in range(warm_up)))
        warm.append(await engine.submit(FANOUT, [3]))
        for eid, expected in zip(warm, [3] * warm_up + [6], strict=True):
            _ok(await engine.result(eid, 60), expected)
        stats: dict[str, int] = engine.own_storage.stats  # type: ignore[attr-defined]  # (SQLite's)
        before = dict(stats)
        cpu0 = tree_cpu()
        result = await body(engine)
        cpu = tree_cpu() - cpu0
        delta = {k: stats[k] - before[k] for k in stats}
        elapsed = result["elapsed_s"]
        result.update(
            engine_start_s=round(startup, 3),
            cpu_s=round(cpu, 3),
            logical_tx=delta["logical"],
            commits=delta["commits"],
            appended_events=delta["events"],
            logical_tx_per_s=round(delta["logical"] / elapsed),
            commits_per_s=round(delta["commits"] / elapsed),
            logical_tx_per_commit=round(delta["logical"] / max(1, delta["commits"]), 1),
        )
        return result
    finally:
        await engine.stop()


async def serial(engine: Any, steps: int, ffqn: str = SERIAL) -> dict[str, Any]:
    t0 = time.perf_counter()
    eid = await engine.submit(ffqn, [steps])
    result = await engine.result(eid, 3600)
    elapsed = time.perf_counter() - t0
    _ok(result, steps)
    return {
        "steps": steps,
        "elapsed_s": round(elapsed, 3),
        "steps_per_s": round(steps / elapsed),
        "runs": await _runs(engine, eid),
    }


async def many(engine: Any, workflows: int, per_workflow: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    ids = await asyncio.gather(*(engine.submit(SERIAL, [per_workflow]) for _ in range(workflows)))
    results = await asyncio.gather(*(engine.result(eid, 3600) for eid in ids))
    elapsed = time.perf_counter() - t0
    for result in results:
        _ok(result, per_workflow)
    steps = workflows * per_workflow
    return {
        "workflows": workflows,
        "per_workflow": per_workflow,
        "steps": steps,
        "elapsed_s": round(elapsed, 3),
        "steps_per_s": round(steps / elapsed),
    }


async def many_shared(data_dir: Path, workflows: int, per_workflow: int) -> dict[str, Any]:
    """`many` on an engine of two processes (`Engine.start(processes=2)`: a helper engine
    on a SQLite shard of its own), each on a CPU of its own."""
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("many-shared needs two CPUs")
    global CPU_AFFINITY
    saved, CPU_AFFINITY = CPU_AFFINITY, "split"  # one CPU per process
    try:
        return await _measured(
            data_dir, lambda e: many(e, workflows, per_workflow), processes=2, warm_up=20
        )
    finally:
        CPU_AFFINITY = saved


async def fanout(engine: Any, children: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    eid = await engine.submit(FANOUT, [children])
    result = await engine.result(eid, 3600)
    elapsed = time.perf_counter() - t0
    _ok(result, sum(i + 1 for i in range(children)))
    return {
        "children": children,
        "elapsed_s": round(elapsed, 3),
        "children_per_s": round(children / elapsed),
        "runs": await _runs(engine, eid),
    }


async def _runs(engine: Any, execution_id: str) -> int:
    """Runs of an execution (distinct run ids in its `locked` events)."""
    from engine.core import events as ev

    events = await engine.storage.get_events(execution_id)
    return len({e.event.run_id for e in events if isinstance(e.event, ev.Locked)})


async def interrupt_curve(data_dir: Path, sizes: list[int]) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        sub = data_dir / f"interrupt-{n}"
        sub.mkdir()

        def body(e: Any, n: int = n) -> Awaitable[dict[str, Any]]:
            return serial(e, n, SERIAL_INTERRUPT)

        out.append(await _measured(sub, body))
    return out


# ---------------------------------------------------------------------------------------
# Replay after SIGKILL (child processes)
# ---------------------------------------------------------------------------------------


async def _child_first(data_dir: Path, steps: int) -> None:
    """Child process 1: start, submit, report the id; the parent kills us."""
    from engine.engine import Engine

    engine = await Engine.start(
        data_dir / "deployment.toml", data_dir / "data", cpu_affinity=CPU_AFFINITY
    )
    eid = await engine.submit(SERIAL, [steps])
    print(json.dumps({"execution_id": eid}), flush=True)
    await asyncio.sleep(3600)


async def _child_restart(data_dir: Path, execution_id: str) -> None:
    """Child process 2: start the engine on the same data dir, wait for the result."""
    from engine.core import events as ev
    from engine.engine import Engine

    t0 = time.perf_counter()
    engine = await Engine.start(
        data_dir / "deployment.toml", data_dir / "data", cpu_affinity=CPU_AFFINITY
    )
    t_started = time.perf_counter()
    result = await engine.result(execution_id, 600)
    t_done = time.perf_counter()
    events = await engine.storage.get_events(execution_id)
    await engine.stop()
    assert isinstance(result, ev.ResultOk), result
    locks = [e for e in events if isinstance(e.event, ev.Locked)]
    last_run = locks[-1].event.run_id  # type: ignore[union-attr]
    first_of_run = next(e for e in locks if e.event.run_id == last_run)  # type: ignore[union-attr]
    finished = events[-1]
    join_nexts = [
        e.version
        for e in events
        if isinstance(e.event, ev.HistoryEvent) and isinstance(e.event.event, ev.JoinNext)
    ]
    replayed = sum(1 for v in join_nexts if v < first_of_run.version)
    print(
        json.dumps(
            {
                "result": result.value,
                "engine_start_s": round(t_started - t0, 3),
                "restart_to_finished_s": round(t_done - t0, 3),
                "started_to_finished_s": round(t_done - t_started, 3),
                "new_run_s": round(
                    (finished.created_at - first_of_run.created_at).total_seconds(), 3
                ),
                "events": len(events),
                "replayed_steps": replayed,
                "new_steps": len(join_nexts) - replayed,
            }
        ),
        flush=True,
    )


def _finished_children(db: Path, execution_id: str) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        (n,) = conn.execute(
            "SELECT count(*) FROM executions WHERE parent_id = ? AND state = 'finished'",
            (execution_id,),
        ).fetchone()
        return int(n)
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def replay(data_dir: Path, steps: int, kill_at: int, lock_expiry_ms: int) -> dict[str, Any]:
    write_deployment(data_dir, lock_expiry_ms=lock_expiry_ms)
    db = data_dir / "data" / "obelisk.sqlite"
    cmd = [sys.executable, "-m", "bench.workflow_throughput", "--data-dir", str(data_dir)]
    cmd += ["--cpu-affinity", CPU_AFFINITY]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cwd = Path(__file__).resolve().parents[1]
    first = subprocess.Popen(
        [*cmd, "--_child-first", str(steps)], stdout=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    try:
        assert first.stdout is not None
        execution_id = json.loads(first.stdout.readline())["execution_id"]
        deadline = time.monotonic() + 600
        while (done := _finished_children(db, execution_id)) < kill_at:
            if first.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the first process stopped early ({done} steps done)")
            time.sleep(0.005)
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    done_at_kill = _finished_children(db, execution_id)
    # At once: the new process's watcher finds the dead executors' leases at start and
    # releases what they held (the workflow's run, the child activity it was running),
    # without waiting for their locks to expire (`engine.storage.leases`).
    second = subprocess.run(
        [*cmd, "--_child-restart", execution_id],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        check=True,
    )
    outcome = json.loads(second.stdout.strip().splitlines()[-1])
    if outcome["result"] != steps:
        raise SystemExit(f"replayed workflow returned {outcome['result']}, wanted {steps}")
    return {"steps": steps, "steps_done_at_kill": done_at_kill, **outcome}


# ---------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    from importlib.metadata import version

    import wasmtime  # noqa: F401

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
        ram = f"{mem_kb / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        ram = "?"
    return {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram": ram,
        "python": platform.python_version(),
        "wasmtime": version("wasmtime"),
        "quickjs_rs": version("quickjs-rs"),
        "sqlite": sqlite3.sqlite_version,
    }


def _line(name: str, r: dict[str, Any], main: str) -> str:
    return (
        f"{name:<34} {main:<28} commits {r['commits']:>6} ({r['commits_per_s']:>5}/s), "
        f"logical tx {r['logical_tx']:>6} ({r['logical_tx_per_s']:>5}/s, "
        f"{r['logical_tx_per_commit']} per commit), CPU {r['cpu_s']} s"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="serial,many,fanout,replay,interrupt")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--workflows", type=int, default=100)
    p.add_argument("--per-workflow", type=int, default=10)
    p.add_argument("--children", type=int, default=1000)
    p.add_argument("--interrupt-steps", default="10,50,100,200,500")
    p.add_argument(
        "--kill-at",
        type=float,
        default=0.95,
        help="replay: SIGKILL once this fraction of the steps is done (0.95)",
    )
    p.add_argument(
        "--replay-lock-expiry-ms",
        type=int,
        default=10_000,
        help="replay: the workflow's exec.lock_expiry (10000; not waited for)",
    )
    p.add_argument(
        "--cpu-affinity",
        choices=["off", "split"],
        default="split",
        help="the engines' thread placement (engine.affinity; default split)",
    )
    p.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's collector thresholds (default: the server's, engine.gc_tuning)",
    )
    p.add_argument("--repeat", type=int, default=1, help="run each scenario this many times")
    p.add_argument("--data-dir", type=Path, help="parent of the data dirs (default: temp)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--_child-first", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_child-restart", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    global CPU_AFFINITY
    CPU_AFFINITY = args.cpu_affinity
    if not args.default_gc:
        from engine.gc_tuning import tune_gc

        tune_gc()  # as `obelisk server run` and a helper process do

    if args._child_first is not None:
        asyncio.run(_child_first(args.data_dir, args._child_first))
        return 0
    if args._child_restart is not None:
        asyncio.run(_child_restart(args.data_dir, args._child_restart))
        return 0

    only = set(args.only.split(","))
    results: dict[str, Any] = {
        "machine": {
            **machine(),
            "cpu_affinity": CPU_AFFINITY,
            "gc_thresholds": list(gc.get_threshold()),
        }
    }
    if not args.json:
        print(json.dumps(results["machine"]))
    for _ in range(args.repeat):
        tmp = Path(tempfile.mkdtemp(prefix="obelisk-wfbench-", dir=args.data_dir))
        try:

            def sub(name: str, tmp: Path = tmp) -> Path:
                d = tmp / name
                d.mkdir()
                return d

            def record(name: str, r: Any, text: str) -> None:
                results.setdefault(name, []).append(r)
                if not args.json:
                    print(text, flush=True)

            if "serial" in only:
                r = asyncio.run(_measured(sub("serial"), lambda e: serial(e, args.steps)))
                record(
                    "serial",
                    r,
                    _line(
                        f"(a) 1 x {args.steps} sequential (await)",
                        r,
                        f"{r['elapsed_s']:.3f} s {r['steps_per_s']:>6} steps/s",
                    ),
                )
            if "many" in only:
                r = asyncio.run(
                    _measured(sub("many"), lambda e: many(e, args.workflows, args.per_workflow))
                )
                record(
                    "many",
                    r,
                    _line(
                        f"(b) {args.workflows} x {args.per_workflow} at once (await)",
                        r,
                        f"{r['elapsed_s']:.3f} s {r['steps_per_s']:>6} steps/s",
                    ),
                )
            if "many-shared" in only:
                r = asyncio.run(many_shared(sub("many-shared"), args.workflows, args.per_workflow))
                record(
                    "many-shared",
                    r,
                    _line(
                        f"(b2) {args.workflows} x {args.per_workflow}, 2 processes",
                        r,
                        f"{r['elapsed_s']:.3f} s {r['steps_per_s']:>6} steps/s",
                    ),
                )
            if "fanout" in only:
                r = asyncio.run(_measured(sub("fanout"), lambda e: fanout(e, args.children)))
                record(
                    "fanout",
                    r,
                    _line(
                        f"(c) fan-out {args.children} children",
                        r,
                        f"{r['elapsed_s']:.3f} s end to end",
                    ),
                )
            if "replay" in only:
                kill_at = max(1, int(args.steps * args.kill_at))
                r = replay(sub("replay"), args.steps, kill_at, args.replay_lock_expiry_ms)
                results.setdefault("replay", []).append(r)
                if not args.json:
                    print(
                        f"(d) replay {args.steps} steps, killed at {r['steps_done_at_kill']}: "
                        f"restart -> finished {r['restart_to_finished_s']:.3f} s = engine "
                        f"start {r['engine_start_s']:.3f} s + {r['started_to_finished_s']:.3f} s; "
                        f"the new run alone (locked -> finished: {r['replayed_steps']} steps "
                        f"replayed, {r['new_steps']} new) {r['new_run_s']:.3f} s",
                        flush=True,
                    )
            if "interrupt" in only:
                sizes = [int(n) for n in args.interrupt_steps.split(",")]
                for r in asyncio.run(interrupt_curve(sub("interrupt"), sizes)):
                    record(
                        "interrupt",
                        r,
                        _line(
                            f"(e) interrupt, {r['steps']} sequential",
                            r,
                            f"{r['elapsed_s']:.3f} s {r['steps_per_s']:>6} steps/s",
                        ),
                    )
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
