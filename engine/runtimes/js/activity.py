"""The `activity_js` runner: one exported function of an ES module, run in QuickJS.

QuickJS comes from `quickjs-rs` (QuickJS compiled to WASM, driven by wasmtime). Every
run gets a brand-new runtime and context, loads the module, calls the export with the
params as positional arguments and maps what happens to a `RunOutcome`. `run()` is
synchronous and meant for a worker thread; it drives a private asyncio loop internally.

Sandbox
-------
The guest sees the ECMAScript built-ins (including `Date`, `Math.random`, `performance`)
and only these additions:

* `console.log/info/warn/error/debug/trace/assert` → `LogLine`s on the run's `LogSink`
  (`log` → level `info`; arguments joined with spaces; strings as is, objects as JSON,
  errors as `Name: message` plus their stack).
* `fetch(url, init)`, `Headers`, `Response` — see "Network" below.
* `process.env` — only when `env_vars` is given (not None): a frozen
  `process = {env: {...env_vars}}` and nothing else. Without `env_vars` there is no
  `process` at all. Nothing else from the host environment is visible.

There is no filesystem, no timers (`setTimeout`), no `require`, and a module may not
`import` anything (the loader resolves only the module itself).

Network (`allowed_hosts`)
-------------------------
`fetch` is implemented in Python (aiohttp) and may only reach URLs whose scheme, host
and port match one of the run's `allowed_hosts` patterns. A pattern is
`[scheme://]host[:port]`:

* `scheme` — `http`, `https` or `*`; omitted means `http` or `https`.
* `host` — case-insensitive; `*` matches any run of characters (dots included), so
  `*.example.com` matches `a.example.com` and `a.b.example.com` but not `example.com`;
  a bare `*` matches every host. IPv6 literals are written in brackets: `[::1]:8080`.
* `port` — a number or `*` (any port). Omitted means the default port of the URL's
  scheme only (80 for http, 443 for https).

Examples: `"api.example.com"` (http/https on 80/443), `"*.example.com"`,
`"127.0.0.1:8080"`, `"http://localhost:*"`. Malformed patterns raise `ValueError` from
`parse_allowed_hosts` (use it to validate deployment config); in `run()` they make
the run a `RunTrap`. A refused URL throws a JS `TypeError` naming the host and saying
it is not in `allowed_hosts`; redirects are followed by hand and every hop is checked.
Network failures also throw `TypeError` (`fetch failed: ...`). Fetches are bounded by
the run deadline, response bodies by `MAX_RESPONSE_BYTES`. `init.redirect` supports
`follow` (default), `error` and `manual` (which returns the 3xx response itself).

Results
-------
* return → `RunOk(value)`; the value goes through `JSON.stringify` (so `undefined` →
  None, `Date` → ISO string); a `BigInt` becomes a Python int. A value that cannot be
  serialised (a cycle) is a `RunTrap`.
* throw → `RunErr(value)`: for an `Error` the value is its `message`; anything else is
  the thrown value as JSON (`undefined` → None).
* Permanence (SPEC §5.2: an err whose *variant case name* contains `permanent` is not
  retried). The runner does not know the WIT type, so it looks at the JSON shape of a
  variant (§9.2): the err is permanent iff it is a string that is a kebab-case case
  name containing `permanent` (`"permanent-failure"`, also as an `Error` message), or
  an object with exactly one key that is such a case name (`{"permanent-failure":
  "card declined"}`). Free text such as `"permanent failure: x"` is not permanent.

Failures
--------
Deadline passed (including a busy loop, which QuickJS's interrupt handler stops) →
`RunTimedOut`; `cancel` set → `RunCancelled` (within ~20 ms when the guest waits on
`fetch`, within well under a millisecond while it computes); a function that finishes
after its deadline also counts as timed out. Exceeding the memory limit (enforced on
the WASM linear memory, default 64 MiB) → `RunTrap("out of memory")`. Unbounded
recursion exhausts the WASM stack → `RunTrap("stack overflow")`. A module that fails
to load, a promise that never settles and other engine errors → `RunTrap(reason,
detail)` (detail is the JS stack where there is one).

Note on quickjs-rs internals: installing our own interrupt handler (for `cancel`) and
the linear-memory limit use two private attributes (`Runtime._engine_rt`,
`Context._engine_ctx._inst.store`) because quickjs-rs 0.2.6 has no public API for
them (its own `memory_limit` is not enforced by this WASM build). The tests cover both.
Sandboxes also take the leaner guest-call and memory paths of
`engine.runtimes.js.quickjs_fast` (`ACCELERATE`; ~40 % of a trivial run's CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import threading
import time
import traceback
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast
from urllib.parse import urljoin, urlsplit

import wasmtime
from quickjs_rs import (
    DeadlockError,
    InterruptError,
    JSError,
    MemoryLimitError,
    QuickJSError,
    Runtime,
)

from engine.runtimes.api import RunContext
from engine.runtimes.js.activity_prelude import LOAD_SNIPPET, PRELUDE
from engine.runtimes.js.common import (
    DEFAULT_MEMORY_LIMIT,
    out_of_memory_reason,
    result_record,
    run_coroutine,
    source_line,
    trap_reason,
    warm_up,
)
from engine.runtimes.js.heap import SandboxImages
from engine.runtimes.js.memory import (
    GuestStderr,
    is_allocation_failure,
    release_after_failure,
)
from engine.runtimes.js.network import DEFAULT_PORTS, HostPattern, parse_allowed_hosts
from engine.runtimes.js.quickjs_fast import (
    fast_guest_calls,
    install_lazy_exports,
    map_host_function,
)
from engine.runtimes.outcome import (
    LogLevel,
    LogLine,
    LogSink,
    RunCancelled,
    RunErr,
    RunOk,
    RunOutcome,
    RunTimedOut,
    RunTrap,
)

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "DEFAULT_LOAD_TIMEOUT",
    "DEFAULT_MEMORY_LIMIT",
    "MAX_RESPONSE_BYTES",
    "HostPattern",
    "JsActivityRunner",
    "JsLoadError",
    "is_permanent_err",
    "parse_allowed_hosts",
    "warm_up",
]

#: Whether sandboxes use `engine.runtimes.js.quickjs_fast` (tests compare both paths).
ACCELERATE = True
#: Sandboxes wrap their exports when first used (`quickjs_fast.install_lazy_exports`).
LAZY_EXPORTS = install_lazy_exports()

DEFAULT_LOAD_TIMEOUT = 5.0
"""Seconds the module's top-level code may take during `check()`."""

MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""Largest `fetch` response body accepted (larger bodies throw a `TypeError`)."""

_MIN_MEMORY_LIMIT = 4 * 1024 * 1024


_POLL_INTERVAL = 0.02
_MAX_REDIRECTS = 20
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_LOG_LEVELS: frozenset[str] = frozenset({"trace", "debug", "info", "warn", "error"})
_CASE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:-[A-Za-z][A-Za-z0-9]*)*")

_T = TypeVar("_T")


class JsLoadError(Exception):
    """The module does not load, or the export is missing or not a function."""


# ---------------------------------------------------------------------------
# Permanence rule
# ---------------------------------------------------------------------------


def _is_permanent_case(name: str) -> bool:
    return _CASE_NAME.fullmatch(name) is not None and "permanent" in name.lower()


def is_permanent_err(value: Any) -> bool:
    """Whether an err value looks like a variant case whose name contains `permanent`.

    `"permanent-failure"` and `{"permanent-failure": payload}` are permanent; free text
    and objects with several keys are not.
    """
    if isinstance(value, str):
        return _is_permanent_case(value)
    if isinstance(value, dict) and len(value) == 1:
        (key,) = value
        return isinstance(key, str) and _is_permanent_case(key)
    return False


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


_STACK_POS = re.compile(r"\(?([^\s()]+):(\d+):(\d+)\)?\s*$")


def _position(stack: str | None, filename: str) -> tuple[int, int] | None:
    """(line, column) of the first stack frame in `filename`."""
    for line in (stack or "").splitlines():
        m = _STACK_POS.search(line.strip())
        if m is not None and m.group(1) == filename:
            return int(m.group(2)), int(m.group(3))
    return None


class _FetchError(Exception):
    """Becomes a JS `TypeError` with this message."""


class _Aborted(Exception):
    """The supervisor stopped the guest (cancel or deadline)."""


# ---------------------------------------------------------------------------
# One sandbox = one fresh QuickJS runtime + context
# ---------------------------------------------------------------------------


def _prelude_source(env_json: str) -> str:
    return PRELUDE.replace("__OBELISK_ENV__", env_json)


#: The prelude's host functions: (global name, `_Sandbox` method, is async).
_HOST_FUNCTIONS = (
    ("__obelisk_host_log", "_host_log", False),
    ("__obelisk_host_fetch", "_host_fetch", True),
    ("__obelisk_host_body", "_host_body", False),
    ("__obelisk_host_seed", "_host_seed", False),
)


def _prepare_prelude(key: tuple[int, str], ctx: Any) -> None:
    for name, _, is_async in _HOST_FUNCTIONS:
        ctx.register(name, _no_host_call, is_async=is_async)
    ctx.eval(_prelude_source(key[1]), filename="<prelude>")


def _no_host_call(*_args: Any) -> None:
    raise RuntimeError("the prelude's image is taken without host calls")


#: Whether sandboxes start from a heap image of the evaluated prelude (tests compare).
USE_SNAPSHOT = True
#: (memory limit, environment JSON) → the prelude's heap image: restoring it costs
#: ~0.25 ms, registering the host functions and evaluating the prelude (which creates
#: QuickJS's runtime) ~1.2 ms. The module still loads in every run: its top-level code
#: runs once per run, as before.
_prelude_images = SandboxImages[tuple[int, str]](_prepare_prelude)


class _Sandbox:
    def __init__(
        self,
        *,
        source: str,
        filename: str,
        memory_limit: int,
        deadline: float,
        cancel: threading.Event,
        log: LogSink,
        patterns: tuple[HostPattern, ...],
        env_vars: dict[str, str] | None,
    ) -> None:
        self.source = source
        self.filename = filename
        self.memory_limit = memory_limit
        self.deadline = deadline
        self.cancel = cancel
        self.log = log
        self.patterns = patterns
        self.abort: Literal["cancelled", "timed_out"] | None = None
        self._bodies: dict[int, tuple[bytes, str]] = {}
        self._next_body = 1
        self._session: aiohttp.ClientSession | None = None

        self.rt = Runtime(memory_limit=memory_limit)
        self.ctx: Any = None
        try:
            self.rt.set_module_loader(normalize=self._normalize, load=self._load)
            self.ctx = self.rt.new_context(timeout=10.0 * 365 * 24 * 3600)
            # quickjs-rs has no public hook for a custom interrupt condition, nor an
            # enforced memory limit in its WASM build: use the engine objects directly.
            self.rt._engine_rt.set_interrupt_handler(self._should_interrupt)
            self._inst: Any = self.ctx._engine_ctx._inst
            self._inst.store.set_limits(memory_size=memory_limit)
            #: The guest's stderr: how its allocator says it ran out of memory.
            self.stderr = GuestStderr()
            self.stderr.install(self._inst.store)
            #: Whether this sandbox uses `engine.runtimes.js.quickjs_fast` (~40 % of a run).
            self.accelerated = ACCELERATE and fast_guest_calls(self._inst)
            env_json = "null" if env_vars is None else json.dumps(dict(env_vars))
            image = (
                _prelude_images.get((memory_limit, env_json), memory_limit, self._inst)
                if USE_SNAPSHOT
                else None
            )
            self.from_snapshot = image is not None
            for name, method, is_async in _HOST_FUNCTIONS:
                fn = getattr(self, method)
                if image is not None:  # the restored guest has the function already
                    map_host_function(self.ctx, name, fn, is_async=is_async)
                else:
                    self.ctx.register(name, fn, is_async=is_async)
            if image is not None:
                image.restore(self._inst)
            else:
                self.ctx.eval(_prelude_source(env_json), filename="<prelude>")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _host_seed() -> list[int]:
        """`Math.random`'s seed for this run."""
        return [secrets.randbits(32) for _ in range(4)]

    # -- lifecycle --

    def close(self) -> None:
        # Context.close and Runtime.close only release the wasmtime store; they do not
        # call into the guest, so this is safe even after a WASM trap.
        with contextlib.suppress(Exception):
            if self.ctx is not None:
                self.ctx.close()
        with contextlib.suppress(Exception):
            self.rt.close()
        self._bodies.clear()

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            with contextlib.suppress(Exception):
                await session.close()
        self.close()

    def memory_exhausted(self) -> bool:
        """Whether the linear memory has (almost) reached its limit."""
        try:
            size = int(self._inst.mem.data_len(self._inst.store))
        except Exception:
            return False
        return size + 1024 * 1024 > self.memory_limit

    # -- interruption --

    def _check_abort(self) -> bool:
        if self.abort is not None:
            return True
        if self.cancel.is_set():
            self.abort = "cancelled"
        elif time.monotonic() >= self.deadline:
            self.abort = "timed_out"
        return self.abort is not None

    def _should_interrupt(self) -> bool:
        return self._check_abort()

    async def supervise(self, awaitable: Awaitable[_T]) -> _T:
        """Await `awaitable`, cancelling it when `cancel` is set or the deadline passes.

        Busy JS never yields to the loop; the interrupt handler stops it instead.
        """
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                if self._check_abort():
                    task.cancel()
                    await asyncio.wait({task}, timeout=1.0)
                    if task.done() and not task.cancelled():
                        task.exception()  # mark retrieved
                    raise _Aborted
                remaining = self.deadline - time.monotonic()
                done, _ = await asyncio.wait(
                    {task}, timeout=max(0.0, min(_POLL_INTERVAL, remaining))
                )
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()

    # -- module loader: only the module itself resolves --

    def _normalize(self, base: str, spec: str) -> str | None:
        return spec if spec == self.filename else None

    def _load(self, name: str) -> str | None:
        return self.source if name == self.filename else None

    async def load_module(self) -> None:
        await self.ctx.eval_async(LOAD_SNIPPET.format(spec=json.dumps(self.filename)), module=True)

    async def invoke(self, export: str, params_js: str) -> str:
        code = f"await __obelisk_invoke(__obelisk_module, {json.dumps(export)}, {params_js})"
        result = await self.ctx.eval_async(code, filename="<invoke>")
        if not isinstance(result, str):
            raise QuickJSError(f"unexpected invoke result {result!r}")
        return result

    # -- host functions --

    def _host_log(self, level: Any, message: Any) -> None:
        lvl = cast(LogLevel, level if isinstance(level, str) and level in _LOG_LEVELS else "info")
        # A failing sink must not break the guest.
        with contextlib.suppress(Exception):
            self.log(LogLine(lvl, str(message)))

    def _host_body(self, body_id: Any, kind: Any) -> str | bytes:
        data, charset = self._bodies.pop(int(body_id))
        if kind == "bytes":
            return data
        try:
            return data.decode(charset, errors="replace")
        except LookupError:
            return data.decode("utf-8", errors="replace")

    def _check_url(self, url: str) -> tuple[str, str, int]:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise _FetchError(f"fetch: invalid URL '{url}': {e}") from None
        scheme = parts.scheme.lower()
        host = parts.hostname
        if scheme not in DEFAULT_PORTS:
            if not scheme:
                raise _FetchError(
                    f"fetch: invalid URL '{url}' (an absolute http(s) URL is required)"
                )
            raise _FetchError(
                f"fetch: unsupported URL scheme '{scheme}' in '{url}' (http and https only)"
            )
        if not host:
            raise _FetchError(f"fetch: invalid URL '{url}' (no host)")
        effective = port if port is not None else DEFAULT_PORTS[scheme]
        if not any(p.matches(scheme, host, effective) for p in self.patterns):
            shown = f"[{host}]" if ":" in host else host
            if port is not None:
                shown = f"{shown}:{port}"
            raise _FetchError(
                f"fetch: host '{shown}' is not in the deployment's allowed_host list (refused {scheme}://{shown})"
            )
        return scheme, host, effective

    async def _get_session(self) -> aiohttp.ClientSession:
        import aiohttp  # at the first fetch: loading it (CA certificates) took 0.1-0.2 s of
        # every engine start, for the JS activities that fetch nothing

        if self._session is None:
            self._session = aiohttp.ClientSession(
                trust_env=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    async def _host_fetch(
        self, url: Any, method: Any, headers: Any, body: Any, redirect: Any
    ) -> dict[str, Any]:
        import aiohttp

        try:
            return await self._fetch(str(url), str(method), headers, body, str(redirect))
        except _FetchError as e:
            return {"error": {"name": "TypeError", "message": str(e)}}
        except TimeoutError:
            return {"error": {"name": "TypeError", "message": "fetch failed: timed out"}}
        except (aiohttp.ClientError, OSError, ValueError) as e:
            detail = str(e) or type(e).__name__
            return {"error": {"name": "TypeError", "message": f"fetch failed: {detail}"}}

    async def _fetch(
        self, url: str, method: str, headers: Any, body: Any, redirect: str
    ) -> dict[str, Any]:
        header_pairs: list[tuple[str, str]] = []
        if isinstance(headers, list):
            for pair in headers:
                if isinstance(pair, list) and len(pair) == 2:
                    header_pairs.append((str(pair[0]), str(pair[1])))
        data: bytes | None
        if body is None:
            data = None
        elif isinstance(body, bytes):
            data = body
        else:
            data = str(body).encode()
            if not any(k.lower() == "content-type" for k, _ in header_pairs):
                header_pairs.append(("content-type", "text/plain;charset=UTF-8"))
        import aiohttp

        redirected = False
        current = url
        for _hop in range(_MAX_REDIRECTS + 1):
            self._check_url(current)
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            session = await self._get_session()
            async with session.request(
                method,
                current,
                headers=header_pairs,
                data=data,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=remaining),
            ) as resp:
                location = resp.headers.get("Location")
                if resp.status in _REDIRECT_STATUSES and location and redirect != "manual":
                    if redirect == "error":
                        raise _FetchError(
                            f"fetch failed: redirected to '{location}' with redirect mode 'error'"
                        )
                    current = urljoin(str(resp.url), location)
                    redirected = True
                    if (resp.status == 303 and method != "HEAD") or (
                        resp.status in (301, 302) and method == "POST"
                    ):
                        method = "GET"
                        data = None
                        header_pairs = [
                            (k, v)
                            for k, v in header_pairs
                            if k.lower() not in ("content-type", "content-length")
                        ]
                    continue
                chunks: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    size += len(chunk)
                    if size > MAX_RESPONSE_BYTES:
                        raise _FetchError(
                            f"fetch failed: response body larger than {MAX_RESPONSE_BYTES} bytes"
                        )
                    chunks.append(chunk)
                body_id = self._next_body
                self._next_body += 1
                self._bodies[body_id] = (b"".join(chunks), resp.charset or "utf-8")
                return {
                    "id": body_id,
                    "status": resp.status,
                    "statusText": resp.reason or "",
                    "url": str(resp.url),
                    "redirected": redirected,
                    "headers": [[k, v] for k, v in resp.headers.items()],
                }
        raise _FetchError(f"fetch failed: more than {_MAX_REDIRECTS} redirects")


