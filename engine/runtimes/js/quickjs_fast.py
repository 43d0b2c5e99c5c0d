"""Leaner guest calls and memory access for quickjs-rs 0.2.6 instances (optional).

Every value that crosses the QuickJS boundary costs several guest calls, and a JS run
makes hundreds of them: its setup, each host call, each value read back. quickjs-rs goes
through wasmtime-py's generic `Func.__call__` (the function's type rebuilt and every
argument converted through `Val` objects on every call) and `Memory.read`/`write` (a new
ctypes array type per access, two copies). `fast_guest_calls(inst)` replaces both on one
instance with equivalents that cache the export signatures and copy once. Used by JS
workflows (`engine.runtimes.js.workflow`) and JS activities (`engine.runtimes.js.activity`);
each has a switch the tests flip to check both paths give the same results.

`install_lazy_exports()` (process-wide, for every QuickJS sandbox) makes a new instance
look its exports up by name when first used, instead of wrapping all 55 of them up front.
`install_lean_host_imports()` (process-wide too) gives the guest's four host imports
trampolines that read and write their i32s directly.
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any

import wasmtime
import wasmtime._func as wasmtime_func  # noqa: PLC2701 (wasmtime internals, version pinned)
from quickjs_rs import ConcurrentEvalError, DeadlockError, QuickJSError
from quickjs_rs.handle import Handle
from wasmtime import _ffi as wasmtime_ffi  # noqa: PLC2701 (wasmtime internals, version pinned)
from wasmtime._extern import wrap_extern  # noqa: PLC2701 (wasmtime internals, version pinned)

from engine.runtimes.gil import _library, memmove_keeping_gil, quick

__all__ = [
    "LazyExports",
    "define_lean_import",
    "fast_guest_calls",
    "install_lazy_exports",
    "install_lean_host_imports",
    "lean_trampoline",
    "map_host_function",
]


_VAL_FIELDS = ("i32", "i64", "f32", "f64")

#: Export name → (param kinds, result kind or -1, params array type, results array
#: type); the same for every instance of the QuickJS guest module.
_SIGNATURES: dict[str, tuple[tuple[int, ...], int, Any, Any]] = {}

#: Guest exports that run no JS code (allocation, strings, numbers, handles): called
#: without releasing the GIL (`engine.runtimes.gil`). Everything else — evaluating,
#: calling, property access (getters, proxies), pending jobs — may run the guest's
#: code for as long as it likes and releases the GIL as usual.
_QUICK_EXPORTS = frozenset(
    {
        "qjs_alloc",
        "qjs_free",
        "qjs_last_len",
        "qjs_last_ptr",
        "qjs_result_free",
        "get_string",
        "get_number",
        "get_bool",
        "get_bigint",
        "new_string",
        "new_number",
        "new_bool",
        "new_null",
        "new_undefined",
        "new_object",
        "new_array",
        "free_value",
        "dup_handle",
        "type_of",
        "is_promise",
        "promise_state",
        "global_object",
        "set_max_stack_size",
        "set_memory_limit",
    }
)


@functools.cache
def _call_bindings() -> dict[str, Any]:
    """What every instance's `c` needs, looked up once per process."""
    from quickjs_rs import _engine as qjs_engine  # noqa: PLC2701 (quickjs_rs internals, version pinned)
    from wasmtime import Trap, ValType, WasmtimeError

    func_call = wasmtime_ffi.wasmtime_func_call
    return {
        "kinds": {
            str(ValType.i32()): 0,
            str(ValType.i64()): 1,
            str(ValType.f32()): 2,
            str(ValType.f64()): 3,
        },
        "cur": qjs_engine._CUR,
        "func_call": func_call,
        "quick_call": quick("wasmtime_func_call") or func_call,
        "trap_ptr_t": ctypes.POINTER(wasmtime_ffi.wasm_trap_t),
        "maybe_raise_last_exn": wasmtime_func.maybe_raise_last_exn,
        "Trap": Trap,
        "WasmtimeError": WasmtimeError,
    }


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
        b = _call_bindings()
        kinds = b["kinds"]
        store = inst.store
        exports = inst._exports
        cur = b["cur"]
        func_call = b["func_call"]
        quick_call = b["quick_call"]
        trap_ptr_t = b["trap_ptr_t"]
        maybe_raise_last_exn = b["maybe_raise_last_exn"]
        trap_class = b["Trap"]
        error_class = b["WasmtimeError"]
        val_t = wasmtime_ffi.wasmtime_val_t
        byref = ctypes.byref
        raw_func = exports.raw_func if isinstance(exports, LazyExports) else None
        cache: dict[str, tuple[Any, tuple[int, ...], int, Any, Any, Any]] = {}

        def signature(name: str) -> tuple[Any, tuple[int, ...], int, Any, Any, Any]:
            sig = _SIGNATURES.get(name)
            if sig is None:
                ty = exports[name].type(store)
                params = tuple(kinds[str(p)] for p in ty.params)
                results = tuple(kinds[str(r)] for r in ty.results)
                if len(results) > 1:
                    raise TypeError(f"guest export {name} returns several values")
                sig = (params, results[0] if results else -1, val_t * len(params), val_t * 1)
                _SIGNATURES[name] = sig
            func = raw_func(name) if raw_func is not None else exports[name]._func
            call = quick_call if name in _QUICK_EXPORTS else func_call
            entry = (func, *sig, call)
            cache[name] = entry
            return entry

        def c(name: str, *args: Any) -> Any:
            entry = cache.get(name)
            if entry is None:
                entry = signature(name)
            func, param_kinds, result_kind, params_t, results_t, call = entry
            if len(args) != len(param_kinds):
                raise error_class(
                    f"{name}: given {len(args)} parameters, expected {len(param_kinds)}"
                )
            params = params_t()
            for i, kind in enumerate(param_kinds):
                slot = params[i]
                slot.kind = kind
                setattr(slot.of, _VAL_FIELDS[kind], args[i])
            results = results_t()
            # `store._context()` without the call: the pointer, None once closed.
            if (context := store._Store__context) is None:
                raise ValueError("already closed")
            prev = getattr(cur, "inst", None)
            cur.inst = inst
            try:
                trap = trap_ptr_t()
                error = call(
                    context,
                    byref(func),
                    params,
                    len(param_kinds),
                    results,
                    0 if result_kind < 0 else 1,
                    byref(trap),
                )
                if error:
                    maybe_raise_last_exn()
                    raise error_class._from_ptr(error)
                if trap:
                    trap_obj = trap_class._from_ptr(trap)
                    try:
                        maybe_raise_last_exn()
                        raise trap_obj
                    finally:
                        # The trap's traceback holds this frame: as a local too, it
                        # would make a cycle that keeps the frames below (and the
                        # guest call's arguments, a whole JS source) until a full GC.
                        del trap_obj
            finally:
                cur.inst = prev
            if result_kind < 0:
                return None
            return getattr(results[0].of, _VAL_FIELDS[result_kind])

        if not _context_is_readable(store):
            return False  # not the Store this was written for
        # Validate the signatures this build relies on before switching over.
        for name in ("qjs_alloc", "qjs_free", "get_string", "new_string", "eval_code"):
            signature(name)
        inst.c = c
        _fast_memory(inst)
        return True
    except Exception:
        return False


