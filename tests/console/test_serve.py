"""`obelisk-tui --serve` is guarded: a token (then a cookie), same-origin WebSockets, a
session cap, loopback unless `--serve-public`.

Real HTTP on loopback with aiohttp's client: against a real `obelisk-tui --serve` process
(attached to an address where no server answers: the guard is in front of any session, so
the engine does not matter), and against the served app in this process with a stand-in
console command that marks each start, so that "no session started" can be checked.
"""

from __future__ import annotations

import base64
import gc
import os
import shlex
import sys
from asyncio.base_subprocess import BaseSubprocessTransport
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from tests.console.e2e_helpers import DrainedProcess, async_wait_for, console_command, free_port

START_TIMEOUT = 30.0

#: A stand-in console: marks its start (a file named by its pid), says it is a Textual app
#: (the prelude textual-serve waits for), sends one data packet, then runs until
#: textual-serve says quit or closes its stdin.
STAND_IN = r"""
import os, pathlib, sys
pathlib.Path(sys.argv[1], str(os.getpid())).touch()
out = sys.stdout.buffer
out.write(b"__GANGLION__\n" + b"D" + (5).to_bytes(4, "big") + b"ready")
out.flush()
while (chunk := sys.stdin.buffer.read1(4096)) and b'"quit"' not in chunk:
    pass
"""


def serve_args(port: int, *extra: str) -> list[str]:
    return [
        *console_command(),
        "--serve",
        "--attach",
        "http://127.0.0.1:9",
        "--serve-listen",
        f"127.0.0.1:{port}",
        *extra,
    ]


def start_serve(tmp_path: Path, env: dict[str, str]) -> tuple[DrainedProcess, str]:
    """A real `obelisk-tui --serve`, and the URL it printed for the operator."""
    port = free_port()
    serve = DrainedProcess(serve_args(port), tmp_path / "serve.log", env=env)
    try:
        line = serve.wait_line("Console in the browser:", START_TIMEOUT)
    except BaseException:
        serve.kill()
        raise
    url = line.split("Console in the browser:", 1)[1].split()[0]
    return serve, url


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(base URL, token) of one `--serve` for the module's checks."""
    env = {**os.environ}
    env.pop("OBELISK_API_TOKEN", None)
    serve, url = start_serve(tmp_path_factory.mktemp("serve"), env)
    try:
        base, _, token = url.partition("/?token=")  # (checked by the first test)
        yield base, token
    finally:
        serve.kill()


def cookie_session() -> aiohttp.ClientSession:
    # `unsafe`: aiohttp's jar keeps no cookie of an IP address (127.0.0.1) otherwise.
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def ws_status(http: aiohttp.ClientSession, url: str, origin: str | None) -> tuple[int, str]:
    """A WebSocket upgrade as a browser sends it: its status and the body that explains a
    refusal (101: it was accepted)."""
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode(),
    }
    if origin is not None:
        headers["Origin"] = origin
    timeout = aiohttp.ClientTimeout(total=START_TIMEOUT)
    async with http.get(url, headers=headers, timeout=timeout) as response:
        if response.status == 101:
            return 101, ""
        return response.status, await response.text()


def test_the_printed_url_carries_a_new_token(served: tuple[str, str]) -> None:
    base, token = served
    assert base.startswith("http://127.0.0.1:"), base
    assert len(token) >= 32, f"no token, or a short one: {token!r}"


async def test_no_token_no_page_no_session(served: tuple[str, str]) -> None:
    base, _ = served
    async with aiohttp.ClientSession() as http:
        for path in ("/", "/static/js/textual.js"):
            async with http.get(base + path) as response:
                assert response.status == 401, path
                text = await response.text()
                assert "a token is required" in text and "?token=" in text, text
                assert "Set-Cookie" not in response.headers
        assert (await ws_status(http, f"{base}/ws", origin=base))[0] == 401


