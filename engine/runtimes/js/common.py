"""What the JS activity and the JS workflow runtimes share: the sandbox's memory limit
and its out-of-memory reason, JSON results with BigInts, trap reasons, source lines for
messages, the bridge from a worker thread to the coroutines of quickjs-rs, and QuickJS's
compilation (once per process, cached on disk)."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import hashlib
import json
import threading
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from quickjs_rs import Runtime

from engine.runtimes.js.quickjs_fast import install_lean_host_imports

_T = TypeVar("_T")

#: The guest's host imports go through lean trampolines
#: (`quickjs_fast.install_lean_host_imports`): installed before any sandbox or the
#: compiled module (`preload_compiled_quickjs`) builds quickjs-rs's shared linker.
LEAN_HOST_IMPORTS = install_lean_host_imports()

DEFAULT_MEMORY_LIMIT = 64 * 1024 * 1024
"""Limit of the guest's WASM linear memory (QuickJS heap, stack and interpreter data)."""
#: JSON strings that stand for BigInts (the guest's `JSON.stringify` replacer).
BIGINT_PREFIX = "\x00obelisk:bigint:"


def out_of_memory_reason(memory_limit: int) -> str:
    """The failure reason of a run that exhausted its sandbox's memory (also when it
    happened while serializing the return value)."""
    return f"out of memory (the JS sandbox's limit is {memory_limit // 2**20} MiB)"


def revive_bigints(value: Any) -> Any:
    if isinstance(value, str):
        if value.startswith(BIGINT_PREFIX):
            return int(value[len(BIGINT_PREFIX) :])
        return value
    if isinstance(value, list):
        return [revive_bigints(v) for v in value]
    if isinstance(value, dict):
        return {k: revive_bigints(v) for k, v in value.items()}
    return value


def parse_json_result(text: str) -> Any:
    value = json.loads(text)
    if "\\u0000obelisk:bigint:" in text:
        value = revive_bigints(value)
    return value


def source_line(source: str, line: int, limit: int = 80) -> str:
    """Line `line` (1-based) of `source`, stripped, cut to `limit` and quoted: where a
    syntax error is (QuickJS's column of a parse error is unreliable: it may count
    from an earlier line)."""
    lines = source.splitlines()
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


class _ThreadLoop:
    """A thread's private event loop, kept from one run to the next: a new loop costs a
    socket pair and an epoll instance, and closing one looks at every task of the
    process (`asyncio.all_tasks`), hundreds while the engine's loop is busy. The tasks
    created on it are tracked here, so that the ones a run leaves behind are found
    without that scan. Closed when its thread ends (the thread-local goes)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.tasks: set[asyncio.Task[Any]] = set()
        self.loop.set_task_factory(self._task)

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def run(self, factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
        loop = self.loop
        try:
            return loop.run_until_complete(factory())
        finally:
            pending = [t for t in self.tasks if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if not self.loop.is_closed() and not self.loop.is_running():
                self.loop.close()

    def __del__(self) -> None:
        self.close()


_thread_loops = threading.local()
#: Every live one: closed at exit, before the interpreter tears objects down in any order
#: (a loop finalised after its self-pipe's socket prints a traceback).
_all_thread_loops: weakref.WeakSet[_ThreadLoop] = weakref.WeakSet()


@atexit.register
def _close_thread_loops() -> None:
    for own in list(_all_thread_loops):
        own.close()


def run_coroutine(factory: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """Run a coroutine on this thread's private event loop (or on a helper thread when
    this thread already runs a loop). The loop's default executor is never waited for,
    so an abandoned DNS lookup cannot hold the caller."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        own: _ThreadLoop | None = getattr(_thread_loops, "loop", None)
        if own is None or own.loop.is_closed():
            own = _thread_loops.loop = _ThreadLoop()
            _all_thread_loops.add(own)
        return own.run(factory)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: run_coroutine(factory)).result()


def trap_reason(e: BaseException) -> str:
    text = str(e)
    if "call stack exhausted" in text:
        return "stack overflow"
    last = text.strip().splitlines()[-1] if text.strip() else type(e).__name__
    return f"wasm trap: {last.strip()}"


def warm_up(cache_dir: Path | None = None) -> None:
    """Compile QuickJS's WASM now (once per process) instead of on first use.

    With `cache_dir`, the compiled module is kept there (keyed by the guest's digest, the
    wasmtime version and the machine) and later processes deserialize it in a few ms
    instead of compiling it again (~0.3-1 s). Blocking: call it from a thread
    (`asyncio.to_thread(warm_up, …)`) at start.
    """
    if cache_dir is not None:
        preload_compiled_quickjs(cache_dir)
    rt = Runtime()
    try:
        rt.new_context().eval("0")
    finally:
        rt.close()


def preload_compiled_quickjs(cache_dir: Path) -> None:
    """Put QuickJS's compiled module in quickjs-rs's process-wide artifact cache, from the
    disk cache when it is there. Uses quickjs-rs internals (the version is pinned)."""
    import wasmtime
    from quickjs_rs import _engine as qjs_engine  # noqa: PLC2701 (quickjs_rs internals, version pinned)
    from quickjs_rs import _wasmtime as qjs_wasmtime  # noqa: PLC2701 (quickjs_rs internals, version pinned)

    from engine.runtimes.wasm.activity import cache_tag, write_atomically

    key = "quickjs"  # the key quickjs_rs._engine._quickjs_artifact uses
    if key in qjs_wasmtime._SHARED_ARTIFACTS:
        return
    wasm = qjs_engine._read_guest_wasm()
    digest = hashlib.sha256(wasm)
    path = Path(cache_dir) / f"quickjs-{digest.hexdigest()[:32]}-{cache_tag()}.cwasm"
    engine = qjs_wasmtime.shared_wasmtime_engine()
    module = None
    with contextlib.suppress(OSError, wasmtime.WasmtimeError):  # missing, or unusable
        module = wasmtime.Module.deserialize(engine, path.read_bytes())
    if module is None:
        module = wasmtime.Module(engine, wasm)
        write_atomically(path, bytes(module.serialize()))
    artifact = qjs_wasmtime.SharedWasmArtifact(
        module=module,
        linker=qjs_engine._build_shared_linker(engine),
        build_id=digest.digest(),
    )
    with qjs_wasmtime._SHARED_ARTIFACTS_LOCK:
        qjs_wasmtime._SHARED_ARTIFACTS.setdefault(key, artifact)


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """What a guest's call of its export came to, as the prelude reports it (one JSON
    record `{"t": "ok"|"err"|"oom"|"trap", …}`): the activity and the workflow runtimes
    turn it into their outcomes."""

    kind: Literal["ok", "err", "oom", "trap"]
    value: Any = None
    reason: str = ""
    detail: str = ""


def result_record(text: str) -> ResultRecord:
    """The prelude's result record, decoded (a record that does not decode is a trap)."""
    try:
        record = parse_json_result(text)
    except ValueError as e:
        return ResultRecord(
            "trap", reason=f"cannot decode the function's result: {e}", detail=text[:1000]
        )
    kind = record.get("t")
    if kind == "ok" or kind == "err":
        return ResultRecord(kind, record.get("v"))
    if kind == "oom":
        return ResultRecord("oom", reason="out of memory")
    reason = str(record.get("reason", "unknown failure"))
    return ResultRecord("trap", reason=reason, detail=str(record.get("detail", "")))
