"""The prelude of JS activities: JavaScript evaluated in every fresh sandbox before the
activity's module (`console`, `fetch` with `Headers`/`Response`, `process.env`), and the
snippet that loads the module."""

from __future__ import annotations

PRELUDE = r"""
(() => {
"use strict";
const G = globalThis;
const hostLog = G.__obelisk_host_log;
const hostFetch = G.__obelisk_host_fetch;
const hostBody = G.__obelisk_host_body;
const hostSeed = G.__obelisk_host_seed;
delete G.__obelisk_host_log;
delete G.__obelisk_host_fetch;
delete G.__obelisk_host_body;
delete G.__obelisk_host_seed;

// Math.random: xoshiro128**, seeded by the host on first use (every run its own seed,
// also when the sandbox starts from a heap image, which would repeat QuickJS's state).
let rs = null;
const rotl = (x, k) => (x << k) | (x >>> (32 - k));
function next32() {
  if (rs === null) {
    rs = Uint32Array.from(hostSeed());
    if ((rs[0] | rs[1] | rs[2] | rs[3]) === 0) rs[0] = 1;
  }
  const r = Math.imul(rotl(Math.imul(rs[1], 5), 7), 9) >>> 0;
  const t = rs[1] << 9;
  rs[2] ^= rs[0]; rs[3] ^= rs[1]; rs[1] ^= rs[2]; rs[0] ^= rs[3];
  rs[2] ^= t; rs[3] = rotl(rs[3], 11);
  return r;
}
Object.defineProperty(Math, "random", {
  value: function random() {
    return ((next32() >>> 5) * 67108864 + (next32() >>> 6)) / 9007199254740992;
  },
  writable: true, configurable: true, enumerable: false,
});

const BIGINT = "\u0000obelisk:bigint:";
const replacer = (_k, v) => (typeof v === "bigint" ? BIGINT + v.toString() : v);
const define = (name, value) =>
  Object.defineProperty(G, name, { value, writable: true, configurable: true, enumerable: false });

function fmt(a) {
  if (typeof a === "string") return a;
  if (a instanceof Error) {
    const head = `${a.name}: ${a.message}`;
    const stack = typeof a.stack === "string" ? a.stack.replace(/\n+$/, "") : "";
    return stack ? `${head}\n${stack}` : head;
  }
  if (typeof a === "function") return `[Function: ${a.name || "anonymous"}]`;
  if (a !== null && typeof a === "object") {
    try {
      const s = JSON.stringify(a, (_k, v) => (typeof v === "bigint" ? v.toString() : v));
      return s === undefined ? String(a) : s;
    } catch (_e) {
      return String(a);
    }
  }
  return String(a);
}
const logger = (level) => (...args) => { hostLog(level, args.map(fmt).join(" ")); };
define("console", {
  log: logger("info"),
  info: logger("info"),
  warn: logger("warn"),
  error: logger("error"),
  debug: logger("debug"),
  trace: logger("trace"),
  assert: (cond, ...args) => {
    if (!cond) hostLog("error", ["Assertion failed" + (args.length ? ":" : "")].concat(args.map(fmt)).join(" "));
  },
});

class Headers {
  #map = new Map();
  constructor(init) {
    if (init === undefined || init === null) return;
    if (typeof init !== "object") throw new TypeError("Headers: init must be an object or a list of pairs");
    if (typeof init[Symbol.iterator] === "function") {
      for (const pair of init) {
        if (pair === null || typeof pair !== "object" || pair.length !== 2) {
          throw new TypeError("Headers: each header must be a [name, value] pair");
        }
        this.append(pair[0], pair[1]);
      }
    } else {
      for (const k of Object.keys(init)) this.append(k, init[k]);
    }
  }
  append(name, value) {
    const k = String(name).toLowerCase();
    const v = String(value);
    const cur = this.#map.get(k);
    this.#map.set(k, cur === undefined ? v : `${cur}, ${v}`);
  }
  set(name, value) { this.#map.set(String(name).toLowerCase(), String(value)); }
  get(name) { const v = this.#map.get(String(name).toLowerCase()); return v === undefined ? null : v; }
  has(name) { return this.#map.has(String(name).toLowerCase()); }
  delete(name) { this.#map.delete(String(name).toLowerCase()); }
  *entries() { yield* [...this.#map.entries()].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0)); }
  *keys() { for (const [k] of this.entries()) yield k; }
  *values() { for (const [, v] of this.entries()) yield v; }
  forEach(cb, thisArg) { for (const [k, v] of this.entries()) cb.call(thisArg, v, k, this); }
  [Symbol.iterator]() { return this.entries(); }
}

class Response {
  #id;
  #used = false;
  constructor(r) {
    this.status = r.status;
    this.statusText = r.statusText;
    this.ok = r.status >= 200 && r.status < 300;
    this.headers = new Headers(r.headers);
    this.url = r.url;
    this.redirected = r.redirected;
    this.type = "basic";
    this.#id = r.id;
  }
  get bodyUsed() { return this.#used; }
  #take(kind) {
    if (this.#used) return Promise.reject(new TypeError("Body has already been consumed"));
    this.#used = true;
    try {
      return Promise.resolve(hostBody(this.#id, kind));
    } catch (e) {
      return Promise.reject(e);
    }
  }
  text() { return this.#take("text"); }
  async json() { return JSON.parse(await this.#take("text")); }
  async bytes() { return await this.#take("bytes"); }
  async arrayBuffer() {
    const u8 = await this.#take("bytes");
    return u8.buffer.slice(u8.byteOffset, u8.byteOffset + u8.byteLength);
  }
}

async function fetch(input, init) {
  init = init === undefined || init === null ? {} : init;
  let url;
  if (typeof input === "string") url = input;
  else if (input !== null && typeof input === "object" && typeof input.url === "string") url = input.url;
  else if (input !== null && typeof input === "object" && typeof input.href === "string") url = input.href;
  else url = String(input);
  const method = String(init.method === undefined ? "GET" : init.method).toUpperCase();
  const headers = [...new Headers(init.headers)];
  let body = init.body;
  if (body === undefined || body === null) {
    body = null;
  } else if (typeof body === "string") {
    // as is
  } else if (body instanceof ArrayBuffer || ArrayBuffer.isView(body)) {
    const view = body instanceof ArrayBuffer
      ? new Uint8Array(body)
      : new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
    body = new Uint8Array(view.byteLength);
    body.set(view);
  } else {
    body = String(body);
  }
  if (body !== null && (method === "GET" || method === "HEAD")) {
    throw new TypeError(`fetch: a ${method} request cannot have a body`);
  }
  const redirect = init.redirect === undefined ? "follow" : String(init.redirect);
  if (redirect !== "follow" && redirect !== "error" && redirect !== "manual") {
    throw new TypeError(`fetch: invalid redirect mode '${redirect}'`);
  }
  const r = await hostFetch(url, method, headers, body, redirect);
  if (r.error !== undefined) {
    throw r.error.name === "TypeError" ? new TypeError(r.error.message) : new Error(r.error.message);
  }
  return new Response(r);
}
define("Headers", Headers);
define("Response", Response);
define("fetch", fetch);

const env = __OBELISK_ENV__;
if (env !== null) define("process", Object.freeze({ env: Object.freeze(env) }));

const errRecord = (e) => {
  if (e instanceof Error) {
    const message = String(e.message);
    if (e.name === "InternalError" && message === "out of memory") {
      return JSON.stringify({ t: "oom" });
    }
    return JSON.stringify({
      t: "err", error: true, v: message, name: String(e.name),
      stack: typeof e.stack === "string" ? e.stack : "",
    });
  }
  let s;
  try { s = JSON.stringify(e === undefined ? null : e, replacer); } catch (_e) { s = undefined; }
  return s === undefined ? JSON.stringify({ t: "err", v: String(e) }) : `{"t":"err","v":${s}}`;
};

Object.defineProperty(G, "__obelisk_invoke", {
  value: async (m, name, args) => {
    const fn = m[name];
    if (typeof fn !== "function") {
      return JSON.stringify({ t: "trap", reason: `export '${name}' is not a function (it is ${typeof fn})` });
    }
    let value;
    try {
      value = await fn(...args);
    } catch (e) {
      return errRecord(e);
    }
    let s;
    try {
      s = JSON.stringify(value, replacer);
    } catch (e) {
      return JSON.stringify({
        t: "trap", reason: `the return value is not JSON-serializable: ${e instanceof Error ? e.message : String(e)}`,
      });
    }
    return s === undefined ? '{"t":"ok"}' : `{"t":"ok","v":${s}}`;
  },
  writable: false, configurable: false, enumerable: false,
});
})();
"""

LOAD_SNIPPET = (
    "import * as m from {spec};\n"
    "Object.defineProperty(globalThis, '__obelisk_module', {{value: m, enumerable: false}});\n"
)
