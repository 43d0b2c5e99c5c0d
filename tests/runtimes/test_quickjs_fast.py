"""`engine.runtimes.js.quickjs_fast.install_lazy_exports`: QuickJS sandboxes look their
exports up by name when first used, and find the same ones as wasmtime-py's eager
`Instance.exports()`. (The JS runtime and activity tests run every sandbox this way.)"""

from __future__ import annotations

import ctypes

import pytest
import wasmtime
from quickjs_rs import Runtime
from quickjs_rs import _engine as qjs_engine
from wasmtime._instance import InstanceExports

import engine.runtimes.js.activity as js_activity
import engine.runtimes.js.workflow as js_runtime
from engine.runtimes.js.quickjs_fast import LazyExports, fast_guest_calls, install_lazy_exports


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
