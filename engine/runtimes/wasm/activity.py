"""Runs `activity_wasm` components: loading with a compiled-code cache, export inspection, runs.

Synchronous and thread-safe: the executor calls `WasmActivityRunner.run` from worker threads.

Interruption. The shared engine has epoch interruption on and a daemon thread bumps the epoch
every ~5 ms. Every store gets an epoch-deadline callback (`install_interrupt`) that asks a
check function, while guest code runs, whether to stop (at the first tick, then spaced out
to every 8 ticks: `Interrupt`); if so the guest traps with a marker error and the caller
learns the reason (timeout, cancelled) from the `Interrupt`. A guest spinning in a loop is
therefore stopped within ~40 ms. A guest blocked inside a host call (e.g. a WASI sleep) is
only stopped once that call returns.

Host state. wasmtime-py keeps the last Python exception raised by a host function in a
process-wide global, which one thread may pick up from another; our host functions never
raise, and calls go through `call_result_func`, which does not look at that global. The log sink of
the run in progress is found through a thread-local (host functions run on the calling
thread). WASI stdout/stderr callbacks, however, arrive on a wasmtime-internal thread: their
bytes are buffered and turned into log lines on the worker thread (on epoch ticks, before each
`obelisk:log` line, and at the end of the run), so the sink is only called from the worker.

Instances. Activity runs instantiate on a process-wide engine with wasmtime's pooling
allocator (`WasmEngine.activity_pool`): linear memories, tables and instance state live in
slots reserved once and reused, where an on-demand engine maps fresh memory for every run
and unmaps it afterwards (with a TLB shootdown on every CPU the process ran on): that made
a trivial run cost ~2x its CPU and most of its wall time. At most `ACTIVITY_POOL_SLOTS`
instances exist at once; a run waits for a free slot. A component that does not fit a slot
(too many core instances, memories or table elements) is loaded on the on-demand engine
instead (`load_activity`). When the pool cannot be set up (e.g. an address-space limit:
slots are virtual reservations of several GiB each) activities use the on-demand engine.

Caching. `WasmEngine.load` keys compiled code by the sha256 of the component file plus the
wasmtime version and platform. The cache directory must be trusted: deserializing compiled
code skips validation.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.metadata
import logging
import os
import platform
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import WasmtimeError
from wasmtime import _bindings as bindings  # noqa: PLC2701 (wasmtime internals, version pinned)
from wasmtime import _ffi as ffi  # noqa: PLC2701 (wasmtime internals, version pinned)
from wasmtime import component as wc

from engine.runtimes.api import RunContext
from engine.runtimes.gil import keep_gil
from engine.runtimes.outcome import (
    LogLevel,
    LogLine,
    LogSink,
    LogStream,
    RunCancelled,
    RunErr,
    RunOk,
    RunOutcome,
    RunTimedOut,
    RunTrap,
)
from engine.runtimes.wasm.common import (
    ExportTypes,
    call_result_func,
    error_cause,
    post_return,
    trap_reason,
)
from engine.runtimes.wasm.plumbing import Keyed, RunStore, SlotTokens
from engine.wit.codec import (
    WitValueError,
    json_to_wasmtime,
    wasmtime_to_json,
    wit_type_from_wasmtime,
)
from engine.wit.types import (
    FunctionSignature,
    WitEnum,
    WitResult,
    WitType,
    WitTypeError,
    WitVariant,
    format_wit_type,
)

__all__ = [
    "LOG_INTERFACE",
    "ComponentLoadError",
    "FunctionSignature",
    "Interrupt",
    "LoadedComponent",
    "WasmActivityRunner",
    "WasmEngine",
    "engine_of",
    "inspect_exports",
    "install_interrupt",
]

_log = logging.getLogger(__name__)

LOG_INTERFACE = "obelisk:log/log@1.0.0"
LOG_LEVELS: tuple[LogLevel, ...] = ("trace", "debug", "info", "warn", "error")
EPOCH_TICK_SECONDS = 0.005
WASMTIME_VERSION = importlib.metadata.version("wasmtime")
_INTERRUPT_MARKER = "obelisk: guest interrupted: "
_MAX_LINE_BYTES = 64 * 1024
_COMPONENT_HEADER = b"\0asm\x0d\x00\x01\x00"
_CORE_HEADER = b"\0asm\x01\x00\x00\x00"


# Quick wasmtime calls keep the GIL (measured: -25% CPU per trivial execution in
# `bench/activity_throughput.py`; see `engine.runtimes.gil`).
keep_gil()


class ComponentLoadError(Exception):
    """A component file cannot be read, is not a component, or does not compile."""


class _NoFreeSlot(ComponentLoadError):
    """`WasmEngine.verify_instantiable` found no free pooled slot in time."""


# ---------------------------------------------------------------------------------------------
# Interruption through epoch-deadline callbacks


#: At most this many epoch ticks between two checks of a running guest (40 ms).
MAX_CHECK_TICKS = 8


class Interrupt:
    """Per-store interruption state; `check` is called on the guest's thread at the first
    epoch tick, then after 2, 4 … and at most `MAX_CHECK_TICKS` ticks.

    Each check takes the GIL: one per tick (200/s) for every running guest, with 64 guests
    that spin, was ~13k a second, enough to starve the event loop (an embedded console
    drew its frames seconds late). Spaced out, a guest is stopped at most ~40 ms after its
    timeout or cancellation."""

    __slots__ = ("check", "reason", "ticks")

    def __init__(self, check: Callable[[], str | None]) -> None:
        self.check = check
        #: Set to the reason `check` returned once the guest was told to stop.
        self.reason: str | None = None
        #: Ticks to the next check.
        self.ticks = 1


_EPOCH_CALLBACK = ctypes.CFUNCTYPE(
    ctypes.c_size_t,
    ctypes.POINTER(ffi.wasmtime_context_t),
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(ffi.wasmtime_update_deadline_kind_t),
)
_INTERRUPTS: Keyed[Interrupt] = Keyed()
_UPDATE_DEADLINE_CONTINUE = 0


@_EPOCH_CALLBACK  # type: ignore[untyped-decorator]
def _on_epoch(_ctx: Any, data: int | None, delta: Any, kind: Any) -> int:
    interrupt = _INTERRUPTS.items.get(data or 0)
    if interrupt is not None:
        try:
            if interrupt.reason is None:
                interrupt.reason = interrupt.check()
        except BaseException:  # a callback must not raise into C
            _log.exception("interrupt check failed")
        if interrupt.reason is not None:
            error = WasmtimeError(_INTERRUPT_MARKER + interrupt.reason)
            return ctypes.cast(error._consume(), ctypes.c_void_p).value or 0
        ticks = interrupt.ticks
        interrupt.ticks = min(2 * ticks, MAX_CHECK_TICKS)
    else:
        ticks = 1
    delta[0] = ticks
    kind[0] = _UPDATE_DEADLINE_CONTINUE
    return 0


def install_interrupt(
    store: wasmtime.Store | RunStore, check: Callable[[], str | None]
) -> Interrupt:
    """Make `store`'s guest code stop (trap) as soon as `check()` returns a reason.

    Every store of an epoch-interruption engine needs this (or its own deadline): without it
    the guest traps at the first epoch check. `check` runs on the thread running the guest.
    """
    interrupt = Interrupt(check)
    key = _INTERRUPTS.add(interrupt)
    _epoch_deadline_callback(store.ptr(), _on_epoch, key, _INTERRUPTS.dropped)
    _set_epoch_deadline(store._context(), 1)
    return interrupt


# (`_bindings`' `name` functions are a Python call each around `_name`; these keep the GIL.)
_epoch_deadline_callback = bindings._wasmtime_store_epoch_deadline_callback
_set_epoch_deadline = bindings._wasmtime_context_set_epoch_deadline


# ---------------------------------------------------------------------------------------------
# Engine, compiled-component cache


@dataclass(frozen=True, slots=True)
class LoadedComponent:
    component: wc.Component
    #: `sha256:` + hex digest of the component file.
    digest: str
    #: True when the compiled code came from the cache directory.
    cache_hit: bool


#: Instances the activity pool holds at once (`WasmEngine.activity_pool`).
ACTIVITY_POOL_SLOTS = 128
#: Per slot: what one activity instance may use (generous: a slot is address space
#: reserved, memory is only committed while used).
_POOL_PER_SLOT = {"core_instances": 32, "memories": 2, "tables": 4}
_POOL_MAX_MEMORY = 4 << 30
_POOL_TABLE_ELEMENTS = 100_000
_POOL_KEEP_RESIDENT = 1 << 20


def _pooled_config(slots: int) -> wasmtime.Config | None:
    """An epoch-interrupting config with the pooling allocator, or None when this
    wasmtime build cannot make one. Every limit is per component as well as in total,
    so a component that passes the load check (`load_activity`) fits any free slot."""
    config = wasmtime.Config()
    config.epoch_interruption = True
    try:
        pooling = ffi.wasmtime_pooling_allocation_config_new()
        if not pooling:
            return None

        def setting(name: str, value: int) -> None:
            getattr(ffi, f"wasmtime_pooling_allocation_config_{name}_set")(pooling, value)

        try:
            setting("total_component_instances", slots)
            for what, per_slot in _POOL_PER_SLOT.items():
                setting(f"total_{what}", slots * per_slot)
                setting(f"max_{what}_per_component", per_slot)
            setting("max_memory_size", _POOL_MAX_MEMORY)
            setting("table_elements", _POOL_TABLE_ELEMENTS)
            # A freed slot's first MiB is zeroed rather than decommitted: decommitting
            # (madvise) interrupts every CPU the process runs on to flush its TLB.
            setting("linear_memory_keep_resident", _POOL_KEEP_RESIDENT)
            setting("table_keep_resident", _POOL_KEEP_RESIDENT)
            ffi.wasmtime_pooling_allocation_strategy_set(config.ptr(), pooling)
        finally:
            ffi.wasmtime_pooling_allocation_config_delete(pooling)
    except (AttributeError, OSError, ctypes.ArgumentError):  # pragma: no cover
        return None
    return config


class WasmEngine:
    """A wasmtime engine with epoch interruption, its epoch ticker and the activity linker."""

    _shared: WasmEngine | None = None
    _pool: WasmEngine | None = None
    _shared_lock = threading.Lock()

    def __init__(self, pool_slots: int = 0) -> None:
        """`pool_slots` > 0: instances come from that many pooled slots (see the module's
        docstring), if the pool can be set up (`pooled` says whether it was)."""
        engine: wasmtime.Engine | None = None
        if pool_slots > 0 and (config := _pooled_config(pool_slots)) is not None:
            try:
                engine = wasmtime.Engine(config)
            except WasmtimeError as e:
                _log.info("no pooled activity instances (%s): using on-demand memory", e)
        self.pooled = engine is not None
        if engine is None:
            config = wasmtime.Config()
            config.epoch_interruption = True
            engine = wasmtime.Engine(config)
        self.engine = engine
        self._engine_ptr = engine.ptr()
        #: Bounds the instances alive at once to the pool's slots.
        self.slots = SlotTokens(pool_slots) if self.pooled else None
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None
        #: Stores of this engine alive now (`ticking`): the ticker parks when none is.
        self._stores = 0
        #: Re-entrant: a store's finalizer (`_store_gone`) may run in a collection that
        #: starts inside the sections it guards.
        self._stores_lock = threading.RLock()
        #: Set while the ticker ticks; cleared while it is parked.
        self._ticking = threading.Event()
        self._linker: wc.Linker | None = None

    @classmethod
    def activity_pool(cls) -> WasmEngine:
        """The process-wide engine of activity runs: pooled instances when possible."""
        with cls._shared_lock:
            if cls._pool is None:
                cls._pool = cls(ACTIVITY_POOL_SLOTS)
            return cls._pool

    @classmethod
    def shared(cls) -> WasmEngine:
        """The process-wide engine (components must run on the engine that compiled them)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def ensure_ticker(self) -> None:
        """Start the daemon thread that advances the epoch every ~5 ms (once).

        It ticks while a store of this engine is alive (a guest may be running, and only
        the ticks let its deadline callback stop it) and parks when none has been for a
        tick: an idle engine then wakes nobody (it spent ~1.8 % of a core on 200
        wake-ups a second, each taking the GIL). The first store made while it is
        parked wakes it; its first tick comes within `EPOCH_TICK_SECONDS`, as before."""
        if self._ticker is not None:
            return
        with self._lock:
            if self._ticker is None:
                self._ticking.set()
                self._ticker = threading.Thread(target=self._tick, name="wasm-epoch", daemon=True)
                self._ticker.start()

    def _tick(self) -> None:
        engine, ticking = self.engine, self._ticking
        while True:
            time.sleep(EPOCH_TICK_SECONDS)
            engine.increment_epoch()
            if not self._stores:
                with self._stores_lock:
                    if not self._stores:  # (a store made now sets it again, under the lock)
                        ticking.clear()
                ticking.wait()

    def _store_made(self) -> None:
        with self._stores_lock:
            self._stores += 1
            if not self._ticking.is_set():
                self._ticking.set()

    def _store_gone(self) -> None:
        with self._stores_lock:
            self._stores -= 1

    @property
    def ticking(self) -> bool:
        """Whether the epoch ticker runs (not parked): tests and diagnostics."""
        return self._ticker is not None and self._ticking.is_set()

    def new_store(self, check: Callable[[], str | None]) -> tuple[wasmtime.Store, Interrupt]:
        """A store whose guest stops when `check()` returns a reason (see `install_interrupt`)."""
        self.ensure_ticker()
        store = wasmtime.Store(self.engine)
        self._store_made()
        weakref.finalize(store, self._store_gone)
        return store, install_interrupt(store, check)

    def new_run_store(self, check: Callable[[], str | None]) -> tuple[RunStore, Interrupt]:
        """`new_store` for an activity run: a `RunStore` (closed by its run)."""
        self.ensure_ticker()
        store = RunStore(self._engine_ptr, self._store_gone)
        self._store_made()
        return store, install_interrupt(store, check)

    def take_slot(self, check: Callable[[], str | None]) -> str | None:
        """Wait for a pooled instance slot (at once without a pool): None once it is
        held (give it back with `release_slot`), or the reason `check()` gave for not
        waiting any longer."""
        slots = self.slots
        if slots is not None:
            while not slots.acquire(timeout=0.05):
                if (reason := check()) is not None:
                    return reason
        return None

    def release_slot(self) -> None:
        if self.slots is not None:
            self.slots.release()

    def activity_linker(self) -> wc.Linker:
        """WASI p2, wasi:http and `obelisk:log`, shared by all activity runs (built once)."""
        with self._lock:
            if self._linker is None:
                linker = wc.Linker(self.engine)
                linker.add_wasip2()
                linker.add_wasi_http()
                with linker.root() as root, root.add_instance(LOG_INTERFACE) as log_ifc:
                    for level in LOG_LEVELS:
                        log_ifc.add_func(level, _log_host_function(level))
                self._linker = linker
            return self._linker

    def load(
        self, source: Path | str | bytes, cache_dir: Path | str | None = None
    ) -> LoadedComponent:
        """Compile a component file (or its bytes), reusing compiled code from `cache_dir`."""
        label = "<bytes>" if isinstance(source, bytes) else str(source)
        if isinstance(source, bytes):
            data = source
        else:
            try:
                data = Path(source).read_bytes()
            except OSError as e:
                raise ComponentLoadError(
                    f"cannot read component: {label}: {e.strerror or e}"
                ) from None
        _check_header(data, label)
        hexdigest = hashlib.sha256(data).hexdigest()
        digest = f"sha256:{hexdigest}"
        cache_file = None
        if cache_dir is not None:
            cache_file = _cache_file(cache_dir, hexdigest)
            cached = self._from_cache(cache_file)
            if cached is not None:
                return LoadedComponent(cached, digest, cache_hit=True)
        try:
            component = wc.Component(self.engine, data)
        except WasmtimeError as e:
            raise ComponentLoadError(
                f"invalid WebAssembly component: {label}: {error_cause(str(e))}"
            ) from None
        _COMPONENT_ENGINES[component] = self
        if cache_file is not None:
            write_atomically(cache_file, bytes(component.serialize()))
        return LoadedComponent(component, digest, cache_hit=False)

    def load_component(
        self, source: Path | str | bytes, cache_dir: Path | str | None = None
    ) -> wc.Component:
        return self.load(source, cache_dir).component

    def load_cached(self, digest: str, cache_dir: Path | str) -> wc.Component | None:
        """The compiled component of file digest `sha256:…` from `cache_dir`, if it is
        there and usable: how an old version whose file changed is run again."""
        return self._from_cache(_cache_file(cache_dir, digest.removeprefix("sha256:")))

    def _from_cache(self, cache_file: Path) -> wc.Component | None:
        """A compiled component from the cache; None if absent or unusable."""
        # Read into memory rather than `deserialize_file`: that one mmaps the file, and a
        # cache file rewritten in place later would crash the process (SIGBUS).
        try:
            cached = cache_file.read_bytes()
        except OSError:
            return None
        try:
            component = wc.Component.deserialize(self.engine, cached)
        except WasmtimeError as e:
            _log.warning("ignoring unusable compiled cache %s: %s", cache_file, e)
            return None
        _COMPONENT_ENGINES[component] = self
        return component

    def verify_instantiable(self, component: wc.Component, timeout: float = 5.0) -> None:
        """Instantiate `component` once with the activity linker; `ComponentLoadError`
        naming the cause when that fails."""
        limit = time.monotonic() + timeout

        def check() -> str | None:
            return "timeout" if time.monotonic() > limit else None

        with self.slot(check) as got:
            if got is not None:
                raise _NoFreeSlot("cannot instantiate component: no free instance slot")
            store, _ = self.new_store(check)
            store.set_wasi(wasmtime.WasiConfig())
            store.set_wasi_http()
            try:
                self.activity_linker().instantiate(store, component)
            except WasmtimeError as e:
                raise ComponentLoadError(
                    f"cannot instantiate component: {error_cause(str(e))}"
                ) from None
            finally:
                store.close()

    @contextlib.contextmanager
    def slot(self, check: Callable[[], str | None]) -> Iterator[str | None]:
        """`take_slot` … `release_slot` as a context: yields None while the slot is held,
        or the reason `check()` gave for not waiting any longer."""
        if (reason := self.take_slot(check)) is not None:
            yield reason
            return
        try:
            yield None
        finally:
            self.release_slot()


