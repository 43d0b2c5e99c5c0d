"""What a failed QuickJS sandbox run leaves behind, and how it ran out of memory.

Frames of a failed run
----------------------
A guest fault surfaces as a Python exception (a `wasmtime.Trap`, a `QuickJSError`, a
cancellation) raised through quickjs-rs and asyncio's `TaskGroup`. Python 3.11's
`TaskGroup.__aexit__` leaves the `ExceptionGroup` it raises in a reference cycle with
its own frame (whose `tb` argument holds the failed guest call's frames), and those
frames hold quickjs-rs's closure over the code string the runner built from the params,
a copy of their whole JSON text. The handled exception does not lead to that group, so
it cannot be cut loose from here; only the cyclic collector frees it, and with the
engine's thresholds (`engine.gc_tuning`) a full collection may not come for hours: each
failed attempt with a 60 MiB param kept 60-240 MiB. `release_after_failure` runs that
collection at once after a failed run with large params (rare: they are bounded by
`engine.limits`, and their run costs more than the collection).

Out of memory
-------------
The guest's allocator (Rust) does not return null when the linear memory may not grow
past the sandbox's limit: it prints `memory allocation of N bytes failed` on stderr and
aborts, which wasmtime reports as a `wasm unreachable` trap. `GuestStderr` takes the
guest's stderr (quickjs-rs gives it the host process's) so that the runner can tell that
abort from other traps (`is_allocation_failure`) and report the documented message.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

import wasmtime

from engine.runtimes.outcome import RunErr, RunOk, RunOutcome

__all__ = ["GuestStderr", "is_allocation_failure", "needs_collection", "release_after_failure"]

#: Bytes of the guest's stderr kept per run (the abort message is short).
STDERR_LIMIT = 4096
#: Params JSON from which a failed run is followed by a full collection: below it, what
#: the cycles hold is small enough to wait for the collector's own pace, and a full
#: collection (~10-100 ms in a busy engine) would cost more than the run.
COLLECT_AFTER_BYTES = 256 * 1024


def needs_collection(outcome: RunOutcome, params_bytes: int) -> bool:
    """Whether a run left cycles worth a full collection: it failed through an exception
    (a trap, a timeout, a cancel: not a return or a throw) and its params were large."""
    return params_bytes >= COLLECT_AFTER_BYTES and not isinstance(outcome, (RunOk, RunErr))


def release_after_failure(outcome: RunOutcome, params_bytes: int) -> None:
    """Free at once what a failed run with large params left in reference cycles."""
    if needs_collection(outcome, params_bytes):
        gc.collect()


def is_allocation_failure(error: BaseException, stderr: bytes) -> bool:
    """Whether a guest call failed for want of memory: the guest's allocator gave up
    (Rust's `handle_alloc_error`: `memory allocation of N bytes failed` on stderr, then a
    trap), or the host could not even get room for its input in the guest
    (`qjs_alloc` returning null)."""
    if isinstance(error, wasmtime.Trap):
        return b"memory allocation of " in stderr and b" bytes failed" in stderr
    return "qjs_alloc returned null" in str(error)


class GuestStderr:
    """The first `STDERR_LIMIT` bytes a sandbox's guest writes on stderr. wasmtime calls
    `write` on a thread of its own; a write has finished when the guest's `fd_write`
    returns, so a trap that follows it is seen after the text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunks: list[bytes] = []
        self._size = 0

    def install(self, store: Any) -> None:
        """Give the guest of `store` this stderr (and no stdout: it has none to write)."""
        wasi = wasmtime.WasiConfig()
        wasi.stderr_custom = self.write
        store.set_wasi(wasi)

    def write(self, data: bytes) -> None:
        with self._lock:
            room = STDERR_LIMIT - self._size
            if room > 0:
                chunk = bytes(data[:room])
                self._chunks.append(chunk)
                self._size += len(chunk)

    def text(self) -> bytes:
        with self._lock:
            return b"".join(self._chunks)
