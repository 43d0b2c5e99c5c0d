"""Opening a PostgreSQL database: the schema (one per engine cluster), its migrations,
connection settings, the clock skew check.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from engine.storage.contract import (
    StorageError,
)
from engine.storage.postgres.leases import SCHEMA as LEASES_SCHEMA
from engine.storage.postgres.queries import RESULT_CLASS_SQL
from engine.storage.postgres.target import PostgresTarget

SCHEMA_VERSION = 4

MIGRATIONS: list[str] = [
    # 1: the schema of SQLite's migrations 1-3, in PostgreSQL types. Ids and FFQNs sort
    # byte-wise (COLLATE "C") as in SQLite, whatever the database's locale.
    """
    CREATE TABLE executions (
        execution_id TEXT COLLATE "C" PRIMARY KEY,
        ffqn TEXT COLLATE "C" NOT NULL,
        component_type TEXT NOT NULL,
        parent_id TEXT COLLATE "C",
        state TEXT NOT NULL,
        pending_at BIGINT,          -- µs; set only while the state is exactly PendingAt
        lock_expires_at BIGINT,     -- µs; set only while the underlying state is Locked
        next_version INTEGER NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL,
        summary BYTEA NOT NULL,
        pinned_digest TEXT
    );
    CREATE INDEX executions_due ON executions (ffqn, pending_at) WHERE pending_at IS NOT NULL;
    CREATE INDEX executions_lock_expiry ON executions (lock_expires_at)
        WHERE lock_expires_at IS NOT NULL;
    CREATE INDEX executions_created ON executions (created_at DESC, execution_id DESC);
    CREATE INDEX executions_state ON executions (state);
    CREATE INDEX executions_parent ON executions (parent_id) WHERE parent_id IS NOT NULL;
    CREATE INDEX executions_pinned ON executions (pinned_digest)
        WHERE pinned_digest IS NOT NULL;

    CREATE TABLE events (
        execution_id TEXT COLLATE "C" NOT NULL,
        version INTEGER NOT NULL,
        created_at BIGINT NOT NULL,
        event BYTEA NOT NULL,
        backtrace_id BIGINT,
        PRIMARY KEY (execution_id, version)
    );

    CREATE TABLE responses (
        execution_id TEXT COLLATE "C" NOT NULL,
        cursor INTEGER NOT NULL,
        created_at BIGINT NOT NULL,
        source_id TEXT NOT NULL,    -- child execution id or delay id: one response each
        response BYTEA NOT NULL,
        PRIMARY KEY (execution_id, cursor)
    );
    CREATE UNIQUE INDEX responses_source ON responses (execution_id, source_id);

    CREATE TABLE delays (
        delay_id TEXT PRIMARY KEY,
        execution_id TEXT COLLATE "C" NOT NULL,
        join_set_id TEXT NOT NULL,
        expires_at BIGINT NOT NULL
    );
    CREATE INDEX delays_expiry ON delays (expires_at);
    CREATE INDEX delays_execution ON delays (execution_id);

    CREATE TABLE logs (
        id BIGSERIAL PRIMARY KEY,
        execution_id TEXT COLLATE "C" NOT NULL,
        run_id TEXT,
        created_at BIGINT NOT NULL,
        level TEXT NOT NULL,
        stream TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX logs_execution ON logs (execution_id, id);

    CREATE TABLE backtraces (
        backtrace_id BIGSERIAL PRIMARY KEY,
        hash BYTEA NOT NULL UNIQUE,
        component_digest TEXT NOT NULL,
        frames BYTEA NOT NULL
    );

    CREATE TABLE component_sources (
        digest TEXT PRIMARY KEY,
        file TEXT NOT NULL,
        source TEXT NOT NULL
    );
    """,
    # 2: the console's "last change first" order pages through an index, not a sort
    """
    CREATE INDEX executions_updated ON executions (updated_at DESC, execution_id DESC);
    """,
    # 3: executor leases: a dead process's locks are released at once
    LEASES_SCHEMA,
    # 4: a finished row's result class (the console's ok / err / failed) as a stored
    # column, computed once per write, and counted through an index on (state, it): the
    # counts by result read the index, not every row's summary (an expression index
    # would not do: PostgreSQL takes an index-only scan only when every column the
    # query names is in the index, and the expression names `summary`). It replaces
    # the index on state alone, which the new one's first column serves. Adding a
    # stored column rewrites the table, once.
    f"""
    ALTER TABLE executions ADD COLUMN result_class TEXT
        GENERATED ALWAYS AS (CASE WHEN state = 'finished' THEN {RESULT_CLASS_SQL} END) STORED;
    CREATE INDEX executions_state_result ON executions (state, result_class);
    DROP INDEX executions_state;
    """,
]


# ---------------------------------------------------------------------------------------
# Opening: settings, migrations, clock
# ---------------------------------------------------------------------------------------


def _server_settings(schema: str) -> dict[str, str]:
    return {
        "search_path": schema,
        "application_name": "obelisk",
        # A process stopped (not killed) mid-transaction must not hold row locks forever.
        "idle_in_transaction_session_timeout": "60s",
    }


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


async def _migrate(conn: asyncpg.Connection, target: PostgresTarget) -> None:
    """Create the schema or bring it up to SCHEMA_VERSION, once even when several engines
    start at the same time (a transaction-scoped advisory lock serialises them)."""
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1))", f"obelisk-migrate:{target.schema}"
        )
        # Only when missing: creating needs a privilege that using does not.
        if await conn.fetchval("SELECT to_regnamespace($1) IS NULL", _quote_ident(target.schema)):
            await conn.execute(f"CREATE SCHEMA {_quote_ident(target.schema)}")
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS obelisk_schema_version (version INTEGER NOT NULL)"
        )
        current = await conn.fetchval("SELECT max(version) FROM obelisk_schema_version") or 0
        if current > SCHEMA_VERSION:
            raise StorageError(
                f"database {target.description} was created by a newer version of obelisk "
                f"(schema {current}, this version knows up to {SCHEMA_VERSION})"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            await conn.execute(MIGRATIONS[version - 1])
            await conn.execute("INSERT INTO obelisk_schema_version (version) VALUES ($1)", version)


async def _clock_skew(conn: asyncpg.Connection) -> float:
    """The database server's clock minus ours (seconds), the round trip halved."""
    before = time.time()
    server = float(await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())"))
    after = time.time()
    return server - (before + after) / 2


async def _close_quietly(conn: asyncpg.Connection | None, pool: asyncpg.Pool | None) -> None:
    if conn is not None:
        try:
            await asyncio.wait_for(conn.close(), 5)
        except Exception:
            conn.terminate()
    if pool is not None:
        try:
            await asyncio.wait_for(pool.close(), 5)
        except Exception:
            pool.terminate()
