"""The JavaScript a `workflow_js` run evaluates besides the workflow's own module
(`engine.runtimes.js.workflow`): the prelude (a script evaluated in every fresh context
before the module: deterministic `Date` / `Math.random`, `console`, the `obelisk` API, join
sets, the error classes, the host bridge's JS side) and the virtual ES modules a workflow
imports (`obelisk:workflow@1.0.0`, `obelisk:log/log@1.0.0`, and one per deployed interface
and extension)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from engine.runtimes.workflow_host import FunctionShape

__all__ = [
    "API_NAMES",
    "INTERNAL_MODULE",
    "INTERNAL_MODULE_SOURCE",
    "LOAD_MODULE",
    "LOAD_SNIPPET",
    "LOG_LEVELS",
    "LOG_MODULE",
    "LOG_MODULE_SOURCE",
    "PRELUDE_SOURCE",
    "STACK_OPS",
    "WORKFLOW_MODULE",
    "WORKFLOW_MODULE_SOURCE",
    "VirtualModule",
    "camel_case",
    "module_source",
    "module_table",
    "prelude_seed",
    "split_interface",
]

LOAD_MODULE = "<obelisk:load>"
INTERNAL_MODULE = "obelisk:internal"
WORKFLOW_MODULE = "obelisk:workflow@1.0.0"
LOG_MODULE = "obelisk:log/log@1.0.0"
LOG_LEVELS = frozenset({"trace", "debug", "info", "warn", "error"})
_EXT_SUFFIXES = ("-obelisk-ext", "-obelisk-schedule", "-obelisk-stub")
API_NAMES = (
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


# ---------------------------------------------------------------------------
# Virtual modules
# ---------------------------------------------------------------------------


def camel_case(name: str) -> str:
    """WIT kebab-case → JS camelCase: `sleep-millis` → `sleepMillis`."""
    parts = [p for p in name.lstrip("%").split("-") if p]
    if not parts:
        return name
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])


def prelude_seed(execution_id: str) -> list[int]:
    digest = hashlib.sha256(b"obelisk:math-random:" + execution_id.encode()).digest()
    words = [int.from_bytes(digest[i : i + 4], "little") for i in range(0, 16, 4)]
    if not any(words):  # xoshiro must not start from all zeros
        words[0] = 1
    return words


def split_interface(key: str) -> tuple[str, str, str] | None:
    """`ns:pkg/ifc@v` → (`ns:pkg`, `ifc`, `@v`)."""
    m = re.fullmatch(r"([^:/@\s]+:[^:/@\s]+)/([^/@\s]+)(@[^\s]+)?", key)
    if m is None:
        return None
    return m.group(1), m.group(2), m.group(3) or ""


@dataclass(frozen=True, slots=True)
class VirtualModule:
    kind: str  # "direct" | "ext" | "schedule" | "stub"
    interface: str
    functions: tuple[tuple[str, FunctionShape], ...]  # (wit name, shape)


def module_table(
    interfaces: Mapping[str, Mapping[str, FunctionShape]],
) -> dict[str, VirtualModule]:
    table: dict[str, VirtualModule] = {}
    unversioned: dict[str, list[str]] = {}
    for key in sorted(interfaces):
        split = split_interface(key)
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
            table[name] = VirtualModule(kind, key, functions)
            if version:
                unversioned.setdefault(name[: -len(version)], []).append(name)
    for alias, targets in unversioned.items():
        if alias not in table and len(targets) == 1:
            table[alias] = table[targets[0]]
    return table


def module_source(module: VirtualModule) -> str:
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


WORKFLOW_MODULE_SOURCE = (
    'import I from "obelisk:internal";\n'
    "const api = I.api;\n"
    + "".join(f"export const {n} = api.{n};\n" for n in API_NAMES)
    + "export default api;\n"
)

LOG_MODULE_SOURCE = 'import I from "obelisk:internal";\n' + "".join(
    f'export const {lvl} = I.logFn("{lvl}");\n' for lvl in sorted(LOG_LEVELS)
)

INTERNAL_MODULE_SOURCE = (
    "const I = globalThis.__obelisk_internal;\n"
    "delete globalThis.__obelisk_internal;\n"
    "export default I;\n"
)

LOAD_SNIPPET = (
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
STACK_OPS = (
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

PRELUDE_SOURCE = _PRELUDE.replace("__OBELISK_STACK_OPS__", json.dumps(list(STACK_OPS)))
