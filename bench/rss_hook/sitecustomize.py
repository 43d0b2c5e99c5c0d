"""A memory dump on SIGUSR1, for the rss phase of `bench/console.py` (`--rss-dump-at`):
the bench puts this directory on the console's PYTHONPATH and sets OBELISK_RSS_DUMP_DIR.

On the signal, Python's allocator statistics (`sys._debugmallocstats`: pymalloc arenas,
pools, blocks in use per size class) and glibc's (`malloc_stats`: per malloc arena the
bytes taken from the system and in use, and the mmap'ed blocks), both of which C writes to
fd 2, are written to `DIR/PID-N.txt` (fd 2 is pointed at the file meanwhile: the console's
stderr is its terminal). Plus the gc's counts and the number of live objects by type (the
top 30).

OBELISK_RSS_DUMP_GARBAGE=1: each dump also collects (gc.DEBUG_SAVEALL) and lists what a
full collection found unreachable, by type (the garbage is then freed).

OBELISK_RSS_GC_LOG=1: the collector's passes are counted by generation, with their CPU
time (`gc.callbacks`), and each dump lists them.

OBELISK_RSS_GC_THRESHOLDS=A,B,C: the collector's thresholds, kept (later
`gc.set_threshold` calls, e.g. the console's `engine.gc_tuning`, do nothing).
"""

from __future__ import annotations

import os
import signal
import sys
import time

_DIR = os.environ.get("OBELISK_RSS_DUMP_DIR")


def _dump(_signum: int, _frame: object) -> None:
    import collections
    import ctypes
    import gc

    assert _DIR is not None
    n = len([f for f in os.listdir(_DIR) if f.startswith(f"{os.getpid()}-") and f.endswith(".txt")])
    path = os.path.join(_DIR, f"{os.getpid()}-{n}.txt")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    saved = os.dup(2)
    try:
        sys.stderr.flush()
        os.dup2(fd, 2)
        sys._debugmallocstats()
        os.write(2, b"\n--- glibc malloc_stats ---\n")
        libc = ctypes.CDLL(None)
        libc.malloc_stats()
        counts = collections.Counter(type(o).__name__ for o in gc.get_objects())
        lines = [f"\n--- gc: counts {gc.get_count()}, tracked {sum(counts.values())}"]
        lines += [f"{v:8d} {k}" for k, v in counts.most_common(30)]
        os.write(2, ("\n".join(lines) + "\n").encode())
        if _passes:
            lines = ["\n--- collector passes so far: generation, passes, CPU ms total/max, freed"]
            for g in sorted(_passes):
                n, total, most, freed = (int(_passes[g][0]), *_passes[g][1:3], int(_passes[g][3]))
                lines.append(
                    f"gen {g}: {n} passes, {total * 1000:.0f} / {most * 1000:.1f} ms, {freed}"
                )
            os.write(2, ("\n".join(lines) + "\n").encode())
        if os.environ.get("OBELISK_RSS_DUMP_GARBAGE"):
            # What a full collection would free now (it frees it: the run is changed).
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                t0, c0 = time.perf_counter(), time.thread_time()
                found = gc.collect()
                took, cpu = time.perf_counter() - t0, time.thread_time() - c0
                garbage = collections.Counter(type(o).__name__ for o in gc.garbage)
                gc.garbage.clear()
            finally:
                gc.set_debug(0)
            lines = [
                f"\n--- garbage: {found} objects, the collection took {took * 1000:.1f} ms "
                f"({cpu * 1000:.1f} ms CPU)"
            ]
            lines += [f"{v:8d} {k}" for k, v in garbage.most_common(40)]
            os.write(2, ("\n".join(lines) + "\n").encode())
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


#: generation → [passes, CPU seconds, the longest pass's, objects freed]
_passes: dict[int, list[float]] = {}
_started = [0.0]


def _on_collect(phase: str, info: dict[str, int]) -> None:
    """The collector's passes by generation (OBELISK_RSS_GC_LOG=1): their CPU time."""
    if phase == "start":
        _started[0] = time.thread_time()
        return
    took = time.thread_time() - _started[0]
    entry = _passes.setdefault(info["generation"], [0, 0.0, 0.0, 0])
    entry[0] += 1
    entry[1] += took
    entry[2] = max(entry[2], took)
    entry[3] += info["collected"]


if _DIR:
    signal.signal(signal.SIGUSR1, _dump)
    if os.environ.get("OBELISK_RSS_GC_LOG"):
        import gc as _gc

        _gc.callbacks.append(_on_collect)

_GC = os.environ.get("OBELISK_RSS_GC_THRESHOLDS")
if _GC:
    import gc

    gc.set_threshold(*(int(x) for x in _GC.split(",")))
    gc.set_threshold = lambda *_args: None  # type: ignore[assignment]
