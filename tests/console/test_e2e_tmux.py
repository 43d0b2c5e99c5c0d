"""End to end in a real terminal: `obelisk-tui --demo` in a tmux pane, driven by keys.

The console runs as its own process (`python -m obelisk_tui` of this checkout, with the
venv's interpreter) on a fresh data dir, in a private tmux server (its own socket, so a
developer's tmux is never touched) with a fixed 160x45 window. The test reads the pane with
`capture-pane -p` and types with `send-keys`, as a person would: it watches the demo
traffic move through the states, filters, freezes the list, opens an execution, reads
its event log and a backtrace, travels back in time on the diagram, looks at the
components, and quits with `q` (exit code 0, no traceback).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import time
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.console.e2e_helpers import (
    REPO_ROOT,
    STATES,
    VERSION_RE,
    Row,
    console_command,
    console_log,
    list_title,
    parse_counts,
    parse_events,
    parse_rows,
    require_executable,
    wait_for,
)

pytestmark = pytest.mark.slow

WIDTH, HEIGHT = 160, 45
SESSION = "obelisk-e2e"
#: The first start on a new data dir compiles the demo's components (about 10 s on an
#: idle 2-core machine; much more when other work shares it).
START_TIMEOUT = 90.0
#: Anything else the console is asked to show.
SCREEN_TIMEOUT = 10.0


class Tmux:
    """A private tmux server with one session running one command."""

    def __init__(self, tmux: str, socket: Path) -> None:
        self.tmux = tmux
        self.socket = socket
        self.last_screen = ""
        #: More to show when a wait fails (the console's log).
        self.context: Callable[[], str] = str

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [self.tmux, "-S", str(self.socket), *args],
            capture_output=True,
            text=True,
            timeout=15,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"tmux {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}"
            )
        return done.stdout

    def start(self, command: list[str], env: dict[str, str], exit_file: Path) -> None:
        """Run `command` in a new session. The server starts with `env`. The pane's shell
        writes the command's exit code to `exit_file` (tmux 3.3 was seen here to miss the
        SIGCHLD of a pane's process now and then, leaving it a zombie and the pane's exit
        status unknown; the shell reaps its child without depending on a signal). The pane
        stays after the command exits (remain-on-exit) so that its last screen can be read.
        """
        script = f"{shlex.join(command)}; echo $? > {shlex.quote(str(exit_file))}"
        self(
            "-f",
            os.devnull,
            "set-option",
            "-g",
            "remain-on-exit",
            "on",
            ";",
            "new-session",
            "-d",
            "-s",
            SESSION,
            "-x",
            str(WIDTH),
            "-y",
            str(HEIGHT),
            "-c",
            str(REPO_ROOT),
            script,
            env=env,
        )

    def capture(self) -> str:
        self.last_screen = self("capture-pane", "-p", "-t", SESSION)
        return self.last_screen

    def history(self) -> str:
        """Everything the pane showed, scrollback included (e.g. a whole traceback)."""
        return self("capture-pane", "-p", "-S", "-", "-t", SESSION)

    def keys(self, *keys: str) -> None:
        """tmux key names: "Enter", "Escape", "j", "/", "Space", …"""
        self("send-keys", "-t", SESSION, *keys)

    def type(self, text: str) -> None:
        self("send-keys", "-t", SESSION, "-l", text)

    def pane_pid(self) -> int:
        """The pane's shell: the leader of the process group the console runs in."""
        out = self("display-message", "-p", "-t", SESSION, "#{pane_pid}").strip()
        return int(out) if out.isdigit() else 0

    def wait_screen(self, what: str, check: object, timeout: float = SCREEN_TIMEOUT) -> str:
        """The first capture for which `check(screen)` is truthy."""
        assert callable(check)

        def probe() -> str | None:
            screen = self.capture()
            return screen if check(screen) else None

        return wait_for(probe, timeout, what, describe=self.describe)

    def describe(self) -> str:
        return f"--- the pane, as last captured ---\n{self.last_screen}\n{self.context()}"

    def kill(self) -> None:
        """Stop the tmux server, and whatever is left of the pane's process group."""
        try:
            group = self.pane_pid()
        except (AssertionError, subprocess.TimeoutExpired):
            group = 0
        subprocess.run(
            [self.tmux, "-S", str(self.socket), "kill-server"],
            capture_output=True,
            timeout=15,
            check=False,
        )
        if group:  # the server's SIGHUP should have ended them; make sure
            deadline = time.monotonic() + 10
            while _group_alive(group) and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    path = require_executable("/usr/bin/tmux", "tmux", "tmux")
    # A short socket path: unix socket paths are limited to ~100 bytes.
    socket_dir = Path("/tmp") / f"obelisk-e2e-{os.getpid()}-{time.monotonic_ns()}"
    socket_dir.mkdir(mode=0o700)
    session = Tmux(path, socket_dir / "tmux.sock")
    try:
        yield session
    finally:
        session.kill()
        for child in socket_dir.iterdir():
            child.unlink()
        socket_dir.rmdir()


