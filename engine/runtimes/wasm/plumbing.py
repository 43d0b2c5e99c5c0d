"""The per-run plumbing of WASM activity runs, kept to C calls where wasmtime-py and
`threading` would spend Python calls on every run.

- `SlotTokens`: the pooled engine's instance slots, a counting semaphore on a C queue
  (`threading.BoundedSemaphore` is Python code over a `Condition`: ~8 Python calls per
  acquire and release).
- `set_output`: a WASI stdout/stderr callback through one static C callback and a
  key, instead of wasmtime-py's `WasiConfig.stdout_custom` (a slab entry allocated,
  looked up and freed through Python calls for every run and stream).
- `Keyed`: the objects such static callbacks find by key (the outputs here, the
  runs' interrupts in `engine.runtimes.wasm.activity`), forgotten when wasmtime drops
  the key.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import wasmtime
from wasmtime import _ffi as ffi  # noqa: PLC2701 (wasmtime internals, version pinned)

__all__ = ["Keyed", "SlotTokens", "set_output"]

T = TypeVar("T")

_log = logging.getLogger("obelisk.wasm")


class SlotTokens:
    """A bounded counting semaphore of `n` slots (`acquire`/`release`, as
    `threading.BoundedSemaphore`), each acquire and release one C call on a queue of
    tokens. Releasing more than was acquired raises `ValueError`."""

    __slots__ = ("_n", "_releasing", "_tokens")

    def __init__(self, n: int) -> None:
        self._n = n
        self._tokens: queue.SimpleQueue[None] = queue.SimpleQueue()
        #: Makes the over-release check and the put one step (a C lock: no Python call).
        self._releasing = threading.Lock()
        for _ in range(n):
            self._tokens.put(None)

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Take a slot; False when none came (at once unless `blocking`, else within
        `timeout` seconds; None: wait for one)."""
        try:
            self._tokens.get(blocking, timeout)
        except queue.Empty:
            return False
        return True

    def release(self) -> None:
        with self._releasing:
            if self._tokens.qsize() >= self._n:
                raise ValueError("slot released too many times")
            self._tokens.put(None)


#: The finalizer wasmtime calls with a callback's data when it lets go of it.
FINALIZER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Keyed(Generic[T]):
    """Python objects that a static C callback finds by key (the `void*` data wasmtime
    hands it), rather than a ctypes closure made per run. `dropped` is the finalizer to
    give wasmtime with the key: the object is forgotten when wasmtime lets go of it."""

    __slots__ = ("_keys", "dropped", "items")

    def __init__(self) -> None:
        self.items: dict[int, T] = {}
        self._keys = itertools.count(1)
        items = self.items

        def drop(key: int | None) -> None:
            items.pop(key or 0, None)

        self.dropped = FINALIZER(drop)

    def add(self, item: T) -> int:
        """`item` under a new key (its callback's data)."""
        key = next(self._keys)
        self.items[key] = item
        return key

    def __len__(self) -> int:
        return len(self.items)


_OutputCallback = Callable[[bytes], None]
_OUTPUTS: Keyed[_OutputCallback] = Keyed()
_OUTPUT_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_ssize_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_ubyte), ctypes.c_size_t
)


@_OUTPUT_CALLBACK  # type: ignore[untyped-decorator]
def _on_output(key: int | None, data: Any, size: int) -> int:
    """WASI's write to the stream of `key`: the bytes to its callback (as wasmtime-py's
    `custom_call`: all of them taken; an exception is an I/O error for the guest)."""
    try:
        callback = _OUTPUTS.items[key or 0]
        callback(ctypes.string_at(data, size))
        return size
    except Exception:
        _log.exception("WASI output callback failed")
        return -errno.EIO


def set_output(wasi: wasmtime.WasiConfig, stream: str, callback: _OutputCallback) -> None:
    """Send what the guest writes to `stream` ("stdout" or "stderr") to `callback`, on
    the thread running the guest, until the store using `wasi` is dropped."""
    key = _OUTPUTS.add(callback)
    set_custom = (
        ffi.wasi_config_set_stdout_custom
        if stream == "stdout"
        else ffi.wasi_config_set_stderr_custom
    )
    set_custom(wasi.ptr(), _on_output, key, _OUTPUTS.dropped)
