"""End to end in a browser: `obelisk-tui --serve --demo`, opened in headless Chromium.

The console serves itself with textual-serve (one shared engine; each browser session
runs `obelisk-tui --attach` against its API). The test drives Debian's Chromium over the
DevTools protocol with a small client on aiohttp's websocket (below), types real key
events (`Input.dispatchKeyEvent`) and reads the terminal's text.

Reading the terminal: textual-serve's page draws with xterm.js on a canvas (WebGL or
canvas renderer), so the DOM holds no text. Its `textual.js` creates the `Terminal` in a
closure (`this.terminal = new Terminal(…)` in its session class), out of reach of page
scripts. A script installed before the page loads (`Page.addScriptToEvaluateOnNewDocument`)
defines a setter for `terminal` on `Object.prototype`: the session's assignment lands
there, the setter keeps the terminal in `window.__obeliskTerminals` and defines the
property on the object as a plain one (so textual.js sees no difference). The test then
reads the visible rows from xterm.js's public buffer API
(`buffer.active.getLine(y).translateToString()`): exactly the characters on the screen.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.console.e2e_helpers import (
    VERSION_RE,
    DrainedProcess,
    async_wait_for,
    console_command,
    free_port,
    list_title,
    parse_counts,
    parse_events,
    parse_rows,
    require_executable,
)

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
#: The first start on a new data dir compiles the demo's components (about 10 s on an
#: idle 2-core machine; much more when other work shares it).
START_TIMEOUT = 90.0
SCREEN_TIMEOUT = 15.0

#: As root, in a machine without network: no sandbox, no GPU, no background traffic.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--mute-audio",
    "--window-size=1600,1000",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]

#: Installed before textual.js runs: keeps each xterm.js Terminal assigned to a
#: `.terminal` property (textual-serve's session object) in window.__obeliskTerminals.
CAPTURE_TERMINAL = """
(() => {
  const terminals = [];
  Object.defineProperty(window, "__obeliskTerminals", { value: terminals });
  Object.defineProperty(Object.prototype, "terminal", {
    configurable: true,
    set(value) {
      Object.defineProperty(this, "terminal", {
        value, writable: true, configurable: true, enumerable: true,
      });
      if (value && value.buffer && typeof value.write === "function") terminals.push(value);
    },
  });
})();
"""

#: The visible rows of the (first) terminal as text, or null before there is one.
READ_SCREEN = """
(() => {
  const term = window.__obeliskTerminals[0];
  if (!term) return null;
  const buffer = term.buffer.active;
  const lines = [];
  for (let y = 0; y < term.rows; y++) {
    const line = buffer.getLine(buffer.viewportY + y);
    lines.push(line ? line.translateToString(true) : "");
  }
  return { cols: term.cols, rows: term.rows, count: window.__obeliskTerminals.length,
           text: lines.join("\\n") };
})()
"""


class Cdp:
    """A minimal DevTools protocol client for one target: commands and their answers."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read(), name="cdp-reader")

    async def _read(self) -> None:
        async for message in self._ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            future = self._waiting.pop(data.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(data)
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("the DevTools connection closed"))

    async def send(self, method: str, timeout: float = 15.0, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[message_id] = future
        await self._ws.send_json({"id": message_id, "method": method, "params": params})
        answer = await asyncio.wait_for(future, timeout)
        if "error" in answer:
            raise AssertionError(f"{method}: {answer['error']}")
        result: dict[str, Any] = answer.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression[:60]}…: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def close(self) -> None:
        await self._ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


#: key name → (key, code, windowsVirtualKeyCode, text, modifiers); 8 = shift.
SPECIAL_KEYS: dict[str, tuple[str, str, int, str, int]] = {
    "Enter": ("Enter", "Enter", 13, "\r", 0),
    "Escape": ("Escape", "Escape", 27, "", 0),
    " ": (" ", "Space", 32, " ", 0),
    "/": ("/", "Slash", 191, "/", 0),
}