def load_activity(
    source: Path | str, cache_dir: Path | str | None, fallback: WasmEngine
) -> wc.Component:
    """An activity component, compiled for the pooled engine (`WasmEngine.activity_pool`);
    on `fallback` (on-demand instances) when the pool is not available or the component
    does not compile or instantiate for a pooled slot (its runs then say why, if it
    cannot instantiate on demand either)."""
    pool = WasmEngine.activity_pool()
    if not pool.pooled:
        return fallback.load_component(source, cache_dir)
    try:
        component = pool.load_component(source, cache_dir)
        pool.verify_instantiable(component)
    except _NoFreeSlot:  # every slot busy for seconds: most components fit, keep it
        _log.info("%s: not checked against a pooled slot (none was free)", source)
        return component
    except ComponentLoadError as pooled_error:
        # Not for a pooled slot (or not valid at all: then this says so).
        on_demand = fallback.load_component(source, cache_dir)
        _log.info("%s: on-demand instances (%s)", source, pooled_error)
        return on_demand
    return component


# Which engine compiled a component: using it with another engine's store or linker fails
# ("cross-`Engine` instantiation"), so `engine=None` arguments resolve through this.
_COMPONENT_ENGINES: weakref.WeakKeyDictionary[wc.Component, WasmEngine] = (
    weakref.WeakKeyDictionary()
)


