"""QuickJS sandboxes kept from one JS workflow run to the next.

Opening a sandbox costs more than most runs: a new wasmtime store and instance of the
QuickJS guest, a dozen guest calls to set it up, the first touch of every page the heap
image writes, and closing it again (~1.3 ms of the ~2.5 ms a short run costs; measured
in `docs/benchmarks.md`). A run that ended cleanly gives its sandbox back here instead;
the next run of the same runner and heap image takes it, reset to that image
(`HeapImage.reset`: the image's pages, zeros everywhere else, the stack pointer), which
makes its memory byte for byte what a fresh sandbox restored from the image has (a test
compares them). Everything else a run sets on a sandbox is set again by the next one:
the module loader, the interrupt handler, the host function, the host-call bridge.

The next run gets a new quickjs-rs `Context` over the same instance; the previous
one is marked closed first, so that a JS value handle the previous run left behind and
the garbage collector finalizes later cannot free anything in the next run's heap
(quickjs-rs frees a handle's value only while its context is open).

How many are kept: as many as were in use lately, up to `KEEP` per runner and
`KEEP_IN_PROCESS` in all (~1.5 MB each for a small module). A burst of runs at once
leaves as many sandboxes behind as it used, which is no more memory than the burst took
while it ran; a sandbox nobody took for `IDLE_SECONDS` is closed by a daemon thread that
looks every `TRIM_EVERY` seconds (`SandboxPool.trim`), so the memory goes back once the
burst is over. (With 16 kept, a burst of 100 runs opened 84 new sandboxes every time:
~5 % of the concurrent-steps benchmark's CPU.)

Only sandboxes whose run ended normally come back: the function returned or threw, no
trap (a store that trapped is dead), no interrupt, no memory limit hit, no memory growth
beyond the image, nothing pending. Pinned to quickjs-rs 0.2.6 (`Runtime._contexts`,
`QjsRuntime._new_instance`, `Context._engine_ctx`), like the rest of this runtime.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from engine.runtimes.js.heap import HeapImage

#: Sandboxes kept per runner, and by all runners of the process together (each holds
#: its linear memory: ~1.5 MB for a small module).
KEEP = 128
KEEP_IN_PROCESS = 128
#: An idle sandbox not taken for this long is closed.
IDLE_SECONDS = 30.0
#: How often the trimmer thread looks for such sandboxes.
TRIM_EVERY = 5.0

_log = logging.getLogger("obelisk.js")

_kept_lock = threading.Lock()
_kept = 0  # idle sandboxes in every pool of the process


def _keep_one() -> bool:
    global _kept
    with _kept_lock:
        if _kept >= KEEP_IN_PROCESS:
            return False
        _kept += 1
        return True


def _let_go(n: int = 1) -> None:
    global _kept
    with _kept_lock:
        _kept -= n


@dataclass(slots=True)
class PooledSandbox:
    """A sandbox between runs: its quickjs-rs `Runtime`, the guest instance, the image
    it runs from, and whether its guest calls take the faster path."""

    rt: Any
    inst: Any
    image: HeapImage
    accelerated: bool

    def new_context(self, timeout: float) -> Any:
        """A quickjs-rs `Context` over this sandbox's instance (what `Runtime.new_context`
        makes, minus a new instance: `QjsRuntime._new_instance` is what it asks for one)."""
        engine_rt = self.rt._engine_rt
        inst = self.inst

        def same_instance() -> Any:
            # What `_new_instance` gives a new one; the limits it also sets are in the
            # guest's memory, which the reset made the image's again.
            inst.module_normalize = engine_rt._module_normalize
            inst.module_load = engine_rt._module_load
            inst.runtime_transform_flags = engine_rt._transform_flags
            inst.module_transform_flags = engine_rt._module_transform_flags
            inst.interrupt_handler = engine_rt._interrupt_handler
            engine_rt._instances.add(inst)
            return inst

        engine_rt._new_instance = same_instance
        try:
            return self.rt.new_context(timeout=timeout)
        finally:
            del engine_rt._new_instance

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.inst.close()
        with contextlib.suppress(Exception):
            self.rt.close()


def retire_context(rt: Any, ctx: Any) -> None:
    """Mark a run's `Context` closed without closing its instance (which stays for the
    next run): its leftover handles then never touch the guest again."""
    ctx._closed = True
    ctx._engine_ctx._closed = True
    rt._unregister_context(ctx)


class SandboxPool:
    """The sandboxes of one runner waiting for a run (any thread)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        #: Idle sandboxes and since when (`time.monotonic()`), the latest given last.
        self._idle: list[tuple[PooledSandbox, float]] = []
        self._lock = threading.Lock()
        _pools.add(self)

    def __len__(self) -> int:
        return len(self._idle)

    def take(self, image: HeapImage) -> PooledSandbox | None:
        """A sandbox reset to `image`, or None (the run opens a new one)."""
        while True:
            with self._lock:
                if not self._idle:
                    return None
                sandbox, _ = self._idle.pop()
            _let_go()
            if sandbox.image is not image:  # the runner's imports changed
                sandbox.close()
                continue
            try:
                image.reset(sandbox.inst)
            except Exception:  # closed or grown meanwhile: not usable
                sandbox.close()
                continue
            return sandbox

    def give(self, sandbox: PooledSandbox) -> None:
        with self._lock:
            if len(self._idle) < self._keep and _keep_one():
                self._idle.append((sandbox, time.monotonic()))
                _ensure_trimmer()
                return
        sandbox.close()

    def trim(self, now: float) -> int:
        """Close the sandboxes idle since before `now - IDLE_SECONDS` (`time.monotonic()`
        times); how many."""
        with self._lock:
            cut = now - IDLE_SECONDS
            expired = [sandbox for sandbox, since in self._idle if since <= cut]
            if expired:
                self._idle = [(sb, since) for sb, since in self._idle if since > cut]
        _let_go(len(expired))
        for sandbox in expired:
            sandbox.close()
        return len(expired)

    def clear(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        _let_go(len(idle))
        for sandbox, _ in idle:
            sandbox.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter exit, modules may be gone
            self.clear()


_pools: weakref.WeakSet[SandboxPool] = weakref.WeakSet()
_trimmer: threading.Thread | None = None
_trimmer_lock = threading.Lock()


def _ensure_trimmer() -> None:
    """Start the daemon thread that trims every pool (once per process)."""
    global _trimmer
    if _trimmer is not None:
        return
    with _trimmer_lock:
        if _trimmer is None:
            _trimmer = threading.Thread(
                target=_trim_forever, name="obelisk-sandbox-trim", daemon=True
            )
            _trimmer.start()


def trim_all(now: float) -> int:
    """`SandboxPool.trim` on every pool of the process; how many sandboxes were closed."""
    closed = 0
    for pool in list(_pools):
        try:
            closed += pool.trim(now)
        except Exception:  # one pool's failure must not stop the others
            _log.exception("trimming idle sandboxes failed")
    return closed


def _trim_forever() -> None:
    while True:
        time.sleep(TRIM_EVERY)
        trim_all(time.monotonic())
