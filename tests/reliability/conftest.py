"""Harness for the reliability tests: `obelisk server run` as real processes on one data dir.

`ServerProcess` starts the console script, waits (on its stdout, no fixed sleeps) for the
"API listening on …" line and keeps draining its output into a file under the test's tmp
dir (shown when a test fails). The database is observed read-only while servers run
(`count_states`) and checked through `SqliteStorage` once they are gone (`check_logs`).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from engine.core import events as ev
from engine.core.ids import ExecutionId
from engine.core.state import replay
from engine.storage.sqlite import SqliteStorage

REPO_ROOT = Path(__file__).resolve().parents[2]
OBELISK = Path(sys.executable).parent / "obelisk"
DB_NAME = "obelisk.sqlite"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(
    condition: Callable[[], bool], timeout: float, what: str, interval: float = 0.02
) -> None:
    """Poll `condition` (cheap: a read-only query) until it holds; fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


class ServerProcess:
    """One `obelisk server run` process; `kill()` is SIGKILL, `stop()` SIGTERM + wait."""

    def __init__(
        self,
        deployment: Path,
        data_dir: Path,
        log_path: Path,
        *,
        extra_args: list[str] | None = None,
        prefix: list[str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """`prefix` runs the server under another command (`ip netns exec NS`); `host` is
        the address its API listens on and is reached at."""
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("a", encoding="utf-8", buffering=1)
        self._listening = threading.Event()
        self._ready = False
        args = [
            str(OBELISK),
            "server",
            "run",
            "--deployment",
            str(deployment),
            "--data-dir",
            str(data_dir),
            "--api-listen",
            f"{host}:{self.port}",
            "--allow-unauthenticated-api",
            *(extra_args or []),
        ]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("OBELISK_API_TOKEN", None)
        self._log.write(f"$ {' '.join(args)}\n")
        self.proc = subprocess.Popen(
            [*(prefix or []), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            if "API listening on" in line:
                self._ready = True
                self._listening.set()
        self._listening.set()  # EOF: the process is gone; wait_ready reports it

    def wait_ready(self, timeout: float = 30.0) -> ServerProcess:
        if not self._listening.wait(timeout):
            self.kill()
            raise AssertionError(f"server did not start in {timeout:g} s; see {self.log_path}")
        if not self._ready:
            self.proc.wait(10)
            self._reader.join(5)
            raise AssertionError(
                f"server exited with {self.proc.returncode} at start:\n{self.output()}"
            )
        return self

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def error_lines(self) -> list[str]:
        """Lines logged at ERROR or CRITICAL, and tracebacks."""
        marks = (" ERROR ", " CRITICAL ", "Traceback (most recent call last)")
        return [line for line in self.output().splitlines() if any(m in line for m in marks)]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self, timeout: float = 30.0) -> int:
        """Graceful shutdown (SIGTERM); returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"server did not stop in {timeout:g} s") from None
        self._close()
        return code

    def _close(self) -> None:
        self._reader.join(10)
        self._log.close()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    """Every ServerProcess a test appends here is killed at teardown if still running."""
    started: list[ServerProcess] = []
    yield started
    for server in started:
        if server.alive:
            server.kill()


# ---------------------------------------------------------------------------------------
# Talking to a server
# ---------------------------------------------------------------------------------------


def submit(url: str, execution_id: str, ffqn: str, params: list[Any]) -> None:
    """POST one execution with a client-chosen id (so a retry is idempotent)."""
    body = json.dumps({"ffqn": ffqn, "params": params, "execution_id": execution_id}).encode()
    request = urllib.request.Request(
        url + "/v1/executions",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.loads(response.read())
    assert response.status == 201, answer
    assert answer["execution_id"] == execution_id


@dataclass
class Submission:
    execution_id: str
    ffqn: str
    params: list[Any]
    expected: Any  # the `ok` value


@dataclass
class SubmitOutcome:
    acknowledged: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)


def submit_all(
    targets: list[tuple[str, Submission]],
    threads: int = 8,
    stop: threading.Event | None = None,
) -> SubmitOutcome:
    """Submit each (url, submission) on a small thread pool. Submissions whose request
    fails (the server was killed under them) are recorded, not raised."""
    outcome = SubmitOutcome()
    lock = threading.Lock()

    def one(item: tuple[str, Submission]) -> None:
        url, sub = item
        if stop is not None and stop.is_set():
            with lock:
                outcome.failed.add(sub.execution_id)
            return
        try:
            submit(url, sub.execution_id, sub.ffqn, sub.params)
        except urllib.error.HTTPError:
            raise  # an answer from the server: a real failure
        except (urllib.error.URLError, OSError, http.client.HTTPException):
            with lock:
                outcome.failed.add(sub.execution_id)
        else:
            with lock:
                outcome.acknowledged.add(sub.execution_id)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, targets))
    return outcome


def new_ids(n: int) -> list[str]:
    return [str(ExecutionId.generate()) for _ in range(n)]


# ---------------------------------------------------------------------------------------
# The database
# ---------------------------------------------------------------------------------------


def count_states(db: Path) -> Counter[str]:
    """Executions per state, read-only, from outside the servers (a fresh connection each
    time, so this process never holds the file between polls)."""
    if not db.exists():
        return Counter()
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        return Counter(dict(conn.execute("SELECT state, count(*) FROM executions GROUP BY state")))
    except sqlite3.OperationalError:  # the schema is not there yet
        return Counter()
    finally:
        conn.close()


@dataclass
class ExecutionLog:
    execution_id: str
    events: list[ev.StoredEvent]
    responses: list[ev.StoredResponse]

    def of_type(self, cls: type[Any]) -> list[Any]:
        return [e.event for e in self.events if isinstance(e.event, cls)]


async def _load_logs(db: Path, ids: Iterable[str]) -> dict[str, ExecutionLog]:
    storage = await SqliteStorage.open(db)
    try:
        logs: dict[str, ExecutionLog] = {}
        for eid in ids:
            events = await storage.get_events(eid)
            responses = await storage.get_responses(eid)
            logs[eid] = ExecutionLog(eid, events, responses)
        return logs
    finally:
        await storage.close()


def load_logs(db: Path, ids: Iterable[str]) -> dict[str, ExecutionLog]:
    """Every execution's log, through the engine's own storage (servers must be gone)."""
    return asyncio.run(_load_logs(db, list(ids)))


def _ids(db: Path, sql: str, *args: Any) -> set[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return {row[0] for row in conn.execute(sql, args)}
    finally:
        conn.close()


def all_execution_ids(db: Path) -> set[str]:
    return _ids(db, "SELECT execution_id FROM executions")


def ids_in_state(db: Path, state: str) -> set[str]:
    return _ids(db, "SELECT execution_id FROM executions WHERE state = ?", state)


def check_log(log: ExecutionLog, expected: Any) -> None:
    """One execution: finished once with `ok(expected)`, versions 0..n-1, a legal log."""
    eid = log.execution_id
    assert log.events, f"{eid}: no events"
    versions = [e.version for e in log.events]
    assert versions == list(range(len(versions))), f"{eid}: versions {versions}"
    finished = log.of_type(ev.Finished)
    assert len(finished) == 1, f"{eid}: {len(finished)} finished events"
    assert isinstance(log.events[-1].event, ev.Finished), f"{eid}: finished is not last"
    assert finished[0].result == ev.ResultOk(expected), f"{eid}: {finished[0].result!r}"
    items: list[tuple[Any, Any]] = [(e.created_at, e.event) for e in log.events]
    summary = replay(items)  # raises IllegalAppend on an illegal sequence
    assert summary.next_version == len(log.events)
    assert summary.result == ev.ResultOk(expected)
    assert not log.responses, f"{eid}: unexpected responses"


def shape(log: ExecutionLog) -> str:
    """The event types of a log, e.g. `created locked finished`."""
    return " ".join(e.event.__struct_config__.tag for e in log.events)  # type: ignore[attr-defined]


def describe(log: ExecutionLog) -> str:
    return ", ".join(
        f"{e.version}:{e.event.__struct_config__.tag}"  # type: ignore[attr-defined]
        for e in log.events
    )