def engine_of(component: wc.Component) -> WasmEngine:
    """The `WasmEngine` that loaded `component` (the shared engine if it was not loaded here)."""
    return _COMPONENT_ENGINES.get(component) or WasmEngine.shared()


def _check_header(data: bytes, label: str) -> None:
    if data[:8] == _COMPONENT_HEADER:
        return
    if not data:
        reason = "the file is empty"
    elif data[:8] == _CORE_HEADER:
        reason = (
            "it is a core WebAssembly module (make a component, e.g. `wasm-tools component new`)"
        )
    elif data[:4] == b"\0asm":
        reason = f"unsupported WebAssembly version/layer {data[4:8].hex()}"
    else:
        reason = "not a WebAssembly binary (bad magic number)"
    raise ComponentLoadError(f"not a WebAssembly component: {label}: {reason}")


def _cache_file(cache_dir: Path | str, hexdigest: str) -> Path:
    """Where the compiled code of a component file (by its SHA-256) is cached."""
    return Path(cache_dir) / f"{hexdigest}-{cache_tag()}.cwasm"


def cache_tag() -> str:
    return f"wasmtime{WASMTIME_VERSION}-{platform.machine() or 'unknown'}-epoch"


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:  # a cache that cannot be written only costs compile time
        _log.warning("cannot write compiled cache %s: %s", path, e)
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# Exports


