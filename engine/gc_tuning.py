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

The console (`obelisk-tui`) takes `CONSOLE_THRESHOLDS`: the same rare generation-0 passes,
but the oldest generation collected after every other generation-1 pass. With the
server's (50, 100) a full collection comes after 5,000 generation-0 passes (~9 hours of
demo traffic in an attached console), and until then every object that lived through two
passes and then died in a reference cycle stays. Textual leaves many: the footer's key
widgets it replaces, the virtual `DOMNode`s of widgets' component-class styles, finished
workers with their tasks, and the rendered strips these hold (what a full collection
found after 5 minutes of demo traffic: 37k objects). The attached console's RSS grew
~0.8 MiB/min, all of it such garbage: live pymalloc blocks and tracked objects grew
(29 → 46 MB, 29k → 150k in 2 → 12 min), the same with `PYTHONMALLOC=malloc`, +1.2 MiB
in 16 min with CPython's thresholds (`bench/console_live.py`, rss). With these, a full
pass over what is not frozen at start (60-80k objects) took ~75 ms of CPU (at most 112)
on a loaded 2-core machine, about one a minute of demo traffic, ~0.1% of a core (the
generation-0 passes take ~0.6%); CPython also skips it until a quarter as many objects as
its last pass kept are new in the oldest generation.
"""

from __future__ import annotations

import gc

#: Generation thresholds: (allocations before a gen-0 pass, gen-0 passes per gen-1 pass,
#: gen-1 passes per gen-2 pass).
THRESHOLDS = (20_000, 50, 100)
#: The console's: a full collection every ~22 generation-0 passes (a pass of the oldest
#: generation runs when its count exceeds its threshold: after 2 generation-1 passes).
CONSOLE_THRESHOLDS = (20_000, 10, 1)


def tune_gc(thresholds: tuple[int, int, int] = THRESHOLDS) -> None:
    gc.set_threshold(*thresholds)


__all__ = ["CONSOLE_THRESHOLDS", "THRESHOLDS", "tune_gc"]
