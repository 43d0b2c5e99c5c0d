"""Where a workflow step's CPU goes: per-thread CPU of the (a)/(b) workloads on one engine.

    .venv/bin/python -m bench.step_profile [--scenario many|serial|short] [--rounds 5]
        [--workflows 100] [--per-workflow 10] [--steps 1000] [--default-gc] [--json]
        [--calls [TOP]]

`short`: `--workflows` workflows that make no call, at once; its "steps" are workflows
(the cost of a workflow run itself: submit, lock, sandbox, result).

Starts an embedded engine on the `bench.workflow_throughput` deployment (fresh SQLite
data dir, WAL + synchronous=FULL; the server's collector thresholds unless `--default-gc`), warms it up with 20 workflows, then runs the scenario
`--rounds` times, reading every thread's user+sys CPU from `/proc/self/task/*/stat`
before and after (threads named through `threading.enumerate()`, grouped by name up to
the first digit). Reported: CPU per step of each group and of the whole process, steps/s;
"(ended)" is the CPU of threads that ended during the round (workflow runs' threads of
a pool that shrank), which `/proc` no longer lists.

`--calls [TOP]` counts Python-level function calls instead (a profile hook on every
thread; times are then meaningless): per step, by thread group, and the TOP functions
(default 40; generated methods, such as a dataclass's `__init__`, are named with their
class). The counts do not depend on the machine's load, so they compare trees
where the noisy CPU times cannot show a few percent.
For stacks, run it under `py-spy record --threads --idle -o profile.svg -- python -m …`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

from bench.procs import task_cpu
from bench.workflow_throughput import SERIAL, _ok, write_deployment


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user+sys) of each thread of this process, by native id (ns-precise
    where the kernel has `schedstat`: `bench.procs.task_cpu`)."""
    out: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        if (cpu := task_cpu(f"/proc/self/task/{tid}")) is not None:
            out[int(tid)] = cpu
    return out


def group_of(name: str) -> str:
    return re.split(r"[-_ ]?\d", name, maxsplit=1)[0] or name


def by_group(before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id}
    groups: dict[str, float] = {}
    for tid, cpu in after.items():
        group = group_of(names.get(tid, "(other)"))
        groups[group] = groups.get(group, 0.0) + cpu - before.get(tid, 0.0)
    return groups


class CallCounter:
    """A profile hook counting Python function calls by thread group and function."""

    def __init__(self) -> None:
        self.counting = False
        self.by_group: Counter[str] = Counter()
        self.by_function: Counter[tuple[str, str]] = Counter()

    def hook(self, frame: FrameType, event: str, _arg: object) -> None:
        if event != "call" or not self.counting:
            return
        group = group_of(threading.current_thread().name)
        code = frame.f_code
        where = f"{code.co_filename.rsplit('site-packages/', 1)[-1]}:{code.co_firstlineno}"
        name = code.co_qualname
        if code.co_filename == "<string>" and "self" in frame.f_locals:
            # Generated methods (dataclasses' __init__, __eq__...): name the class.
            name = f"{type(frame.f_locals['self']).__qualname__}.{code.co_name}"
        self.by_group[group] += 1
        self.by_function[(group, f"{where} {name}")] += 1


async def profile(
    args: argparse.Namespace, data_dir: Path, calls: CallCounter | None = None
) -> dict[str, Any]:
    from engine.engine import Engine

    deployment = write_deployment(data_dir)
    engine = await Engine.start(deployment, data_dir / "data", cpu_affinity=args.cpu_affinity)
    try:
        warm = await asyncio.gather(*(engine.submit(SERIAL, [3]) for _ in range(20)))
        for eid in warm:
            _ok(await engine.result(eid, 60), 3)
        rounds = []
        for _ in range(args.rounds):
            if args.scenario == "many":
                n, per = args.workflows, args.per_workflow
            elif args.scenario == "short":
                n, per = args.workflows, 0
            else:
                n, per = 1, args.steps
            cpu0, p0, t0 = thread_cpu(), time.process_time(), time.perf_counter()
            if calls is not None:
                calls.counting = True
            ids = await asyncio.gather(*(engine.submit(SERIAL, [per]) for _ in range(n)))
            for eid in ids:
                _ok(await engine.result(eid, 3600), per)
            if calls is not None:
                calls.counting = False
            elapsed = time.perf_counter() - t0
            process = time.process_time() - p0
            groups = by_group(cpu0, thread_cpu())
            if (ended := process - sum(groups.values())) > 0:
                groups["(ended)"] = ended
            # `short`: per workflow (it makes no call), the rest per step.
            steps = n * per or n
            rounds.append(
                {
                    "steps": steps,
                    "steps_per_s": round(steps / elapsed),
                    "cpu_ms_per_step": round(process / steps * 1000, 3),
                    "threads_ms_per_step": {
                        g: round(c / steps * 1000, 3)
                        for g, c in sorted(groups.items(), key=lambda kv: -kv[1])
                        if c > 0
                    },
                }
            )
        result: dict[str, Any] = {"scenario": args.scenario, "rounds": rounds}
        if calls is not None:
            steps = sum(r["steps"] for r in rounds)
            result["calls_per_step"] = {
                "total": round(sum(calls.by_group.values()) / steps, 1),
                "by_group": {g: round(c / steps, 1) for g, c in calls.by_group.most_common()},
                "top": [
                    [group, function, round(c / steps, 2)]
                    for (group, function), c in calls.by_function.most_common(args.calls)
                ],
            }
        return result
    finally:
        await engine.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=["many", "serial", "short"], default="many")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workflows", type=int, default=100)
    p.add_argument("--per-workflow", type=int, default=10)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--cpu-affinity", choices=["off", "split"], default="split")
    p.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's collector thresholds (default: the server's, engine.gc_tuning)",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--calls",
        type=int,
        nargs="?",
        const=40,
        default=None,
        metavar="TOP",
        help="count Python calls per step (by thread group, and the TOP functions)",
    )
    args = p.parse_args()
    if not args.default_gc:
        from engine.gc_tuning import tune_gc

        tune_gc()  # as `obelisk server run` does
    calls = CallCounter() if args.calls is not None else None
    if calls is not None:  # before the engine starts: its threads inherit the hook
        threading.setprofile(calls.hook)
        sys.setprofile(calls.hook)
    with tempfile.TemporaryDirectory(prefix="obelisk-stepprof-") as tmp:
        result = asyncio.run(profile(args, Path(tmp), calls))
    if calls is not None:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(result))
        return
    if (counted := result.get("calls_per_step")) is not None:
        groups = ", ".join(f"{g} {c}" for g, c in counted["by_group"].items())
        print(f"Python calls per step: {counted['total']}  ({groups})")
        for group, function, c in counted["top"]:
            print(f"{c:8.2f}  {group:<24} {function}")
        return
    for r in result["rounds"]:
        threads = ", ".join(f"{g} {c:.3f}" for g, c in r["threads_ms_per_step"].items())
        print(f"{r['steps_per_s']:>5} steps/s  {r['cpu_ms_per_step']:.3f} ms/step  ({threads})")


if __name__ == "__main__":
    main()