def inspect_exports(
    component: wc.Component, engine: WasmEngine | None = None
) -> dict[str, FunctionSignature]:
    """Map each function of each exported interface to its signature, by FFQN.

    The FFQN is `<interface as exported>.<function>`, e.g. `myapp:demo/activity.step` or
    `myapp:demo/activity@1.0.0.step`. Functions exported outside an interface are ignored.
    A function whose types have no JSON form (resources, streams…) is a `ComponentLoadError`.
    """
    eng = (engine or engine_of(component)).engine
    out: dict[str, FunctionSignature] = {}
    for ifc_name, ext in component.type.exports(eng).items():
        ifc = ext.ty
        if not isinstance(ifc, wc.ComponentInstanceType) or ":" not in ifc_name:
            continue
        for fn_name, fext in ifc.exports(eng).items():
            fty = fext.ty
            if not isinstance(fty, wc.FuncType):
                continue
            ffqn = f"{ifc_name}.{fn_name}"
            try:
                params = [(name, wit_type_from_wasmtime(t)) for name, t in fty.params]
                result_ty = fty.result
                result = None if result_ty is None else wit_type_from_wasmtime(result_ty)
            except WitTypeError as e:
                raise ComponentLoadError(f"cannot use exported function {ffqn}: {e}") from None
            out[ffqn] = FunctionSignature(params, result)
    return out


