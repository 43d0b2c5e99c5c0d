"""The `workflow_js` runtime: run one export of an ES module deterministically against a
`WorkflowHost` (SPEC §7.4).

Every `run()` gets a brand-new QuickJS sandbox (quickjs-rs, the same engine as
`activity_js`), loads the module, calls the export with the params as positional
arguments and maps what happens to a `WorkflowOutcome`. `run()` is synchronous and meant
for a worker thread: every host call the guest makes is a plain synchronous call of the
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
`JsWorkflowRunner._module_image`) and `ACCELERATE` (a leaner guest-call path and direct
memory access, `engine.runtimes.js.quickjs_fast`, and the one-string host bridge read without
quickjs-rs's generic marshalling). Images restore page-wise (`engine.runtimes.js.heap`).
With all of them a run costs ~2.5 ms of CPU alone, ~5 ms with a hundred at once, plus
~0.09 ms per host call (vs ~10 ms and ~0.4 ms without them; measured on a shared 2-core machine, so
indicative only).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
    BIGINT_PREFIX,
    DEFAULT_MEMORY_LIMIT,
    out_of_memory_reason,
    parse_json_result,
    run_coroutine,
    source_line,
    trap_reason,
    warm_up,
)
from engine.runtimes.js.heap import HeapImage, SandboxImages
from engine.runtimes.js.quickjs_fast import fast_guest_calls, map_host_function
from engine.runtimes.outcome import WfAborted, WfErr, WfOk, WfTimedOut, WfTrap, WorkflowOutcome
from engine.runtimes.workflow_host import (
    AllProcessed,
    ChildResponse,
    DelayResponse,
    FunctionMismatch,
    FunctionShape,
    Pending,
    RunAborted,
    ScheduleAtArg,
    WorkflowCallError,
    WorkflowHost,
)

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
_FOREVER = 10.0 * 365 * 24 * 3600
_LOAD_MODULE = "<obelisk:load>"
_INTERNAL_MODULE = "obelisk:internal"
_WORKFLOW_MODULE = "obelisk:workflow@1.0.0"
_LOG_MODULE = "obelisk:log/log@1.0.0"
_LOG_LEVELS = frozenset({"trace", "debug", "info", "warn", "error"})
_EXT_SUFFIXES = ("-obelisk-ext", "-obelisk-schedule", "-obelisk-stub")
_API_NAMES = (
    "createJoinSet",
    "sleep",
    "call",
    "schedule",
    "stub",
    "getResult",
    "randomU64",
    "randomU64Inclusive",
    "randomString",
    "executionIdCurrent",
    "executionIdGenerate",
    "ChildExecutionError",
    "ChildError",
    "AwaitNextError",
)


class JsWorkflowLoadError(Exception):
    """The module does not load (syntax, unknown import, top-level throw), or the export
    is missing or not a function. The message names the file (and line where known)."""

    def __init__(self, message: str, *, filename: str, line: int | None = None) -> None:
        super().__init__(message)
        self.filename = filename
        self.line = line


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def camel_case(name: str) -> str:
    """WIT kebab-case → JS camelCase: `sleep-millis` → `sleepMillis`."""
    parts = [p for p in name.lstrip("%").split("-") if p]
    if not parts:
        return name
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


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


def _seed(execution_id: str) -> list[int]:
    digest = hashlib.sha256(b"obelisk:math-random:" + execution_id.encode()).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    if not any(words):  # xoshiro must not start from all zeros
        words[0] = 1
    return words


def _split_interface(key: str) -> tuple[str, str, str] | None:
    """`ns:pkg/ifc@v` → (`ns:pkg`, `ifc`, `@v`)."""
    m = re.fullmatch(r"([^:/@\s]+:[^:/@\s]+)/([^/@\s]+)(@[^\s]+)?", key)
    if m is None:
        return None
    return m.group(1), m.group(2), m.group(3) or ""


@dataclass(frozen=True, slots=True)
class _VirtualModule:
    kind: str  # "direct" | "ext" | "schedule" | "stub"
    interface: str
    functions: tuple[tuple[str, FunctionShape], ...]  # (wit name, shape)


def _module_table(
    interfaces: Mapping[str, Mapping[str, FunctionShape]],
) -> dict[str, _VirtualModule]:
    table: dict[str, _VirtualModule] = {}
    unversioned: dict[str, list[str]] = {}
    for key in sorted(interfaces):
        split = _split_interface(key)
        if split is None:
            continue
        pkg, ifc, version = split
        functions = tuple(sorted(interfaces[key].items()))
        names = {
            "direct": key,
            "ext": f"{pkg}-obelisk-ext/{ifc}{version}",
            "schedule": f"{pkg}-obelisk-schedule/{ifc}{version}",
            "stub": f"{pkg}-obelisk-stub/{ifc}{version}",
        }
        for kind, name in names.items():
            table[name] = _VirtualModule(kind, key, functions)
            if version:
                unversioned.setdefault(name[: -len(version)], []).append(name)
    for alias, targets in unversioned.items():
        if alias not in table and len(targets) == 1:
            table[alias] = table[targets[0]]
    return table


def _module_source(module: _VirtualModule) -> str:
    out = ['import I from "obelisk:internal";']
    exported: set[str] = set()
    for index, (wit_name, shape) in enumerate(module.functions):
        base = camel_case(wit_name)
        ffqn = json.dumps(shape.ffqn)
        params = json.dumps(list(shape.param_names))
        entries: list[tuple[str, str]]
        if module.kind == "direct":
            entries = [(base, f"I.direct({ffqn}, {params}, {json.dumps(base)})")]
        elif module.kind == "ext":
            entries = [
                (f"{base}Submit", f"I.submitFn({ffqn}, {params}, {json.dumps(base + 'Submit')})"),
                (f"{base}AwaitNext", f"I.awaitNextFn({ffqn}, {json.dumps(base + 'AwaitNext')})"),
                (f"{base}Get", f"I.getFn({ffqn}, {json.dumps(base + 'Get')})"),
            ]
        elif module.kind == "schedule":
            name = base + "Schedule"
            entries = [(name, f"I.scheduleFn({ffqn}, {params}, {json.dumps(name)})")]
        else:
            name = base + "Stub"
            entries = [(name, f"I.stubFn({ffqn}, {json.dumps(name)})")]
        for n, (export, expr) in enumerate(entries):
            if export in exported:
                continue
            exported.add(export)
            local = f"f{index}_{n}"
            out.append(f"const {local} = {expr};")
            out.append(f"export {{ {local} as {export} }};")
    return "\n".join(out) + "\n"


_WORKFLOW_MODULE_SOURCE = (
    'import I from "obelisk:internal";\n'
    "const api = I.api;\n"
    + "".join(f"export const {n} = api.{n};\n" for n in _API_NAMES)
    + "export default api;\n"
)

_LOG_MODULE_SOURCE = 'import I from "obelisk:internal";\n' + "".join(
    f'export const {lvl} = I.logFn("{lvl}");\n' for lvl in sorted(_LOG_LEVELS)
)

_INTERNAL_MODULE_SOURCE = (
    "const I = globalThis.__obelisk_internal;\n"
    "delete globalThis.__obelisk_internal;\n"
    "export default I;\n"
)

_LOAD_SNIPPET = (
    'import "obelisk:internal";\n'
    "import * as m from {spec};\n"
    "Object.defineProperty(globalThis, '__obelisk_module', {{value: m, enumerable: false}});\n"
)


# ---------------------------------------------------------------------------
# JS prelude (a script evaluated in every fresh context before the module)
# ---------------------------------------------------------------------------

_PRELUDE = r"""
(() => {
"use strict";
const G = globalThis;
const rawHost = G.__obelisk_host;
delete G.__obelisk_host;
delete G.performance;
// Their callbacks and results depend on when the garbage collector runs: not replayable.
delete G.WeakRef;
delete G.FinalizationRegistry;
let EXECUTION_ID = "";
// Reads of the execution's id or seed before `__obelisk_init` (by the module's top-level
// code, when a runner loads the module once for a heap image: such a module cannot use one).
let PRE_INIT_READS = 0;
const STACK_OPS = new Set(__OBELISK_STACK_OPS__);
const RealDate = Date;
const RealError = Error;
const JSONstringify = JSON.stringify;
const JSONparse = JSON.parse;
try { RealError.stackTraceLimit = 64; } catch (_e) { /* not supported */ }

const BIGINT = "\u0000obelisk:bigint:";
const BIGINT_JSON = "\\u0000obelisk:bigint:";
const replacer = (_k, v) => (typeof v === "bigint" ? BIGINT + v.toString() : v);
const reviver = (_k, v) => (typeof v === "string" && v.startsWith(BIGINT) ? BigInt(v.slice(BIGINT.length)) : v);
const define = (obj, name, value) =>
  Object.defineProperty(obj, name, { value, writable: true, configurable: true, enumerable: false });
const MISUSE = Symbol("obelisk.misuse");

function fmt(a) {
  if (typeof a === "string") return a;
  if (a instanceof RealError) {
    const head = `${a.name}: ${a.message}`;
    const stack = typeof a.stack === "string" ? a.stack.replace(/\n+$/, "") : "";
    return stack ? `${head}\n${stack}` : head;
  }
  if (typeof a === "function") return `[Function: ${a.name || "anonymous"}]`;
  if (typeof a === "bigint") return `${a}n`;
  if (a !== null && typeof a === "object") {
    try {
      const s = JSONstringify(a, (_k, v) => (typeof v === "bigint" ? v.toString() : v));
      return s === undefined ? String(a) : s;
    } catch (_e) {
      return String(a);
    }
  }
  return String(a);
}

function misuse(message, Ctor) {
  const e = new (Ctor || TypeError)(message);
  Object.defineProperty(e, MISUSE, { value: true });
  return e;
}

function host(op, args) {
  const stack = STACK_OPS.has(op) ? new RealError().stack : "";
  const text = rawHost(JSONstringify([op, args, stack], replacer));
  const r = text.includes(BIGINT_JSON) ? JSONparse(text, reviver) : JSONparse(text);
  if (r.e !== undefined) throw misuse(r.e, r.t === "TypeError" ? TypeError : RealError);
  return r.v;
}

// -- console --------------------------------------------------------------------------
const logger = (level) => (...args) => { host("log", [level, args.map(fmt).join(" ")]); };
define(G, "console", Object.freeze({
  log: logger("info"),
  info: logger("info"),
  warn: logger("warn"),
  error: logger("error"),
  debug: logger("debug"),
  trace: logger("trace"),
}));

// -- determinism --------------------------------------------------------------------------
const now = () => host("now", []);
function DetDate(...args) {
  if (new.target === undefined) return new RealDate(now()).toString();
  return Reflect.construct(RealDate, args.length === 0 ? [now()] : args, new.target);
}
DetDate.prototype = RealDate.prototype;
define(RealDate.prototype, "constructor", DetDate);
define(DetDate, "now", now);
define(DetDate, "parse", RealDate.parse);
define(DetDate, "UTC", RealDate.UTC);
Object.defineProperty(DetDate, "name", { value: "Date" });
Object.defineProperty(DetDate, "length", { value: 7 });
define(G, "Date", DetDate);

let s0 = 1, s1 = 0, s2 = 0, s3 = 0;
const rotl = (x, k) => (x << k) | (x >>> (32 - k));
function nextU32() {
  if (EXECUTION_ID === "") PRE_INIT_READS++;
  const result = Math.imul(rotl(Math.imul(s1, 5), 7), 9) >>> 0;
  const t = s1 << 9;
  s2 ^= s0; s3 ^= s1; s1 ^= s2; s0 ^= s3; s2 ^= t; s3 = rotl(s3, 11);
  return result;
}
define(Math, "random", function random() {
  return ((nextU32() >>> 5) * 67108864 + (nextU32() >>> 6)) / 9007199254740992;
});

// -- errors -----------------------------------------------------------------------------
class ChildExecutionError extends RealError {
  constructor(message, value, info) {
    super(message);
    info = info || {};
    define(this, "name", "ChildExecutionError");
    this.value = value;
    this.childId = info.childId;
    this.ffqn = info.ffqn;
    this.failureKind = info.failureKind;
    this.cancelled = info.failureKind === "cancelled";
    this.reason = info.reason;
    this.detail = info.detail;
  }
}
class AwaitNextError extends RealError {
  constructor(message, value) {
    super(message);
    define(this, "name", "AwaitNextError");
    this.value = value;
  }
}

function unwrap(result, childId, ffqn) {
  if (result !== null && typeof result === "object") {
    if ("ok" in result) return result.ok;
    const what = `child execution ${childId === undefined ? "" : childId + " "}(${ffqn || "?"})`;
    if ("err" in result) {
      throw new ChildExecutionError(`${what} returned err: ${fmt(result.err)}`, result.err, { childId, ffqn });
    }
    const f = result.execution_failure;
    if (f !== null && typeof f === "object") {
      throw new ChildExecutionError(
        `${what} failed: ${f.kind}${f.reason ? ": " + f.reason : ""}`, "execution-failed",
        { childId, ffqn, failureKind: f.kind, reason: f.reason, detail: f.detail });
    }
  }
  throw misuse(`unexpected child result ${fmt(result)}`, RealError);
}

// -- argument checks ----------------------------------------------------------------------
const UNITS = { milliseconds: 1, seconds: 1000, minutes: 60000, hours: 3600000, days: 86400000 };

function durationMs(d, what) {
  if (d === null || typeof d !== "object" || Array.isArray(d)) {
    throw misuse(`${what}: expected a duration like {seconds: 5}, got ${fmt(d)}`);
  }
  const keys = Object.keys(d);
  if (keys.length === 0) throw misuse(`${what}: empty duration (use milliseconds, seconds, minutes, hours or days)`);
  let total = 0;
  for (const k of keys) {
    const unit = UNITS[k];
    if (unit === undefined || !Object.prototype.hasOwnProperty.call(UNITS, k)) {
      throw misuse(`${what}: unknown duration unit '${k}' (use milliseconds, seconds, minutes, hours or days)`);
    }
    const v = typeof d[k] === "bigint" ? Number(d[k]) : d[k];
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
      throw misuse(`${what}: duration ${k} must be a non-negative number, got ${fmt(d[k])}`);
    }
    total += v * unit;
  }
  return Math.round(total);
}

function scheduleAt(x, what) {
  if (x === "now") return "now";
  if (x !== null && typeof x === "object" && !Array.isArray(x) && "at" in x) {
    const at = x.at;
    let ms = NaN;
    if (at instanceof RealDate) ms = at.getTime();
    else if (typeof at === "number") ms = at;
    else if (typeof at === "string") ms = RealDate.parse(at);
    if (!Number.isFinite(ms)) throw misuse(`${what}: {at} must be a Date, unix milliseconds or an ISO string, got ${fmt(at)}`);
    return ["at", Math.round(ms)];
  }
  if (x !== null && typeof x === "object" && !Array.isArray(x)) return ["in", durationMs(x, what)];
  throw misuse(`${what}: expected a duration like {minutes: 5}, {at: Date} or "now", got ${fmt(x)}`);
}

function str(x, what) {
  if (typeof x !== "string") throw misuse(`${what} must be a string, got ${fmt(x)}`);
  return x;
}

function paramsArray(p, what) {
  if (p === undefined) return [];
  if (!Array.isArray(p)) throw misuse(`${what}: params must be an array, got ${fmt(p)}`);
  return p;
}

function positional(args, names, what) {
  if (args.length > names.length) {
    throw misuse(`${what} takes ${names.length} argument(s) (${names.join(", ")}), got ${args.length}`);
  }
  const out = [];
  for (let i = 0; i < names.length; i++) out.push(i < args.length && args[i] !== undefined ? args[i] : null);
  return out;
}

function u64(x, what, exclusive) {
  if (typeof x === "bigint") {
    const limit = exclusive ? 18446744073709551616n : 18446744073709551615n;
    if (x < 0n || x > limit) throw misuse(`${what} must be in the u64 range, got ${x}`, RangeError);
    return x;
  }
  if (typeof x === "number" && Number.isSafeInteger(x) && x >= 0) return BigInt(x);
  throw misuse(`${what} must be a non-negative safe integer or a BigInt, got ${fmt(x)}`);
}

function u16(x, what) {
  if (typeof x === "number" && Number.isInteger(x) && x >= 0 && x <= 65535) return x;
  throw misuse(`${what} must be an integer between 0 and 65535, got ${fmt(x)}`);
}

// -- join sets ----------------------------------------------------------------------------
const TOKEN = Symbol("obelisk.joinSet");
const lastIds = new Map();
const setLast = (jsId, id) => { lastIds.set(jsId, id); };

function response(jsId, r) {
  switch (r.kind) {
    case "child":
      setLast(jsId, r.id);
      return { type: "child", id: r.id, ffqn: r.ffqn, value: unwrap(r.result, r.id, r.ffqn) };
    case "delay":
      setLast(jsId, r.id);
      return { type: "delay", id: r.id, cancelled: r.cancelled };
    case "all_processed":
      return { type: "allProcessed" };
    case "pending":
      return { type: "pending" };
  }
  throw misuse(`unexpected join-next answer ${fmt(r)}`, RealError);
}

class JoinSet {
  #id;
  constructor(token, id) {
    if (token !== TOKEN) throw misuse("use obelisk.createJoinSet() to create a join set");
    this.#id = id;
    lastIds.set(id, null);
  }
  get id() { return this.#id; }
  get lastId() { const v = lastIds.get(this.#id); return v === undefined ? null : v; }
  submit(ffqn, params) {
    return host("submit", [this.#id, str(ffqn, "submit: ffqn"), paramsArray(params, "submit")]);
  }
  submitDelay(at) { return host("submit_delay", [this.#id, scheduleAt(at, "submitDelay")]); }
  joinNext() { return response(this.#id, host("join_next", [this.#id, null])); }
  joinNextTry() { return response(this.#id, host("join_next_try", [this.#id])); }
  close() { host("js_close", [this.#id]); }
  toString() { return this.#id; }
  toJSON() { return this.#id; }
}

function joinSetId(js, what) {
  if (js instanceof JoinSet) return js.id;
  if (typeof js === "string") return js;
  throw misuse(`${what}: expected a join set (from obelisk.createJoinSet()) or its id, got ${fmt(js)}`);
}

// -- the host API ---------------------------------------------------------------------------
const api = {
  createJoinSet(opts) {
    let name = null;
    if (opts !== undefined && opts !== null) {
      if (typeof opts !== "object") throw misuse(`createJoinSet: expected {name}, got ${fmt(opts)}`);
      if (opts.name !== undefined && opts.name !== null) name = str(opts.name, "createJoinSet: name");
    }
    return new JoinSet(TOKEN, host("js_create", [name]));
  },
  sleep(at, name) {
    const ms = host("sleep", [scheduleAt(at, "sleep"), name === undefined || name === null ? null : str(name, "sleep: name")]);
    if (ms === null) {
      throw new ChildExecutionError("Sleep was cancelled", "cancelled", { failureKind: "cancelled" });
    }
    return new RealDate(ms);
  },
  call(ffqn, params) {
    str(ffqn, "call: ffqn");
    return unwrap(host("call", [ffqn, paramsArray(params, "call")]), undefined, ffqn);
  },
  schedule(ffqn, params, at) {
    str(ffqn, "schedule: ffqn");
    return host("schedule", [ffqn, paramsArray(params, "schedule"), scheduleAt(at === undefined ? "now" : at, "schedule")]);
  },
  stub(executionId, result) {
    str(executionId, "stub: executionId");
    if (result === null || typeof result !== "object" || !("ok" in result || "err" in result)) {
      throw misuse(`stub: the result must be {ok: value} or {err: value}, got ${fmt(result)}`);
    }
    host("stub", [executionId, "ok" in result ? { ok: result.ok } : { err: result.err }]);
  },
  getResult(executionId) {
    str(executionId, "getResult: executionId");
    return unwrap(host("get_result", [executionId]), executionId, undefined);
  },
  randomU64(min, maxExclusive) {
    const big = typeof min === "bigint" || typeof maxExclusive === "bigint";
    const lo = u64(min, "randomU64: min"), hi = u64(maxExclusive, "randomU64: maxExclusive", true);
    if (hi <= lo) throw misuse(`randomU64: maxExclusive (${hi}) must be greater than min (${lo})`, RangeError);
    const s = host("random_u64", [lo, hi - 1n]);
    return big ? BigInt(s) : Number(s);
  },
  randomU64Inclusive(min, maxInclusive) {
    const big = typeof min === "bigint" || typeof maxInclusive === "bigint";
    const lo = u64(min, "randomU64Inclusive: min"), hi = u64(maxInclusive, "randomU64Inclusive: maxInclusive");
    if (hi < lo) throw misuse(`randomU64Inclusive: maxInclusive (${hi}) must not be less than min (${lo})`, RangeError);
    const s = host("random_u64", [lo, hi]);
    return big ? BigInt(s) : Number(s);
  },
  randomString(minLen, maxLenExclusive) {
    const lo = u16(minLen, "randomString: minLen"), hi = u16(maxLenExclusive, "randomString: maxLenExclusive");
    if (hi <= lo) throw misuse(`randomString: maxLenExclusive (${hi}) must be greater than minLen (${lo})`, RangeError);
    return host("random_string", [lo, hi]);
  },
  executionIdCurrent() {
    if (EXECUTION_ID === "") PRE_INIT_READS++;
    return EXECUTION_ID;
  },
  executionIdGenerate() { return host("id_generate", []); },
  ChildExecutionError,
  ChildError: ChildExecutionError,
  AwaitNextError,
};
Object.freeze(api);
define(G, "obelisk", api);

// -- generated import modules ------------------------------------------------------------
const named = (name, fn) => { Object.defineProperty(fn, "name", { value: name }); return fn; };
const internal = {
  api,
  logFn: (level) => (...args) => { host("log", [level, args.map(fmt).join(" ")]); },
  direct: (ffqn, names, name) => named(name, (...args) =>
    unwrap(host("call", [ffqn, positional(args, names, name)]), undefined, ffqn)),
  submitFn: (ffqn, names, name) => named(name, (js, ...args) =>
    host("submit", [joinSetId(js, name), ffqn, positional(args, names, name)])),
  awaitNextFn: (ffqn, name) => named(name, (js) => {
    const jsId = joinSetId(js, name);
    const r = host("join_next", [jsId, ffqn]);
    switch (r.kind) {
      case "child":
        setLast(jsId, r.id);
        return unwrap(r.result, r.id, r.ffqn);
      case "all_processed":
        throw new AwaitNextError(`${name}: all responses of join set ${jsId} were already processed`, "all-processed");
      case "function_mismatch":
      case "delay": {
        setLast(jsId, r.id);
        const actual = r.kind === "delay" ? null : r.ffqn;
        throw new AwaitNextError(
          `${name}: the next response of join set ${jsId} is ${r.id} (${actual === null ? "a delay" : actual}), not ${ffqn}`,
          { "function-mismatch": { specified_function: ffqn, actual_function: actual, actual_id: r.id } });
      }
    }
    throw misuse(`unexpected join-next answer ${fmt(r)}`, RealError);
  }),
  getFn: (ffqn, name) => named(name, (id) =>
    unwrap(host("get_result", [str(id, `${name}: executionId`)]), id, ffqn)),
  scheduleFn: (ffqn, names, name) => named(name, (at, ...args) =>
    host("schedule", [ffqn, positional(args, names, name), scheduleAt(at, name)])),
  stubFn: (ffqn, name) => named(name, (executionId, result) => {
    str(executionId, `${name}: executionId`);
    if (result === null || typeof result !== "object" || !("ok" in result || "err" in result)) {
      throw misuse(`${name}: the result must be {ok: value} or {err: value}, got ${fmt(result)}`);
    }
    host("stub", [executionId, "ok" in result ? { ok: result.ok } : { err: result.err }]);
  }),
};
Object.defineProperty(G, "__obelisk_internal", { value: Object.freeze(internal), configurable: true, enumerable: false });

// -- per-run values (the prelude itself is shared through a heap snapshot) ---------------
Object.defineProperty(G, "__obelisk_init", {
  value: (executionId, seed) => {
    EXECUTION_ID = executionId;
    s0 = seed[0] | 0; s1 = seed[1] | 0; s2 = seed[2] | 0; s3 = seed[3] | 0;
    delete G.__obelisk_init;
    delete G.__obelisk_pre_init_reads;
  },
  configurable: true, enumerable: false,
});
Object.defineProperty(G, "__obelisk_pre_init_reads", {
  value: () => PRE_INIT_READS, configurable: true, enumerable: false,
});

// -- invoking the export --------------------------------------------------------------------
const record = (t, v) => {
  const s = JSONstringify(v === undefined ? null : v, replacer);
  return s === undefined ? `{"t":"${t}","v":null}` : `{"t":"${t}","v":${s}}`;
};
const errRecord = (e) => {
  if (e instanceof ChildExecutionError || e instanceof AwaitNextError) return record("err", e.value);
  if (e !== null && typeof e === "object" && e[MISUSE] === true) {
    return JSONstringify({ t: "trap", reason: String(e.message), detail: typeof e.stack === "string" ? e.stack : "" });
  }
  if (e instanceof RealError) {
    if (e.name === "InternalError") {
      if (String(e.message) === "out of memory") return JSONstringify({ t: "oom" });
      return JSONstringify({ t: "trap", reason: `${e.name}: ${e.message}`, detail: typeof e.stack === "string" ? e.stack : "" });
    }
    return record("err", String(e.message));
  }
  try { return record("err", e); } catch (_e) { return record("err", String(e)); }
};
Object.defineProperty(G, "__obelisk_invoke", {
  value: async (m, name, argsText) => {
    const args = argsText.includes(BIGINT_JSON) ? JSONparse(argsText, reviver) : JSONparse(argsText);
    const fn = m[name];
    if (typeof fn !== "function") {
      return JSONstringify({ t: "trap", reason: `export '${name}' is not a function (it is ${typeof fn})` });
    }
    let value;
    try {
      value = await fn(...args);
    } catch (e) {
      return errRecord(e);
    }
    try {
      return record("ok", value);
    } catch (e) {
      return JSONstringify({
        t: "trap", reason: `the return value is not JSON-serializable: ${e instanceof RealError ? e.message : String(e)}`,
      });
    }
  },
  writable: false, configurable: false, enumerable: false,
});
})();
"""

#: Host operations that may write history: the JS stack is passed to `set_stack`.
_STACK_OPS = (
    "now",
    "random_u64",
    "random_string",
    "id_generate",
    "js_create",
    "submit",
    "submit_delay",
    "join_next",
    "join_next_try",
    "js_close",
    "call",
    "sleep",
    "schedule",
    "stub",
)

_ABORT_REPLY = json.dumps({"e": "the workflow run was aborted"})

_PRELUDE_SOURCE = _PRELUDE.replace("__OBELISK_STACK_OPS__", json.dumps(list(_STACK_OPS)))

#: Whether runs start from a heap image taken after the prelude (tests compare both).
USE_SNAPSHOT = True
#: Whether runs start from a heap image taken once per runner after its module loaded
#: (only with `USE_SNAPSHOT`; tests compare both).
USE_MODULE_IMAGE = True


def _prepare_prelude(_memory_limit: int, ctx: Any) -> None:
    ctx.register("__obelisk_host", lambda _request: _ABORT_REPLY, is_async=False)
    ctx.eval(_PRELUDE_SOURCE, filename="<obelisk:prelude>")


#: Heap images with the prelude evaluated, one per memory limit: restoring one is much
#: cheaper than compiling and running the prelude in every run.
_prelude_images = SandboxImages[int](_prepare_prelude)


class _BadArgs(Exception):
    """Malformed arguments reached the host bridge: becomes a JS TypeError."""


_MAX_SAFE_INTEGER = 2**53 - 1


def _wide_ints_as_bigints(value: Any) -> Any:
    """Integers beyond JS's safe range cross as BigInts (like quickjs-rs does), so the
    guest sees them exactly; the prelude's JSON reviver turns the markers back."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return (
            value if -_MAX_SAFE_INTEGER <= value <= _MAX_SAFE_INTEGER else f"{BIGINT_PREFIX}{value}"
        )
    if isinstance(value, list):
        return [_wide_ints_as_bigints(v) for v in value]
    if isinstance(value, dict):
        return {k: _wide_ints_as_bigints(v) for k, v in value.items()}
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadArgs(f"{what} must be an integer, got {value!r}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _BadArgs(f"{what} must be a string, got {value!r}")
    return value


def _opt_str(value: Any, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _BadArgs(f"{what} must be an array, got {value!r}")
    return value


def _schedule_at(value: Any) -> ScheduleAtArg:
    if value == "now":
        return "now"
    if isinstance(value, list) and len(value) == 2 and value[0] in ("in", "at"):
        ms = _int(value[1], "schedule-at")
        return ("in", ms) if value[0] == "in" else ("at", ms)
    raise _BadArgs(f"bad schedule-at {value!r}")


def _answer(answer: Any) -> dict[str, Any]:
    if isinstance(answer, ChildResponse):
        return {
            "kind": "child",
            "id": answer.execution_id,
            "ffqn": answer.ffqn,
            "result": answer.result,
        }
    if isinstance(answer, DelayResponse):
        return {"kind": "delay", "id": answer.delay_id, "cancelled": answer.outcome == "cancelled"}
    if isinstance(answer, AllProcessed):
        return {"kind": "all_processed"}
    if isinstance(answer, Pending):
        return {"kind": "pending"}
    if isinstance(answer, FunctionMismatch):
        return {
            "kind": "function_mismatch",
            "id": answer.response.execution_id,
            "ffqn": answer.response.ffqn,
            "requested": answer.requested_ffqn,
        }
    raise TypeError(f"the host returned an unexpected join-next answer {answer!r}")


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


class _Run:
    def __init__(
        self,
        runner: JsWorkflowRunner,
        host: WorkflowHost | None,
        interfaces: Mapping[str, Mapping[str, FunctionShape]],
        execution_id: str,
        spin_timeout: float | None,
    ) -> None:
        self.runner = runner
        self.host = host
        self.execution_id = execution_id
        self.spin_timeout = spin_timeout
        self.modules = _module_table(interfaces)
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
        #: Host calls made so far (a module image needs a load that made none).
        self.dispatched = 0
        self._ops: dict[str, Callable[[list[Any]], Any]] = {
            "log": self._op_log,
            "now": lambda _a: self._host().now_ms(),
            "random_u64": self._op_random_u64,
            "random_string": self._op_random_string,
            "id_generate": lambda _a: self._host().execution_id_generate(),
            "js_create": self._op_js_create,
            "submit": self._op_submit,
            "submit_delay": self._op_submit_delay,
            "join_next": self._op_join_next,
            "join_next_try": self._op_join_next_try,
            "js_close": self._op_js_close,
            "get_result": self._op_get_result,
            "call": self._op_call,
            "sleep": self._op_sleep,
            "schedule": self._op_schedule,
            "stub": self._op_stub,
        }

    # -- sandbox --

    def open(self, *, init: bool = True) -> None:
        runner = self.runner
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
            self.ctx.eval(_PRELUDE_SOURCE, filename="<obelisk:prelude>")
        if init:
            init_js = (
                f"__obelisk_init({json.dumps(self.execution_id)}, "
                f"{json.dumps(_seed(self.execution_id))})"
            )
            self.ctx.eval(init_js, filename="<obelisk:init>")

    def _fast_host_call(self, inst: Any) -> bool:
        """Route the prelude's `__obelisk_host(request)` straight to `_dispatch`.

        quickjs-rs marshals every argument generically (type probe, then value), which
        costs extra guest calls; the request is always one string, so read it as one.
        Other host functions (none today) keep the generic path."""
        generic = inst._host_call
        name = b"__obelisk_host"
        if not callable(generic) or not hasattr(inst, "_get_string"):
            return False

        def host_call(name_ptr: int, name_len: int, this: int, argc: int, argv_ptr: int) -> int:
            if argc != 1 or name_len != len(name) or inst.read(name_ptr, name_len) != name:
                return int(generic(name_ptr, name_len, this, argc, argv_ptr))
            try:
                handle = int.from_bytes(inst.read(argv_ptr, 4), "little", signed=True)
                reply = self._dispatch(inst._get_string(handle))
                return int(inst._new_string(reply))
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

    @property
    def stopping(self) -> bool:
        return self.stop or self.aborted or self.timed_out or self.host_failure is not None

    # -- module loader --

    def _normalize(self, base: str, spec: str) -> str | None:
        if spec == self.filename and base == _LOAD_MODULE:
            return spec
        if spec == _LOAD_MODULE:
            return spec if base != self.filename else None
        if spec == _INTERNAL_MODULE:
            return spec if base != self.filename else None
        if spec in (_WORKFLOW_MODULE, _LOG_MODULE) or spec in self.modules:
            return spec
        self.unresolved.append(spec)
        return None

    def _load(self, name: str) -> str | None:
        if name == self.filename:
            return self.runner.source
        if name == _LOAD_MODULE:
            return _LOAD_SNIPPET.format(spec=json.dumps(self.filename))
        if name == _INTERNAL_MODULE:
            return _INTERNAL_MODULE_SOURCE
        if name == _WORKFLOW_MODULE:
            return _WORKFLOW_MODULE_SOURCE
        if name == _LOG_MODULE:
            return _LOG_MODULE_SOURCE
        module = self.modules.get(name)
        return None if module is None else _module_source(module)

    async def load_module(self) -> None:
        if self.module_loaded:  # restored from the runner's module image
            return
        self.guest_since = time.monotonic()
        await self.ctx.eval_async(f"import {json.dumps(_LOAD_MODULE)};", module=True)

    async def invoke(self, export: str, params_js: str) -> str:
        code = (
            f"await __obelisk_invoke(__obelisk_module, {json.dumps(export)}, "
            f"{json.dumps(params_js)})"
        )
        self.guest_since = time.monotonic()
        result = await self.ctx.eval_async(code, filename="<obelisk:invoke>")
        if not isinstance(result, str):
            raise QuickJSError(f"unexpected invoke result {result!r}")
        return result

    def export_kind(self, export: str) -> tuple[str, list[str]]:
        kind, names = self.ctx.eval(
            f"[typeof __obelisk_module[{json.dumps(export)}], Object.keys(__obelisk_module)]"
        )
        return str(kind), [str(n) for n in names]

    # -- the host bridge --

    def _host(self) -> WorkflowHost:
        if self.host is None:
            raise WorkflowCallError(
                "the workflow host API cannot be used while the module is only being checked "
                "(top-level code runs without a host during validation)"
            )
        return self.host

    def _dispatch(self, request: Any) -> str:
        """The one host function the prelude calls: `[op, args, stack]` as JSON in, a
        JSON reply `{"v": value}` / `{"e": message, "t"?: "TypeError"}` out. (One string
        each way: every value crossing the QuickJS boundary costs several WASM calls.)"""
        self.dispatched += 1
        try:
            if self.stopping:
                return _ABORT_REPLY
            op, args, stack = parse_json_result(str(request))
            handler = self._ops.get(str(op))
            if handler is None:
                return json.dumps({"e": f"unknown host operation {op!r}"})
            if not isinstance(args, list):
                raise _BadArgs("host arguments must be an array")
            if stack and self.host is not None and op in _STACK_OPS:
                self.host.set_stack(self.runner.stack_frames(str(stack)))
            value = handler(args)
            return json.dumps({"v": _wide_ints_as_bigints(value)}, allow_nan=False)
        except RunAborted:
            self.aborted = True
            return _ABORT_REPLY
        except WorkflowCallError as e:
            return json.dumps({"e": str(e) or type(e).__name__})
        except _BadArgs as e:
            return json.dumps({"e": str(e), "t": "TypeError"})
        except BaseException as e:
            # A bug in the host (or in this bridge): stop the guest, re-raise from run().
            self.host_failure = e
            return _ABORT_REPLY
        finally:
            self.guest_since = time.monotonic()

    def _op_log(self, a: list[Any]) -> None:
        level = a[0] if a and a[0] in _LOG_LEVELS else "info"
        message = str(a[1]) if len(a) > 1 else ""
        if self.host is not None:
            self.host.log(level, message)

    def _op_random_u64(self, a: list[Any]) -> str:
        lo, hi = _int(a[0], "min"), _int(a[1], "max")
        return str(self._host().random_u64(lo, hi))

    def _op_random_string(self, a: list[Any]) -> str:
        return self._host().random_string(_int(a[0], "minLen"), _int(a[1], "maxLenExclusive"))

    def _op_js_create(self, a: list[Any]) -> str:
        return self._host().join_set_create(_opt_str(a[0], "join set name"))

    def _op_submit(self, a: list[Any]) -> str:
        js, ffqn = _str(a[0], "join set id"), _str(a[1], "ffqn")
        return self._host().submit(js, ffqn, _list(a[2], "params"))

    def _op_submit_delay(self, a: list[Any]) -> str:
        return self._host().submit_delay(_str(a[0], "join set id"), _schedule_at(a[1]))

    def _op_join_next(self, a: list[Any]) -> dict[str, Any]:
        js, ffqn = _str(a[0], "join set id"), _opt_str(a[1], "ffqn")
        return _answer(self._host().join_next(js, ffqn))

    def _op_join_next_try(self, a: list[Any]) -> dict[str, Any]:
        return _answer(self._host().join_next_try(_str(a[0], "join set id")))

    def _op_js_close(self, a: list[Any]) -> None:
        self._host().join_set_close(_str(a[0], "join set id"))

    def _op_get_result(self, a: list[Any]) -> dict[str, Any]:
        return self._host().get_result(_str(a[0], "execution id"))

    def _op_call(self, a: list[Any]) -> dict[str, Any]:
        return self._host().call(_str(a[0], "ffqn"), _list(a[1], "params"))

    def _op_sleep(self, a: list[Any]) -> int | None:
        return self._host().sleep(_schedule_at(a[0]), _opt_str(a[1], "sleep name"))

    def _op_schedule(self, a: list[Any]) -> str:
        ffqn = _str(a[0], "ffqn")
        return self._host().schedule(ffqn, _list(a[1], "params"), _schedule_at(a[2]))

    def _op_stub(self, a: list[Any]) -> None:
        result = a[1]
        if not isinstance(result, dict):
            raise _BadArgs(f"stub result must be an object, got {result!r}")
        self._host().stub(_str(a[0], "execution id"), result)


# ---------------------------------------------------------------------------
# Load-error messages
# ---------------------------------------------------------------------------

_RESOLVE_ERR = re.compile(r"Error resolving module '(.*)' from '(.*)'")
_EXPORT_ERR = re.compile(r"Could not find export '(.*)' in module '(.*)'")
_STACK_POS = re.compile(r":(\d+):(\d+)\)?\s*$")


def _line_of(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1


def _import_line(source: str, module: str, name: str | None = None) -> int | None:
    """The line of the import of `name` (or of the module specifier) from `module`."""
    quoted = r"(?P<q>['\"])" + re.escape(module) + r"(?P=q)"
    first: int | None = None
    for m in re.finditer(r"\bimport\b(?P<clause>[^;'\"]*?)\bfrom\s*" + quoted, source):
        if first is None:
            first = _line_of(source, m.start("q"))
        if name is not None:
            hit = re.search(r"(?<![\w$])" + re.escape(name) + r"(?![\w$])", m.group("clause"))
            if hit is not None:
                return _line_of(source, m.start("clause") + hit.start())
    if first is not None:
        return first
    m2 = re.search(quoted, source)
    return None if m2 is None else _line_of(source, m2.start())


def _stack_position(stack: str | None, filename: str) -> tuple[int, int] | None:
    for text in (stack or "").splitlines():
        if filename in text:
            m = _STACK_POS.search(text)
            if m is not None:
                return int(m.group(1)), int(m.group(2))
    return None


# ---------------------------------------------------------------------------
# Public runner
# ---------------------------------------------------------------------------


class JsWorkflowRunner:
    """Runs one export of a `workflow_js` module; one fresh QuickJS sandbox per `run()`.

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
        if filename in (_LOAD_MODULE, _INTERNAL_MODULE, _WORKFLOW_MODULE, _LOG_MODULE):
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
        self._module_images: dict[tuple[Any, ...], HeapImage | None] = {}
        self._image_lock = threading.Lock()
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
        fname = self.filename
        m = _RESOLVE_ERR.search(e.message)
        if m is not None:
            spec, base = m.group(1), m.group(2)
            line = _import_line(self.source, spec) if base == fname else None
            where = f"{fname}:{line}" if line else fname
            if _split_interface(spec) is not None or spec.startswith("obelisk:"):
                known = sorted(
                    {v.interface for v in run.modules.values()} | {_WORKFLOW_MODULE, _LOG_MODULE}
                )
                return JsWorkflowLoadError(
                    f"{where}: unknown interface '{spec}' imported: no deployed component "
                    f"exports it (importable: {', '.join(known)}, and their -obelisk-ext, "
                    "-obelisk-schedule and -obelisk-stub variants)",
                    filename=fname,
                    line=line,
                )
            return JsWorkflowLoadError(
                f"{where}: cannot import '{spec}': a workflow_js module may import only "
                f"deployed interfaces and {_WORKFLOW_MODULE}",
                filename=fname,
                line=line,
            )
        m = _EXPORT_ERR.search(e.message)
        if m is not None:
            name, spec = m.group(1), m.group(2)
            line = _import_line(self.source, spec, name)
            where = f"{fname}:{line}" if line else fname
            available = self._exports_of(run, spec)
            return JsWorkflowLoadError(
                f"{where}: '{spec}' has no function '{name}' "
                f"(available: {', '.join(available) if available else 'none'})",
                filename=fname,
                line=line,
            )
        pos = _stack_position(e.stack, fname)
        where = f" (line {pos[0]}, column {pos[1]})" if pos else ""
        line = pos[0] if pos else None
        if e.name == "SyntaxError":
            # The line and its text (QuickJS's column of a parse error is unreliable).
            where = f" (line {line}: {source_line(self.source, line)})" if line else ""
            return JsWorkflowLoadError(
                f"{fname}: SyntaxError: {e.message}{where}", filename=fname, line=line
            )
        return JsWorkflowLoadError(
            f"{fname}: module evaluation failed: {e.name}: {e.message}{where}",
            filename=fname,
            line=line,
        )

    @staticmethod
    def _exports_of(run: _Run, spec: str) -> list[str]:
        if spec == _WORKFLOW_MODULE:
            return [*_API_NAMES, "default"]
        if spec == _LOG_MODULE:
            return sorted(_LOG_LEVELS)
        source = run._load(spec) or ""
        return re.findall(r"export \{ \w+ as ([\w$]+) \}", source)

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
            params_js = json.dumps(_wide_ints_as_bigints(list(params)), allow_nan=False)
        except (TypeError, ValueError) as e:
            return WfTrap(f"params are not JSON: {e}")
        try:
            interfaces = host.interfaces()
        except RunAborted:
            return WfAborted()
        run = _Run(self, host, interfaces, host.execution_id, spin_timeout)
        if USE_SNAPSHOT and USE_MODULE_IMAGE:
            run.module_image = self._module_image(run.modules, interfaces)
        with self._lock:
            self._active.add(run)
        try:
            outcome = run_coroutine(lambda: self._run_async(run, params_js))
        finally:
            with self._lock:
                self._active.discard(run)
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

    def _module_image(
        self,
        modules: dict[str, _VirtualModule],
        interfaces: Mapping[str, Mapping[str, FunctionShape]],
    ) -> HeapImage | None:
        """The heap after the module loaded, for runs with these imports (built on first
        use): a run restores it instead of compiling and evaluating the module and its
        imports (~2 ms). The module is loaded once without a host and before
        `__obelisk_init`; a module whose top-level code made a host call or read the
        execution's id or random numbers (which `__obelisk_init` sets) gets no image, so
        each of its runs loads it after `__obelisk_init` as before."""
        key = tuple(sorted(modules.items()))
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

    async def _run_async(self, run: _Run, params_js: str) -> WorkflowOutcome:
        try:
            run.open()
        except Exception as e:
            return WfTrap(f"cannot create the JS sandbox: {e}", traceback.format_exc())
        stage = "loading the module"
        try:
            await run.load_module()
            stage = "running the function"
            text = await run.invoke(self.export, params_js)
        except InterruptError:
            return WfTrap("interrupted")  # replaced by run() according to the stop flags
        except MemoryLimitError:
            return WfTrap("out of memory")
        except DeadlockError:
            return WfTrap(
                f"{stage}: awaited a promise that never settles (host calls are synchronous; "
                "there are no timers)"
            )
        except JSError as e:
            if stage == "loading the module":
                return WfTrap(str(self._load_error(run, e)), e.stack or "")
            return WfTrap(f"{stage}: {e.name}: {e.message}", e.stack or "")
        except wasmtime.Trap as e:
            reason = trap_reason(e)
            return WfTrap(reason, "" if reason == "stack overflow" else str(e))
        except QuickJSError as e:
            return WfTrap(f"{stage}: {type(e).__name__}: {e}", traceback.format_exc())
        except Exception as e:
            return WfTrap(f"{stage}: internal error: {e!r}", traceback.format_exc())
        return self._outcome_from_record(text)

    def _user_stack(self, stack: str) -> str:
        """Keep the frames of the workflow's own file (the rest is the runtime's)."""
        lines = [
            line
            for line in stack.splitlines()
            if any(f.file == self.filename for f in parse_js_stack(line))
        ]
        return "\n".join(lines) if lines else stack

    def _outcome_from_record(self, text: str) -> WorkflowOutcome:
        try:
            record = parse_json_result(text)
        except ValueError as e:
            return WfTrap(f"cannot decode the function's result: {e}", text[:1000])
        kind = record.get("t")
        if kind == "ok":
            return WfOk(record.get("v"))
        if kind == "err":
            return WfErr(record.get("v"))
        if kind == "oom":
            return WfTrap("out of memory")
        reason = str(record.get("reason", "unknown failure"))
        return WfTrap(reason, self._user_stack(str(record.get("detail", ""))))
