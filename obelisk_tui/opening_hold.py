"""While the console opens an execution's screen: the cyclic garbage collector held off,
and the GIL handed between threads more often.

- The collector. Opening an execution allocates tens of thousands of objects (widgets,
  styles, strips), so with the console's thresholds (`engine.gc_tuning.CONSOLE_THRESHOLDS`)
  about one opening in five crossed a threshold and paid a generation-1 or a full pass in
  the middle: 26-100 ms on top of a ~90 ms opening, most of an opening's p95. Held off
  until the screen's first filled frame is drawn, the same passes run just after it, when
  nobody waits for them.
- The GIL's switch interval. The screen's first read runs in the engine's reader thread
  while the event loop's thread composes the screen. With CPython's 5 ms interval, the
  reader got the GIL back only every 5 ms for each of its Python steps, so the read was
  late, the screen was drawn once empty and again filled, and the opening took both
  frames' work. At 0.5 ms the read is in before the first layout (`bench/console.py`,
  detail phase: median and p95 down by ~30 %, docs/benchmarks.md).

Both are process-wide, so only the process that is the console holds them
(`ObeliskApp(tune_gc=True)`), and never for longer than `MAX_HOLD` seconds: should the
screen never fill (a server that does not answer), they end anyway. Only cycles wait for
the collector; reference counting frees everything else as usual.
"""

from __future__ import annotations

import asyncio
import gc
import sys

#: The hold ends at the latest this many seconds after it began.
MAX_HOLD = 1.0
#: The GIL's switch interval during an opening (CPython's default: 5 ms).
OPENING_SWITCH_INTERVAL = 0.0005


class OpeningHold:
    """`hold()` when an opening starts, `release()` once it is drawn (idempotent)."""

    def __init__(self, enabled: bool, max_hold: float = MAX_HOLD) -> None:
        self.enabled = enabled
        self.max_hold = max_hold
        self._deadline: asyncio.TimerHandle | None = None
        #: What the hold changed, to put back: the switch interval, and whether the
        #: collector was enabled (someone else's pause is not ours to end).
        self._switch_interval = 0.0
        self._collector_was_enabled = False

    @property
    def held(self) -> bool:
        return self._deadline is not None

    def hold(self) -> None:
        if not self.enabled:
            return
        if self._deadline is not None:  # a second opening at once: one hold, a new limit
            self._deadline.cancel()
        else:
            self._switch_interval = sys.getswitchinterval()
            self._collector_was_enabled = gc.isenabled()
            sys.setswitchinterval(OPENING_SWITCH_INTERVAL)
            gc.disable()
        self._deadline = asyncio.get_running_loop().call_later(self.max_hold, self.release)

    def release(self) -> None:
        if self._deadline is None:
            return
        self._deadline.cancel()
        self._deadline = None
        sys.setswitchinterval(self._switch_interval)
        if self._collector_was_enabled:
            # The pass that came due meanwhile runs at the next allocation, after this frame.
            gc.enable()


__all__ = ["MAX_HOLD", "OPENING_SWITCH_INTERVAL", "OpeningHold"]