# ---------------------------------------------------------------------------
# Public runner
# ---------------------------------------------------------------------------


def _discard_log(_line: LogLine) -> None:
    return None


class JsActivityRunner:
    """Runs one export of a JS ES module; one fresh QuickJS sandbox per `run()`.

    The constructor validates the module (it runs `check()`), raising `JsLoadError`.
    """

    def __init__(
        self,
        source: str,
        filename: str,
        export_name: str | None = None,
        *,
        env_vars: dict[str, str] | None = None,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        load_timeout: float = DEFAULT_LOAD_TIMEOUT,
    ) -> None:
        if memory_limit < _MIN_MEMORY_LIMIT:
            raise ValueError(f"memory_limit must be at least {_MIN_MEMORY_LIMIT} bytes")
        self.source = source
        self.filename = filename
        self.export_name = export_name
        self.memory_limit = memory_limit
        self.load_timeout = load_timeout
        self.check(env_vars=env_vars)

    @property
    def export(self) -> str:
        """The export's name in the module namespace (`default` for the default export)."""
        return "default" if self.export_name is None else self.export_name

    def _describe_export(self) -> str:
        return "default export" if self.export_name is None else f"export '{self.export_name}'"

    # -- validation --

    def check(self, env_vars: dict[str, str] | None = None) -> None:
        """Load the module in a fresh sandbox (its top-level code runs with no network
        and discarded logs; `process.env` only if `env_vars` is given) and verify the
        export is a function. Raises `JsLoadError`."""
        run_coroutine(lambda: self._check_async(env_vars))

    async def _check_async(self, env_vars: dict[str, str] | None) -> None:
        fname = self.filename
        try:
            box = _Sandbox(
                source=self.source,
                filename=fname,
                memory_limit=self.memory_limit,
                deadline=time.monotonic() + self.load_timeout,
                cancel=threading.Event(),
                log=_discard_log,
                patterns=(),
                env_vars=env_vars,
            )
        except Exception as e:
            raise JsLoadError(f"{fname}: cannot create the JS sandbox: {e}") from e
        try:
            try:
                await box.supervise(box.load_module())
            except _Aborted:
                raise JsLoadError(
                    f"{fname}: module evaluation did not finish within {self.load_timeout:g} s"
                ) from None
            except InterruptError:
                raise JsLoadError(
                    f"{fname}: module evaluation did not finish within {self.load_timeout:g} s"
                ) from None
            except MemoryLimitError:
                raise JsLoadError(f"{fname}: out of memory while loading the module") from None
            except DeadlockError:
                raise JsLoadError(
                    f"{fname}: module evaluation awaits a promise that never settles"
                ) from None
            except JSError as e:
                raise JsLoadError(self._load_error_message(e)) from None
            except wasmtime.Trap as e:
                raise JsLoadError(f"{fname}: engine trap while loading: {trap_reason(e)}") from None
            except QuickJSError as e:
                raise JsLoadError(f"{fname}: cannot load the module: {e}") from None
            kind, exports = box.ctx.eval(
                f"[typeof __obelisk_module[{json.dumps(self.export)}], "
                "Object.keys(__obelisk_module)]"
            )
            if kind == "undefined":
                listed = ", ".join(exports) if exports else "none"
                raise JsLoadError(f"{fname}: no {self._describe_export()} (exports: {listed})")
            if kind != "function":
                raise JsLoadError(
                    f"{fname}: {self._describe_export()} is not a function (it is {kind})"
                )
        finally:
            await box.aclose()

    def _load_error_message(self, e: JSError) -> str:
        fname = self.filename
        pos = _position(e.stack, fname)
        where = f" (line {pos[0]}, column {pos[1]})" if pos else ""
        if e.name == "SyntaxError":
            where = f" (line {pos[0]}: {source_line(self.source, pos[0])})" if pos else ""
            return f"{fname}: SyntaxError: {e.message}{where}"
        if "resolving module" in e.message:
            return (
                f"{fname}: imports are not supported in activity_js modules ({e.name}: {e.message})"
            )
        return f"{fname}: module evaluation failed: {e.name}: {e.message}{where}"

    # -- running --

    def run(self, ffqn: str, params: list[Any], ctx: RunContext) -> RunOutcome:
        """`ActivityRunner.run`: the export once (a JS activity exports one function)."""
        return self.call(
            params, ctx.deadline, ctx.cancel, ctx.log, list(ctx.allowed_hosts), dict(ctx.env)
        )

    def call(
        self,
        params_json: list[Any],
        deadline: float,
        cancel: threading.Event,
        log: LogSink,
        allowed_hosts: list[str],
        env_vars: dict[str, str] | None = None,
    ) -> RunOutcome:
        """Run the export once with `params_json` as positional arguments.

        `deadline` is a `time.monotonic()` instant. Never raises for guest faults.
        """
        if cancel.is_set():
            return RunCancelled()
        if time.monotonic() >= deadline:
            return RunTimedOut()
        try:
            patterns = parse_allowed_hosts(allowed_hosts)
        except ValueError as e:
            return RunTrap(str(e))
        try:
            params_js = json.dumps(list(params_json), allow_nan=False)
        except (TypeError, ValueError) as e:
            return RunTrap(f"params are not JSON: {e}")
        outcome = run_coroutine(
            lambda: self._run_async(params_js, deadline, cancel, log, patterns, env_vars)
        )
        release_after_failure(outcome, len(params_js))
        if isinstance(outcome, RunTrap) and outcome.reason.endswith("out of memory"):
            return RunTrap(out_of_memory_reason(self.memory_limit), outcome.detail)
        return outcome

    async def _run_async(
        self,
        params_js: str,
        deadline: float,
        cancel: threading.Event,
        log: LogSink,
        patterns: tuple[HostPattern, ...],
        env_vars: dict[str, str] | None,
    ) -> RunOutcome:
        try:
            box = _Sandbox(
                source=self.source,
                filename=self.filename,
                memory_limit=self.memory_limit,
                deadline=deadline,
                cancel=cancel,
                log=log,
                patterns=patterns,
                env_vars=env_vars,
            )
        except Exception as e:
            return RunTrap(f"cannot create the JS sandbox: {e}", traceback.format_exc())
        try:
            outcome = await self._run_in(box, params_js)
            if box.abort == "cancelled":
                return RunCancelled()
            if box.abort == "timed_out" or time.monotonic() >= deadline:
                return RunTimedOut()
            if isinstance(outcome, RunErr) and outcome.value is None and box.memory_exhausted():
                return RunTrap("out of memory")
            return outcome
        finally:
            await box.aclose()

    async def _run_in(self, box: _Sandbox, params_js: str) -> RunOutcome:
        stage = "loading the module"
        try:
            await box.supervise(box.load_module())
            stage = "running the function"
            text = await box.supervise(box.invoke(self.export, params_js))
        except Exception as e:
            return self._failure(box, stage, e)
        return self._outcome_from_record(text)

    def _failure(self, box: _Sandbox, stage: str, e: Exception) -> RunOutcome:
        """The outcome of a run whose guest call raised `e` (called while handling it)."""
        if isinstance(e, _Aborted):
            return RunTimedOut()  # replaced by the caller according to box.abort
        if isinstance(e, InterruptError):
            return RunTrap("interrupted")  # box.abort is set: the caller maps it
        if isinstance(e, MemoryLimitError):
            return RunTrap("out of memory")
        if isinstance(e, DeadlockError):
            return RunTrap(
                f"{stage}: awaited a promise that never settles "
                "(there are no timers; only fetch completes asynchronously)"
            )
        if isinstance(e, JSError):
            if stage == "loading the module":
                return RunTrap(self._load_error_message(e), e.stack or "")
            return RunTrap(f"{stage}: {e.name}: {e.message}", e.stack or "")
        if is_allocation_failure(e, box.stderr.text()):
            return RunTrap("out of memory", str(e))
        if isinstance(e, wasmtime.Trap):
            return RunTrap(trap_reason(e), str(e))
        if isinstance(e, QuickJSError):
            return RunTrap(f"{stage}: {type(e).__name__}: {e}", traceback.format_exc())
        return RunTrap(f"{stage}: internal error: {e!r}", traceback.format_exc())

    def _outcome_from_record(self, text: str) -> RunOutcome:
        record = result_record(text)
        if record.kind == "ok":
            return RunOk(record.value)
        if record.kind == "err":
            return RunErr(record.value, permanent=is_permanent_err(record.value))
        return RunTrap(record.reason, record.detail)
