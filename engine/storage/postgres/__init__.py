"""The PostgreSQL backend (asyncpg): several engines on several hosts share one database.

- `storage`: `PostgresStorage`, the `Storage` contract: open / close, the listener
  (LISTEN / NOTIFY), the public methods.
- `writer`: the writer task: group commit, reconnects, announcing what committed.
- `batches`: one physical transaction per batch, one NOTIFY, savepoints on failure, a
  lost COMMIT looked up by transaction id.
- `transactions`: the logical transactions (create, lock pending, append, responses,
  logs, backtraces, delays).
- `queries`: lists of executions (`ListFilter` → SQL) and their rows.
- `schema`: the schema, its migrations, connection settings, the clock skew check.
- `target`: DSNs (`parse_dsn`, `dsn_from_parts`, `DATABASE_URL_ENV`) and which errors
  are connection failures.
- `leases`: which executors are alive (advisory locks).
"""

from engine.storage.postgres.schema import SCHEMA_VERSION
from engine.storage.postgres.storage import PostgresStorage
from engine.storage.postgres.target import (
    DATABASE_URL_ENV,
    PostgresTarget,
    dsn_from_parts,
    parse_dsn,
)

__all__ = [
    "DATABASE_URL_ENV",
    "SCHEMA_VERSION",
    "PostgresStorage",
    "PostgresTarget",
    "dsn_from_parts",
    "parse_dsn",
]
