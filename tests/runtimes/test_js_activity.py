"""Tests for the activity_js runner (real JS in quickjs-rs, a real local HTTP server)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from engine.runtimes.js import activity as js_activity
from engine.runtimes.js.activity import (
    HostPattern,
    JsActivityRunner,
    JsLoadError,
    is_permanent_err,
    parse_allowed_hosts,
    warm_up,
)
from engine.runtimes.outcome import (
    LogLine,
    RunCancelled,
    RunErr,
    RunOk,
    RunOutcome,
    RunTimedOut,
    RunTrap,
)

# ---------------------------------------------------------------------------
# A local HTTP server
# ---------------------------------------------------------------------------


#: Set when a request for `/slow` arrives: the guest is then waiting on its fetch.
SLOW_REQUESTED = threading.Event()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        # The client may have given up (cancel / deadline tests).
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(body)

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        if self.path == "/hello":
            self._send(200, b'{"msg": "hi"}', {"Content-Type": "application/json", "X-Test": "1"})
        elif self.path == "/slow":
            SLOW_REQUESTED.set()
            time.sleep(1.5)
            self._send(200, b"late")
        elif self.path == "/redirect":
            self._send(302, b"", {"Location": "/hello"})
        elif self.path == "/redirect-out":
            self._send(302, b"", {"Location": f"http://localhost:{port}/hello"})
        else:
            self._send(404, b"not found", {"Content-Type": "text/plain"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        data = self.rfile.read(length)
        reply = {
            "body": data.decode(),
            "contentType": self.headers.get("Content-Type"),
            "token": self.headers.get("X-Token"),
        }
        self._send(201, json.dumps(reply).encode(), {"Content-Type": "application/json"})


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def run(
    source: str,
    params: list[Any] | None = None,
    *,
    export: str | None = None,
    timeout: float = 5.0,
    cancel: threading.Event | None = None,
    logs: list[LogLine] | None = None,
    allowed_hosts: list[str] | None = None,
    env_vars: dict[str, str] | None = None,
    memory_limit: int | None = None,
) -> RunOutcome:
    kwargs: dict[str, Any] = {}
    if memory_limit is not None:
        kwargs["memory_limit"] = memory_limit
    runner = JsActivityRunner(source, "activity/test.js", export, **kwargs)
    sink = logs if logs is not None else []
    return runner.call(
        params or [],
        time.monotonic() + timeout,
        cancel or threading.Event(),
        sink.append,
        allowed_hosts or [],
        env_vars,
    )


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


def test_default_export_gets_positional_params() -> None:
    src = "export default function (name, n) { return { greeting: `Hello ${name}`, n: n + 1 }; }"
    assert run(src, ["World", 41]) == RunOk({"greeting": "Hello World", "n": 42})


def test_named_export_and_json_values() -> None:
    src = """
    export function shape(xs, opt) { return [xs.length, opt, { nested: [true, null] }]; }
    export default function () { throw new Error("wrong export"); }
    """
    assert run(src, [[1, 2, 3], None], export="shape") == RunOk([3, None, {"nested": [True, None]}])


def test_undefined_return_is_none_and_bigint_is_int() -> None:
    assert run("export default function () {}") == RunOk(None)
    assert run("export default () => 12345678901234567890n") == RunOk(12345678901234567890)


def test_throw_error_gives_its_message() -> None:
    src = "export default function () { throw new TypeError('card declined'); }"
    assert run(src) == RunErr("card declined", permanent=False)


def test_throw_object_gives_the_value() -> None:
    src = "export default function () { throw { code: 7, reason: 'x' }; }"
    assert run(src) == RunErr({"code": 7, "reason": "x"}, permanent=False)
    assert run("export default function () { throw 'plain'; }") == RunErr("plain")


@pytest.mark.parametrize(
    ("thrown", "value", "permanent"),
    [
        ("'permanent-failure'", "permanent-failure", True),
        ("{ 'permanent-failure': 'card declined' }", {"permanent-failure": "card declined"}, True),
        ("new Error('permanent-failure')", "permanent-failure", True),
        ("'permanent failure: not a case name'", "permanent failure: not a case name", False),
        ("{ 'permanent-failure': 1, other: 2 }", {"permanent-failure": 1, "other": 2}, False),
        ("'temporary-failure'", "temporary-failure", False),
    ],
)
def test_permanent_err(thrown: str, value: Any, permanent: bool) -> None:
    src = f"export default function () {{ throw {thrown}; }}"
    assert run(src) == RunErr(value, permanent=permanent)


def test_is_permanent_err_rule() -> None:
    assert is_permanent_err("permanent")
    assert is_permanent_err({"not-found-permanent": None})
    assert not is_permanent_err(["permanent"])
    assert not is_permanent_err(None)
    assert not is_permanent_err("some permanent text")


def test_unserializable_return_is_trap() -> None:
    src = "export default function () { const a = {}; a.self = a; return a; }"
    out = run(src)
    assert isinstance(out, RunTrap)
    assert "JSON" in out.reason


def test_never_settling_promise_is_trap() -> None:
    out = run("export default async function () { await new Promise(() => {}); }")
    assert isinstance(out, RunTrap)
    assert "never settles" in out.reason


def test_top_level_throw_at_run_time_is_trap() -> None:
    # Passes check() (no env) but throws at run time when env differs.
    src = "if (process.env.MODE === 'bad') throw new Error('bad mode'); export default () => 1;"
    runner = JsActivityRunner(src, "activity/test.js", env_vars={"MODE": "ok"})
    out = runner.call(
        [], time.monotonic() + 5, threading.Event(), lambda _l: None, [], {"MODE": "bad"}
    )
    assert isinstance(out, RunTrap)
    assert "bad mode" in out.reason
    assert "activity/test.js" in out.reason


# ---------------------------------------------------------------------------
# Console
# ---------------------------------------------------------------------------


def test_console_is_captured() -> None:
    src = """
    export default function () {
      console.log("hello", 42, { a: [1, 2] });
      console.info("info");
      console.warn("careful");
      console.error(new Error("bad"));
      console.debug("dbg", null, undefined, true);
      return 1;
    }
    """
    logs: list[LogLine] = []
    assert run(src, logs=logs) == RunOk(1)
    assert [(line.level, line.message.splitlines()[0]) for line in logs] == [
        ("info", 'hello 42 {"a":[1,2]}'),
        ("info", "info"),
        ("warn", "careful"),
        ("error", "Error: bad"),
        ("debug", "dbg null undefined true"),
    ]
    assert "activity/test.js" in logs[3].message  # the error's stack


# ---------------------------------------------------------------------------
# fetch
# ---------------------------------------------------------------------------


def test_async_export_awaits_fetch(server: str) -> None:
    src = """
    export default async function (base) {
      const res = await fetch(`http://${base}/hello`);
      const body = await res.json();
      return { status: res.status, ok: res.ok, msg: body.msg,
               type: res.headers.get("content-type"), x: res.headers.get("X-TEST") };
    }
    """
    out = run(src, [server], allowed_hosts=[server])
    assert out == RunOk(
        {"status": 200, "ok": True, "msg": "hi", "type": "application/json", "x": "1"}
    )


def test_fetch_post_text_and_status(server: str) -> None:
    src = """
    export default async function (base) {
      const res = await fetch(`http://${base}/echo`, {
        method: "POST", body: JSON.stringify({ a: 1 }),
        headers: { "Content-Type": "application/json", "X-Token": "t0k" },
      });
      const missing = await fetch(`http://${base}/missing`);
      return { status: res.status, echo: await res.json(),
               missing: [missing.status, missing.ok, await missing.text()] };
    }
    """
    out = run(src, [server], allowed_hosts=["http://127.0.0.1:*"])
    assert out == RunOk(
        {
            "status": 201,
            "echo": {"body": '{"a":1}', "contentType": "application/json", "token": "t0k"},
            "missing": [404, False, "not found"],
        }
    )


def test_fetch_follows_redirects(server: str) -> None:
    src = """
    export default async function (base) {
      const res = await fetch(`http://${base}/redirect`);
      return [res.status, res.redirected, (await res.json()).msg];
    }
    """
    assert run(src, [server], allowed_hosts=[server]) == RunOk([200, True, "hi"])


def test_fetch_refused_for_host_not_allowed() -> None:
    src = """
    export default async function () {
      try {
        await fetch("https://evil.example.com/steal");
        return "fetched";
      } catch (e) {
        return [e instanceof TypeError, e.message];
      }
    }
    """
    out = run(src, allowed_hosts=["api.example.com", "127.0.0.1:1"])
    assert isinstance(out, RunOk)
    is_type_error, message = out.value
    assert is_type_error
    assert "evil.example.com" in message
    assert "not in the deployment's allowed_host list" in message


def test_uncaught_refusal_is_err_and_no_hosts_means_no_network(server: str) -> None:
    src = "export default async (base) => (await fetch(`http://${base}/hello`)).status;"
    out = run(src, [server])
    assert isinstance(out, RunErr)
    assert "127.0.0.1" in out.value and "not in the deployment's allowed_host list" in out.value


def test_redirect_to_host_not_allowed_is_refused(server: str) -> None:
    src = "export default async (base) => (await fetch(`http://${base}/redirect-out`)).status;"
    out = run(src, [server], allowed_hosts=[server])
    assert isinstance(out, RunErr)
    assert "localhost" in out.value and "not in the deployment's allowed_host list" in out.value


def test_fetch_connection_failure_is_type_error() -> None:
    src = """
    export default async function () {
      try { await fetch("http://127.0.0.1:1/"); } catch (e) { return [e.name, e.message]; }
    }
    """
    out = run(src, allowed_hosts=["127.0.0.1:1"])
    assert isinstance(out, RunOk)
    assert out.value[0] == "TypeError"
    assert out.value[1].startswith("fetch failed")


@pytest.mark.parametrize(
    ("pattern", "url", "allowed"),
    [
        ("api.example.com", "https://api.example.com/x", True),
        ("api.example.com", "http://api.example.com/x", True),
        ("api.example.com", "https://api.example.com:8443/x", False),
        ("api.example.com", "https://other.example.com/x", False),
        ("*.example.com", "https://a.b.example.com/", True),
        ("*.example.com", "https://example.com/", False),
        ("127.0.0.1:8080", "http://127.0.0.1:8080/", True),
        ("127.0.0.1:8080", "http://127.0.0.1:8081/", False),
        ("http://localhost:*", "http://localhost:1234/", True),
        ("http://localhost:*", "https://localhost:1234/", False),
        ("https://API.example.com", "https://api.EXAMPLE.com/", True),
        ("*", "https://anything.test/", True),
        ("[::1]:8080", "http://[::1]:8080/", True),
    ],
)
def test_allowed_host_patterns(pattern: str, url: str, allowed: bool) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    assert parts.hostname is not None
    port = parts.port or {"http": 80, "https": 443}[parts.scheme]
    (p,) = parse_allowed_hosts([pattern])
    assert p.matches(parts.scheme, parts.hostname, port) is allowed


@pytest.mark.parametrize("bad", ["", "ftp://host", "host:99999", "http://", "a b"])
def test_invalid_allowed_host_pattern(bad: str) -> None:
    with pytest.raises(ValueError, match="allowed_host pattern"):
        HostPattern.parse(bad)
    out = run("export default () => 1", allowed_hosts=[bad])
    assert isinstance(out, RunTrap)


# ---------------------------------------------------------------------------
# Sandbox
# ---------------------------------------------------------------------------


def test_no_ambient_access() -> None:
    src = """
    export default function () {
      return [typeof process, typeof require, typeof setTimeout, typeof Deno,
              typeof __obelisk_host_log, typeof __obelisk_host_fetch, typeof fetch];
    }
    """
    assert run(src) == RunOk(
        ["undefined", "undefined", "undefined", "undefined", "undefined", "undefined", "function"]
    )


def test_env_vars_exposed_as_process_env() -> None:
    src = "export default () => [process.env.GREETING, process.env.MISSING, Object.keys(process)];"
    assert run(src, env_vars={"GREETING": "hi"}) == RunOk(["hi", None, ["env"]])


def test_runs_do_not_share_state() -> None:
    src = """
    let counter = 0;
    export default function () { globalThis.seen = (globalThis.seen || 0) + 1; return [++counter, seen]; }
    """
    runner = JsActivityRunner(src, "activity/test.js")
    for _ in range(2):
        out = runner.call([], time.monotonic() + 5, threading.Event(), lambda _l: None, [])
        assert out == RunOk([1, 1])


def test_imports_are_rejected() -> None:
    with pytest.raises(JsLoadError, match=r"activity/test\.js.*imports are not supported"):
        JsActivityRunner("import x from './other.js'; export default x;", "activity/test.js")


# ---------------------------------------------------------------------------
# Load errors
# ---------------------------------------------------------------------------


def test_syntax_error_names_file_and_line() -> None:
    src = "export default function () {\n  return 1;\n}\nlet x = ;\n"
    with pytest.raises(JsLoadError) as info:
        JsActivityRunner(src, "activity/broken.js")
    message = str(info.value)
    assert "activity/broken.js" in message
    assert "SyntaxError" in message
    assert "(line 4: 'let x = ;')" in message, message  # no column: QuickJS's is off


def test_missing_export() -> None:
    src = "export function greet() {}\nexport const x = 1;"
    with pytest.raises(
        JsLoadError, match=r"activity/test\.js: no default export \(exports: greet, x\)"
    ):
        JsActivityRunner(src, "activity/test.js")
    with pytest.raises(JsLoadError, match="no export 'nope'"):
        JsActivityRunner(src, "activity/test.js", "nope")
    with pytest.raises(JsLoadError, match="export 'x' is not a function"):
        JsActivityRunner(src, "activity/test.js", "x")


def test_top_level_throw_is_load_error() -> None:
    with pytest.raises(
        JsLoadError, match=r"activity/test\.js: module evaluation failed: Error: boom"
    ):
        JsActivityRunner("throw new Error('boom');\nexport default () => 1;", "activity/test.js")


# ---------------------------------------------------------------------------
# Timeouts, cancellation, resources
# ---------------------------------------------------------------------------


def test_spinning_loop_times_out() -> None:
    started = time.monotonic()
    out = run("export default function () { while (true) {} }", timeout=0.3)
    elapsed = time.monotonic() - started
    assert out == RunTimedOut()
    assert elapsed < 0.3 + 0.25


def test_cancel_interrupts_spinning_loop() -> None:
    cancel = threading.Event()
    runner = JsActivityRunner("export default function () { for (;;) {} }", "activity/test.js")
    set_at: list[float] = []

    def fire() -> None:
        set_at.append(time.monotonic())
        cancel.set()

    timer = threading.Timer(0.15, fire)
    timer.start()
    out = runner.call([], time.monotonic() + 10, cancel, lambda _l: None, [])
    latency = time.monotonic() - set_at[0]
    assert out == RunCancelled()
    assert latency < 0.05


def test_cancel_interrupts_pending_fetch(server: str) -> None:
    cancel = threading.Event()
    src = "export default async (base) => (await fetch(`http://${base}/slow`)).text();"
    runner = JsActivityRunner(src, "activity/test.js")
    set_at: list[float] = []

    def fire() -> None:
        # Once the guest waits on its fetch (not after a fixed delay: under load the
        # sandbox alone can take longer to start, and the cancel would come before it).
        SLOW_REQUESTED.wait(10)
        set_at.append(time.monotonic())
        cancel.set()

    SLOW_REQUESTED.clear()
    threading.Thread(target=fire, daemon=True).start()
    out = runner.call([server], time.monotonic() + 10, cancel, lambda _l: None, [server])
    assert out == RunCancelled()
    assert time.monotonic() - set_at[0] < 0.1


def test_deadline_bounds_pending_fetch(server: str) -> None:
    src = "export default async (base) => (await fetch(`http://${base}/slow`)).text();"
    started = time.monotonic()
    out = run(src, [server], timeout=0.3, allowed_hosts=[server])
    assert out == RunTimedOut()
    assert time.monotonic() - started < 0.6


def test_already_cancelled_or_expired() -> None:
    runner = JsActivityRunner("export default () => 1", "activity/test.js")
    cancel = threading.Event()
    cancel.set()
    assert runner.call([], time.monotonic() + 5, cancel, lambda _l: None, []) == RunCancelled()
    out = runner.call([], time.monotonic() - 1, threading.Event(), lambda _l: None, [])
    assert out == RunTimedOut()


def test_memory_limit_is_out_of_memory_trap() -> None:
    src = (
        "export default function () { const a = []; for (;;) a.push(new Array(100000).fill(1.5)); }"
    )
    out = run(src, memory_limit=16 * 1024 * 1024)
    assert out == RunTrap("out of memory (the JS sandbox's limit is 16 MiB)")


def test_memory_limit_caught_by_guest_still_traps() -> None:
    src = """
    export default function () {
      const a = [];
      try { for (;;) a.push(new Uint8Array(1 << 20)); } catch (e) { throw e; }
    }
    """
    out = run(src, memory_limit=16 * 1024 * 1024)
    assert out == RunTrap("out of memory (the JS sandbox's limit is 16 MiB)")


def test_a_return_value_too_big_to_serialize_is_out_of_memory() -> None:
    src = "export default function () { return 'x'.repeat(6 * 1024 * 1024); }"
    out = run(src, memory_limit=16 * 1024 * 1024)
    assert out == RunTrap("out of memory (the JS sandbox's limit is 16 MiB)")


def test_unbounded_recursion_is_trap() -> None:
    out = run("function f(n) { return f(n + 1) + 1; }\nexport default () => f(0);")
    assert isinstance(out, RunTrap)
    assert out.reason == "stack overflow"


# ---------------------------------------------------------------------------
# Threads and loops
# ---------------------------------------------------------------------------


def test_warm_up_is_idempotent() -> None:
    warm_up()
    warm_up()


def test_concurrent_runs_in_threads() -> None:
    src = "export default async function (i) { await null; let s = 0; for (let k = 0; k < 20000; k++) s += k; return [i, s]; }"
    runner = JsActivityRunner(src, "activity/test.js")
    results: dict[int, RunOutcome] = {}

    def work(i: int) -> None:
        results[i] = runner.call([i], time.monotonic() + 10, threading.Event(), lambda _l: None, [])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: RunOk([i, 199990000]) for i in range(8)}


async def test_run_from_asyncio_via_to_thread_and_directly() -> None:
    runner = JsActivityRunner("export default (x) => x * 2", "activity/test.js")
    out = await asyncio.to_thread(
        runner.call, [21], time.monotonic() + 5, threading.Event(), lambda _l: None, []
    )
    assert out == RunOk(42)
    # Called on a thread that runs a loop: still works (uses a helper thread).
    assert runner.call([2], time.monotonic() + 5, threading.Event(), lambda _l: None, []) == RunOk(
        4
    )


def test_compiled_quickjs_is_cached_on_disk(tmp_path: Path) -> None:
    """A process compiles QuickJS once and keeps it; the next deserializes it, and an
    unusable cache file is compiled again and replaced."""
    import subprocess
    import sys

    script = (
        "import sys; from pathlib import Path; from engine.runtimes.js.activity import warm_up; "
        "warm_up(Path(sys.argv[1]))"
    )

    def run() -> None:
        subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=True, timeout=120)

    run()
    (cached,) = tmp_path.glob("quickjs-*.cwasm")
    assert cached.stat().st_size > 100_000
    first = cached.stat().st_mtime_ns
    run()  # deserialized: not written again
    assert cached.stat().st_mtime_ns == first
    cached.write_bytes(b"not a compiled module")
    run()
    assert cached.stat().st_size > 100_000


_THREAD_LOOPS_AT_EXIT = """
import asyncio, threading
from engine.runtimes.js.common import run_coroutine
ran = threading.Barrier(9)
def worker():
    async def step():
        await asyncio.sleep(0)
    run_coroutine(step)  # keeps this thread's loop for its next run
    ran.wait()
    threading.Event().wait()  # a pool thread still alive when the process exits
