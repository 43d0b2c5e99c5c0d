"""An engine helper process (`python -m engine.helper_process`), started by
`engine.processes.Helpers` for `Engine.start(processes=N)`: a full engine on the same
database (or its own SQLite shard) until the starting process closes its stdin."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from engine.engine import Engine
from engine.errors import DeploymentError
from engine.gc_tuning import tune_gc
from engine.processes import DATABASE_ENV
from engine.storage.contract import StorageError


async def _helper(deployment: Path, data_dir: Path, shard: int | None) -> int:
    try:
        engine = await Engine.start(
            deployment,
            data_dir,
            database_url=os.environ.get(DATABASE_ENV) or None,
            shard=shard,
        )
    except (DeploymentError, StorageError, OSError) as e:
        print(f"error: {e}", flush=True)
        return 1
    try:
        print("ready", flush=True)
        # Until the starting process closes our stdin, or dies.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
    finally:
        await engine.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="an engine helper process (see engine.helper_process)")
    p.add_argument("--deployment", type=Path, required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--cpus", help="the CPUs to run on, comma-separated")
    p.add_argument("--shard", type=int, help="the SQLite shard to work on (from 1)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    if args.cpus:
        with contextlib.suppress(OSError, AttributeError):
            os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    # The starting process handles Ctrl-C and stops us through stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s %(levelname)s %(name)s [helper {os.getpid()}]: %(message)s",
    )
    tune_gc()
    return asyncio.run(_helper(args.deployment, args.data_dir, args.shard))


if __name__ == "__main__":
    sys.exit(main())