class Page:
    """The console's page: its terminal's text, and keys typed into it."""

    def __init__(self, cdp: Cdp) -> None:
        self.cdp = cdp
        self.last_screen = ""

    async def screen(self) -> str:
        value = await self.cdp.evaluate(READ_SCREEN)
        self.last_screen = value["text"] if value else ""
        return self.last_screen

    async def describe(self) -> str:
        return f"--- the terminal in the browser, as last read ---\n{self.last_screen}"

    async def wait_screen(self, what: str, check: Any, timeout: float = SCREEN_TIMEOUT) -> str:
        async def probe() -> str | None:
            screen = await self.screen()
            return screen if check(screen) else None

        return await async_wait_for(probe, timeout, what, interval=0.1, describe=self.describe)

    async def press(self, key: str) -> None:
        """One key, as the keyboard sends it: keyDown (with its text), keyUp."""
        if key in SPECIAL_KEYS:
            name, code, vk, text, modifiers = SPECIAL_KEYS[key]
        elif len(key) == 1 and key.isalnum():
            name, text = key, key
            code = f"Digit{key}" if key.isdigit() else f"Key{key.upper()}"
            vk, modifiers = ord(key.upper()), 8 if key.isupper() else 0
        else:
            raise ValueError(f"no key event for {key!r}")
        down: dict[str, Any] = {
            "type": "keyDown",
            "key": name,
            "code": code,
            "windowsVirtualKeyCode": vk,
            "modifiers": modifiers,
        }
        if text:
            down["text"] = down["unmodifiedText"] = text
        await self.cdp.send("Input.dispatchKeyEvent", **down)
        await self.cdp.send(
            "Input.dispatchKeyEvent",
            type="keyUp",
            key=name,
            code=code,
            windowsVirtualKeyCode=vk,
            modifiers=modifiers,
        )


class Chromium:
    """Headless Chromium on a fresh profile, with a DevTools port of its choosing."""

    def __init__(self, path: str, profile: Path, log: Path) -> None:
        profile.mkdir()
        self.profile = profile
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [path, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its helpers (renderer, GPU, zygote) in its group
        )

    async def devtools_port(self, timeout: float = 30.0) -> int:
        active = self.profile / "DevToolsActivePort"  # "PORT\n/devtools/browser/…"

        async def probe() -> int | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"chromium exited with {self.proc.returncode}")
            lines = active.read_text().split() if active.exists() else []
            return int(lines[0]) if len(lines) >= 2 else None

        return await async_wait_for(probe, timeout, "chromium's DevTools port")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self._log.close()


@pytest.fixture
def chromium_path() -> str:
    return require_executable(CHROMIUM, "Chromium", "chromium")


@contextlib.asynccontextmanager
async def open_page(chromium: Chromium, url: str) -> AsyncIterator[Page]:
    port = await chromium.devtools_port()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page = next(t for t in targets if t["type"] == "page")
        ws = await http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        cdp = Cdp(ws)
        try:
            await cdp.send("Page.enable")
            await cdp.send("Network.enable")
            # The page asks Google for a web font: there is no network here, don't wait.
            await cdp.send("Network.setBlockedURLs", urls=["*://fonts.googleapis.com/*"])
            # A headless window never has the focus; textual-serve would tell the app so.
            await cdp.send("Emulation.setFocusEmulationEnabled", enabled=True)
            await cdp.send("Page.addScriptToEvaluateOnNewDocument", source=CAPTURE_TERMINAL)
            await cdp.send("Page.navigate", url=url)
            yield Page(cdp)
        finally:
            await cdp.close()


