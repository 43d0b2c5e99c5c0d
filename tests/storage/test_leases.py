"""Executor leases (`engine.storage.leases`): a lease is alive while its process lives, and
dead — to this process and to others — once that process is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.ids import new_executor_id
from engine.storage.leases import ExecutorLeases

HOLDER = """
import sys, time
from pathlib import Path
from engine.storage.leases import ExecutorLeases
leases = ExecutorLeases(Path(sys.argv[1]))
held = [leases.hold(executor_id) for executor_id in sys.argv[2:]]
print("holding", flush=True)
time.sleep(600)
"""


def hold_in_child(directory: Path, *executor_ids: str) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory), *executor_ids],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "holding\n"
    return child


def test_a_lease_is_alive_while_its_process_lives_and_dead_after_sigkill(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "db.sqlite-executors"
    a, b = new_executor_id(), new_executor_id()
    child = hold_in_child(directory, a, b)
    try:
        ours = ExecutorLeases(directory)
        mine = ours.hold(new_executor_id())
        assert ours.dead() == set()  # the child's are alive, and our own never dead
        assert sorted(os.listdir(directory)) == sorted([a, b, mine.executor_id])
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert ours.dead() == {a, b}
    # Another process (here: another set of open files) sees the same; ours is alive.
    assert ExecutorLeases(directory).dead() == {a, b}
    ours.forget({a})
    assert ours.dead() == {b}
    assert sorted(os.listdir(directory)) == sorted([b, mine.executor_id])
    mine.release()  # a clean stop removes the file
    assert os.listdir(directory) == [b]
    assert ExecutorLeases(directory).dead() == {b}


def test_forget_keeps_live_leases_and_cleans_abandoned_temporary_files(tmp_path: Path) -> None:
    directory = tmp_path / "leases"
    ours = ExecutorLeases(directory)
    live = ExecutorLeases(directory).hold(new_executor_id())  # "another process"
    stray = directory / f".{new_executor_id()}.123.tmp"  # died between create and rename
    stray.write_text("123\n")
    (directory / "not-an-executor").write_text("")
    assert ours.dead() == set()
    ours.forget({live.executor_id})
    assert sorted(os.listdir(directory)) == sorted([live.executor_id, "not-an-executor"])


def test_no_directory_means_nobody_is_dead(tmp_path: Path) -> None:
    leases = ExecutorLeases(tmp_path / "missing")
    assert leases.dead() == set()
    leases.forget({new_executor_id()})  # nothing to do, no error


def test_an_unwritable_directory_gives_a_lease_that_does_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    leases = ExecutorLeases(blocker / "leases")  # a directory inside a file: ENOTDIR
    executor_id = new_executor_id()
    lease = leases.hold(executor_id)
    assert f"executor {executor_id}: no lease file in {blocker / 'leases'}" in caplog.text
    assert "released only when they expire" in caplog.text
    lease.release()
    assert leases.dead() == set()
