"""The `workflow_js` runtime: run one export of an ES module deterministically against a
`WorkflowHost` (SPEC §7.4).

Every `run()` gets a QuickJS sandbox of its own (quickjs-rs, the same engine as
`activity_js`): a new one, or one an earlier run of the same runner ended cleanly in,
reset byte for byte to the state a new one starts in (`engine.runtimes.js.sandbox_pool`).
It loads the module, calls the export with the params as positional arguments and maps
what happens to a `WorkflowOutcome`. `run()` is synchronous and meant for a worker
thread: every host call the guest makes is a plain synchronous call of the
`WorkflowHost` on that thread, which may block it for as long as the host likes (waiting
for a child): no wall-clock timeout runs while the host is working.

JS-visible API
==============

Imports (ES modules resolved from `WorkflowHost.interfaces()`, kebab-case function
names become camelCase; params are passed to the host as a JSON array in declared
order, missing trailing arguments as `null`, extra arguments are a `TypeError`):

* `ns:pkg/ifc` — `f(...args)`: a direct call (`host.call`). Returns the child's ok
  value; throws `ChildExecutionError` when the child returned err (`.value` = the err
  value) or ended in an execution failure (`.value = "execution-failed"`,
  `.failureKind` = the failure kind, `.reason`, `.detail`).
* `ns:pkg-obelisk-ext/ifc` — `fSubmit(joinSet, ...args)` → child execution id (`joinSet`
  is a join set object or its id); `fAwaitNext(joinSet)` → the ok value of the next
  response (`joinSet.lastId` is then its id); throws `ChildExecutionError` as above, or
  `AwaitNextError` with `.value = "all-processed"` when nothing is left to await, or
  `.value = {"function-mismatch": {specified_function, actual_function, actual_id}}`
  when the next response belongs to another function or is a delay (it is consumed);
  `fGet(executionId)` → the ok value of an already processed child (`host.get_result`),
  throwing `ChildExecutionError` for err/failure.
* `ns:pkg-obelisk-schedule/ifc` — `fSchedule(scheduleAt, ...args)` → the id of a new
  top-level execution.
* `ns:pkg-obelisk-stub/ifc` — `fStub(executionId, {ok: v} | {err: v})` → `undefined`.
* `obelisk:workflow@1.0.0` — the host API below as named exports (and as the default
  export); the same object is the global `obelisk`.
* `obelisk:log/log@1.0.0` — `trace/debug/info/warn/error(message)`.

A versioned interface key (`ns:pkg/ifc@1.0.0`) may also be imported without its version
when that is unambiguous. Any other import (relative files, unknown interfaces or
functions) is a `JsWorkflowLoadError` naming the import, the file and the line.

`obelisk` (global, frozen):

| JS | returns |
|---|---|
| `createJoinSet()` / `createJoinSet({name})` | a `JoinSet` (generated `g:N` / named `n:name`) |
| `sleep(scheduleAt, name?)` | the wake-up time as a `Date`; a cancelled sleep throws `ChildExecutionError` (`message "Sleep was cancelled"`, `.cancelled = true`, `.failureKind = "cancelled"`, `.value = "cancelled"`: uncaught, the workflow returns err `"cancelled"`) |
| `call(ffqn, params = [])` | like a direct call |
| `schedule(ffqn, params = [], scheduleAt = "now")` | execution id |
| `stub(executionId, {ok: v} \\| {err: v})` | `undefined` |
| `getResult(executionId)` | the ok value of a processed child (throws like `fGet`) |
| `randomU64(min, maxExclusive)`, `randomU64Inclusive(min, maxInclusive)` | a `number` (bounds must be safe integers ≥ 0), or a `BigInt` when either bound is a `BigInt` (full u64 range) |
| `randomString(minLen, maxLenExclusive)` | an alphanumeric string |
| `executionIdCurrent()`, `executionIdGenerate()` | execution ids (strings) |
| `ChildExecutionError` (alias `ChildError`), `AwaitNextError` | error classes |

`ChildExecutionError` has `.value`, `.childId` (undefined for direct calls and sleep),
`.ffqn`, `.failureKind` (undefined for a plain err), `.cancelled`, `.reason`, `.detail`.

`JoinSet` objects: `id` and `lastId` (read-only; `lastId` is the id of the last response
processed from this join set, `null` before), `submit(ffqn, params = [])` → child id,
`submitDelay(scheduleAt)` → delay id, `close()`, and

* `joinNext()` → `{type: "child", id, ffqn, value}` for an ok child (an err / failed
  child throws `ChildExecutionError` with `.childId`), `{type: "delay", id, cancelled}`,
  or `{type: "allProcessed"}` when nothing is left to await;
* `joinNextTry()` → the same, or `{type: "pending"}` when requests are outstanding but
  no response has arrived.

A *duration* is an object with one or more of `milliseconds`, `seconds`, `minutes`,
`hours`, `days` (non-negative numbers, summed and rounded to whole milliseconds). A
*scheduleAt* is a duration (from now), `{at: Date | unix-ms | ISO string}`, or `"now"`.

Determinism
-----------
`Date.now()`, `new Date()` and `Date()` read `host.now_ms()` (other `Date` constructor
forms are untouched); `Math.random()` is a xoshiro128** PRNG seeded from a SHA-256 of
`host.execution_id` (not recorded: replay reproduces it). There is no `process`,
`fetch`, `setTimeout`, `performance`, filesystem, `WeakRef` or `FinalizationRegistry`
(they depend on when the garbage collector runs). `console.log/info/warn/error/
debug/trace` → `host.log(level, message)` (`log` → `info`).

Values cross between Python and JS as JSON; integers beyond ±(2**53 − 1) cross as
`BigInt` in both directions (params, child results, return values), smaller ones as
numbers — the same rule quickjs-rs uses.

Results
-------
return → `WfOk(value)` (through `JSON.stringify`: `undefined` → None, `BigInt` → int);
throw → `WfErr(value)`: a `ChildExecutionError` / `AwaitNextError` → its `.value`, an
`Error` → its message, anything else → the value as JSON. Misuse of the host API (a
`WorkflowCallError` from the host, or a bad argument caught by the runtime, e.g. an
invalid duration) throws a JS `TypeError`/`Error` that the guest may catch (a
constraint violation, e.g. submitting into a closed join set, is a `RunAborted`: below); uncaught it
ends the run with `WfTrap(reason=message, detail=JS stack)`, as do engine errors (out of
memory, stack overflow, a module that fails to load at run time, a promise that never
settles).

Stopping
--------
* A `RunAborted` raised by any host method makes that JS call throw, makes every later
  host call throw without reaching the host, and arms the QuickJS interrupt handler
  (an uncatchable interrupt at the next poll, within a few ms): the outcome is
  `WfAborted()` whatever the guest does.
* `runner.interrupt(execution_id=None)` (from any thread) does the same for the runs of
  this runner in progress (all of them, or that execution's; a run that has not
  entered `run()` yet is not affected); a guest spinning in a loop without host calls
  is stopped within a few ms. A guest blocked in a host call is not woken: the host
  must return or raise.
* `run(..., spin_timeout=s)`: the guest may compute for at most `s` seconds at a stretch
  (measured from the start and from the return of each host call; time spent inside
  host calls never counts) → `WfTimedOut()`.
* An unexpected exception from the host (a bug: anything but `RunAborted` and
  `WorkflowCallError`) stops the guest and is re-raised by `run()`.

Backtraces
----------
Before every host call that may write history (everything except `log` and
`get_result`) the runtime calls `host.set_stack(frames)` with the JS stack, innermost
first, keeping only frames of the workflow's own file.

Cost and quickjs-rs internals
-----------------------------
Like `activity_js`, the runtime installs its own interrupt handler and a linear-memory
limit through private attributes of quickjs-rs 0.2.6 (`Runtime._engine_rt`,
`Context._engine_ctx._inst.store`). More private hooks make runs cheaper, each with a
switch the tests flip to check both paths give the same results: `USE_SNAPSHOT` (every
run restores a heap image taken once after the prelude instead of compiling it),
`USE_MODULE_IMAGE` (with it, a heap image taken once per runner and import table after
the module loaded: no module compile per run, unless the module's top-level code made
host calls or read the execution's id or random numbers before `__obelisk_init`, see
`JsWorkflowRunner._module_image`), `REUSE_SANDBOXES` (a run from the module image takes
the sandbox of an earlier run, reset to the image: `engine.runtimes.js.sandbox_pool`)
and `ACCELERATE` (a leaner guest-call path and direct memory access,
`engine.runtimes.js.quickjs_fast`, and the one-string host bridge read without
quickjs-rs's generic marshalling). Images restore page-wise (`engine.runtimes.js.heap`).
With all of them a run of a short workflow costs ~1.3 ms of CPU on a reused sandbox
(~2.6 ms on a new one), plus ~0.09 ms per host call (vs ~10 ms and ~0.4 ms without
them; measured on a shared 2-core machine, so indicative only).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any

import wasmtime
from quickjs_rs import (
    DeadlockError,
    InterruptError,
    JSError,
    MemoryLimitError,
    QuickJSError,
    Runtime,
)

from engine.core.records import Frame
from engine.runtimes.gil import keep_gil
from engine.runtimes.js.activity import (
    LAZY_EXPORTS as LAZY_EXPORTS,  # `quickjs_fast.install_lazy_exports` (see below)
)
from engine.runtimes.js.common import (
    DEFAULT_MEMORY_LIMIT,
    out_of_memory_reason,
    result_record,
    run_coroutine,
    trap_reason,
    warm_up,
)
from engine.runtimes.js.heap import HeapImage, SandboxImages
from engine.runtimes.js.quickjs_fast import eval_script_sync, fast_guest_calls, map_host_function
from engine.runtimes.js.sandbox_pool import PooledSandbox, SandboxPool, retire_context
from engine.runtimes.js.workflow_bridge import ABORT_REPLY, HostBridge, wide_ints_as_bigints
from engine.runtimes.js.workflow_load_errors import JsWorkflowLoadError, load_error
from engine.runtimes.js.workflow_prelude import (
    INTERNAL_MODULE,
    INTERNAL_MODULE_SOURCE,
    LOAD_MODULE,
    LOAD_SNIPPET,
    LOG_MODULE,
    LOG_MODULE_SOURCE,
    PRELUDE_SOURCE,
    WORKFLOW_MODULE,
    WORKFLOW_MODULE_SOURCE,
    VirtualModule,
    camel_case,
    module_source,
    module_table,
    prelude_seed,
)
from engine.runtimes.outcome import WfAborted, WfErr, WfOk, WfTimedOut, WfTrap, WorkflowOutcome
from engine.runtimes.workflow_host import FunctionShape, RunAborted, WorkflowHost

# Memory reads and writes, export lookups and type conversions of every guest call and
# host callback keep the GIL (`engine.runtimes.gil`).
keep_gil()

__all__ = [
    "DEFAULT_LOAD_TIMEOUT",
    "JsWorkflowLoadError",
    "JsWorkflowRunner",
    "WfAborted",
    "WfErr",
    "WfOk",
    "WfTimedOut",
    "WfTrap",
    "WorkflowOutcome",
    "camel_case",
    "parse_js_stack",
    "warm_up",
]

log = logging.getLogger("obelisk.workflow.js")

DEFAULT_LOAD_TIMEOUT = 5.0
"""Seconds the module's top-level code may compute during `check()`."""

