"""A full disk under the database: writes answer 503 naming it, the log says so once per
interval (not once per failed write), and everything acknowledged survives.

The disk is real: a 2 MiB tmpfs mounted for the test (tests run as root; skipped where
mounting is not permitted), filled up with a file, then freed by deleting it.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine.engine import Engine
from engine.server.api import make_app
from engine.storage import disk_full
from engine.storage.contract import StorageError, StorageFull
from engine.storage.disk_full import Throttle, is_disk_full, write_error
from tests.server.test_api import APPROVE, AUTH, TOKEN, write_deployment


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except OSError as e:
        pytest.skip(f"cannot mount a tmpfs: {e}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False, timeout=30)


def fill(directory: Path) -> Path:
    """A file that takes every free byte of `directory`'s filesystem."""
    path = directory / "filler"
    chunk = b"\0" * 65536
    with path.open("wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(chunk)
    with path.open("ab", buffering=0) as f, contextlib.suppress(OSError):
        while True:  # the last, partial block
            f.write(b"\0" * 512)
    return path


def disk_full_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "disk is full" in r.getMessage()]


async def test_a_full_disk_is_503_logged_once_and_loses_nothing(
    tmp_path: Path,
    small_disk: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An hour: however slow the machine, the failures below fall into one interval.
    monkeypatch.setattr(disk_full, "disk_full_log", Throttle(interval=3600))
    caplog.set_level(logging.ERROR)
    deployment = write_deployment(tmp_path)
    data = small_disk / "data"
    big = "x" * 200_000  # more than the WAL holds already: every commit needs new space

    engine = await Engine.start(deployment, data)
    acknowledged: list[str] = []
    try:
        async with TestClient(TestServer(make_app(engine, TOKEN)), headers=AUTH) as client:
            for _ in range(3):
                r = await client.post("/v1/executions", json={"ffqn": APPROVE, "params": ["a"]})
                assert r.status == 201, await r.text()
                acknowledged.append((await r.json())["execution_id"])

            filler = fill(small_disk)
            refused = 0
            for _ in range(20):
                r = await client.post("/v1/executions", json={"ffqn": APPROVE, "params": [big]})
                body = await r.json()
                assert r.status == 503, body
                assert body["error"].startswith("the database's disk is full: "), body
                assert "Traceback" not in body["error"]
                assert r.headers["Retry-After"] == "10"
                refused += 1
            assert refused == 20
            assert len(disk_full_records(caplog)) == 1, [
                r.getMessage() for r in disk_full_records(caplog)
            ]
            # Reads still work, and show every acknowledged execution.
            for eid in acknowledged:
                r = await client.get(f"/v1/executions/{eid}/status")
                assert r.status == 200, await r.text()

            filler.unlink()  # space again: writes work without a restart
            r = await client.post("/v1/executions", json={"ffqn": APPROVE, "params": [big]})
            assert r.status == 201, await r.text()
            acknowledged.append((await r.json())["execution_id"])
    finally:
        await engine.stop()

    engine = await Engine.start(deployment, data)
    try:
        async with TestClient(TestServer(make_app(engine, TOKEN)), headers=AUTH) as client:
            r = await client.get("/v1/executions", params={"limit": "1000"})
            listed = {e["execution_id"] for e in await r.json()}
            assert listed == set(acknowledged)
    finally:
        await engine.stop()


def test_sqlite_full_from_max_page_count_is_storage_full(tmp_path: Path) -> None:
    """SQLITE_FULL also comes from the database's own size limit: the same error."""
    conn = sqlite3.connect(tmp_path / "db.sqlite")
    conn.execute("CREATE TABLE t (x BLOB)")
    conn.commit()
    (pages,) = conn.execute("PRAGMA page_count").fetchone()
    conn.execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(sqlite3.OperationalError) as raised:
        for _ in range(100):
            conn.execute("INSERT INTO t VALUES (zeroblob(4096))")
    conn.close()
    assert is_disk_full(raised.value)
    error = write_error(raised.value)
    assert isinstance(error, StorageFull)
    assert str(error) == "the database's disk is full: database or disk is full"


def test_other_errors_are_not_storage_full() -> None:
    error = write_error(sqlite3.OperationalError("database is locked"))
    assert type(error) is StorageError
    assert str(error) == "database write failed: database is locked"
    assert isinstance(write_error(OSError(28, "No space left on device")), StorageFull)
    assert not is_disk_full(OSError(5, "Input/output error"))


def test_throttle_logs_once_per_interval_with_the_count_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    throttle = Throttle(interval=10, clock=lambda: now[0])
    logger = logging.getLogger("obelisk.test_disk_full")
    caplog.set_level(logging.ERROR)
    logged = []
    for t in range(25):  # one report a second for 25 s
        now[0] = 100.0 + t
        logged.append(throttle.report(logger, "the database's disk is full"))
    assert [t for t, yes in enumerate(logged) if yes] == [0, 10, 20]
    assert [r.getMessage() for r in caplog.records] == [
        "the database's disk is full",
        "the database's disk is full (9 more not logged in the last 10 s)",
        "the database's disk is full (9 more not logged in the last 10 s)",
    ]