def _context_is_readable(store: Any) -> bool:
    """Whether `store._Store__context` is what `store._context()` returns (wasmtime-py
    50's private attribute; the fast path reads it without a call)."""
    context = getattr(store, "_Store__context", None)
    return context is not None and context is store._context()


@functools.cache
def _memory_bindings() -> tuple[Any, Any] | None:
    """GIL-keeping `wasmtime_memory_data` and `_data_size` taking plain addresses."""
    library = _library()
    if library is None:
        return None
    data = library["wasmtime_memory_data"]  # a binding of its own: its restype is ours
    data.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    data.restype = ctypes.c_void_p
    size = library["wasmtime_memory_data_size"]
    size.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    size.restype = ctypes.c_size_t
    return data, size


def _fast_memory(inst: Any) -> None:
    """Replace `inst.read` and `inst.alloc_write` by direct copies from and to the guest's
    linear memory. wasmtime-py's `Memory.read`/`write` ask for the memory's size twice,
    build a new ctypes array type per call and copy twice; this asks for the base
    address and the size (GIL-keeping calls) and copies once. The base is asked for at
    every access: the memory may grow and move. Same bounds checks and errors."""
    from quickjs_rs._engine import QuickJSError as GuestMemoryError  # as `inst.read` raises  # noqa: PLC2701 (quickjs_rs internals, version pinned)

    bindings = _memory_bindings()
    if bindings is None:
        return
    data, size = bindings
    context = ctypes.cast(inst.store._context(), ctypes.c_void_p).value
    memory = ctypes.addressof(inst.mem._memory)
    # `ctypes.string_at` is a Python function around this C one (a call per read).
    string_at = getattr(ctypes, "_string_at", ctypes.string_at)
    memmove = memmove_keeping_gil
    c = inst.c

    def read(ptr: int, length: int) -> bytes:
        if ptr < 0 or length < 0 or ptr + length > size(context, memory):
            raise GuestMemoryError(f"out-of-range guest read ptr={ptr} len={length}")
        return string_at(data(context, memory) + ptr, length)

    def write_at(ptr: int, payload: bytes) -> None:
        """Copy `payload` to guest memory the caller allocated (`ptr` from `qjs_alloc`)."""
        address = ptr & 0xFFFFFFFF  # an i32: above 2 GiB it comes back negative
        if address + len(payload) > size(context, memory):
            raise IndexError("index out of range")
        memmove(data(context, memory) + address, payload, len(payload))

    def alloc_write(payload: bytes) -> int:
        n = len(payload)
        p = c("qjs_alloc", n)
        if p == 0 and n > 0:
            raise GuestMemoryError("qjs_alloc returned null")
        if n:
            write_at(p, payload)
        return int(p)

    inst.read = read
    inst.alloc_write = alloc_write
    inst.write_at = write_at


