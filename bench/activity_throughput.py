"""Throughput: N executions of a trivial WASM activity through an embedded `Engine`.

    .venv/bin/python -m bench.activity_throughput [--count 10000] [--batch-size 500]
        [--max-inflight 64] [--exec-batch-size 64] [--default-gc] [--cpus LIST]
        [--cpu-affinity split|off] [--data-dir DIR] [--json]

A fresh temporary data directory (SQLite WAL, synchronous=FULL) and a deployment with the
`testing:fixtures/activity` component (built from WAT by `tests.fixtures.components`). The
client side calls the engine facade directly, as an embedding application would: `submit`
in batches of `--batch-size` concurrent calls (`asyncio.gather`), and for every submitted
execution a task that awaits `Engine.result` (a notification, not polling). The clock runs
from the first submit to the last result.

The process uses the garbage-collector thresholds and the thread placement of `obelisk
server run` (`engine.gc_tuning`, `engine.affinity`) unless `--default-gc` or
`--cpu-affinity off` is given.

Reported: executions/s end to end, the submit rate, and from `storage.stats` the events,
logical transactions and physical commits per second (group commit: many logical
transactions per fsync).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FFQN = "testing:fixtures/activity.add"


def write_deployment(directory: Path, *, max_inflight: int, exec_batch_size: int) -> Path:
    from tests.fixtures.components import activity_component

    deployment = directory / "deployment.toml"
    deployment.write_text(
        "[[activity_wasm]]\n"
        'name = "fixtures"\n'
        f'location = "{activity_component()}"\n'
        "max_retries = 0\n"
        f"exec.max_inflight = {max_inflight}\n"
        f"exec.batch_size = {exec_batch_size}\n"
        "exec.lock_expiry.seconds = 30\n"
    )
    return deployment


async def run(
    count: int,
    batch_size: int,
    max_inflight: int,
    exec_batch_size: int,
    data_dir: Path,
    cpu_affinity: Any = "split",
) -> dict[str, Any]:
    from engine.engine import Engine

    deployment = write_deployment(
        data_dir, max_inflight=max_inflight, exec_batch_size=exec_batch_size
    )
    engine = await Engine.start(deployment, data_dir / "data", cpu_affinity=cpu_affinity)
    try:
        # Warm-up (not measured): the first instantiation, the first commit.
        warm = await engine.submit(FFQN, [1, 2])
        assert (await engine.result(warm, 30)).value == 3  # type: ignore[union-attr]
        stats = engine.storage.stats  # type: ignore[attr-defined]
        before = dict(stats)
        before["rows"] = await _count_events(engine)

        waiters: list[asyncio.Task[Any]] = []
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for start in range(0, count, batch_size):
            n = min(batch_size, count - start)
            ids = await asyncio.gather(*(engine.submit(FFQN, [start + i, 1]) for i in range(n)))
            waiters.extend(asyncio.create_task(engine.result(eid)) for eid in ids)
        t_submitted = time.perf_counter()
        results = await asyncio.gather(*waiters)
        t_done = time.perf_counter()
        cpu = time.process_time() - cpu0

        from engine.core.events import ResultOk

        bad = [r for r in results if not isinstance(r, ResultOk)]
        if bad:
            raise SystemExit(f"{len(bad)} executions did not succeed, e.g. {bad[0]!r}")
        # Every result is ok(i + 1): check a few.
        for i in (0, count // 2, count - 1):
            assert results[i].value == i + 1, (i, results[i])

        after = dict(stats)
        after["rows"] = await _count_events(engine)
        elapsed = t_done - t0
        delta = {k: after[k] - before[k] for k in after}
        return {
            "count": count,
            "batch_size": batch_size,
            "max_inflight": max_inflight,
            "exec_batch_size": exec_batch_size,
            "elapsed_s": round(elapsed, 3),
            "submit_s": round(t_submitted - t0, 3),
            "executions_per_s": round(count / elapsed, 1),
            "submits_per_s": round(count / (t_submitted - t0), 1),
            # Rows added to the event log (created, locked, finished: 3 per execution);
            # `stats["events"]` only counts events written through `append`.
            "events": delta["rows"],
            "events_per_s": round(delta["rows"] / elapsed, 1),
            "logical_tx": delta["logical"],
            "logical_tx_per_s": round(delta["logical"] / elapsed, 1),
            "commits": delta["commits"],
            "commits_per_s": round(delta["commits"] / elapsed, 1),
            "logical_tx_per_commit": round(delta["logical"] / max(1, delta["commits"]), 1),
            # CPU time of the whole process (all threads) per execution: less sensitive to
            # other load on the machine than the wall-clock rate.
            "cpu_s": round(cpu, 3),
            "cpu_us_per_execution": round(cpu / count * 1e6),
        }
    finally:
        await engine.stop()


async def _count_events(engine: Any) -> int:
    rows = await engine.storage._reader.execute_fetchall("SELECT count(*) FROM events")
    return int(next(iter(rows))[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=10_000, help="executions to run (10000)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=500,
        help="concurrent submits per asyncio.gather batch (500)",
    )
    p.add_argument(
        "--max-inflight",
        type=int,
        default=64,
        help="executor: runs at once, the component's exec.max_inflight (64)",
    )
    p.add_argument(
        "--exec-batch-size",
        type=int,
        default=64,
        help="executor: executions locked per lock_pending call, exec.batch_size (64)",
    )
    p.add_argument(
        "--default-gc",
        action="store_true",
        help="keep CPython's default GC thresholds (default: engine.gc_tuning, as "
        "`obelisk server run` does)",
    )
    p.add_argument(
        "--cpus",
        metavar="LIST",
        help="run pinned to these CPUs, e.g. 0 or 0,1 (os.sched_setaffinity; default: all)",
    )
    p.add_argument(
        "--cpu-affinity",
        choices=["off", "split"],
        default="split",
        help="the engine's thread placement (engine.affinity; default split)",
    )
    p.add_argument("--data-dir", type=Path, help="parent of the data dir (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    if not args.default_gc:
        from engine.gc_tuning import tune_gc

        tune_gc()

    tmp = Path(tempfile.mkdtemp(prefix="obelisk-bench-", dir=args.data_dir))
    try:
        result = asyncio.run(
            run(
                args.count,
                args.batch_size,
                args.max_inflight,
                args.exec_batch_size,
                tmp,
                args.cpu_affinity,
            )
        )
        result["gc_thresholds"] = list(gc.get_threshold())
        result["cpus"] = sorted(os.sched_getaffinity(0))
        result["cpu_affinity"] = args.cpu_affinity
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return 0
    r = result
    print(
        f"{r['count']} executions of {FFQN} "
        f"(submit batches of {r['batch_size']}, max_inflight {r['max_inflight']}, "
        f"exec batch {r['exec_batch_size']}, gc thresholds {tuple(r['gc_thresholds'])}, "
        f"CPUs {','.join(map(str, r['cpus']))}, cpu_affinity {r['cpu_affinity']})"
    )
    print(f"  end to end:  {r['elapsed_s']:.3f} s  ->  {r['executions_per_s']:,.0f} executions/s")
    print(
        f"  CPU:         {r['cpu_s']:.3f} s (all threads)  ->  "
        f"{r['cpu_us_per_execution']} us per execution"
    )
    print(f"  submitting:  {r['submit_s']:.3f} s  ->  {r['submits_per_s']:,.0f} submits/s")
    print(f"  events:      {r['events']:,}  ->  {r['events_per_s']:,.0f} events/s")
    print(f"  logical tx:  {r['logical_tx']:,}  ->  {r['logical_tx_per_s']:,.0f} /s")
    print(
        f"  commits:     {r['commits']:,}  ->  {r['commits_per_s']:,.0f} fsynced commits/s "
        f"({r['logical_tx_per_commit']} logical tx per commit)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
