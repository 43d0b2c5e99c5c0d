"""Where the database is: DSNs (`parse_dsn`, `dsn_from_parts`, `DATABASE_URL_ENV`), and
which errors mean the connection failed (retried) rather than the statement.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

import asyncpg

from engine.storage.common import (
    first_line,
)
from engine.storage.contract import (
    StorageError,
)

#: Environment variable with the DSN that `obelisk server run` uses (see README).
DATABASE_URL_ENV = "OBELISK_DATABASE_URL"


# ---------------------------------------------------------------------------------------
# DSNs and errors at start
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PostgresTarget:
    """A parsed DSN: what asyncpg gets, the schema (ours, `?schema=`), and a description
    for messages that never contains the password."""

    dsn: str
    schema: str
    description: str


def parse_dsn(url: str) -> PostgresTarget:
    """`postgresql://user:password@host:port/dbname?schema=obelisk` (schema: `public` by
    default). Raises StorageError for what is not a PostgreSQL URL."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise StorageError(f"invalid database URL: {e}") from None
    if parts.scheme not in ("postgres", "postgresql"):
        raise StorageError(
            "invalid database URL: expected postgresql://user:password@host:port/dbname, "
            f"got scheme {parts.scheme or '(none)'!r}"
        )
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    schema = "public"
    kept = []
    for key, value in query:
        if key == "schema":
            schema = value
        else:
            kept.append((key, value))
    if not schema or len(schema) > 50 or not schema.replace("_", "a").isalnum():
        raise StorageError(
            f"invalid schema name {schema!r} in the database URL (letters, digits, _)"
        )
    dsn = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(kept)))
    host = parts.hostname or "localhost"
    user = f"{urllib.parse.unquote(parts.username)}@" if parts.username else ""
    where = f"[{host}]" if ":" in host else host
    dbname = parts.path.lstrip("/") or "(default database)"
    description = f"postgresql://{user}{where}:{port or 5432}/{dbname}"
    if schema != "public":
        description += f" (schema {schema})"
    return PostgresTarget(dsn, schema, description)


def dsn_from_parts(
    host: str = "localhost",
    port: int = 5432,
    user: str | None = None,
    password: str | None = None,
    dbname: str | None = None,
    schema: str | None = None,
) -> str:
    """The URL of a `[database.postgres]` table (see `engine.server.config`)."""
    auth = ""
    if user:
        auth = urllib.parse.quote(user, safe="")
        if password:
            auth += ":" + urllib.parse.quote(password, safe="")
        auth += "@"
    where = f"[{host}]" if ":" in host else host
    url = f"postgresql://{auth}{where}:{port}/{urllib.parse.quote(dbname or '', safe='')}"
    if schema:
        url += "?" + urllib.parse.urlencode({"schema": schema})
    return url


def _start_error(target: PostgresTarget, e: BaseException) -> StorageError:
    """One line naming the problem (no traceback at start)."""
    where = target.description
    if isinstance(e, asyncpg.InvalidPasswordError):
        return StorageError(f"cannot connect to {where}: password authentication failed")
    if isinstance(e, asyncpg.InvalidAuthorizationSpecificationError):
        return StorageError(f"cannot connect to {where}: {first_line(e)}")
    if isinstance(e, asyncpg.InvalidCatalogNameError):
        return StorageError(f"cannot connect to {where}: {first_line(e)}")
    if isinstance(e, asyncpg.PostgresError):
        return StorageError(f"database {where}: {first_line(e)}")
    if isinstance(e, TimeoutError):
        return StorageError(f"cannot connect to {where}: timed out")
    if isinstance(e, ConnectionRefusedError):
        return StorageError(
            f"cannot connect to {where}: connection refused (is the server running?)"
        )
    if isinstance(e, OSError):
        reason = e.strerror or str(e) or type(e).__name__
        return StorageError(f"cannot connect to {where}: {reason} (is the server running?)")
    return StorageError(f"cannot connect to {where}: {first_line(e) or type(e).__name__}")


def is_connection_error(e: BaseException) -> bool:
    """The connection (not the statement) failed: reconnect and try again."""
    if isinstance(
        e,
        asyncpg.PostgresConnectionError  # class 08
        | asyncpg.InterfaceError  # "connection is closed", "another operation is in progress"
        | asyncpg.exceptions.ConnectionDoesNotExistError
        | asyncpg.exceptions.OperatorInterventionError  # 57P01 admin shutdown, terminate
        | asyncpg.exceptions.CannotConnectNowError
        | asyncpg.exceptions.TooManyConnectionsError
        # The protocol's state machine after the server dropped the connection mid-way
        # ("cannot switch to state N; another operation is in progress"): that
        # connection is unusable.
        | asyncpg.exceptions.InternalClientError
        | ConnectionError
        | TimeoutError,
    ):
        return not isinstance(e, asyncpg.exceptions.QueryCanceledError)
    return isinstance(e, OSError)


def _is_retryable(e: BaseException) -> bool:
    """Transaction-level failures that running the logical transaction again resolves."""
    return isinstance(
        e,
        asyncpg.exceptions.DeadlockDetectedError | asyncpg.exceptions.SerializationError,
    )
