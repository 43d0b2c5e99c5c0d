"""Leaner guest calls and memory access for quickjs-rs 0.2.6 instances (optional).

Every value that crosses the QuickJS boundary costs several guest calls, and a JS run
makes hundreds of them: its setup, each host call, each value read back. quickjs-rs goes
through wasmtime-py's generic `Func.__call__` (the function's type rebuilt and every
argument converted through `Val` objects on every call) and `Memory.read`/`write` (a new
ctypes array type per access, two copies). `fast_guest_calls(inst)` replaces both on one
instance with equivalents that cache the export signatures and copy once. Used by JS
workflows (`engine.workflow.js_runtime`) and JS activities (`engine.workers.js_activity`);
each has a switch the tests flip to check both paths give the same results.
"""

from __future__ import annotations

from typing import Any

from engine.workers.gil import _library, quick

__all__ = ["fast_guest_calls"]


_VAL_FIELDS = ("i32", "i64", "f32", "f64")

#: Export name → (param kinds, result kind or -1, params array type, results array
#: type); the same for every instance of the QuickJS guest module.
_SIGNATURES: dict[str, tuple[tuple[int, ...], int, Any, Any]] = {}

#: Guest exports that run no JS code (allocation, strings, numbers, handles): called
#: without releasing the GIL (`engine.workers.gil`). Everything else — evaluating,
#: calling, property access (getters, proxies), pending jobs — may run the guest's
#: code for as long as it likes and releases the GIL as usual.
_QUICK_EXPORTS = frozenset(
    {
        "qjs_alloc", "qjs_free", "qjs_last_len", "qjs_last_ptr", "qjs_result_free",
        "get_string", "get_number", "get_bool", "get_bigint", "new_string", "new_number",
        "new_bool", "new_null", "new_undefined", "new_object", "new_array", "free_value",
        "dup_handle", "type_of", "is_promise", "promise_state", "global_object",
        "set_max_stack_size", "set_memory_limit",
    }
)