_MIN_MEMORY_LIMIT = 4 * 1024 * 1024
#: The reply buffer of a run's host calls starts at this size (bytes) and grows to fit,
#: up to `_REPLY_BUFFER_MAX`; a larger reply is allocated for itself.
_REPLY_BUFFER = 1024
_REPLY_BUFFER_MAX = 1024 * 1024
_FOREVER = 10.0 * 365 * 24 * 3600


# ---------------------------------------------------------------------------
# JS stacks
# ---------------------------------------------------------------------------

#: Distinct stacks a runner keeps parsed (`JsWorkflowRunner.stack_frames`).
_MAX_CACHED_STACKS = 1024

_FRAME = re.compile(r"^\s*at (?:(.*?) \()?(.+):(\d+):(\d+)\)?\s*$")


def parse_js_stack(stack: str, filename: str | None = None) -> list[Frame]:
    """QuickJS `Error.stack` text → frames, innermost first. With `filename`, only the
    frames of that file are kept."""
    frames: list[Frame] = []
    for text in stack.splitlines():
        m = _FRAME.match(text)
        if m is None:
            continue
        file = m.group(2)
        if filename is not None and file != filename:
            continue
        function = m.group(1) or ""
        if function == "<anonymous>":
            function = ""
        frames.append(Frame(file, int(m.group(3)), int(m.group(4)), function))
    return frames