# ---------------------------------------------------------------------------------------------
# Runs


class _RunState:
    """What host functions of one run need; lives in a thread-local while the guest runs."""

    def __init__(self, sink: LogSink) -> None:
        self.sink = sink
        self._lock = threading.Lock()
        #: What the guest wrote and `flush_output` has not turned into lines yet.
        self.pending: list[tuple[LogStream, bytes]] = []
        self._partial: dict[LogStream, bytes] = {"stdout": b"", "stderr": b""}

    def write(self, stream: LogStream, data: bytes) -> None:
        """What the guest wrote to `stream` (called on a wasmtime thread: only buffer)."""
        with self._lock:
            self.pending.append((stream, data))

    def emit(self, line: LogLine) -> None:
        try:
            self.sink(line)
        except Exception:
            _log.exception("log sink failed")

    def flush_output(self, final: bool = False) -> None:
        """Turn buffered stdout/stderr bytes into lines (the rest of a line too if `final`)."""
        with self._lock:
            pending, self.pending = self.pending, []
        for stream, data in pending:
            buf = self._partial[stream] + data
            *lines, rest = buf.split(b"\n")
            while len(rest) > _MAX_LINE_BYTES:
                lines.append(rest[:_MAX_LINE_BYTES])
                rest = rest[_MAX_LINE_BYTES:]
            self._partial[stream] = rest
            for line in lines:
                self._emit_output(stream, line)
        if final:
            for stream, rest in self._partial.items():
                if rest:
                    self._emit_output(stream, rest)
            self._partial = {"stdout": b"", "stderr": b""}

    def _emit_output(self, stream: LogStream, line: bytes) -> None:
        text = line.removesuffix(b"\r").decode("utf-8", errors="replace")
        self.emit(LogLine("info" if stream == "stdout" else "error", text, stream))


