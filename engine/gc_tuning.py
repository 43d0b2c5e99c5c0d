"""Garbage-collector settings for a process that runs the engine (`obelisk server run`).

The engine allocates many short-lived container objects per execution (futures, tasks,
events, summaries), so with CPython's default thresholds (700, 10, 10) the cyclic
collector runs generation-0 passes thousands of times a second and regularly rescans every
live task and future in older generations. Larger thresholds make those passes rarer;
reference counting still frees almost everything at once, only cycles wait longer.
In a profile of `bench/activity_throughput.py` the collector was ~7% of all CPU samples;
with these thresholds the benchmark ran 0-20% faster (noisy machine).

Process-wide, so the embeddable `Engine` does not do this by itself: a process that embeds
the engine can call `tune_gc()` too.
"""

from __future__ import annotations

import gc

#: Generation thresholds: (allocations before a gen-0 pass, gen-0 passes per gen-1 pass,
#: gen-1 passes per gen-2 pass).
THRESHOLDS = (20_000, 50, 100)


def tune_gc() -> None:
    gc.set_threshold(*THRESHOLDS)


__all__ = ["THRESHOLDS", "tune_gc"]