class LazyExports(Mapping[str, Any]):
    """An instance's exports, each looked up by name when first asked for.

    wasmtime-py's `Instance.exports()` wraps every export of the instance at once: for
    the QuickJS guest's 55, ~260 µs, more than instantiating it (~20 µs). A run uses a
    dozen or two. Iterating (which nobody here does) builds the full mapping."""

    def __init__(self, store: Any, instance: Any) -> None:
        self._store = store
        self._instance = instance
        self._found: dict[str, Any] = {}
        self._all: Any = None

    def __getitem__(self, name: str) -> Any:
        found = self._found.get(name)
        if found is None:
            found = self._found[name] = wrap_extern(self._extern(name))
        return found

    def raw_func(self, name: str) -> Any:
        """The `wasmtime_func_t` of function export `name`, without a `Func` around it
        (what `fast_guest_calls` passes to `wasmtime_func_call`)."""
        item = self._extern(name)
        if item.kind != wasmtime_ffi.WASMTIME_EXTERN_FUNC.value:
            raise KeyError(f"{name} is not a function")
        return item.of.func

    def _extern(self, name: str) -> Any:
        raw = name.encode()
        item = wasmtime_ffi.wasmtime_extern_t()
        # `store._context()` without the call (as in `fast_guest_calls`): None once closed.
        if (context := self._store._Store__context) is None:
            raise ValueError("already closed")
        if not wasmtime_ffi.wasmtime_instance_export_get(
            context,
            ctypes.byref(self._instance._instance),
            raw,
            len(raw),
            ctypes.byref(item),
        ):
            raise KeyError(name)
        return item

    def _everything(self) -> Any:
        if self._all is None:
            from wasmtime._instance import InstanceExports  # noqa: PLC2701 (wasmtime internals, version pinned)

            self._all = InstanceExports(self._store, self._instance)
        return self._all

    def __iter__(self) -> Iterator[str]:
        return iter(self._everything())

    def __len__(self) -> int:
        return len(self._everything())


def install_lazy_exports() -> bool:
    """Make quickjs-rs instantiate its sandboxes with `LazyExports` (idempotent; False
    when this quickjs-rs does not instantiate the way 0.2.6 does)."""
    try:
        from quickjs_rs import _engine as qjs_engine  # noqa: PLC2701 (quickjs_rs internals, version pinned)
        from quickjs_rs import _wasmtime as qjs_wasmtime  # noqa: PLC2701 (quickjs_rs internals, version pinned)
    except ImportError:
        return False
    current = vars(qjs_engine).get("instantiate_wasm_artifact")
    if getattr(current, "lazy_exports", False):
        return True
    if current is not qjs_wasmtime.instantiate_wasm_artifact:
        return False  # not the function we know: leave it alone

    def instantiate(artifact: Any, store: Any) -> Any:
        instance = current(artifact, store)
        if getattr(instance, "_exports", "?") is None:  # what `exports()` returns if set
            instance._exports = LazyExports(store, instance)  # type: ignore[assignment]
        return instance

    instantiate.lazy_exports = True  # type: ignore[attr-defined]
    qjs_engine.instantiate_wasm_artifact = instantiate  # type: ignore[attr-defined]
    return True


