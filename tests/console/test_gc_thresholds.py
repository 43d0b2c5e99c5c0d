"""The console's collector thresholds (`engine.gc_tuning.CONSOLE_THRESHOLDS`): cyclic
garbage that reached the oldest generation is freed as the session goes on. With the
server's thresholds a full collection waits for 5,000 generation-0 passes, and the
attached console's RSS grew ~0.8 MiB/min with such garbage (Textual's widgets and their
virtual style nodes; `bench/console_live.py`, rss)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a process of its own: the collector's state (thresholds, counts, frozen objects)
# is process-wide, and the test needs it clean.
_MEASURE = r"""
import gc, json, weakref
from engine.gc_tuning import CONSOLE_THRESHOLDS, THRESHOLDS, tune_gc
from obelisk_tui.app import ObeliskApp

class Node:
    '''A reference cycle, like a widget and the virtual node of its styles.'''
    def __init__(self) -> None:
        self.me = self

def old_garbage_left(thresholds: tuple[int, int, int]) -> int:
    tune_gc(thresholds)
    gc.collect()
    nodes = [Node() for _ in range(1000)]
    refs = [weakref.ref(n) for n in nodes]
    gc.collect(1)  # they lived through two passes: in the oldest generation now
    del nodes  # and then died
    session = [[] for _ in range(500_000)]  # what a session allocates and keeps a while
    left = sum(r() is not None for r in refs)
    del session
    return left

ObeliskApp(lambda: None, what="test", tune_gc=True)  # as `obelisk-tui` makes it
print(json.dumps({
    "console_thresholds": list(gc.get_threshold()),
    "left_with_server_thresholds": old_garbage_left(THRESHOLDS),
    "left_with_console_thresholds": old_garbage_left(CONSOLE_THRESHOLDS),
}))
"""


def test_old_cyclic_garbage_is_collected_with_the_console_thresholds() -> None:
    from engine.gc_tuning import CONSOLE_THRESHOLDS

    done = subprocess.run(
        [sys.executable, "-c", _MEASURE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["console_thresholds"] == list(CONSOLE_THRESHOLDS)
    # 500,000 allocations (25 generation-0 passes): the server's thresholds have not yet
    # run a full collection; the console's have.
    assert out["left_with_server_thresholds"] == 1000
    assert out["left_with_console_thresholds"] == 0
