"""Shared parts of the console's end-to-end tests (`test_e2e_tmux.py`, `test_e2e_browser.py`).

Both start the real `obelisk-tui` as a separate process and read what it shows: a tmux
pane (`capture-pane`) or a headless Chromium page (the xterm.js buffer over the DevTools
protocol). The only way to know the other process got somewhere is to look at its screen,
so the tests poll with a short interval and a generous deadline (`wait_for`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

T = TypeVar("T")


def in_ci() -> bool:
    """`.ci/run` exports CI=1 (and the CI runner sets CI=true)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_executable(path: str, what: str, package: str) -> str:
    """The executable at `path` (or on PATH). Missing: a failure in CI (where `.ci/run`
    installs it), a loud skip elsewhere."""
    found = path if os.access(path, os.X_OK) else shutil.which(Path(path).name)
    if found:
        return found
    message = (
        f"{what} is not installed ({path} missing): this end-to-end test cannot run. "
        f"Install it with `apt-get install -y {package}` (bash .ci/run does)."
    )
    if in_ci():
        pytest.fail(f"CI is set, so this is a failure: {message}", pytrace=False)
    with contextlib.suppress(Warning):  # (under -W error: still a skip, not an error)
        warnings.warn(message, stacklevel=2)
    pytest.skip(f"!!! NOT RUN: {message}")