def map_host_function(ctx: Any, name: str, fn: Any, *, is_async: bool = False) -> None:
    """The Python side of quickjs-rs 0.2.6's `Context.register`, for a sandbox restored
    from a heap image whose guest already has the function `name` (the guest calls host
    functions by name): its calls reach `fn`."""
    fn_id = ctx._next_fn_id
    ctx._next_fn_id += 1
    ctx._host_registry[fn_id] = fn
    inst = ctx._engine_ctx._inst
    inst.name_to_fn_id[name] = fn_id
    if is_async:
        inst.async_names.add(name)
    else:
        inst.async_names.discard(name)


#: The host imports of the QuickJS guest (quickjs-rs 0.2.6's `_build_shared_linker`):
#: name, number of i32 parameters, the module-level shim of `quickjs_rs._engine` that
#: routes a call to the instance running on this thread. Each returns one i32.
_HOST_IMPORTS = (
    ("host_call", 5, "_tramp_host_call"),
    ("host_interrupt", 0, "_tramp_host_interrupt"),
    ("host_module_normalize", 5, "_tramp_host_module_normalize"),
    ("host_module_load", 3, "_tramp_host_module_load"),
)

#: The C callbacks given to wasmtime: they must live as long as the process.
_LEAN_TRAMPOLINES: list[Any] = []


def lean_trampoline(target: Any, arity: int) -> Any:
    """A `wasmtime_func_callback_t` for a host import taking `arity` i32s and returning
    one, calling `target` with plain ints.

    wasmtime-py's generic trampoline wraps the caller, converts each parameter through a
    `Val` and the result through `ValType` comparisons: ~45 Python calls per host call,
    one host call per workflow step. This one makes none but `target`'s. Same contract:
    a result that is not an int is a `TypeError`; an exception (a `BaseException`, as
    wasmtime-py) becomes wasmtime-py's pending exception (`LAST_EXCEPTION`, raised by
    the guest call's `maybe_raise_last_exn`) and a trap for the guest."""
    i32 = wasmtime_ffi.WASMTIME_I32.value
    void_p = ctypes.c_void_p
    cast = ctypes.cast

    def callback(
        _env: Any, _caller: Any, params: Any, _n: int, results: Any, _m: int
    ) -> int | None:
        try:
            if arity == 5:
                value = target(
                    params[0].of.i32,
                    params[1].of.i32,
                    params[2].of.i32,
                    params[3].of.i32,
                    params[4].of.i32,
                )
            elif arity == 0:
                value = target()
            else:
                value = target(*(params[i].of.i32 for i in range(arity)))
            if not isinstance(value, int):
                raise TypeError(f"don't know how to convert {value!r} to i32")
            result = results[0]
            result.kind = i32
            result.of.i32 = value
            return 0
        except BaseException as e:
            # (wasmtime-py's own trampoline stores any BaseException there too.)
            wasmtime_func.LAST_EXCEPTION = e  # type: ignore[assignment]
            trap = wasmtime.Trap("python exception")._consume()
            return cast(trap, void_p).value  # (as wasmtime-py's trampoline)

    trampoline = wasmtime_ffi.wasmtime_func_callback_t(callback)
    _LEAN_TRAMPOLINES.append(trampoline)
    return trampoline


_NO_FINALIZER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)()  # NULL: nothing to free


def define_lean_import(linker: Any, module: str, name: str, arity: int, trampoline: Any) -> None:
    """Define `module`.`name` (`arity` i32s → i32) in wasmtime-py `linker` as the C
    callback `trampoline` (`lean_trampoline`), for every store instantiating from it."""
    ty = wasmtime.FuncType([wasmtime.ValType.i32()] * arity, [wasmtime.ValType.i32()])
    raw_module, raw_name = module.encode(), name.encode()
    error = wasmtime_ffi.wasmtime_linker_define_func(
        linker.ptr(),
        ctypes.create_string_buffer(raw_module),
        len(raw_module),
        ctypes.create_string_buffer(raw_name),
        len(raw_name),
        ty.ptr(),
        trampoline,
        None,
        _NO_FINALIZER,
    )
    if error:
        raise wasmtime.WasmtimeError._from_ptr(error)


