"""The SQLite backend (the embedded default): one file, WAL, group commit.

- `storage`: `SqliteStorage`, the `Storage` contract: open / close, the public methods,
  notifications, batched summary reads.
- `writer`: the writer thread and group commit (`_Writer`).
- `batches`: logical transactions (`_Tx`) and how a batch of them runs (plain,
  savepoints, optimistic), outcomes handed over before the COMMIT.
- `connection`: the writer's connection: write lock, BEGIN / COMMIT / ROLLBACK.
- `transactions`: the logical transactions themselves (create, lock pending, append,
  responses, logs, backtraces, pause / cancel, delays).
- `queries`: lists of executions (`ListFilter` → SQL) and their rows.
- `schema`: opening a file, WAL, the schema and its migrations.
- Several processes on one file: `peers` (the peer bus: wake-ups), `cache` (which
  summaries another writer changed), `optimistic` (phase-2 writes of optimistic
  batches), `write_lock` (the lock file taken before SQLite's).
"""

from engine.storage.sqlite.storage import SqliteStorage

__all__ = ["SqliteStorage"]