def console_command() -> list[str]:
    """`obelisk-tui` of this checkout: the module run by this interpreter (the venv's) in
    REPO_ROOT, so that it is this checkout's code even when the venv's `obelisk-tui`
    script was installed (editable) from another one."""
    return [sys.executable, "-m", "obelisk_tui"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(
    probe: Callable[[], T | None],
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
    describe: Callable[[], str] | None = None,
) -> T:
    """Call `probe` until it returns something truthy (returned); fail after `timeout` s,
    with `describe()` (e.g. the screen as it last was) in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")
        time.sleep(interval)


async def async_wait_for(
    probe: Callable[[], Awaitable[T | None]],
    timeout: float,
    what: str,
    *,
    interval: float = 0.05,
    describe: Callable[[], Awaitable[str]] | None = None,
) -> T:
    """`wait_for` for an async probe."""
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{await describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{detail}")
        await asyncio.sleep(interval)


def console_log(data_dir: Path, lines: int = 40) -> str:
    """The end of the console's engine log (`DATA_DIR/console.log`), for failure messages."""
    path = data_dir / "console.log"
    if not path.exists():
        return f"({path} does not exist)"
    tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return f"--- last lines of {path} ---\n" + "\n".join(tail)


class DrainedProcess:
    """A subprocess whose stdout+stderr go to a file (drained by a thread, so the pipe
    never fills), with a way to wait for a line."""

    def __init__(
        self, args: list[str], log_path: Path, *, env: dict[str, str] | None = None
    ) -> None:
        self.args = args
        self.log_path = log_path
        self._log: IO[str] = log_path.open("a", encoding="utf-8", buffering=1)
        self._log.write(f"$ {' '.join(args)}\n")
        self._lines: list[str] = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,  # its own process group: killed as one in `kill`
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_line(self, needle: str, timeout: float) -> str:
        """The first output line containing `needle`; fails when the process exits first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self._lines:
                    if needle in line:
                        return line
                if self.proc.poll() is not None and not self._reader.is_alive():
                    raise AssertionError(
                        f"{self.args[0]} exited with {self.proc.returncode} before printing "
                        f"{needle!r}:\n{self.output()}"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no line with {needle!r} after {timeout:g} s:\n{self.output()}"
                    )
                self._changed.wait(min(left, 0.2))

    def output(self) -> str:
        with self._changed:
            return "".join(self._lines)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then wait for the exit code (None: it had to be killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to what is left of its process group (it and what it started), reap."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(10)
        finally:
            self._reader.join(5)
            if not self._log.closed:
                self._log.close()


# ---------------------------------------------------------------------------------------
# Reading the console's screens from plain text (a tmux capture or the xterm.js buffer)
# ---------------------------------------------------------------------------------------

#: The header of the executions screen: total, then executions per state.
COUNTS_RE = re.compile(
    r"(?P<total>[\d,]+) executions\s+pending (?P<pending_at>[\d,]+)\s+locked (?P<locked>[\d,]+)"
    r"\s+blocked (?P<blocked_by_join_set>[\d,]+)\s+paused (?P<paused>[\d,]+)"
    r"\s+cancelling (?P<cancelling>[\d,]+)"
    r"\s+ok (?P<ok>[\d,]+)\s+err (?P<err>[\d,]+)\s+failed (?P<failed>[\d,]+)"
)
#: The title above the list: "146 executions · newest first · filter: state:finished".
LIST_TITLE_RE = re.compile(
    r"^\s*(?:(?P<total>[\d,]+) )?executions · (?P<order>[^·\n]+?)(?: · (?P<rest>.*?))?\s*$", re.M
)
#: One row of the event log: version, time, backtrace marker, event name, summary.
EVENT_ROW_RE = re.compile(
    r"^\s*(?P<version>\d+)\s+\d\d:\d\d:\d\d\.\d{3}\s+(?P<bt>◆?)\s*(?P<event>[a-z_]+)\b(?P<summary>.*)$"
)
#: "live   at version 3 of 7" / "time travel   at version 1 of 7" on the State tab.
VERSION_RE = re.compile(
    r"(?P<mode>live|time travel)\s+at version (?P<version>\d+) of (?P<last>\d+)"
)

STATES = ("pending_at", "locked", "blocked_by_join_set", "paused", "cancelling", "finished")


def parse_counts(screen: str) -> dict[str, int] | None:
    """{"total": …, "pending_at": …, …, "finished": …, "ok": …, "err": …, "failed": …} from
    the executions screen's header (which splits the finished by result), or None."""
    match = COUNTS_RE.search(screen)
    if match is None:
        return None
    counts = {k: int(v.replace(",", "")) for k, v in match.groupdict().items()}
    counts["finished"] = counts["ok"] + counts["err"] + counts["failed"]
    return counts


def list_title(screen: str) -> re.Match[str] | None:
    return LIST_TITLE_RE.search(screen)


@dataclass(frozen=True)
class Row:
    """One row of the executions list, as shown (the id may be shortened with "…")."""

    shown_id: str
    ffqn: str
    state: str
    events: int | None

    @property
    def finished(self) -> bool:
        return self.state.startswith(("finished", "failed"))

    @property
    def top_level(self) -> bool:
        return "…" not in self.shown_id and "." not in self.shown_id

    def is_shown_id_of(self, execution_id: str) -> bool:
        if "…" not in self.shown_id:
            return self.shown_id == execution_id
        head, _, tail = self.shown_id.partition("…")
        return execution_id.startswith(head) and execution_id.endswith(tail)


def parse_rows(screen: str) -> list[Row]:
    """The visible rows of the executions list, cut at the header's column positions."""
    lines = screen.splitlines()
    for i, line in enumerate(lines):
        if "EXECUTION" in line and "FFQN" in line and "STATE" in line:
            header, body = line, lines[i + 1 :]
            break
    else:
        return []
    cols = {
        name: header.index(name)
        for name in ("EXECUTION", "FFQN", "STATE", "WHEN", "EV", "CH")
        if name in header
    }
    rows: list[Row] = []
    for line in body:
        shown_id = line[cols["EXECUTION"] : cols["FFQN"]].strip()
        if not shown_id.startswith("E_"):
            continue
        ev_text = line[cols["EV"] : cols["CH"]].strip() if "EV" in cols and "CH" in cols else ""
        rows.append(
            Row(
                shown_id=shown_id,
                ffqn=line[cols["FFQN"] : cols["STATE"]].strip(),
                state=line[cols["STATE"] : cols.get("WHEN", cols["STATE"] + 20)].strip(),
                events=int(ev_text) if ev_text.isdigit() else None,
            )
        )
    return rows


@dataclass(frozen=True)
class EventRow:
    version: int
    event: str
    backtrace: bool
    summary: str


def parse_events(screen: str) -> list[EventRow]:
    """The visible rows of the Events tab."""
    out: list[EventRow] = []
    for line in screen.splitlines():
        match = EVENT_ROW_RE.match(line)
        if match:
            out.append(
                EventRow(
                    int(match["version"]),
                    match["event"],
                    bool(match["bt"]),
                    match["summary"].strip(),
                )
            )
    return out