_ACTIVE = threading.local()


def _active_state() -> _RunState | None:
    state: _RunState | None = getattr(_ACTIVE, "state", None)
    return state


def _log_host_function(level: LogLevel) -> Callable[[Any, str], None]:
    def log(_store: Any, message: str) -> None:
        try:
            state = _active_state()
            if state is not None:
                state.flush_output()
                state.emit(LogLine(level, message))
        except Exception:  # never let a Python exception reach wasmtime's global slot
            _log.exception("obelisk:log host function failed")

    return log


def _trap_outcome(error: WasmtimeError) -> RunTrap:
    message = str(error)
    if isinstance(error, wasmtime.ExitTrap):
        return RunTrap(f"guest exited with code {error.code}", message)
    return RunTrap(trap_reason(error), message)


def _err_is_permanent(err_json: Any, err_type: WitType | None) -> bool:
    """An err value is permanent when it is a variant (or enum) case named `*permanent*`."""
    if isinstance(err_type, WitVariant | WitEnum):
        case = err_json if isinstance(err_json, str) else next(iter(err_json), "")
        return "permanent" in case
    return False


class WasmActivityRunner:
    """Runs the exported functions of one activity component; one fresh instance per run."""

    def __init__(
        self,
        component: wc.Component,
        signatures: Mapping[str, FunctionSignature],
        engine: WasmEngine | None = None,
    ) -> None:
        self.component = component
        self.signatures = dict(signatures)
        self.engine = engine or engine_of(component)
        self._linker = self.engine.activity_linker()
        # Their C pointers, valid while the runner holds them (`RunStore.instantiate`).
        self._linker_ptr = self._linker.ptr()
        self._component_ptr = component.ptr()
        self._export_types: dict[str, ExportTypes | None] = {}

    def _types(self, ffqn: str, raw_instance: Any, store: RunStore) -> ExportTypes | None:
        """The export index and types of `ffqn` (None: not exported), looked up once
        (callers read `_export_types` first)."""
        # (Typed loosely: wasmtime-py asks these calls' store only for `_context()`.)
        instance: Any = wc.Instance._from_raw(raw_instance)
        interface, _, function = ffqn.rpartition(".")
        types = None
        ifc_index = self.component.get_export_index(interface)
        fn_index = (
            None if ifc_index is None else self.component.get_export_index(function, ifc_index)
        )
        func = None if fn_index is None else instance.get_func(store, fn_index)
        if func is not None:
            fty = func.type(store)
            result = fty.result
            ok = err = None
            if isinstance(result, wc.ResultType):
                ok, err = result.ok, result.err
            types = ExportTypes(fn_index, tuple(t for _, t in fty.params), ok, err)
        self._export_types[ffqn] = types  # benign race: every thread computes the same
        return types

    def verify_instantiable(self, timeout: float = 5.0) -> None:
        """Instantiate once (imports satisfiable?) so a deployment fails early and clearly."""
        self.engine.verify_instantiable(self.component, timeout)

    def run(self, ffqn: str, params: list[Any], ctx: RunContext) -> RunOutcome:
        """`ActivityRunner.run`. (`ctx.allowed_hosts` is not applied to WASM activities
        yet: their outgoing HTTP is not intercepted.)"""
        return self.call(ffqn, params, ctx.env, ctx.deadline, ctx.cancel, ctx.log)

    def call(
        self,
        ffqn: str,
        params_json: list[Any],
        env_vars: Mapping[str, str],
        deadline: float,
        cancel: threading.Event,
        log: LogSink,
    ) -> RunOutcome:
        """Call `ffqn` with §9.2 JSON params; never raises for guest faults.

        `deadline` is a `time.monotonic()` value; `cancel` may be set from any thread.
        """
        signature = self.signatures.get(ffqn)
        if signature is None:
            return RunTrap(f"function not exported by the component: {ffqn}")
        result_type = signature.result
        if not isinstance(result_type, WitResult):
            return RunTrap(f"{ffqn} does not return a result: {signature.format()}")
        args = self._convert_params(signature, params_json)
        if isinstance(args, RunTrap):
            return args

        state = _RunState(log)

        def check() -> str | None:  # on the guest's thread, every epoch tick
            if state.pending:  # (read without the lock: a racing write waits for the next)
                state.flush_output()
            if cancel.is_set():
                return "cancelled"
            if time.monotonic() >= deadline:
                return "timeout"
            return None

        if (early := check()) is not None:
            return RunCancelled() if early == "cancelled" else RunTimedOut()
        engine = self.engine
        # `engine.slot(check)` written out: a context manager is four Python calls more.
        if (stopped := engine.take_slot(check)) is not None:
            return RunCancelled() if stopped == "cancelled" else RunTimedOut()
        try:
            return self._run_in_slot(ffqn, args, result_type, env_vars, state, check)
        finally:
            engine.release_slot()

    def _run_in_slot(
        self,
        ffqn: str,
        args: list[Any],
        result_type: WitResult,
        env_vars: Mapping[str, str],
        state: _RunState,
        check: Callable[[], str | None],
    ) -> RunOutcome:
        store, interrupt = self.engine.new_run_store(check)

        def interrupted_or_trap(error: WasmtimeError) -> RunOutcome:
            if interrupt.reason == "cancelled":
                return RunCancelled()
            if interrupt.reason == "timeout":
                return RunTimedOut()
            return _trap_outcome(error)

        _ACTIVE.state = state
        try:
            try:
                store.set_wasi(env_vars, state.write)
                instance = store.instantiate(self._linker_ptr, self._component_ptr)
            except WasmtimeError as e:
                outcome = interrupted_or_trap(e)
                if isinstance(outcome, RunTrap):
                    return RunTrap(f"cannot instantiate: {error_cause(str(e))}"[:300], str(e))
                return outcome
            types = (
                self._export_types[ffqn]
                if ffqn in self._export_types
                else self._types(ffqn, instance, store)
            )
            func = None if types is None else store.get_func(instance, types.index.ptr())
            if func is None or types is None:
                return RunTrap(f"function not exported by the component: {ffqn}")
            try:
                is_ok, raw = call_result_func(func, store, args, types)
            except WasmtimeError as e:
                return interrupted_or_trap(e)
            except (TypeError, ValueError) as e:  # wasmtime-py rejected a converted value
                return RunTrap(f"invalid params: {e}", repr(e))
            except Exception as e:  # a bug on our side: report it rather than kill the worker
                _log.exception("calling %s failed", ffqn)
                return RunTrap(f"internal error: {type(e).__name__}: {e}"[:300], repr(e))
            try:
                post_return(func, store)
            except WasmtimeError as e:
                return interrupted_or_trap(e)
            case = "ok" if is_ok else "err"
            payload_type = result_type.ok if is_ok else result_type.err
            try:
                payload = (
                    None
                    if payload_type is None
                    else wasmtime_to_json(raw, payload_type, f"result.{case}")
                )
            except WitValueError as e:
                return RunTrap(f"cannot read result: {e}", repr(raw))
            if is_ok:
                return RunOk(payload)
            return RunErr(payload, permanent=_err_is_permanent(payload, result_type.err))
        finally:
            _ACTIVE.state = None
            state.flush_output(final=True)
            store.close()  # its slot is free once this returns

    def _convert_params(self, signature: FunctionSignature, params: Any) -> list[Any] | RunTrap:
        expected = signature.params
        if not isinstance(params, list) or len(params) != len(expected):
            got = f"{len(params)}" if isinstance(params, list) else type(params).__name__
            names = ", ".join(f"{n}: {t}" for n, t in _formatted(expected))
            return RunTrap(f"invalid params: expected {len(expected)} ({names}), got {got}")
        args = []
        for i, ((name, t), value) in enumerate(zip(expected, params, strict=True)):
            try:
                args.append(json_to_wasmtime(value, t, f"params[{i}]"))
            except WitValueError as e:
                return RunTrap(f"invalid params: parameter {name!r}: {e}", str(e))
        return args


def _formatted(params: Sequence[tuple[str, WitType]]) -> list[tuple[str, str]]:
    return [(n, format_wit_type(t)) for n, t in params]