#: Whether runs start from a heap image taken after the prelude (tests compare both).
USE_SNAPSHOT = True
#: Whether runs start from a heap image taken once per runner after its module loaded
#: (only with `USE_SNAPSHOT`; tests compare both).
USE_MODULE_IMAGE = True
#: Whether a run from the module image takes the sandbox of an earlier run that ended
#: cleanly, reset to the image (`engine.runtimes.js.sandbox_pool`; tests compare both).
REUSE_SANDBOXES = True


def _prepare_prelude(_memory_limit: int, ctx: Any) -> None:
    ctx.register("__obelisk_host", lambda _request: ABORT_REPLY, is_async=False)
    ctx.eval(PRELUDE_SOURCE, filename="<obelisk:prelude>")


#: Heap images with the prelude evaluated, one per memory limit: restoring one is much
#: cheaper than compiling and running the prelude in every run.
_prelude_images = SandboxImages[int](_prepare_prelude)


# ---------------------------------------------------------------------------
# The faster guest-call path (`engine.runtimes.js.quickjs_fast`)
# ---------------------------------------------------------------------------

#: Whether runs use `engine.runtimes.js.quickjs_fast` (tests compare both paths).
ACCELERATE = True
# Every QuickJS sandbox of the process wraps its exports when first used, not all at
# once: `LAZY_EXPORTS`, installed by `engine.runtimes.js.activity` (imported above).


