"""The cyclic garbage collector held off while the console opens a screen.

Opening an execution allocates tens of thousands of objects (widgets, styles, strips), so
with the console's thresholds (`engine.gc_tuning.CONSOLE_THRESHOLDS`) about one opening in
five crossed a threshold and paid a generation-1 or a full pass in the middle: up to
80-100 ms on top of a ~90 ms opening, most of an opening's p95 (`bench/console.py`,
detail phase, docs/benchmarks.md). Held off until the screen's first filled frame is
drawn, the same passes run just after it, when nobody waits for them.

Process-wide (the collector is), so only the process that is the console holds it
(`ObeliskApp(tune_gc=True)`), and never for longer than `MAX_HOLD` seconds: should the
screen never fill (a server that does not answer), collection resumes anyway. Only
cycles wait; reference counting frees everything else as usual.
"""

from __future__ import annotations

import asyncio
import gc

#: Collection resumes at the latest this many seconds after a hold began.
MAX_HOLD = 1.0


class CollectorHold:
    """`hold()` when an opening starts, `release()` once it is drawn (idempotent)."""

    def __init__(self, enabled: bool, max_hold: float = MAX_HOLD) -> None:
        self.enabled = enabled
        self.max_hold = max_hold
        self._deadline: asyncio.TimerHandle | None = None

    @property
    def held(self) -> bool:
        return self._deadline is not None

    def hold(self) -> None:
        if not self.enabled:
            return
        if self._deadline is not None:  # a second opening at once: one hold, a new limit
            self._deadline.cancel()
        elif not gc.isenabled():  # someone else holds it: not ours to resume
            return
        gc.disable()
        self._deadline = asyncio.get_running_loop().call_later(self.max_hold, self.release)

    def release(self) -> None:
        if self._deadline is None:
            return
        self._deadline.cancel()
        self._deadline = None
        # The pass that came due meanwhile runs at the next allocation, after this frame.
        gc.enable()


__all__ = ["MAX_HOLD", "CollectorHold"]
