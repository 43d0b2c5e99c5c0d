"""Which storage an engine opens: PostgreSQL, one SQLite file, or SQLite shards.

`choose_storage` decides from `Engine.start`'s arguments and the data dir (before
anything is opened: the number of shards is the number of engine processes);
`StorageChoice.open` opens it, and answers with what the engine needs of the chosen
backend without knowing which one it is (`OpenedStorage`). After a failed start,
`StorageChoice.undo` removes the shard files that start made and `damaged` names the
SQLite files of a damaged database.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.core.ids import ExecutionId
from engine.storage.contract import Storage
from engine.storage.data_files import DamagedDatabase, is_damage
from engine.storage.sharded import (
    ShardedStorage,
    existing_shards,
    open_shards,
    remove_empty_shards,
    shard_path,
)


@dataclass(frozen=True, slots=True)
class OpenedStorage:
    """An opened storage, with what an engine needs of it whatever its backend."""

    #: Every execution, for the API and the console.
    storage: Storage
    #: This process's work: what its executors, timers and upgrades see.
    own: Storage
    #: A new top-level id (sharded: one whose home is the next shard in turn, so that
    #: submissions are balanced over the processes).
    new_id: Callable[[], ExecutionId]
    #: Tell the storage which shards' processes are up (`alive(shard index)`): new ids
    #: skip the others while they are being restarted. A no-op for a single database.
    set_available: Callable[[Callable[[int], bool]], None]


def _ignore_availability(alive: Callable[[int], bool]) -> None:
    """A single database: every submission goes to it, whatever process is up."""


def opened(storage: Storage, own: Storage) -> OpenedStorage:
    """What an engine needs of `storage` (and its `own` part)."""
    if isinstance(storage, ShardedStorage):
        sharded = storage

        def set_available(alive: Callable[[int], bool]) -> None:
            sharded.available = alive

        return OpenedStorage(storage, own, sharded.generate_id, set_available)
    return OpenedStorage(storage, own, ExecutionId.generate, _ignore_availability)


@dataclass(frozen=True, slots=True)
class StorageChoice:
    """Where an engine's executions are (see the module)."""

    data_dir: Path
    #: PostgreSQL (`engine.storage.postgres`): shared by several engines on several hosts.
    database_url: str | None
    #: A helper's engine: that SQLite shard alone.
    shard: int | None
    #: SQLite files: 1, or one per engine process (`engine.storage.sharded`).
    shards: int
    #: How many shards the data dir had before this start (the others are its own).
    existing: int
    #: Engine processes in all: with SQLite shards, one per shard (a data dir that has
    #: shards is always served by as many processes, whatever was asked).
    processes: int

    async def open(self) -> OpenedStorage:
        if self.database_url:
            # Imported only when asked for: asyncpg is a heavy import.
            from engine.storage.postgres import PostgresStorage

            storage = await PostgresStorage.open(self.database_url)
            return opened(storage, storage)
        return opened(*await open_shards(self.data_dir, self.shard, self.shards))

    def undo(self) -> None:
        """After a failed start: remove the shard files this start made, unless
        something was written there."""
        remove_empty_shards(self.data_dir, self.existing, self.shards)

    def sqlite_paths(self) -> list[Path]:
        """The SQLite files this choice opens."""
        if self.shard is not None:
            return [shard_path(self.data_dir, self.shard)]
        return [shard_path(self.data_dir, index) for index in range(self.shards)]

    def damaged(self, error: BaseException) -> DamagedDatabase | None:
        """The error to raise instead of `error` when it says a SQLite file is damaged
        (naming the files); None otherwise."""
        if self.database_url or not is_damage(error):
            return None
        return DamagedDatabase(self.sqlite_paths(), error)


def choose_storage(
    data_dir: Path, *, database_url: str | None, shard: int | None, processes: int
) -> StorageChoice:
    """The storage of an engine started with these arguments (`Engine.start`)."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, not {processes}")
    shards = existing = 1
    if not database_url and shard is None:
        existing = existing_shards(data_dir)
        shards = processes = max(processes, existing)
    return StorageChoice(data_dir, database_url, shard, shards, existing, processes)


__all__ = ["OpenedStorage", "StorageChoice", "choose_storage", "opened"]
