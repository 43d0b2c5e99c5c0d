"""The componentize-py demo activity (demo/activity_py) runs under wasmtime's component API.

Builds the component through the cached build step (`engine.build_components`), then calls
its exports with a WASI p2 linker and `obelisk:log` provided as host functions.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from wasmtime import Engine, Store, WasiConfig
from wasmtime.component import Component, Linker, Variant

from engine.build_components import ensure_built, load_component

IFC = "myapp:demo/activity"
LOG_IFC = "obelisk:log/log@1.0.0"
LOG_LEVELS = ("trace", "debug", "info", "warn", "error")


@dataclass
class Call:
    result: Any
    stdout: str
    logs: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine()


@pytest.fixture(scope="module")
def wasm_path() -> Path:
    return ensure_built("activity_py")


@pytest.fixture(scope="module")
def component(engine: Engine, wasm_path: Path) -> Component:
    return load_component(engine, wasm_path)


def call(engine: Engine, component: Component, fn: str, *args: Any) -> Call:
    """Instantiate `component` in a fresh store and call `myapp:demo/activity.<fn>(*args)`."""
    logs: list[tuple[str, str]] = []
    out: list[bytes] = []
    linker = Linker(engine)
    linker.add_wasip2()
    with linker.root() as root, root.add_instance(LOG_IFC) as log_ifc:
        for level in LOG_LEVELS:

            def host_log(_store: Any, message: str, level: str = level) -> None:
                logs.append((level, message))

            log_ifc.add_func(level, host_log)
    wasi = WasiConfig()
    wasi.stdout_custom = out.append
    store = Store(engine)
    store.set_wasi(wasi)
    try:
        instance = linker.instantiate(store, component)
        ifc = instance.get_export_index(store, IFC)
        assert ifc is not None, f"component does not export {IFC}"
        index = instance.get_export_index(store, fn, ifc)
        assert index is not None, f"{IFC} has no function {fn}"
        func = instance.get_func(store, index)
        assert func is not None
        start = time.perf_counter()
        result = func(store, *args)
        func.post_return(store)
        seconds = time.perf_counter() - start
    finally:
        # Drop the store now: a store with a Python stdout callback that is still alive at
        # interpreter exit makes a wasmtime worker thread panic during teardown.
        del store
    return Call(result, b"".join(out).decode(), logs, seconds)


@pytest.fixture
def run(engine: Engine, component: Component) -> Iterator[Any]:
    def _run(fn: str, *args: Any) -> Call:
        return call(engine, component, fn, *args)

    yield _run


def test_build_is_cached(wasm_path: Path) -> None:
    assert wasm_path.is_file()
    assert wasm_path.read_bytes()[:8] == b"\0asm\x0d\0\x01\0"  # a component, not a module
    start = time.perf_counter()
    assert ensure_built("activity_py") == wasm_path
    assert time.perf_counter() - start < 1.0


def test_step_returns_idx_logs_and_prints(run: Any) -> None:
    c = run("step", 3, 0)
    assert c.result == 3
    assert c.stdout == "step 3 done\n"
    assert c.logs == [("info", "step 3 started, sleeping 0 ms")]


def test_step_sleeps(run: Any) -> None:
    c = run("step", 7, 120)
    assert c.result == 7
    assert c.seconds >= 0.12
    assert c.stdout == "step 7 done\n"


def test_step_accepts_large_u64(run: Any) -> None:
    assert run("step", 2**64 - 1, 0).result == 2**64 - 1


def test_send_email_ok(run: Any) -> None:
    c = run("send-email", "alice@example.com", "Hello")
    assert isinstance(c.result, Variant)
    assert c.result.tag == "ok"
    message_id = c.result.payload
    assert isinstance(message_id, str)
    assert message_id.startswith("<") and message_id.endswith("@demo.invalid>")
    assert c.stdout == f"email to alice@example.com subject 'Hello' id {message_id}\n"
    # a fake, deterministic id
    assert run("send-email", "alice@example.com", "Hello").result.payload == message_id
    assert run("send-email", "alice@example.com", "Other").result.payload != message_id


def test_send_email_invalid_address(run: Any) -> None:
    c = run("send-email", "nobody", "Hello")
    assert c.result == Variant("err", "invalid address: nobody")
    assert c.stdout == ""