async def test_a_wrong_token_is_refused(served: tuple[str, str]) -> None:
    base, token = served
    async with cookie_session() as http:
        for wrong in ("nope", token[:-1], token + "x"):
            async with http.get(f"{base}/?token={wrong}") as response:
                assert response.status == 401, wrong
                assert "Set-Cookie" not in response.headers
        assert (await ws_status(http, f"{base}/ws?token=nope", origin=base))[0] == 401
        # A made-up cookie is no token either.
        http.cookie_jar.update_cookies(
            {f"obelisk_console_{base.rsplit(':', 1)[1]}": token}, response_url=URL(base)
        )
        async with http.get(f"{base}/") as response:
            assert response.status == 401


async def test_the_token_serves_the_page_and_sets_a_strict_cookie(
    served: tuple[str, str],
) -> None:
    base, token = served
    port = base.rsplit(":", 1)[1]
    async with cookie_session() as http:
        # Opened as localhost: the page's WebSocket and statics are on that origin too.
        async with http.get(f"http://localhost:{port}/?token={token}") as response:
            assert response.status == 200
            page = await response.text()
            cookie = response.headers["Set-Cookie"]
        assert f'data-session-websocket-url="ws://localhost:{port}/ws"' in page, page
        assert f"http://localhost:{port}/static/js/textual.js" in page
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie, cookie
        assert token not in cookie, "the cookie holds a value derived from the token"
        # The page's own fetches carry the cookie, not the token.
        for path in ("/", "/static/js/textual.js"):
            async with http.get(f"http://localhost:{port}{path}") as response:
                assert response.status == 200, path
        # …and so does its WebSocket; from another origin it is refused all the same.
        for origin in ("http://evil.example", f"http://127.0.0.1:{port}", "null", None):
            status, message = await ws_status(http, f"http://localhost:{port}/ws", origin)
            assert status == 403, (origin, status)
            assert "another origin" in message, message


async def test_a_foreign_origin_is_refused_even_with_the_token(served: tuple[str, str]) -> None:
    base, token = served
    port = base.rsplit(":", 1)[1]
    async with aiohttp.ClientSession() as http:
        for origin in ("http://evil.example", f"http://evil.example:{port}", "http://127.0.0.1"):
            status, _ = await ws_status(http, f"{base}/ws?token={token}", origin)
            assert status == 403, origin
        # A state-changing method from another origin, too (before the token is looked at).
        async with http.post(
            f"{base}/?token={token}", headers={"Origin": "http://evil.example"}
        ) as response:
            assert response.status == 403


async def test_the_api_token_is_the_browsers_token_when_set(tmp_path: Path) -> None:
    serve, url = start_serve(tmp_path, {**os.environ, "OBELISK_API_TOKEN": "s3cret-api"})
    try:
        assert url.endswith("/?token=s3cret-api"), url
        base = url.partition("/?token=")[0]
        async with aiohttp.ClientSession() as http:
            async with http.get(url) as response:
                assert response.status == 200
            async with http.get(base + "/") as response:
                assert response.status == 401
    finally:
        serve.kill()


# -- the served app in this process, with a stand-in console ---------------------------------


class Served:
    def __init__(self, server: object, base: str, token: str, starts: Path) -> None:
        from obelisk_tui.serve import ConsoleServer

        assert isinstance(server, ConsoleServer)
        self.server = server
        self.base = base
        self.token = token
        self.starts = starts

    def started(self) -> int:
        return len(list(self.starts.iterdir()))