# ---------------------------------------------------------------------------
# One run = one fresh QuickJS runtime + context
# ---------------------------------------------------------------------------


class ImportsKey:
    """An import table's key (its modules, sorted), hashed once: a run looks its module
    image up by it, and a tuple of a dozen dataclasses would be hashed field by field on
    every lookup."""

    __slots__ = ("_hash", "items")

    def __init__(self, items: tuple[Any, ...]) -> None:
        self.items = items
        self._hash = hash(items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImportsKey) and self.items == other.items


#: The file name of the script that calls the workflow's function.
INVOKE = "<obelisk:invoke>"


def _invoke_result(result: Any) -> str:
    if not isinstance(result, str):
        raise QuickJSError(f"unexpected invoke result {result!r}")
    return result


class _Run(HostBridge):
    def __init__(
        self,
        runner: JsWorkflowRunner,
        host: WorkflowHost | None,
        interfaces: Mapping[str, Mapping[str, FunctionShape]],
        execution_id: str,
        spin_timeout: float | None,
        modules: dict[str, VirtualModule] | None = None,
    ) -> None:
        self.runner = runner
        self.host = host
        self.execution_id = execution_id
        self.spin_timeout = spin_timeout
        #: The import table (`module_table(interfaces)`, passed in when already known).
        self.modules = module_table(interfaces) if modules is None else modules
        self.filename = runner.filename
        # Stop flags: plain attributes, read by the interrupt handler (O(1)).
        self.stop = False  # interrupt() was called
        self.aborted = False  # the host raised RunAborted
        self.timed_out = False
        self.host_failure: BaseException | None = None
        self.guest_since = time.monotonic()
        self.unresolved: list[str] = []
        self.rt: Any = None
        self.ctx: Any = None
        self.accelerated = False
        self.from_snapshot = False
        #: Set before `open()`: start from this heap image, module loaded (see
        #: `JsWorkflowRunner._module_image`); `module_loaded` once that happened.
        self.module_image: HeapImage | None = None
        self.module_loaded = False
        #: Whether `__obelisk_init` ran (with a module image: as part of the invoke).
        self.initialized = False
        #: Host calls made so far (a module image needs a load that made none).
        self.dispatched = 0
        #: The function ran to its end (returned or threw): the sandbox may be reused.
        self.clean_end = False
        self._ops = self._host_operations()

    # -- sandbox --

    def open(self, *, init: bool = True) -> None:
        runner = self.runner
        if REUSE_SANDBOXES and self.module_image is not None:
            pooled = runner.sandboxes.take(self.module_image)
            if pooled is not None:
                try:
                    self._open_pooled(pooled)
                    return
                except Exception:  # not reusable after all: a new one, as without a pool
                    log.debug("a pooled sandbox could not be reused", exc_info=True)
                    pooled.close()
                    self.rt = self.ctx = None
        self.rt = Runtime(memory_limit=runner.memory_limit)
        self.rt.set_module_loader(normalize=self._normalize, load=self._load)
        self.ctx = self.rt.new_context(timeout=_FOREVER)
        # No wall-clock timeout: our own handler stops the guest only when told to.
        self.rt._engine_rt.set_interrupt_handler(self._should_interrupt)
        inst: Any = self.ctx._engine_ctx._inst
        inst.store.set_limits(memory_size=runner.memory_limit)
        self.accelerated = ACCELERATE and fast_guest_calls(inst) and self._fast_host_call(inst)
        image = None
        if USE_SNAPSHOT:
            image = self.module_image or _prelude_images.get(
                runner.memory_limit, runner.memory_limit, inst
            )
        if image is not None:
            # The guest calls host functions by name: mapping the name to this run's
            # dispatcher is all a restored prelude's (restored) `__obelisk_host` needs.
            # (`register` would also make a JS function and set it on the global
            # object, three guest calls the restore then overwrites.)
            map_host_function(self.ctx, "__obelisk_host", self._dispatch)
            image.restore(inst)
            self.from_snapshot = True
            self.module_loaded = image is self.module_image
        else:
            self.ctx.register("__obelisk_host", self._dispatch, is_async=False)
            self.ctx.eval(PRELUDE_SOURCE, filename="<obelisk:prelude>")
        if init and not self.module_loaded:
            # The module's top-level code runs after `__obelisk_init`; restored with the
            # module loaded, the init goes with the invoke instead (one eval less).
            self.ctx.eval(self._init_js(), filename="<obelisk:init>")
            self.initialized = True

    def _open_pooled(self, pooled: PooledSandbox) -> None:
        """`open` on a sandbox of an earlier run, reset to this run's module image."""
        self.rt = pooled.rt
        self.rt.set_module_loader(normalize=self._normalize, load=self._load)
        self.ctx = pooled.new_context(_FOREVER)
        self.rt._engine_rt.set_interrupt_handler(self._should_interrupt)
        inst: Any = self.ctx._engine_ctx._inst
        self.accelerated = pooled.accelerated and self._fast_host_call(inst)
        map_host_function(self.ctx, "__obelisk_host", self._dispatch)
        self.from_snapshot = self.module_loaded = True

    def pooled(self) -> PooledSandbox | None:
        """This run's sandbox for the next run, when it ended cleanly from its module
        image (`engine.runtimes.js.sandbox_pool`); None: close it."""
        ctx, image = self.ctx, self.module_image
        if not (self.clean_end and self.module_loaded and image is not None and ctx is not None):
            return None
        if self.stopping or ctx._closed or ctx._pending_tasks or ctx._eval_async_in_flight:
            return None
        inst = ctx._engine_ctx._inst
        try:
            if inst.mem.data_len(inst.store) != image.memory_size:
                return None  # grew: a reset cannot shrink it
        except Exception:  # the store is gone
            return None
        retire_context(self.rt, ctx)
        return PooledSandbox(self.rt, inst, image, self.accelerated)

    def _init_js(self) -> str:
        return (
            f"__obelisk_init({json.dumps(self.execution_id)}, "
            f"{json.dumps(prelude_seed(self.execution_id))});"
        )

    def _fast_host_call(self, inst: Any) -> bool:
        """Route the prelude's `__obelisk_host(request)` straight to `_dispatch`.

        quickjs-rs marshals every argument generically (type probe, then value), which
        costs extra guest calls; the request is always one string, so read it as one.
        Other host functions (none today) keep the generic path."""
        # The instance's own one (a reused sandbox still has an earlier run's wrapper).
        generic = inst.__dict__.setdefault("obelisk_generic_host_call", inst._host_call)
        name = b"__obelisk_host"
        if not callable(generic) or not hasattr(inst, "_get_string"):
            return False

        write_at = getattr(inst, "write_at", None)
        # Replies go through one buffer allocated once per run (a new string is a copy):
        # two guest calls less per host call than allocating and freeing each time.
        reply_buffer = [0, 0]  # guest pointer, capacity

        def new_string(reply: str) -> int:
            data = reply.encode()
            n = len(data)
            if write_at is None or n > _REPLY_BUFFER_MAX:
                return int(inst._new_string(reply))
            if n > reply_buffer[1]:
                if reply_buffer[0]:
                    inst.c("qjs_free", reply_buffer[0], reply_buffer[1])
                    reply_buffer[0] = reply_buffer[1] = 0
                capacity = max(_REPLY_BUFFER, 1 << (n - 1).bit_length())
                ptr = inst.c("qjs_alloc", capacity)
                if ptr == 0:
                    return int(inst._new_string(reply))
                reply_buffer[0], reply_buffer[1] = ptr, capacity
            write_at(reply_buffer[0], data)
            return int(inst.c("new_string", reply_buffer[0], n))

        def host_call(name_ptr: int, name_len: int, this: int, argc: int, argv_ptr: int) -> int:
            if argc != 1 or name_len != len(name) or inst.read(name_ptr, name_len) != name:
                return int(generic(name_ptr, name_len, this, argc, argv_ptr))
            try:
                handle = int.from_bytes(inst.read(argv_ptr, 4), "little", signed=True)
                return new_string(self._dispatch(inst._get_string(handle)))
            except Exception:
                return -1  # quickjs-rs's HOST_CALL_ERROR: the guest throws a HostError

        inst._host_call = host_call
        return True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.ctx is not None:
                self.ctx.close()
        with contextlib.suppress(Exception):
            if self.rt is not None:
                self.rt.close()

    def _should_interrupt(self) -> bool:
        if self.stop or self.aborted or self.timed_out or self.host_failure is not None:
            return True
        limit = self.spin_timeout
        if limit is not None and time.monotonic() - self.guest_since > limit:
            self.timed_out = True
            return True
        return False

    # -- module loader --

    def _normalize(self, base: str, spec: str) -> str | None:
        if spec == self.filename and base == LOAD_MODULE:
            return spec
        if spec == LOAD_MODULE:
            return spec if base != self.filename else None
        if spec == INTERNAL_MODULE:
            return spec if base != self.filename else None
        if spec in (WORKFLOW_MODULE, LOG_MODULE) or spec in self.modules:
            return spec
        self.unresolved.append(spec)
        return None

    def _load(self, name: str) -> str | None:
        if name == self.filename:
            return self.runner.source
        if name == LOAD_MODULE:
            return LOAD_SNIPPET.format(spec=json.dumps(self.filename))
        if name == INTERNAL_MODULE:
            return INTERNAL_MODULE_SOURCE
        if name == WORKFLOW_MODULE:
            return WORKFLOW_MODULE_SOURCE
        if name == LOG_MODULE:
            return LOG_MODULE_SOURCE
        module = self.modules.get(name)
        return None if module is None else module_source(module)

    async def load_module(self) -> None:
        if self.module_loaded:  # restored from the runner's module image
            return
        self.guest_since = time.monotonic()
        await self.ctx.eval_async(f"import {json.dumps(LOAD_MODULE)};", module=True)

    async def invoke(self, export: str, params_js: str) -> str:
        code = self._invoke_code(export, params_js)
        self.guest_since = time.monotonic()
        return _invoke_result(await self.ctx.eval_async(code, filename=INVOKE))

    def invoke_sync(self, export: str, params_js: str) -> str:
        """`invoke` without an event loop (`quickjs_fast.eval_script_sync`)."""
        code = self._invoke_code(export, params_js)
        self.guest_since = time.monotonic()
        return _invoke_result(eval_script_sync(self.ctx, code, INVOKE))

    def _invoke_code(self, export: str, params_js: str) -> str:
        code = (
            f"await __obelisk_invoke(__obelisk_module, {json.dumps(export)}, "
            f"{json.dumps(params_js)})"
        )
        if not self.initialized:
            code = self._init_js() + code
            self.initialized = True
        return code

    def export_kind(self, export: str) -> tuple[str, list[str]]:
        kind, names = self.ctx.eval(
            f"[typeof __obelisk_module[{json.dumps(export)}], Object.keys(__obelisk_module)]"
        )
        return str(kind), [str(n) for n in names]


