"""What the WASM activity and the WASM workflow runtimes share: calling an export that
returns a `result<…>` through wasmtime's C API (without wasmtime-py's process-global
host-exception slot), the post-return, and wasmtime's errors and traps as one-line
reasons."""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from wasmtime import WasmtimeError
from wasmtime import _bindings as bindings  # noqa: PLC2701 (wasmtime internals, version pinned)
from wasmtime import _ffi as ffi  # noqa: PLC2701 (wasmtime internals, version pinned)

from engine.runtimes.gil import keep_gil


class Storelike(Protocol):
    """A `wasmtime.Store`, or `engine.runtimes.wasm.plumbing.RunStore`."""

    def _context(self) -> Any: ...


# wasmtime's C functions of a call, bound once, after the GIL-keeping ones are installed
# (`_bindings`' `name` functions are a Python call each around `_name`).
keep_gil()
_func_call = bindings._wasmtime_component_func_call
_post_return = bindings._wasmtime_component_func_post_return
_val_delete = bindings._wasmtime_component_val_delete
_RESULT_KIND = ffi.WASMTIME_COMPONENT_RESULT.value
_byref = ctypes.byref


@dataclass(frozen=True, slots=True)
class ExportTypes:
    """What a call of one exported function needs, looked up once per runner and FFQN.

    Asking wasmtime-py for `func.type(store).params` / `.result` on every call costs a
    dozen ctypes round trips and fresh type objects per run; types do not depend on the
    store, so they are kept here along with the component-level export index.
    """

    index: Any  # wc.ExportIndex of the function, valid for every instance of the component
    params: tuple[Any, ...]  # wasmtime-py ValTypes of the parameters
    ok: Any  # ValType of the `ok` payload of the `result<…>` return type, or None
    err: Any  # ValType of the `err` payload, or None


def call_result_func(
    func: Any, store: Storelike, args: Sequence[Any], types: ExportTypes
) -> tuple[bool, Any]:
    """Call the function `func` (raw: `wc.Func._func`, or `RunStore.get_func`'s) returning
    `result<…>`; `(is_ok, payload as lifted by wasmtime-py)`.

    `Func.__call__` of wasmtime-py 50, without its process-global host-exception slot, and
    with the `result` case read from the C value (not guessed from the payload's class).
    """
    param_tys = types.params
    if len(args) != len(param_tys):
        raise TypeError(f"expected {len(param_tys)} arguments, got {len(args)}")
    param_capi = (ffi.wasmtime_component_val_t * max(len(args), 1))()
    n = 0
    try:
        for ty, value in zip(param_tys, args, strict=True):
            ty.convert_to_c(store, value, ctypes.pointer(param_capi[n]))
            n += 1
        result_space = ffi.wasmtime_component_val_t()
        error = _func_call(_byref(func), store._context(), param_capi, n, _byref(result_space), 1)
        if error:
            raise WasmtimeError._from_ptr(error)
        if result_space.kind != _RESULT_KIND:
            raise TypeError("the function did not return a result")
        is_ok = bool(result_space.of.result.is_ok)
        payload_ty = types.ok if is_ok else types.err
        ptr = result_space.of.result.val
        if payload_ty is None or not ptr:
            return is_ok, None
        # As wasmtime-py's `VariantLikeType._lift` does with a case payload.
        payload = payload_ty.convert_from_c(ptr.contents)
        ptr.contents.kind = ffi.WASMTIME_COMPONENT_BOOL
        ptr.contents.of.boolean = False
        _val_delete(ptr)
        return is_ok, payload
    finally:
        for i in range(n):
            _val_delete(_byref(param_capi[i]))


def post_return(func: Any, store: Storelike) -> None:
    """The post-return of the raw function `func` after `call_result_func`."""
    if error := _post_return(_byref(func), store._context()):
        raise WasmtimeError._from_ptr(error)


TRAP_NAMES = {
    "wasm `unreachable` instruction executed": "unreachable",
    "integer divide by zero": "integer divide by zero",
    "out of bounds memory access": "out of bounds memory access",
    "call stack exhausted": "stack overflow",
}


def trap_reason(error: WasmtimeError) -> str:
    """A trap (or another wasmtime error of a call) as a failure reason: `trap: unreachable`."""
    causes = error_causes(str(error))
    cause = causes[-1] if causes else str(error).strip()
    if cause.startswith("wasm trap: "):
        what = cause.removeprefix("wasm trap: ")
        return f"trap: {TRAP_NAMES.get(what, what)}"
    return f"trap: {cause}"[:300]


def error_causes(message: str) -> list[str]:
    """The lines of a wasmtime (anyhow) error: the context, then each numbered cause."""
    head, _, tail = message.partition("Caused by:")
    lines = [head.strip().splitlines()[0].strip().rstrip(":")] if head.strip() else []
    for line in tail.strip().splitlines():
        line = re.sub(r"^\d+:\s*", "", line.strip())
        if line:
            lines.append(line)
    return lines


def error_cause(message: str) -> str:
    """A wasmtime error on one line: context and causes, without the backtrace banner."""
    lines = [x for x in error_causes(message) if not x.startswith("error while executing at wasm")]
    return ": ".join(lines) or message.strip()
