"""Quick wasmtime C calls that keep the GIL.

wasmtime-py loads its library with `ctypes.CDLL`: every call releases the GIL and takes
it back. When other threads want the GIL (the event loop, the SQLite writer, other runs,
a hundred workflow threads), each release is a hand-off: the calling thread sleeps until
it gets the GIL back, a cross-core wake-up that costs far more than the call itself. A
trivial activity run makes some twenty such calls, a JS workflow ~460 per run plus ~29 per
host call (`engine.runtimes.js.workflow`).

`keep_gil()` rebinds the functions of `QUICK_C_FUNCTIONS` — they return at once and never
run guest code — through `ctypes.PyDLL` (same library handle, same signatures), in
wasmtime-py's `_bindings` module, for every user of wasmtime-py. `quick(name)` gives a
GIL-keeping binding of any function without installing it, for callers that know a call
is short (`wasmtime_func_call` of the QuickJS guest's bridge exports);
`memmove_keeping_gil`, `memset_keeping_gil` and `zero_memory` write into a guest's
memory the same way. Calls that may run long guest code (instantiate, calling user
code) must keep releasing the GIL: a long guest must not stop the other threads, and the
epoch ticker needs the GIL to interrupt it.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any

log = logging.getLogger("obelisk.wasm")

#: C functions of wasmtime that return at once and never run guest code: setting up and
#: dropping a store, WASI configuration, looking up exports and types, reading memory
#: bounds, freeing values. (A host callback's parameter conversion uses the type calls.)
QUICK_C_FUNCTIONS = (
    "wasmtime_store_new",
    "wasmtime_store_context",
    "wasmtime_store_delete",
    "wasmtime_store_epoch_deadline_callback",
    "wasmtime_store_limiter",
    "wasmtime_context_set_epoch_deadline",
    "wasmtime_engine_increment_epoch",
    "wasi_config_new",
    "wasi_config_set_env",
    "wasi_config_inherit_stdout",
    "wasi_config_inherit_stderr",
    "wasi_config_set_stdout_custom",
    "wasi_config_set_stderr_custom",
    "wasmtime_context_set_wasi",
    "wasmtime_context_set_wasi_http",
    "wasmtime_component_instance_get_func",
    "wasmtime_component_val_delete",
    "wasmtime_component_export_index_delete",
    "wasmtime_instance_export_nth",
    "wasmtime_instance_export_get",
    "wasmtime_caller_context",
    "wasmtime_caller_export_get",
    "wasmtime_memory_data",
    "wasmtime_memory_data_size",
    "wasmtime_memory_size",
    "wasmtime_memory_grow",
    "wasmtime_memory_type",
    "wasmtime_global_type",
    "wasmtime_global_get",
    "wasmtime_global_set",
    "wasmtime_func_type",
    "wasmtime_val_unroot",
    "wasm_valtype_new",
    "wasm_valtype_kind",
    "wasm_valtype_delete",
    "wasm_functype_params",
    "wasm_functype_results",
    "wasm_functype_delete",
    "wasm_globaltype_content",
    "wasm_globaltype_delete",
    "wasm_memorytype_delete",
)

_pydll: ctypes.PyDLL | None = None
_installed = False


def _library() -> ctypes.PyDLL | None:
    global _pydll
    if _pydll is None:
        try:
            from wasmtime import _ffi as ffi  # noqa: PLC2701 (wasmtime internals, version pinned)

            _pydll = ctypes.PyDLL(ffi.dll._name)
        except (ImportError, AttributeError, OSError) as e:  # pragma: no cover
            log.debug("quick wasmtime calls keep releasing the GIL: %s", e)
            return None
    return _pydll


def quick(name: str) -> Any | None:
    """A binding of wasmtime's C function `name` that keeps the GIL, with wasmtime-py's
    signature; None when this wasmtime-py version has no such function."""
    from wasmtime import _bindings as bindings  # noqa: PLC2701 (wasmtime internals, version pinned)

    library = _library()
    current = getattr(bindings, f"_{name}", None)
    if library is None or current is None or not hasattr(library, name):
        return None
    fn = getattr(library, name)
    fn.restype = current.restype
    fn.argtypes = current.argtypes
    return fn


def keep_gil() -> None:
    """Install the GIL-keeping bindings of `QUICK_C_FUNCTIONS` (once)."""
    global _installed
    if _installed:
        return
    from wasmtime import _bindings as bindings  # noqa: PLC2701 (wasmtime internals, version pinned)

    for name in QUICK_C_FUNCTIONS:
        fn = quick(name)
        if fn is not None:
            setattr(bindings, f"_{name}", fn)
    _installed = True


#: `ctypes.memmove` without the GIL hand-off: ctypes binds its own `memmove` with
#: `CFUNCTYPE`, which releases the GIL around every call. For the short copies into a
#: guest's memory (a page, a host call's payload) that release is the same hand-off as
#: above: under contention a heap image restore of ~90 pages took ~15 ms of wall-clock
#: time for ~0.8 ms of CPU.
memmove_keeping_gil = ctypes.PYFUNCTYPE(
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
)(ctypes._memmove_addr)  # type: ignore[attr-defined]


#: `ctypes.memset`, likewise without the GIL hand-off.
memset_keeping_gil = ctypes.PYFUNCTYPE(
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
)(
    ctypes._memset_addr  # type: ignore[attr-defined]
)

_MADV_DONTNEED = 4
_OS_PAGE = 4096


def _madvise() -> Any | None:
    if not sys.platform.startswith("linux"):
        return None  # elsewhere MADV_DONTNEED need not leave zeros behind
    try:
        fn = ctypes.PyDLL(None).madvise  # the process's libc, called keeping the GIL
    except (AttributeError, OSError):  # pragma: no cover - a libc without madvise
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


_madvise_fn = _madvise()


def zero_memory(address: int, size: int) -> None:
    """Make `size` bytes at `address` of a guest's linear memory zeros.

    Whole OS pages are given back to the kernel (`madvise(MADV_DONTNEED)`), which maps
    zero pages in on the next touch: pages the guest never wrote cost nothing, where a
    `memset` would page-fault each of them in to write zeros it already had (~0.2 ms
    per JS sandbox reset under load, for a 1.4 MiB memory of which a run touches a
    few pages). Only for memory whose pages read as zeros after that: a private,
    anonymous mapping, as wasmtime's linear memories without an initial image are (the
    callers' tests compare the result with a fresh guest byte for byte). The unaligned
    ends, a failed `madvise`, and everything off Linux are zeroed with `memset`."""
    start = -address % _OS_PAGE
    whole = (size - start) // _OS_PAGE * _OS_PAGE if size > start else 0
    if _madvise_fn is None or whole == 0 or _madvise_fn(address + start, whole, _MADV_DONTNEED):
        memset_keeping_gil(address, 0, size)
        return
    if start:
        memset_keeping_gil(address, 0, start)
    if (tail := size - start - whole) > 0:
        memset_keeping_gil(address + start + whole, 0, tail)