def _deployment_names() -> list[str]:
    """What the components screen must list: each component's name (a stub's FFQN)."""
    with (REPO_ROOT / "demo" / "deployment.toml").open("rb") as f:
        doc = tomllib.load(f)
    return [entry.get("name") or entry["ffqn"] for entries in doc.values() for entry in entries]


def _pick(rows: list[Row]) -> tuple[int, Row]:
    """A finished row to open: a top-level JS workflow (it has backtraces) if one shows."""

    def rank(item: tuple[int, Row]) -> tuple[int, int]:
        _, row = item
        workflow = row.ffqn.startswith("myapp:demo/workflow.")
        fits = row.events is not None and row.events <= 25  # the whole log fits the tab
        return (
            0 if workflow and row.top_level and fits else 1 if row.top_level and fits else 2,
            item[0],
        )

    candidates = [(i, r) for i, r in enumerate(rows) if r.finished and r.events]
    assert candidates, f"no finished row in the (filtered) list: {rows}"
    return min(candidates, key=rank)


def test_console_in_tmux(tmux: Tmux, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # (COLUMNS and LINES: pytest-xdist sets them to 80 and 24, which the console would
    # take over the pane's size.)
    for var in ("TMUX", "TMUX_PANE", "OBELISK_API_TOKEN", "TEXTUAL", "COLUMNS", "LINES"):
        env.pop(var, None)
    if not any("utf" in env.get(v, "").lower() for v in ("LC_ALL", "LC_CTYPE", "LANG")):
        env["LANG"] = "C.UTF-8"  # the console draws with box and block characters
    exit_file = tmp_path / "exit-code"
    tmux.start([*console_command(), "--demo", "--data-dir", str(data_dir)], env, exit_file)

    tmux.context = lambda: console_log(data_dir)
    _run_session(tmux)

    # -- q: the process ends, exit code 0, nothing on the terminal it leaves -------------
    def exit_code() -> str | None:
        if exit_file.exists():
            return exit_file.read_text().strip()  # "" while the shell is writing it
        tmux.capture()  # for the failure message: what the console shows meanwhile
        return None

    code = wait_for(
        exit_code, SCREEN_TIMEOUT, "the console to exit after q", describe=tmux.describe
    )
    assert code == "0", (
        f"obelisk-tui exited with {code} after q\n--- the pane, scrollback included ---\n"
        f"{tmux.history()}\n{console_log(data_dir)}"
    )
    after = tmux.capture()
    assert "Traceback" not in after and "error" not in after.lower(), after
    log = (data_dir / "console.log").read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in log and " ERROR " not in log, console_log(data_dir, 200)


def _run_session(tmux: Tmux) -> None:
    # -- the executions screen, with the header's counts and the list --------------------
    screen = tmux.wait_screen(
        "the executions screen (counts, list title, column header)",
        lambda s: parse_counts(s) and list_title(s) and parse_rows(s),
        START_TIMEOUT,
    )
    title = list_title(screen)
    assert title is not None and title["order"] == "newest first", screen
    assert "Obelisk" in screen.splitlines()[0], screen  # the app's header
    footer = screen.rstrip().splitlines()[-1]
    for hint in ("/ Filter", "q Quit", "C Components"):
        assert hint in footer, footer

    # -- the demo traffic moves: new executions, state changes, several states ----------
    seen_states: set[str] = set()
    unfinished_ids: set[str] = set()
    totals: list[int] = []
    moved: list[str] = []

    def traffic_moves(s: str) -> bool:
        counts = parse_counts(s)
        rows = parse_rows(s)
        if counts is None or not rows:
            return False
        if counts["total"] != sum(counts[k] for k in STATES):
            return False  # the header does not add up (or was captured mid-frame)
        totals.append(counts["total"])
        seen_states.update(k for k in STATES if counts[k] > 0)
        for row in rows:
            if row.finished and row.shown_id in unfinished_ids:
                moved.append(row.shown_id)
            elif not row.finished:
                unfinished_ids.add(row.shown_id)
        return (
            len(set(totals)) >= 3
            and totals[-1] > totals[0]
            and len(seen_states) >= 3
            and "finished" in seen_states
            and bool(moved)
        )

    tmux.wait_screen(
        "executions to appear and move (growing total, >= 3 states, a row seen unfinished "
        "then finished)",
        traffic_moves,
        30.0,
    )

    # -- / filter: state:finished --------------------------------------------------------
    tmux.keys("/")
    tmux.wait_screen(
        "the filter box", lambda s: "filter: state:locked,paused" in s and "(enter: apply" in s
    )
    tmux.type("state:finished")
    tmux.wait_screen("the typed filter", lambda s: "state:finished" in s)
    tmux.keys("Enter")

    def filtered(s: str) -> bool:
        title, counts, rows = list_title(s), parse_counts(s), parse_rows(s)
        if (
            title is None
            or title["total"] is None
            or "filter: state:finished" not in (title["rest"] or "")
        ):
            return False  # not applied yet (the total shows once the filtered list is in)
        # All rows finished, and the list's total is the header's finished count.
        return (
            bool(rows)
            and all(r.finished for r in rows)
            and counts is not None
            and (int(title["total"].replace(",", "")) == counts["finished"])
        )

    tmux.wait_screen("the list filtered to finished executions", filtered)
    for _ in range(5):  # and it stays filtered while the list refreshes live
        time.sleep(0.2)
        rows = parse_rows(tmux.capture())
        assert rows and all(r.finished for r in rows), (
            f"filter state:finished shows {rows}\n{tmux.describe()}"
        )

    # -- space: freeze the live refresh, so that the rows stay where they are ------------
    tmux.keys("Space")
    tmux.wait_screen("the FROZEN mark", lambda s: "FROZEN" in s)
    previous: list[str] = []

    def stable(s: str) -> bool:
        body = [line for line in s.splitlines() if "E_" in line]
        same = body == previous and bool(body)
        previous[:] = body
        return same

    time.sleep(0.3)  # the forced refresh that the freeze asks for is in flight
    screen = tmux.wait_screen("the frozen list to stay still", stable)
    rows = parse_rows(screen)
    index, chosen = _pick(rows)
    assert chosen.events is not None

    # -- enter: the execution's detail, State tab ----------------------------------------
    for _ in range(index):
        tmux.keys("j")
    tmux.keys("Enter")
    screen = tmux.wait_screen(
        f"the detail of row {index} ({chosen.shown_id})",
        # The title gets its ffqn with the first status the detail loads: wait for both.
        lambda s: (
            "1 State" in s
            and "2 Events" in s
            and "events " in s
            and VERSION_RE.search(s)
            and len(s.splitlines()) > 2
            and chosen.ffqn in s.splitlines()[2]
            and "state now: " in s
        ),
    )
    detail_title = screen.splitlines()[2]
    full_id = next((w for w in detail_title.split() if w.startswith("E_")), "")  # after the state
    assert chosen.is_shown_id_of(full_id), f"opened {full_id}, wanted the row {chosen}\n{screen}"
    assert chosen.ffqn in detail_title, screen
    for box in ("PendingAt", "Locked", "BlockedByJoinSet", "Finished"):
        assert box in screen, f"the state diagram lacks {box}\n{screen}"
    metadata = {
        line.split()[0]: line.split()[1:]
        for line in screen.splitlines()
        if line.strip() and line.startswith(" ") and len(line.split()) > 1
    }
    assert metadata.get("execution") == [full_id], screen
    assert metadata.get("events") == [str(chosen.events)], screen
    version = VERSION_RE.search(screen)
    assert version is not None and version["mode"] == "live", screen
    last = chosen.events - 1
    assert (int(version["version"]), int(version["last"])) == (last, last), screen
    assert f"state now: {chosen.state.split()[0]}" in screen, screen

    # -- 2: the Events tab, the whole log ------------------------------------------------
    tmux.keys("2")
    screen = tmux.wait_screen(
        "the Events tab with the whole log, the last event's (no) backtrace beside it",
        lambda s: (
            "TIME (UTC)" in s
            and len(parse_events(s)) >= min(chosen.events, 20)
            and "No backtrace for this event" in s
        ),
    )
    events = parse_events(screen)
    versions = [e.version for e in events]
    assert versions == list(range(versions[0], last + 1)), f"versions {versions}\n{screen}"
    assert events[-1].event == "finished", screen
    if versions[0] == 0:
        assert events[0].event == "created" and chosen.ffqn in events[0].summary, screen

    # A JS workflow's history has backtraces (◆): select one, see the source line.
    with_backtrace = [e for e in events if e.backtrace]
    if chosen.ffqn.startswith("myapp:demo/workflow."):
        assert with_backtrace, f"a JS workflow without any ◆ event\n{screen}"
    if with_backtrace:
        target = with_backtrace[-1]
        for _ in range(last - target.version):
            tmux.keys("k")
        backtrace_re = re.compile(
            rf"^\s*(?P<file>\S+\.js):(?P<line>\d+):\d+\b.*\bversion {target.version}\s*$", re.M
        )

        def excerpt_shown(s: str) -> bool:
            # The frame, then the excerpt with the submitting line numbered and marked
            # (❱). Both in one screen: under load a capture can fall between the paint
            # of the new text and the relayout that gives the panel its height.
            where = backtrace_re.search(s)
            return where is not None and bool(re.search(rf"^\s*❱\s*{where['line']}\s+\S", s, re.M))

        tmux.wait_screen(
            f"the backtrace of version {target.version} (file.js:line:column … version N) "
            "and its source excerpt, the line marked ❱",
            excerpt_shown,
        )
        # Time travel: the State tab shows the diagram at that version.
        tmux.keys("1")
        screen = tmux.wait_screen(
            f"the State tab at version {target.version}",
            lambda s: (m := VERSION_RE.search(s)) is not None and m["mode"] == "time travel",
        )
        version = VERSION_RE.search(screen)
        assert version is not None and int(version["version"]) == target.version, screen

    # -- escape: back to the (still filtered, still frozen) list -------------------------
    tmux.keys("Escape")
    screen = tmux.wait_screen(
        "the executions list again",
        lambda s: "1 State" not in s and parse_rows(s) and list_title(s),
    )
    title = list_title(screen)
    assert title is not None and "filter: state:finished" in (title["rest"] or ""), screen
    assert "FROZEN" in screen, screen

    # -- escape clears the filter; space resumes the live refresh ------------------------
    tmux.keys("Escape")

    def unfiltered(s: str) -> bool:
        title, counts = list_title(s), parse_counts(s)
        return (
            title is not None
            and title["total"] is not None
            and counts is not None
            and "filter" not in (title["rest"] or "")
            and int(title["total"].replace(",", "")) == counts["total"]
        )

    tmux.wait_screen("the filter cleared (the list's total is every execution)", unfiltered)
    frozen_counts = parse_counts(tmux.capture())
    tmux.keys("Space")
    tmux.wait_screen(
        "the live refresh resumed (counts move again)",
        lambda s: "FROZEN" not in s and parse_counts(s) not in (None, frozen_counts),
    )

    # -- C: the components, as deployed --------------------------------------------------
    tmux.keys("C")
    names = _deployment_names()
    screen = tmux.wait_screen(
        "the components screen",
        lambda s: "exports" in s and "digest" in s and all(n in s for n in names),
    )
    for kind in ("activity_wasm", "activity_js", "activity_stub", "workflow_js", "workflow_wasm"):
        assert kind in screen, f"no {kind} component shown\n{screen}"
    assert "started " in screen, f"the reload status (started HH:MM:SS) is missing\n{screen}"
    assert "exported function" in screen and "myapp:demo/" in screen, screen
    tmux.keys("Escape")
    tmux.wait_screen(
        "the executions list after the components", lambda s: parse_rows(s) and list_title(s)
    )

    # -- q ---------------------------------------------------------------------------------
    tmux.keys("q")
