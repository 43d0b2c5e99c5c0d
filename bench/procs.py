"""CPU of processes and threads from `/proc` (Linux), for the benchmarks. No imports
beyond the standard library: the peer benchmark (`bench/peers/`) uses it from a
virtualenv of its own."""

from __future__ import annotations

import os
from collections.abc import Iterable

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_stat(path: str) -> tuple[int, float] | None:
    """(parent pid, user+sys CPU seconds) from a `/proc/…/stat` file; None when gone."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command's name
    except OSError:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def task_cpu(task: str) -> float | None:
    """CPU seconds (user+sys) of a thread, from its `/proc/…/task/<tid>` directory:
    `schedstat`'s nanoseconds where the kernel has them, else `stat`'s clock ticks (10
    ms each: a thread that ran a few ms between two readings shows 0 or 10); None when
    it is gone."""
    try:
        with open(f"{task}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        stat = proc_stat(f"{task}/stat")
        return None if stat is None else stat[1]


def process_tree(root: int) -> list[int]:
    """`root` and every process under it."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        if (stat := proc_stat(f"/proc/{entry}/stat")) is not None:
            children.setdefault(stat[0], []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def cpu_seconds(pids: Iterable[int]) -> float:
    """User+sys CPU seconds of these processes (all their threads); 0 for one gone."""
    return sum(stat[1] for pid in pids if (stat := proc_stat(f"/proc/{pid}/stat")) is not None)


def tree_cpu(root: int | None = None) -> float:
    """User+sys CPU seconds of `root` (default: this process) and every process under it
    (an engine's helper processes; `RUSAGE_CHILDREN` counts only children that ended)."""
    return cpu_seconds(process_tree(os.getpid() if root is None else root))
