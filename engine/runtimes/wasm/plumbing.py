"""The per-run plumbing of WASM activity runs, kept to C calls where wasmtime-py and
`threading` would spend Python calls on every run.

- `SlotTokens`: the pooled engine's instance slots, a counting semaphore on a C queue
  (`threading.BoundedSemaphore` is Python code over a `Condition`: ~8 Python calls per
  acquire and release).
- `set_output`: a WASI stdout/stderr callback through one static C callback and a
  key, instead of wasmtime-py's `WasiConfig.stdout_custom` (a slab entry allocated,
  looked up and freed through Python calls for every run and stream).
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import wasmtime
from wasmtime import _ffi as ffi  # noqa: PLC2701 (wasmtime internals, version pinned)

__all__ = ["SlotTokens", "set_output"]

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


_OutputCallback = Callable[[bytes], None]
_OUTPUTS: dict[int, _OutputCallback] = {}
_output_keys = itertools.count(1)


_OUTPUT_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_ssize_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_ubyte), ctypes.c_size_t
)


@_OUTPUT_CALLBACK  # type: ignore[untyped-decorator]
def _on_output(key: int | None, data: Any, size: int) -> int:
    """WASI's write to the stream of `key`: the bytes to its callback (as wasmtime-py's
    `custom_call`: all of them taken; an exception is an I/O error for the guest)."""
    try:
        callback = _OUTPUTS[key or 0]
        callback(ctypes.string_at(data, size))
        return size
    except Exception:
        _log.exception("WASI output callback failed")
        return -errno.EIO


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # type: ignore[untyped-decorator]
def _on_output_dropped(key: int | None) -> None:
    """The store (its WASI context) is gone: so is the callback."""
    _OUTPUTS.pop(key or 0, None)


def set_output(wasi: wasmtime.WasiConfig, stream: str, callback: _OutputCallback) -> None:
    """Send what the guest writes to `stream` ("stdout" or "stderr") to `callback`, on
    the thread running the guest, until the store using `wasi` is dropped."""
    key = next(_output_keys)
    _OUTPUTS[key] = callback
    set_custom = (
        ffi.wasi_config_set_stdout_custom
        if stream == "stdout"
        else ffi.wasi_config_set_stderr_custom
    )
    set_custom(wasi.ptr(), _on_output, key, _on_output_dropped)
