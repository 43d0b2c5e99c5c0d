"""`engine.runtimes.js.quickjs_fast.install_lazy_exports`: QuickJS sandboxes look their
exports up by name when first used, and find the same ones as wasmtime-py's eager
`Instance.exports()`. (The JS runtime and activity tests run every sandbox this way.)"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import wasmtime
from quickjs_rs import Runtime
from quickjs_rs import _engine as qjs_engine
from wasmtime._instance import InstanceExports

import engine.runtimes.js.activity as js_activity
import engine.runtimes.js.workflow as js_runtime
from engine.runtimes.js.quickjs_fast import (
    LazyExports,
    define_lean_import,
    fast_guest_calls,
    install_lazy_exports,
    lean_trampoline,
)


def signature(fn: wasmtime.Func, store: wasmtime.Store) -> tuple[list[str], list[str]]:
    ty = fn.type(store)
    return [str(t) for t in ty.params], [str(t) for t in ty.results]


def test_the_js_runtimes_install_it_once() -> None:
    assert js_runtime.LAZY_EXPORTS and js_activity.LAZY_EXPORTS
    installed = vars(qjs_engine)["instantiate_wasm_artifact"]
    assert install_lazy_exports()
    assert vars(qjs_engine)["instantiate_wasm_artifact"] is installed  # not wrapped twice


def test_lazy_exports_are_the_instances_exports() -> None:
    rt = Runtime()
    try:
        ctx = rt.new_context()
        assert ctx.eval("6 * 7") == 42  # the sandbox works on them
        inst = ctx._engine_ctx._inst
        lazy = inst._exports
        assert isinstance(lazy, LazyExports)
        store = inst.store
        eager = InstanceExports(store, inst.inst)
        assert len(eager) > 40
        for name in eager:
            got, want = lazy[name], eager[name]
            assert type(got) is type(want), name
            if isinstance(want, wasmtime.Func):
                assert signature(got, store) == signature(want, store), name
                assert bytes(got._func) == bytes(want._func), name  # the same function
            elif isinstance(want, wasmtime.Memory):
                assert ctypes.addressof(got.data_ptr(store).contents) == ctypes.addressof(
                    want.data_ptr(store).contents
                )
        assert lazy["get_string"] is lazy["get_string"]  # looked up once
        with pytest.raises(KeyError):
            lazy["no_such_export"]
        assert sorted(lazy) == sorted(eager) and len(lazy) == len(eager)
    finally:
        rt.close()


@pytest.mark.parametrize("lazy", [True, False])
def test_fast_guest_calls_work_on_either_kind_of_exports(lazy: bool) -> None:
    rt = Runtime()
    try:
        ctx = rt.new_context()
        inst = ctx._engine_ctx._inst
        if not lazy:
            inst._exports = InstanceExports(inst.store, inst.inst)
        assert fast_guest_calls(inst)
        assert ctx.eval("[1, 2, 3].map((x) => x * 2).join()") == "2,4,6"
        assert ctx.eval("'é ✓'.length") == 3
    finally:
        rt.close()


# -- lean host imports (`install_lean_host_imports`) -------------------------------------

_CALLS_HOST = """
(module
  (import "env" "f" (func $f (param i32 i32 i32) (result i32)))
  (func (export "run") (param i32 i32 i32) (result i32)
    (call $f (local.get 0) (local.get 1) (local.get 2))))
"""


def _instance_with_lean_import(target: object) -> tuple[wasmtime.Store, wasmtime.Func]:
    engine = wasmtime.Engine()
    linker = wasmtime.Linker(engine)
    define_lean_import(linker, "env", "f", 3, lean_trampoline(target, 3))
    store = wasmtime.Store(engine)
    module = wasmtime.Module(engine, wasmtime.wat2wasm(_CALLS_HOST))
    run = linker.instantiate(store, module).exports(store)["run"]
    assert isinstance(run, wasmtime.Func)
    return store, run


def test_a_lean_import_passes_i32s_both_ways() -> None:
    seen: list[tuple[int, int, int]] = []

    def f(a: int, b: int, c: int) -> int:
        seen.append((a, b, c))
        return a * 100 + b * 10 + c

    store, run = _instance_with_lean_import(f)
    assert run(store, 1, 2, 3) == 123
    assert run(store, -1, 0, 2**31 - 1) == -100 + 2**31 - 1
    assert seen == [(1, 2, 3), (-1, 0, 2**31 - 1)]


def test_a_lean_import_raises_what_the_host_raised_and_refuses_a_non_int() -> None:
    class Boom(Exception):
        pass

    def raises(a: int, b: int, c: int) -> int:
        raise Boom(f"host failed on {a}")

    store, run = _instance_with_lean_import(raises)
    with pytest.raises(Boom, match="host failed on 7"):
        run(store, 7, 0, 0)

    store, run = _instance_with_lean_import(lambda a, b, c: "not a number")
    with pytest.raises(TypeError, match="convert 'not a number' to i32"):
        run(store, 0, 0, 0)
    # The pending exception was taken: a good call afterwards succeeds.
    store, run = _instance_with_lean_import(lambda a, b, c: a + b + c)
    assert run(store, 1, 1, 1) == 3


def test_quickjs_host_calls_go_through_the_lean_trampolines() -> None:
    """The guest's host calls run no wasmtime-py trampoline (its Python frames would
    show): the JS runtimes installed the lean imports before QuickJS's linker was built."""
    import sys

    import engine.runtimes.js.common as js_common

    assert js_common.LEAN_HOST_IMPORTS
    assert getattr(vars(qjs_engine)["_build_shared_linker"], "lean_host_imports", False)
    frames: set[tuple[str, str]] = set()

    def profile(frame: object, event: str, arg: object) -> None:
        code = frame.f_code  # type: ignore[attr-defined]
        if event == "call":
            frames.add((Path(code.co_filename).parent.name, code.co_name))

    rt = Runtime()
    try:
        ctx = rt.new_context()
        ctx.register("add", lambda x, y: x + y)
        sys.setprofile(profile)
        try:
            assert ctx.eval("add(20, 22)") == 42
        finally:
            sys.setprofile(None)
    finally:
        rt.close()
    assert ("js", "callback") in frames  # quickjs_fast's lean trampoline
    assert ("wasmtime", "trampoline") not in frames
