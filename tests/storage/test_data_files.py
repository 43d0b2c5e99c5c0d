"""The files of a data dir are their owner's only, whatever the umask; existing ones
keep their modes. The cheap check at open tells a damaged database from a good one."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.engine import Engine
from engine.storage.data_files import DamagedDatabase, is_damage, probe
from engine.storage.sqlite import SqliteStorage
from tests.server.test_api import APPROVE, write_deployment


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
        for p in [root, *root.rglob("*")]
        if p.parent.name != "cache"  # compiled components: inside the private cache dir
    }


@pytest.mark.usefixtures("umask_022")
async def test_a_new_data_dir_is_private(tmp_path: Path) -> None:
    data = tmp_path / "new" / "data"
    engine = await Engine.start(write_deployment(tmp_path), data)
    try:
        await engine.submit(APPROVE, ["x"])  # the WAL and the shared memory file exist
        modes = _modes(data)
    finally:
        await engine.stop()
    for name in ["obelisk.sqlite", "obelisk.sqlite-wal", "obelisk.sqlite-shm",
                 "obelisk.sqlite-write-lock", "obelisk.sqlite-peers"]:  # fmt: skip
        assert name in modes, sorted(modes)
    wrong = {
        name: oct(mode)
        for name, mode in modes.items()
        if mode != (0o700 if (data / name).is_dir() else 0o600)
    }
    assert wrong == {}


@pytest.mark.usefixtures("umask_022")
async def test_a_new_shard_is_private_and_existing_files_keep_their_modes(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "obelisk.sqlite").touch(mode=0o640)
    storage = await SqliteStorage.open(data / "obelisk.sqlite")
    shard = await SqliteStorage.open(data / "obelisk-shard1.sqlite")
    await storage.close()
    await shard.close()
    assert stat.S_IMODE(data.stat().st_mode) == 0o755
    assert stat.S_IMODE((data / "obelisk.sqlite").stat().st_mode) == 0o640
    assert stat.S_IMODE((data / "obelisk-shard1.sqlite").stat().st_mode) == 0o600
    assert stat.S_IMODE((data / "obelisk-shard1.sqlite-write-lock").stat().st_mode) == 0o600


async def test_open_refuses_a_damaged_file_without_writing_it(tmp_path: Path) -> None:
    path = tmp_path / "obelisk.sqlite"
    storage = await SqliteStorage.open(path)
    await storage.close()
    with sqlite3.connect(path) as conn:
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'executions'"
        ).fetchone()
    conn.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * 4096 : root * 4096] = b"\xff" * 4096
    path.write_bytes(bytes(data))
    with pytest.raises(DamagedDatabase) as info:
        await SqliteStorage.open(path)
    assert str(info.value).startswith(f"the database {path} is damaged (")
    assert f"sqlite3 {path} 'PRAGMA integrity_check'" in str(info.value)
    assert path.read_bytes() == bytes(data)


def test_probe_passes_good_and_new_files_and_tells_damage_apart(tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "new.sqlite") as conn:
        probe(conn)  # empty: nothing to read
    conn.close()
    assert is_damage(sqlite3.DatabaseError("database disk image is malformed"))
    assert not is_damage(sqlite3.OperationalError("database is locked"))
    busy = sqlite3.OperationalError("database is locked")
    busy.sqlite_errorcode = 5  # type: ignore[attr-defined]
    assert not is_damage(busy)
