"""`bench.procs.task_cpu`: a thread's CPU below the 10 ms clock tick of `/proc/…/stat`."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from bench.procs import proc_stat, task_cpu


def test_a_few_milliseconds_of_a_thread_are_seen() -> None:
    task = f"/proc/self/task/{threading.get_native_id()}"
    if not os.path.exists(f"{task}/schedstat"):
        pytest.skip("this kernel has no schedstat: task_cpu reads clock ticks")
    before, started = task_cpu(task), time.thread_time()
    while time.thread_time() - started < 0.003:  # 3 ms of this thread's own CPU
        pass
    after, burnt = task_cpu(task), time.thread_time() - started
    assert before is not None and after is not None
    # In ticks this is 0 or 10 ms; schedstat tells the 3 ms (and a little more).
    assert burnt * 0.8 <= after - before < 0.009


def test_a_gone_thread_is_none_and_without_schedstat_stat_is_read(tmp_path: Path) -> None:
    assert task_cpu("/proc/self/task/999999999") is None
    stat = Path(f"/proc/self/task/{threading.get_native_id()}/stat").read_text()
    (tmp_path / "stat").write_text(stat)  # a task directory without schedstat
    assert task_cpu(str(tmp_path)) == proc_stat(str(tmp_path / "stat"))[1]  # type: ignore[index]
