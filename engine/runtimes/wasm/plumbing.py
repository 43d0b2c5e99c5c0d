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
- `RunStore`: a run's store, WASI context, instance and function handled with
  wasmtime's C calls directly. wasmtime-py's `Store`, `WasiConfig`, `Linker.instantiate`,
  `Instance` and `Func` spend ~60 Python calls per run on ownership bookkeeping
  (`Managed.ptr`, `_context()`, wrapper objects, finalizers) around a dozen C calls;
  every Python call of a run is GIL time the workflows and the writer wait for.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import wasmtime
from wasmtime import WasmtimeError
from wasmtime import _bindings as bindings  # noqa: PLC2701 (wasmtime internals, version pinned)
from wasmtime import _ffi as ffi  # noqa: PLC2701 (wasmtime internals, version pinned)

from engine.runtimes.gil import keep_gil
from engine.runtimes.outcome import LogStream

__all__ = ["Keyed", "OutputWriter", "RunStore", "SlotTokens"]

# The GIL-keeping bindings first: `RunStore` binds wasmtime's C functions below, once.
keep_gil()

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


#: Where a run's guest output goes: `(stream, bytes)`.
OutputWriter = Callable[[LogStream, bytes], None]
_OUTPUTS: Keyed[OutputWriter] = Keyed()
_OUTPUT_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_ssize_t, ctypes.c_void_p, ctypes.POINTER(ctypes.c_ubyte), ctypes.c_size_t
)


def _output(stream: LogStream, key: int | None, data: Any, size: int) -> int:
    """WASI's write to `stream` of the run of `key`: the bytes to its writer (as
    wasmtime-py's `custom_call`: all of them taken; an exception is an I/O error for the
    guest)."""
    try:
        _OUTPUTS.items[key or 0](stream, ctypes.string_at(data, size))
        return size
    except Exception:
        _log.exception("WASI output callback failed")
        return -errno.EIO


@_OUTPUT_CALLBACK  # type: ignore[untyped-decorator]
def _on_stdout(key: int | None, data: Any, size: int) -> int:
    return _output("stdout", key, data, size)


@_OUTPUT_CALLBACK  # type: ignore[untyped-decorator]
def _on_stderr(key: int | None, data: Any, size: int) -> int:
    return _output("stderr", key, data, size)


# wasmtime's C functions, bound once (`_bindings`' `_name` objects: its `name` functions
# are a Python call each around them). Those of `engine.runtimes.gil.QUICK_C_FUNCTIONS`
# keep the GIL; instantiating and calling run guest code and release it.
_store_new = bindings._wasmtime_store_new
_store_context = bindings._wasmtime_store_context
_store_delete = bindings._wasmtime_store_delete
_wasi_config_new = bindings._wasi_config_new
_set_stdout = bindings._wasi_config_set_stdout_custom
_set_stderr = bindings._wasi_config_set_stderr_custom
_context_set_wasi = bindings._wasmtime_context_set_wasi
_context_set_wasi_http = bindings._wasmtime_context_set_wasi_http
_linker_instantiate = bindings._wasmtime_component_linker_instantiate
_instance_get_func = bindings._wasmtime_component_instance_get_func
_NO_FINALIZER = ctypes.cast(0, ctypes.CFUNCTYPE(None, ctypes.c_void_p))
_byref = ctypes.byref


class RunStore:
    """The wasmtime store of one activity run (see the module's docstring), made and
    dropped with C calls. For wasmtime-py's value conversions and type lookups it is a
    store (`_context()`, `ptr()`)."""

    __slots__ = ("_on_close", "_ptr", "context")

    def __init__(self, engine_ptr: Any, on_close: Callable[[], None] | None = None) -> None:
        """A store of the engine `engine_ptr` (`wasmtime.Engine.ptr()`); `on_close` is
        called once, when it is closed."""
        self._ptr: Any = _store_new(engine_ptr, None, _NO_FINALIZER)
        #: The store's context; None once closed.
        self.context: Any = _store_context(self._ptr)
        self._on_close = on_close

    def ptr(self) -> Any:
        if self._ptr is None:
            raise ValueError("already closed")
        return self._ptr

    def _context(self) -> Any:
        if self.context is None:
            raise ValueError("already closed")
        return self.context

    def set_wasi(self, env: Mapping[str, str], output: OutputWriter) -> None:
        """WASI (with `env` as its environment, stdout and stderr to `output` on the
        thread running the guest, until the store is closed) and wasi:http."""
        if env:
            config = wasmtime.WasiConfig()
            config.env = list(env.items())
            wasi = config._consume()
        else:
            wasi = _wasi_config_new()
        key = _OUTPUTS.add(output)
        # One key for both streams, given back once (by stderr's) with the store: both
        # streams are dropped with it.
        _set_stdout(wasi, _on_stdout, key, _NO_FINALIZER)
        _set_stderr(wasi, _on_stderr, key, _OUTPUTS.dropped)
        if error := _context_set_wasi(self.context, wasi):
            raise WasmtimeError._from_ptr(error)
        _context_set_wasi_http(self.context)

    def instantiate(self, linker_ptr: Any, component_ptr: Any) -> Any:
        """`wasmtime.component.Linker.instantiate`: the raw instance."""
        instance = ffi.wasmtime_component_instance_t()
        if error := _linker_instantiate(linker_ptr, self.context, component_ptr, _byref(instance)):
            raise WasmtimeError._from_ptr(error)
        return instance

    def get_func(self, instance: Any, index_ptr: Any) -> Any | None:
        """The raw function of `instance` at the export index `index_ptr`, or None."""
        func = ffi.wasmtime_component_func_t()
        if not _instance_get_func(_byref(instance), self.context, index_ptr, _byref(func)):
            return None
        return func

    def close(self) -> None:
        """Drop the store (its instance slot is free once this returns); idempotent."""
        if self._ptr is not None:
            _store_delete(self._ptr)
            self._ptr = self.context = None
            if self._on_close is not None:
                self._on_close()