@pytest.fixture
async def stand_in(tmp_path: Path) -> AsyncIterator[Served]:
    from obelisk_tui.serve import ConsoleServer

    starts = tmp_path / "starts"
    starts.mkdir()
    port = free_port()
    command = shlex.join([sys.executable, "-c", STAND_IN, str(starts)])
    server = ConsoleServer(command, host="127.0.0.1", port=port, token="t0ken", max_sessions=2)
    runner = web.AppRunner(await server._make_app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield Served(server, f"http://127.0.0.1:{port}", "t0ken", starts)
    finally:
        await runner.cleanup()
        # textual-serve never awaits its consoles' processes: their transports close once
        # asyncio has reaped them, which must happen before this test's loop closes.
        await async_wait_for(
            _no_open_subprocess, START_TIMEOUT, "the stand-in consoles to be reaped"
        )


async def _no_open_subprocess() -> bool:
    return not any(
        isinstance(o, BaseSubprocessTransport) and not o.is_closing() for o in gc.get_objects()
    )


async def open_session(http: aiohttp.ClientSession, s: Served) -> aiohttp.ClientWebSocketResponse:
    """A console session; returns once its process has started and sent its first bytes."""
    ws = await http.ws_connect(f"{s.base}/ws?token={s.token}", origin=s.base)
    message = await ws.receive(timeout=START_TIMEOUT)
    assert message.type == aiohttp.WSMsgType.BINARY and message.data == b"ready", message
    return ws


async def test_refused_upgrades_start_no_console(stand_in: Served) -> None:
    async with aiohttp.ClientSession() as http:
        for url, origin in [
            (f"{stand_in.base}/ws", stand_in.base),  # no token
            (f"{stand_in.base}/ws?token=t0kem", stand_in.base),  # a wrong one
            (f"{stand_in.base}/ws?token=t0ken", "http://evil.example"),  # another origin
        ]:
            assert (await ws_status(http, url, origin))[0] in (401, 403), (url, origin)
        assert stand_in.started() == 0
        # The same upgrade, with the token and from the page's origin: a console starts.
        ws = await open_session(http, stand_in)
        assert stand_in.started() == 1
        await ws.close()


async def test_sessions_over_the_cap_are_refused(stand_in: Served) -> None:
    async with aiohttp.ClientSession() as http:
        first = await open_session(http, stand_in)
        second = await open_session(http, stand_in)
        status, message = await ws_status(
            http, f"{stand_in.base}/ws?token={stand_in.token}", stand_in.base
        )
        assert status == 503, status
        assert "2 sessions are open" in message and "--serve-max-sessions" in message, message
        assert stand_in.started() == 2
        # The cap is on sessions at once: one closed, one more may open.
        await first.close()

        async def one_ended() -> bool:
            return stand_in.server.sessions < 2

        await async_wait_for(one_ended, START_TIMEOUT, "a session to end")
        third = await open_session(http, stand_in)
        assert stand_in.started() == 3
        await second.close()
        await third.close()


# -- where it listens -----------------------------------------------------------------------


@pytest.mark.parametrize("listen", ["0.0.0.0:8000", "[::]:8000", "192.0.2.1:8000"])
def test_a_public_address_needs_the_flag(tmp_path: Path, listen: str) -> None:
    import subprocess

    done = subprocess.run(
        [*console_command(), "--serve", "--demo", "--serve-listen", listen],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done
    assert "is not a loopback address" in done.stderr and "--serve-public" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (tmp_path / "data").exists(), "refused before any engine started"


def test_the_listen_rule() -> None:
    from obelisk_tui.serve_rules import listen_problem

    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert listen_problem(host, public=False) is None, host
    assert listen_problem("0.0.0.0", public=False) is not None
    assert listen_problem("0.0.0.0", public=True) is None


def test_the_origin_rule() -> None:
    from obelisk_tui.serve_rules import origin_matches

    assert origin_matches("http://127.0.0.1:8000", "127.0.0.1:8000")
    assert origin_matches("http://LocalHost:8000", "localhost:8000")
    assert origin_matches("http://[::1]:8000", "[::1]:8000")
    assert origin_matches("https://console.example.com", "console.example.com")
    assert origin_matches("http://console.example.com", "console.example.com:80")
    for origin, host in [
        ("http://127.0.0.1:8001", "127.0.0.1:8000"),
        ("http://localhost:8000", "127.0.0.1:8000"),
        ("http://evil.example", "127.0.0.1:8000"),
        ("https://console.example.com", "console.example.com:80"),
        ("null", "127.0.0.1:8000"),
        (None, "127.0.0.1:8000"),
        ("http://127.0.0.1:99999", "127.0.0.1:99999"),
        ("file:///x", "127.0.0.1:8000"),
    ]:
        assert not origin_matches(origin, host), (origin, host)
