"""Where the engine's threads run (`cpu_affinity`): "off" (the OS decides) or "split".

CPython's threads take turns on one GIL. The engine's busy ones — the event loop, the
workflow runs (the QuickJS interpreter keeps the GIL) and the SQLite writer — hand it to
each other several times per workflow step, and on two cores every hand-off is a
cross-core wake-up: more CPU burnt on waking than on the work itself when a hundred
workflow runs take turns. "split" keeps the threads that only take turns (the loop, the
workflow runs and what they start) on the first allowed CPU and the SQLite writer, which
also waits for the disk, on the last one; activity runs use every allowed CPU but the
first (a WASM activity computes without the GIL). Measured in `docs/benchmarks.md`: on 2
vCPUs, activities ~+30 %, 100 workflows × 10 calls ~+20 %, one workflow's 1,000
sequential calls ~−5 % (its child's run now shares the writer's core).

The setting is process-wide (CPU affinity belongs to threads, and new threads inherit
their creator's), so it is for whoever owns the process: `obelisk server run` splits by
default; an embedding application opts in with `Engine.start(cpu_affinity="split")`.
Linux only (`os.sched_setaffinity`); elsewhere, or with fewer than two allowed CPUs, it
does nothing.

Several engine processes (`engine.processes`) get a CPU each: `process_cpus`, and
`parse_processes` reads `--processes N|auto` (light: the CLIs import it at start).
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from typing import Literal

log = logging.getLogger("obelisk.affinity")

Mode = Literal["off", "split"]
Role = Literal["turns", "writer", "free"]
MODES: tuple[Mode, ...] = ("off", "split")

_lock = threading.Lock()
_cpus: dict[Role, set[int]] = {}
#: The CPUs the process had before the first split (what "off" gives back).
_original: set[int] | None = None


def configure(mode: Mode) -> bool:
    """Set the mode for threads started from now on and place the calling thread (the
    event loop's); True when threads are being placed. "off" after "split" gives the
    calling thread its CPUs back (threads started meanwhile keep their places)."""
    global _original
    if mode not in MODES:
        raise ValueError(f"cpu_affinity must be one of {', '.join(MODES)}, not {mode!r}")
    with _lock:
        allowed = _original if _original is not None else _allowed()
        _cpus.clear()
        if mode == "off" or allowed is None or len(allowed) < 2:
            if _original is not None:
                _set(_original)
            return False
        _original = allowed
        ordered = sorted(allowed)
        _cpus["turns"], _cpus["writer"] = {ordered[0]}, {ordered[-1]}
        _cpus["free"] = set(ordered[1:])
    pin("turns")
    log.debug("threads split over CPUs: %s", {role: sorted(c) for role, c in _cpus.items()})
    return True


def configure_one(cpus: set[int]) -> bool:
    """This process on `cpus` only (one of several engine processes, each on a CPU of
    its own: `engine.processes`): the calling thread now, threads started from it
    later. "off" gives the CPUs back. True when placed."""
    global _original
    with _lock:
        allowed = _original if _original is not None else _allowed()
        if allowed is None:
            return False
        _original = allowed
        _cpus.clear()
    _set(cpus)
    return True


def pin(role: Role) -> None:
    """Place the calling thread for `role` (a no-op unless configured)."""
    cpus = _cpus.get(role)
    if cpus is not None:
        _set(cpus)


def _set(cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(0, cpus)
    except OSError as e:  # e.g. a CPU taken away by a cgroup meanwhile: not fatal
        log.debug("cannot place a thread on CPUs %s: %s", sorted(cpus), e)


def cpus_of(role: Role) -> set[int] | None:
    """The CPUs of `role` threads (None: not placed)."""
    found = _cpus.get(role)
    return None if found is None else set(found)


def process_cpus(count: int) -> list[set[int]] | None:
    """The CPU of each of `count` engine processes (the first is the calling one), or
    None when CPUs cannot be placed here (not Linux)."""
    allowed = _allowed()
    if allowed is None:
        return None
    ordered = sorted(allowed)
    return [{ordered[i % len(ordered)]} for i in range(count)]


def parse_processes(text: str) -> int:
    """A `--processes` value (an argparse `type`): a count from 1 to 64, or `auto` (one
    per CPU this process may use)."""
    if text == "auto":
        allowed = _allowed()
        return max(1, len(allowed) if allowed else os.cpu_count() or 1)
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or auto: {text!r}") from None
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"must be from 1 to 64, not {n}")
    return n


def _allowed() -> set[int] | None:
    getter = getattr(os, "sched_getaffinity", None)
    if getter is None or not hasattr(os, "sched_setaffinity"):
        return None
    try:
        return set(getter(0))
    except OSError:
        return None