def fast_guest_calls(inst: Any) -> bool:
    """Replace `inst.c` (quickjs-rs's "call a guest export") by a leaner equivalent.

    Every value that crosses the QuickJS boundary costs several guest calls, and
    wasmtime-py's generic `Func.__call__` rebuilds the function's type and converts each
    argument through `Val` objects on every call (~5x the cost of the call itself).
    This version caches the export's numeric signature and calls `wasmtime_func_call`
    directly, with the same bookkeeping as the original (`_CUR.inst` for the import
    trampolines; traps and errors raised the same way, a Python exception from a host
    callback first). Only numeric signatures are supported, which is all the QuickJS
    guest exports; on anything unexpected it leaves `inst.c` alone and returns False.
    Pinned to quickjs-rs 0.2.6 / wasmtime-py 50 (the tests check it is active).
    """
    try:
        import ctypes

        import wasmtime._func as wasmtime_func
        from quickjs_rs import _engine as qjs_engine
        from wasmtime import Trap, ValType, WasmtimeError
        from wasmtime import _ffi as ffi

        kinds = {
            str(ValType.i32()): 0,
            str(ValType.i64()): 1,
            str(ValType.f32()): 2,
            str(ValType.f64()): 3,
        }
        store = inst.store
        exports = inst._exports
        cur = qjs_engine._CUR
        func_call = ffi.wasmtime_func_call
        quick_call = quick("wasmtime_func_call") or func_call
        val_t = ffi.wasmtime_val_t
        trap_ptr_t = ctypes.POINTER(ffi.wasm_trap_t)
        byref = ctypes.byref
        maybe_raise_last_exn = wasmtime_func.maybe_raise_last_exn
        cache: dict[str, tuple[Any, tuple[int, ...], int, Any, Any, Any]] = {}

        def signature(name: str) -> tuple[Any, tuple[int, ...], int, Any, Any, Any]:
            fn = exports[name]
            sig = _SIGNATURES.get(name)
            if sig is None:
                ty = fn.type(store)
                params = tuple(kinds[str(p)] for p in ty.params)
                results = tuple(kinds[str(r)] for r in ty.results)
                if len(results) > 1:
                    raise TypeError(f"guest export {name} returns several values")
                sig = (params, results[0] if results else -1, val_t * len(params), val_t * 1)
                _SIGNATURES[name] = sig
            call = quick_call if name in _QUICK_EXPORTS else func_call
            entry = (fn._func, *sig, call)
            cache[name] = entry
            return entry

        def c(name: str, *args: Any) -> Any:
            entry = cache.get(name)
            if entry is None:
                entry = signature(name)
            func, param_kinds, result_kind, params_t, results_t, call = entry
            if len(args) != len(param_kinds):
                raise WasmtimeError(
                    f"{name}: given {len(args)} parameters, expected {len(param_kinds)}"
                )
            params = params_t()
            for i, kind in enumerate(param_kinds):
                slot = params[i]
                slot.kind = kind
                setattr(slot.of, _VAL_FIELDS[kind], args[i])
            results = results_t()
            prev = getattr(cur, "inst", None)
            cur.inst = inst
            try:
                trap = trap_ptr_t()
                error = call(
                    store._context(),
                    byref(func),
                    params,
                    len(param_kinds),
                    results,
                    0 if result_kind < 0 else 1,
                    byref(trap),
                )
                if error:
                    maybe_raise_last_exn()
                    raise WasmtimeError._from_ptr(error)
                if trap:
                    trap_obj = Trap._from_ptr(trap)
                    maybe_raise_last_exn()
                    raise trap_obj
            finally:
                cur.inst = prev
            if result_kind < 0:
                return None
            return getattr(results[0].of, _VAL_FIELDS[result_kind])

        # Validate the signatures this build relies on before switching over.
        for name in ("qjs_alloc", "qjs_free", "get_string", "new_string", "eval_code"):
            signature(name)
        inst.c = c
        _fast_memory(inst)
        return True
    except Exception:
        return False


def _fast_memory(inst: Any) -> None:
    """Replace `inst.read` and `inst.alloc_write` by direct copies from and to the guest's
    linear memory. wasmtime-py's `Memory.read`/`write` ask for the memory's size twice,
    build a new ctypes array type per call and copy twice; this asks for the base
    address and the size (GIL-keeping calls) and copies once. The base is asked for at
    every access: the memory may grow and move. Same bounds checks and errors."""
    import ctypes

    from quickjs_rs._engine import QuickJSError as GuestMemoryError  # as `inst.read` raises

    library = _library()
    if library is None:
        return
    data = library["wasmtime_memory_data"]  # a binding of its own: its restype is ours
    data.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    data.restype = ctypes.c_void_p
    size = library["wasmtime_memory_data_size"]
    size.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    size.restype = ctypes.c_size_t
    context = ctypes.cast(inst.store._context(), ctypes.c_void_p).value
    memory = ctypes.addressof(inst.mem._memory)
    string_at = ctypes.string_at
    memmove = ctypes.memmove
    c = inst.c

    def read(ptr: int, length: int) -> bytes:
        if ptr < 0 or length < 0 or ptr + length > size(context, memory):
            raise GuestMemoryError(f"out-of-range guest read ptr={ptr} len={length}")
        return string_at(data(context, memory) + ptr, length)

    def alloc_write(payload: bytes) -> int:
        n = len(payload)
        p = c("qjs_alloc", n)
        if p == 0 and n > 0:
            raise GuestMemoryError("qjs_alloc returned null")
        if n:
            address = p & 0xFFFFFFFF  # an i32: above 2 GiB it comes back negative
            if address + n > size(context, memory):
                raise IndexError("index out of range")
            memmove(data(context, memory) + address, payload, n)
        return int(p)

    inst.read = read
    inst.alloc_write = alloc_write