# ---------------------------------------------------------------------------
# Public runner
# ---------------------------------------------------------------------------


class JsWorkflowRunner:
    """Runs one export of a `workflow_js` module; one QuickJS sandbox per `run()` at a time.

    The constructor does not load the module: call `check(interfaces)` to validate it
    against a deployment's interfaces (raises `JsWorkflowLoadError`).
    """

    def __init__(
        self,
        source: str,
        filename: str,
        export_name: str | None = None,
        *,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        load_timeout: float = DEFAULT_LOAD_TIMEOUT,
    ) -> None:
        if memory_limit < _MIN_MEMORY_LIMIT:
            raise ValueError(f"memory_limit must be at least {_MIN_MEMORY_LIMIT} bytes")
        if filename in (LOAD_MODULE, INTERNAL_MODULE, WORKFLOW_MODULE, LOG_MODULE):
            raise ValueError(f"reserved module name {filename!r}")
        self.source = source
        self.filename = filename
        self.export_name = export_name
        self.memory_limit = memory_limit
        self.load_timeout = load_timeout
        self._lock = threading.Lock()
        self._active: set[_Run] = set()
        #: Heap images after the module loaded, by the import table they were loaded
        #: with (None: this module cannot have one). See `_module_image`.
        self._module_images: dict[ImportsKey, HeapImage | None] = {}
        self._image_lock = threading.Lock()
        #: Sandboxes of earlier runs, for the next ones (`REUSE_SANDBOXES`).
        self.sandboxes = SandboxPool()
        #: The last interfaces object runs came with, its import table and the table's
        #: key (`_modules_for`).
        self._last_modules: tuple[Any, dict[str, VirtualModule], ImportsKey] | None = None
        #: `Error.stack` text → its frames in this file: a workflow's calls come from a
        #: few places, each parsed once (the lists are shared, never changed).
        self._stacks: dict[str, list[Frame]] = {}

    def stack_frames(self, stack: str) -> list[Frame]:
        frames = self._stacks.get(stack)
        if frames is None:
            frames = parse_js_stack(stack, self.filename)
            if len(self._stacks) >= _MAX_CACHED_STACKS:
                self._stacks.clear()
            self._stacks[stack] = frames
        return frames

    @property
    def export(self) -> str:
        """The export's name in the module namespace (`default` for the default export)."""
        return "default" if self.export_name is None else self.export_name

    def _describe_export(self) -> str:
        return "default export" if self.export_name is None else f"export '{self.export_name}'"

    # -- validation --

    def check(self, interfaces: Mapping[str, Mapping[str, FunctionShape]]) -> None:
        """Load the module in a fresh sandbox without a host (its top-level code may not
        use the host API) and verify that every import resolves and that the export is
        a function. Raises `JsWorkflowLoadError`."""
        run = _Run(self, None, interfaces, "E_check", self.load_timeout)
        try:
            run_coroutine(lambda: self._check_async(run))
        finally:
            run.close()

    async def _check_async(self, run: _Run) -> None:
        fname = self.filename
        try:
            run.open()
        except Exception as e:
            raise JsWorkflowLoadError(
                f"{fname}: cannot create the JS sandbox: {e}", filename=fname
            ) from e
        try:
            await run.load_module()
        except InterruptError:
            raise JsWorkflowLoadError(
                f"{fname}: module evaluation did not finish within {self.load_timeout:g} s",
                filename=fname,
            ) from None
        except MemoryLimitError:
            raise JsWorkflowLoadError(
                f"{fname}: out of memory while loading the module", filename=fname
            ) from None
        except DeadlockError:
            raise JsWorkflowLoadError(
                f"{fname}: module evaluation awaits a promise that never settles",
                filename=fname,
            ) from None
        except JSError as e:
            raise self._load_error(run, e) from None
        except wasmtime.Trap as e:
            raise JsWorkflowLoadError(
                f"{fname}: engine trap while loading: {trap_reason(e)}", filename=fname
            ) from None
        except QuickJSError as e:
            raise JsWorkflowLoadError(
                f"{fname}: cannot load the module: {e}", filename=fname
            ) from None
        kind, exports = run.export_kind(self.export)
        if kind == "undefined":
            listed = ", ".join(exports) if exports else "none"
            raise JsWorkflowLoadError(
                f"{fname}: no {self._describe_export()} (exports: {listed})", filename=fname
            )
        if kind != "function":
            raise JsWorkflowLoadError(
                f"{fname}: {self._describe_export()} is not a function (it is {kind})",
                filename=fname,
            )

    def _load_error(self, run: _Run, e: JSError) -> JsWorkflowLoadError:
        return load_error(self.filename, self.source, run.modules, e, run._load)

    # -- running --

    def interrupt(self, execution_id: str | None = None) -> None:
        """Stop the runs of this runner in progress (all, or that execution's), from any
        thread: their outcome is `WfAborted`. A guest blocked in a host call is not
        woken (the host must return or raise); a computing guest stops within ms."""
        with self._lock:
            for run in self._active:
                if execution_id is None or run.execution_id == execution_id:
                    run.stop = True

    def run(
        self,
        host: WorkflowHost,
        params: list[Any],
        *,
        ffqn: str | None = None,
        spin_timeout: float | None = None,
    ) -> WorkflowOutcome:
        """Run the export once against `host` with `params` as positional arguments (a
        JS workflow exports one function: `ffqn` is the one it was deployed as).

        Never raises for guest faults; re-raises an unexpected exception of the host.
        """
        try:
            params_js = json.dumps(wide_ints_as_bigints(list(params)), allow_nan=False)
        except (TypeError, ValueError) as e:
            return WfTrap(f"params are not JSON: {e}")
        try:
            interfaces = host.interfaces()
        except RunAborted:
            return WfAborted()
        modules, modules_key = self._modules_for(interfaces)
        run = _Run(self, host, interfaces, host.execution_id, spin_timeout, modules)
        if USE_SNAPSHOT and USE_MODULE_IMAGE:
            run.module_image = self._module_image(modules_key, interfaces)
        with self._lock:
            self._active.add(run)
        try:
            outcome = self._run_body(run, params_js)
        finally:
            with self._lock:
                self._active.discard(run)
            pooled = run.pooled() if REUSE_SANDBOXES else None
            if pooled is not None:
                self.sandboxes.give(pooled)
            else:
                run.close()
        if run.host_failure is not None:
            raise run.host_failure
        if run.stop or run.aborted:
            return WfAborted()
        if run.timed_out:
            return WfTimedOut()
        if isinstance(outcome, WfTrap) and outcome.reason.endswith("out of memory"):
            return WfTrap(out_of_memory_reason(self.memory_limit), outcome.detail)
        return outcome

    def _modules_for(
        self, interfaces: Mapping[str, Mapping[str, FunctionShape]]
    ) -> tuple[dict[str, VirtualModule], ImportsKey]:
        """The import table of runs against `interfaces`, and its key: computed once per
        interfaces object (a registry's, shared by all its runs), not on every run."""
        last = self._last_modules
        if last is not None and last[0] is interfaces:
            return last[1], last[2]
        modules = module_table(interfaces)
        key = ImportsKey(tuple(sorted(modules.items())))
        self._last_modules = (interfaces, modules, key)  # one assignment: no lock needed
        return modules, key

    def _module_image(
        self,
        key: ImportsKey,
        interfaces: Mapping[str, Mapping[str, FunctionShape]],
    ) -> HeapImage | None:
        """The heap after the module loaded, for runs with these imports (built on first
        use): a run restores it instead of compiling and evaluating the module and its
        imports (~2 ms). The module is loaded once without a host and before
        `__obelisk_init`; a module whose top-level code made a host call or read the
        execution's id or random numbers (which `__obelisk_init` sets) gets no image, so
        each of its runs loads it after `__obelisk_init` as before."""
        try:
            return self._module_images[key]
        except KeyError:
            pass
        with self._image_lock:
            if key in self._module_images:
                return self._module_images[key]
            image = self._build_module_image(interfaces)
            if len(self._module_images) >= 8:  # imports changed: the old ones are gone
                self._module_images.clear()
            self._module_images[key] = image
            return image

    def _build_module_image(
        self, interfaces: Mapping[str, Mapping[str, FunctionShape]]
    ) -> HeapImage | None:
        template = _Run(self, None, interfaces, "", self.load_timeout)

        async def load() -> None:
            template.open(init=False)
            await template.load_module()

        try:
            run_coroutine(load)
            # Restored from the prelude's image, so the one that knows a fresh sandbox.
            prelude = _prelude_images.peek(self.memory_limit) if template.from_snapshot else None
            if (
                prelude is None
                or template.dispatched
                or template.stopping
                or template.unresolved
                or template.ctx.eval("__obelisk_pre_init_reads()") != 0
                or template.export_kind(self.export)[0] != "function"
            ):
                return None
            return prelude.capture_more(template.ctx._engine_ctx._inst)
        except Exception:  # the runs load the module themselves and report what fails
            log.debug("%s: no module heap image", self.filename, exc_info=True)
            return None
        finally:
            template.close()

    def _run_body(self, run: _Run, params_js: str) -> WorkflowOutcome:
        """Open the sandbox and run the function. A sandbox restored with the module
        loaded (its image) runs without an event loop (`eval_script_sync`: the
        workflow's host calls are synchronous); one that must load the module first
        goes through quickjs-rs's `eval_async` on this thread's loop."""
        try:
            run.open()
        except Exception as e:
            return WfTrap(f"cannot create the JS sandbox: {e}", traceback.format_exc())
        if not run.module_loaded:
            return run_coroutine(lambda: self._run_async(run, params_js))
        try:
            text = run.invoke_sync(self.export, params_js)
            run.clean_end = True
        except Exception as e:
            return self._guest_error(run, "running the function", e)
        return self._outcome_from_record(text)

    async def _run_async(self, run: _Run, params_js: str) -> WorkflowOutcome:
        stage = "loading the module"
        try:
            await run.load_module()
            stage = "running the function"
            text = await run.invoke(self.export, params_js)
            run.clean_end = True
        except Exception as e:
            return self._guest_error(run, stage, e)
        return self._outcome_from_record(text)

    def _guest_error(self, run: _Run, stage: str, e: Exception) -> WfTrap:
        """What a run that raised `e` while `stage` ends with."""
        if isinstance(e, InterruptError):
            return WfTrap("interrupted")  # replaced by run() according to the stop flags
        if isinstance(e, MemoryLimitError):
            return WfTrap("out of memory")
        if isinstance(e, DeadlockError):
            return WfTrap(
                f"{stage}: awaited a promise that never settles (host calls are synchronous; "
                "there are no timers)"
            )
        if isinstance(e, JSError):
            if stage == "loading the module":
                return WfTrap(str(self._load_error(run, e)), e.stack or "")
            return WfTrap(f"{stage}: {e.name}: {e.message}", e.stack or "")
        if isinstance(e, wasmtime.Trap):
            reason = trap_reason(e)
            return WfTrap(reason, "" if reason == "stack overflow" else str(e))
        if isinstance(e, QuickJSError):
            return WfTrap(f"{stage}: {type(e).__name__}: {e}", traceback.format_exc())
        return WfTrap(f"{stage}: internal error: {e!r}", traceback.format_exc())

    def _user_stack(self, stack: str) -> str:
        """Keep the frames of the workflow's own file (the rest is the runtime's)."""
        lines = [
            line
            for line in stack.splitlines()
            if any(f.file == self.filename for f in parse_js_stack(line))
        ]
        return "\n".join(lines) if lines else stack

    def _outcome_from_record(self, text: str) -> WorkflowOutcome:
        record = result_record(text)
        if record.kind == "ok":
            return WfOk(record.value)
        if record.kind == "err":
            return WfErr(record.value)
        if record.kind == "oom":
            return WfTrap(record.reason)
        return WfTrap(record.reason, self._user_stack(record.detail))