for _ in range(8):
    threading.Thread(target=worker, daemon=True).start()
ran.wait()
"""


def test_thread_loops_are_closed_quietly_when_the_process_exits() -> None:
    """Each worker thread keeps its event loop between runs; at exit they are closed
    before the interpreter tears objects down in any order (a loop finalised after its
    self-pipe socket printed a traceback on a server's stderr, about one exit in three)."""
    root = Path(__file__).resolve().parents[2]
    for _ in range(5):
        done = subprocess.run(
            [sys.executable, "-c", _THREAD_LOOPS_AT_EXIT],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr


# ---------------------------------------------------------------------------
# The faster guest-call path (engine.runtimes.js.quickjs_fast)
# ---------------------------------------------------------------------------

EQUIVALENCE = """
export default async function (base, n) {
  console.log("start", n);
  const res = await fetch(`http://${base}/hello`);
  const body = await res.json();
  let acc = 0;
  for (let i = 0; i < n; i++) acc += i;
  return [acc, body.msg, res.status, 2n ** 60n, "é ✓ \\u0000", { nested: [1, null, true] },
          process.env.GREETING];
}
"""


@pytest.mark.parametrize("accelerate", [True, False])
@pytest.mark.parametrize("snapshot", [True, False])
def test_fast_path_is_active_and_equivalent(
    server: str, monkeypatch: pytest.MonkeyPatch, accelerate: bool, snapshot: bool
) -> None:
    seen: list[bool] = []
    restored: list[bool] = []
    original_init = js_activity._Sandbox.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        seen.append(self.accelerated)
        restored.append(self.from_snapshot)

    monkeypatch.setattr(js_activity._Sandbox, "__init__", spy)
    monkeypatch.setattr(js_activity, "ACCELERATE", accelerate)
    monkeypatch.setattr(js_activity, "USE_SNAPSHOT", snapshot)
    logs: list[LogLine] = []
    out = run(
        EQUIVALENCE,
        [server, 100],
        allowed_hosts=[server],
        env_vars={"GREETING": "hej"},
        logs=logs,
    )
    assert seen and all(a == accelerate for a in seen)
    assert restored and all(r == snapshot for r in restored)  # the prelude's heap image
    assert out == RunOk([4950, "hi", 200, 2**60, "é ✓ \x00", {"nested": [1, None, True]}, "hej"])
    assert [line.message for line in logs] == ["start 100"]


@pytest.mark.parametrize("snapshot", [True, False])
def test_math_random_differs_from_run_to_run(
    monkeypatch: pytest.MonkeyPatch, snapshot: bool
) -> None:
    # A sandbox restored from the prelude's heap image must not repeat QuickJS's
    # random state: Math.random is seeded by the host in every run.
    monkeypatch.setattr(js_activity, "USE_SNAPSHOT", snapshot)
    src = "export default function draw(n) { return Array.from({ length: n }, Math.random); }"
    runs = [run(src, [50]) for _ in range(3)]
    values = [v for r in runs for v in (r.value if isinstance(r, RunOk) else [])]
    assert len(values) == 150, runs
    assert all(isinstance(v, float) and 0 <= v < 1 for v in values)
    assert len(set(values)) == 150  # no run repeats another's sequence
    assert 0.3 < sum(values) / len(values) < 0.7
