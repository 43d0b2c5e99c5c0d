"""A damaged SQLite file: `obelisk server run` and the console's embedded engine exit
at once with one line naming the file (no traceback, no hang), and leave it as it was.
Real processes on real files."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from engine.engine import Engine
from tests.server.test_api import APPROVE, write_deployment
from tests.server.test_cli import _env, _obelisk

pytestmark = pytest.mark.slow

PAGE = 4096


async def _make_database(directory: Path) -> Path:
    """A deployment and a data dir whose database has a few hundred pages of work."""
    deployment = write_deployment(directory)
    engine = await Engine.start(deployment, directory / "data")
    try:
        for _ in range(200):
            await engine.submit(APPROVE, ["x" * 200])
    finally:
        await engine.stop()
    return directory / "data" / "obelisk.sqlite"


def _damage(db: Path, how: str) -> None:
    data = bytearray(db.read_bytes())
    if how == "pages past the header":
        # Every page after the first: the schema (page 1) reads, the tables do not.
        for offset in range(PAGE, len(data), PAGE):
            data[offset : offset + 64] = os.urandom(64)
    elif how == "a page only the start reads":
        # The root of an index that no table probe reads, but the start does (workflows
        # pinned to an old version): found after executors and timers started.
        with sqlite3.connect(db) as conn:
            (root,) = conn.execute(
                "SELECT rootpage FROM sqlite_master WHERE name = 'executions_pinned'"
            ).fetchone()
        conn.close()
        data[(root - 1) * PAGE : root * PAGE] = os.urandom(PAGE)
    elif how == "truncated":
        del data[len(data) // 3 :]
    elif how == "not a database":
        data = bytearray(b"these are not the bytes you are looking for\n" * 100)
    db.write_bytes(bytes(data))


def _check_refused(proc: subprocess.CompletedProcess[str], db: Path) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    # The last line (the console's screen, given back, precedes it on the same stream).
    last = proc.stderr[proc.stderr.rfind("error: ") :].strip()
    assert last.startswith("error: ") and "\n" not in last, proc.stderr
    assert f"the database {db} is damaged" in last, last
    assert f"sqlite3 {db} 'PRAGMA integrity_check'" in last, last


@pytest.mark.parametrize(
    "how",
    ["pages past the header", "a page only the start reads", "truncated", "not a database"],
)
def test_server_run_refuses_a_damaged_database(tmp_path: Path, how: str) -> None:
    db = asyncio.run(_make_database(tmp_path))
    _damage(db, how)
    before, stat = db.read_bytes(), db.stat()
    proc = subprocess.run(
        [*_obelisk(), "server", "run", "--deployment", str(tmp_path / "deployment.toml"),
         "--data-dir", str(tmp_path / "data"), "--api-listen", "127.0.0.1:0"],
        capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=30,
    )  # fmt: skip
    _check_refused(proc, db)
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "API listening" not in proc.stdout
    assert db.read_bytes() == before, "the damaged file was changed"
    assert db.stat().st_mtime_ns == stat.st_mtime_ns


def test_console_refuses_a_damaged_database(tmp_path: Path) -> None:
    db = asyncio.run(_make_database(tmp_path))
    _damage(db, "pages past the header")
    before = db.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "obelisk_tui", "--deployment", str(tmp_path / "deployment.toml"),
         "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=30,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    _check_refused(proc, db)  # its last line, after the screen is given back
    assert db.read_bytes() == before