def install_lean_host_imports() -> bool:
    """Make quickjs-rs build its process-shared linker with `lean_trampoline`s for the
    guest's host imports (idempotent; False, leaving quickjs-rs alone, when this
    quickjs-rs does not define the imports 0.2.6 does). Takes effect for the linker built
    after it: the JS runtimes install it on import, before any sandbox exists."""
    try:
        from quickjs_rs import _engine as qjs_engine  # noqa: PLC2701 (quickjs_rs internals, version pinned)
    except ImportError:
        return False
    current = vars(qjs_engine).get("_build_shared_linker")
    if getattr(current, "lean_host_imports", False):
        return True
    if current is None or not all(hasattr(qjs_engine, shim) for _, _, shim in _HOST_IMPORTS):
        return False
    needed = ("wasmtime_linker_define_func", "wasmtime_func_callback_t", "WASMTIME_I32")
    if not hasattr(wasmtime_func, "LAST_EXCEPTION") or not all(
        hasattr(wasmtime_ffi, name) for name in needed
    ):
        return False  # not the wasmtime-py this was written for
    cur = qjs_engine._CUR

    def host_call(name_ptr: int, name_len: int, this: int, argc: int, argv_ptr: int) -> Any:
        # quickjs-rs's `_tramp_host_call`, without its `typing.cast` call (one per step).
        return cur.inst._host_call(name_ptr, name_len, this, argc, argv_ptr)

    trampolines = [
        (
            name,
            arity,
            lean_trampoline(host_call if name == "host_call" else getattr(qjs_engine, shim), arity),
        )
        for name, arity, shim in _HOST_IMPORTS
    ]

    def build_shared_linker(engine: Any) -> Any:
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        for name, arity, trampoline in trampolines:
            define_lean_import(linker, "env", name, arity, trampoline)
        return linker

    build_shared_linker.lean_host_imports = True  # type: ignore[attr-defined]
    qjs_engine._build_shared_linker = build_shared_linker  # type: ignore[attr-defined]
    return True


def eval_script_sync(ctx: Any, code: str, filename: str) -> Any:
    """`await ctx.eval_async(code, filename=filename)` without an event loop, for a
    context whose host functions are all synchronous (a JS workflow's): the script's
    promise settles once the pending jobs have run, or never (`DeadlockError`).

    quickjs-rs drives every `eval_async` from asyncio (a task group, futures, the
    loop's own turns: ~40 Python calls of event-loop machinery and a dozen guest calls
    per run, a seventh of a short workflow's CPU); this does what its driver does when
    no async host call is in flight, with the same errors (JS exceptions classified,
    interrupts, memory, the deadline). Pinned to quickjs-rs 0.2.6's `Context`
    (`_eval_for_async`, `_raise_from_reason_handle`, `_runtime._deadline`)."""
    if ctx._closed:
        raise QuickJSError("context is closed")
    if ctx._eval_async_in_flight:
        raise ConcurrentEvalError("another eval is already in flight on this context")
    ctx._last_host_exception = None
    deadline = time.monotonic() + ctx._timeout
    ctx._eval_async_in_flight = True
    ctx._runtime._deadline = deadline
    engine_ctx = ctx._engine_ctx
    try:
        handle = ctx._eval_for_async(code, False, False, filename, deadline, None)
        try:
            if not handle._require_live().is_promise():
                settled, handle = handle, None
            else:
                engine_ctx.run_pending_jobs()
                state = engine_ctx.promise_state(handle._require_live())
                if state == 0:
                    raise DeadlockError(
                        "the script's promise is pending and no host call is in flight"
                    )
                result = Handle(ctx, engine_ctx.promise_result(handle._require_live()))
                if state != 1:  # rejected
                    try:
                        ctx._raise_from_reason_handle(result, deadline)
                    finally:
                        result.dispose()
                settled = result
        finally:
            if handle is not None:
                handle.dispose()
    finally:
        ctx._runtime._deadline = None
        ctx._eval_async_in_flight = False
    try:  # a script's completion value comes as {value, done}
        value = settled.get("value")
        try:
            return value.to_python()
        finally:
            value.dispose()
    finally:
        settled.dispose()