async def test_console_in_chromium(chromium_path: str, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OBELISK_API_TOKEN", None)
    serve = DrainedProcess(
        [
            *console_command(),
            "--serve",
            "--demo",
            "--data-dir",
            str(tmp_path / "data"),
            "--serve-listen",
            f"127.0.0.1:{port}",
        ],
        tmp_path / "serve.log",
        env=env,
    )
    chromium: Chromium | None = None
    try:
        line = await asyncio.to_thread(serve.wait_line, "Console in the browser:", START_TIMEOUT)
        # The URL the operator opens carries the token; the page then lives on its cookie.
        url = line.split("Console in the browser:", 1)[1].split()[0]
        assert url.startswith(f"http://127.0.0.1:{port}/?token="), line
        api_line = serve.wait_line("API of the shared engine:", 1.0)
        api_url = api_line.split("API of the shared engine:", 1)[1].strip()

        chromium = Chromium(chromium_path, tmp_path / "profile", tmp_path / "chromium.log")
        async with open_page(chromium, url) as page:
            await _browse(page, api_url, f"http://127.0.0.1:{port}", tmp_path)
            # The session cookie is HttpOnly: no script on the page can read it.
            assert await page.cdp.evaluate("document.cookie") == ""
            # q ends the session: textual-serve's page says so.
            await page.press("q")
            await async_wait_for(
                lambda: page.cdp.evaluate("document.body.classList.contains('-closed')"),
                SCREEN_TIMEOUT,
                "the page to show 'Session ended.' after q",
                describe=page.describe,
            )
        chromium.kill()
        chromium = None
        code = await asyncio.to_thread(serve.stop, 20.0)
        assert code == 0, f"obelisk-tui --serve ended with {code} on SIGTERM\n{serve.output()}"
        assert "Traceback" not in serve.output(), serve.output()
    finally:
        if chromium is not None:
            chromium.kill()
        serve.kill()


async def _browse(page: Page, api_url: str, served_url: str, tmp_path: Path) -> None:
    # -- the executions list, live --------------------------------------------------------
    screen = await page.wait_screen(
        "the executions list in the browser (counts, title, rows)",
        lambda s: parse_counts(s) and list_title(s) and parse_rows(s),
        START_TIMEOUT,
    )
    # The header names where the operator is (the served URL), not the loopback API of
    # the shared engine behind it (the executions below are that engine's).
    assert f"served · {served_url}" in screen.splitlines()[0], (
        f"the browser's console does not name where it is served, {served_url}\n{screen}"
    )
    first = parse_counts(screen)
    assert first is not None
    await page.wait_screen(
        "new executions to show up (the header's total grows)",
        lambda s: (
            (c := parse_counts(s)) is not None and c["total"] > first["total"] and parse_rows(s)
        ),
    )

    # -- freeze, then open the first finished row (its log no longer changes) -------------
    # Focus the terminal (what a click on it does), so that key events reach xterm.js.
    focused = await page.cdp.evaluate(
        "window.__obeliskTerminals[0].focus(), document.activeElement.className"
    )
    assert focused == "xterm-helper-textarea", focused
    await page.press(" ")
    await page.wait_screen("the FROZEN mark", lambda s: "FROZEN" in s)
    previous: list[str] = []

    def stable(s: str) -> bool:
        body = [line for line in s.splitlines() if "E_" in line]
        same = body == previous and bool(body)
        previous[:] = body
        return same

    await asyncio.sleep(0.3)  # the forced refresh that the freeze asks for is in flight
    screen = await page.wait_screen("the frozen list to stay still", stable)
    rows = parse_rows(screen)
    index, chosen = next(((i, r) for i, r in enumerate(rows) if r.finished), (0, rows[0]))
    for _ in range(index):
        await page.press("j")
    await page.press("Enter")
    screen = await page.wait_screen(
        f"the detail view of {chosen.shown_id}",
        lambda s: "1 State" in s and "2 Events" in s and VERSION_RE.search(s) and "execution " in s,
    )
    title = screen.splitlines()[2].split()
    execution_id = next((w for w in title if w.startswith("E_")), "")  # after the state
    assert chosen.is_shown_id_of(execution_id), f"opened {title}, wanted {chosen}\n{screen}"
    assert chosen.ffqn in screen.splitlines()[2], screen
    for box in ("PendingAt", "Locked", "BlockedByJoinSet", "Finished"):
        assert box in screen, f"the state diagram lacks {box}\n{screen}"
    assert any(line.split()[:2] == ["execution", execution_id] for line in screen.splitlines()), (
        screen
    )
    version = VERSION_RE.search(screen)
    assert version is not None

    # -- 2: its event log -------------------------------------------------------------------
    await page.press("2")
    screen = await page.wait_screen(
        "the Events tab",
        lambda s: "TIME (UTC)" in s and parse_events(s),
    )
    events = parse_events(screen)
    versions = [e.version for e in events]
    assert versions == list(range(versions[0], versions[0] + len(versions))), screen
    # (No row finished yet: the first row, which may have moved on since its State tab.)
    assert versions[-1] == int(version["last"]) or (
        not chosen.finished and versions[-1] > int(version["last"])
    ), f"the log ends at {versions[-1]}, the state at {version['last']}\n{screen}"
    if versions[0] == 0:
        assert events[0].event == "created" and chosen.ffqn in events[0].summary, screen
    if chosen.finished:
        assert events[-1].event == "finished", screen
    shot = await page.cdp.send("Page.captureScreenshot", format="png")
    (tmp_path / "events.png").write_bytes(base64.b64decode(shot["data"]))

    # -- escape: back to the list --------------------------------------------------------------
    await page.press("Escape")
    await page.wait_screen(
        "the executions list again",
        lambda s: "1 State" not in s and parse_rows(s) and list_title(s),
    )
