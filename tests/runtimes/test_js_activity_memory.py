"""JS activities with large inputs: the memory they use is given back, and a sandbox that
runs out of memory says so (README "JS activities")."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from engine.runtimes.js.activity import JsActivityRunner
from engine.runtimes.outcome import LogLine, RunOk, RunTrap

ROOT = Path(__file__).resolve().parents[2]


def _run(runner: JsActivityRunner, params: list[object]) -> object:
    return runner.call(params, time.monotonic() + 30, threading.Event(), _discard, [])


def _discard(_line: LogLine) -> None:
    return None


def test_a_param_larger_than_the_sandbox_is_out_of_memory(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The guest's allocator aborts (a wasm `unreachable` trap) when the 20 MiB param
    cannot be copied into a 16 MiB sandbox: that is running out of memory."""
    runner = JsActivityRunner(
        "export default (s) => s.length", "activity/big.js", memory_limit=16 * 2**20
    )
    out = _run(runner, ["x" * (20 * 2**20)])
    assert out == RunTrap("out of memory (the JS sandbox's limit is 16 MiB)", out.detail)  # type: ignore[union-attr]
    # The guest's own abort message is not printed on the engine's stderr.
    assert "memory allocation of" not in capfd.readouterr().err


# Runs in a process of its own: a clean baseline, and the server's GC thresholds.
_MEASURE = r"""
import json, os, sys, threading, time
from engine.gc_tuning import tune_gc
from engine.runtimes.js.activity import JsActivityRunner

tune_gc()  # as `obelisk server run` does
page = os.sysconf("SC_PAGE_SIZE")

def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page

runner = JsActivityRunner("export default (s) => s.length", "activity/big.js")

def run(size: int) -> str:
    out = runner.call(["x" * size], time.monotonic() + 60, threading.Event(), lambda _l: None, [])
    return type(out).__name__ + ":" + str(getattr(out, "reason", getattr(out, "value", "")))

big, allowed, rounds = (int(a) for a in sys.argv[1:])
outcomes = [run(big), run(allowed)]  # warm-up: first use of each size
after_warm_up = rss()
for _ in range(rounds):
    outcomes += [run(big), run(allowed)]
print(json.dumps({"growth": rss() - after_warm_up, "outcomes": outcomes}))
"""


@pytest.mark.slow
def test_rss_returns_to_its_baseline_after_large_inputs() -> None:
    """A 60 MiB param (past the submit check: workflows and results can make large
    values) and one just under the submit limit, run again and again: the memory of each
    run is given back, also when the run fails."""
    from engine.limits import MAX_PARAMS_BYTES

    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(60 * 2**20), str(MAX_PARAMS_BYTES - 64), "4"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    oom = "RunTrap:out of memory (the JS sandbox's limit is 64 MiB)"
    ok = f"RunOk:{MAX_PARAMS_BYTES - 64}"
    # Before the fix each failed 60 MiB run kept 60-240 MiB.
    assert report["growth"] < 150 * 2**20, report
    assert report["outcomes"] == [oom, ok] * 5


def test_large_allowed_params_run() -> None:
    from engine.limits import MAX_PARAMS_BYTES

    runner = JsActivityRunner("export default (s) => s.length", "activity/big.js")
    assert _run(runner, ["é" * (MAX_PARAMS_BYTES // 2 - 16)]) == RunOk(MAX_PARAMS_BYTES // 2 - 16)
