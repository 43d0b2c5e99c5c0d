"""PostgreSQL backend (asyncpg): several engines on several hosts share one database.

The same contract as the SQLite backend, built the same way where that pays:

- **Group commit.** All writes of a process go through one writer task and one
  connection: the logical transactions queued meanwhile run in one physical transaction
  (first without savepoints; when one fails after writing, the batch is rolled back and
  runs again with a SAVEPOINT each). Concurrency turns into fewer round trips and commits.
- **Locking** of due executions is `SELECT … FOR UPDATE SKIP LOCKED`, so processes
  never wait for each other's batches; every append reads its row `FOR UPDATE` and
  checks the expected version there (optimistic concurrency, serialised per execution).
- **Wake-ups across processes**: each batch that changed something sends one `NOTIFY`
  (delivered at commit, only if it commits) naming the FFQNs with new pending work,
  executions with new responses, finished executions, cancellations; every process
  `LISTEN`s and wakes its local waiters (`engine.storage.notify`). Waits still re-check
  now and then, as a safety net for notifications missed while the listening connection
  was being re-established.
- **Connection loss**: the writer reconnects with backoff and runs the interrupted batch
  again. A batch whose COMMIT was sent but not answered is looked up by its transaction
  id (`pg_xact_status`): committed writes are acknowledged, never run twice. Reads retry.

Times are the callers' (`now` is passed in, as with SQLite): hosts must keep their clocks
in sync (NTP); the timers watcher's 500 ms leeway absorbs smaller skew, and `open` warns
when this host's clock differs from the database server's by more than `SKEW_WARNING`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from engine.core import events as ev
from engine.core.ids import DelayId, ExecutionId, IdError
from engine.core.records import Frame, LogLine
from engine.core.state import (
    ExecutionSummary,
    IllegalAppend,
    PendingAt,
    apply_event,
    apply_response,
    created_summary,
)
from engine.storage.common import (
    Notes,
    PreparedBacktrace,
    RemoteNotes,
    announce_direct,
    apply_remote_notes,
    cancel_events,
    check_unpause,
    direct_locked,
    dt,
    event_type,
    execution_row,
    first_line,
    frames_decoder,
    grouped_responses,
    not_before,
    pause_events,
    prepare_backtraces,
    projection,
    response_source,
    stop_runs_the_log_stops,
    summary_decoder,
    us,
)
from engine.storage.contract import (
    AppendExtras,
    Backtrace,
    ComponentSource,
    Conflict,
    CreateRequest,
    DirectLock,
    ExecutionRow,
    ExecutorLease,
    ExpiredDelay,
    ExpiredLock,
    ListFilter,
    LockedExecution,
    NotFound,
    StorageError,
    StorageFull,
    StoredLog,
    UnfinishedExecution,
    VersionConflict,
)
from engine.storage.disk_full import is_disk_full, report_disk_full, write_error
from engine.storage.notify import Notifier, ResponseInbox
from engine.storage.postgres_leases import SCHEMA as LEASES_SCHEMA
from engine.storage.postgres_leases import PostgresLeases

log = logging.getLogger("obelisk.storage")

T = TypeVar("T")

SCHEMA_VERSION = 3

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
]

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


# ---------------------------------------------------------------------------------------
# The writer's connection wrapper and transactions
# ---------------------------------------------------------------------------------------


class _Conn:
    """The writer connection as a logical transaction sees it. `wrote` tells whether it
    changed anything: a failure before any write needs no rollback of the batch."""

    __slots__ = ("conn", "wrote")

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.wrote = False

    async def rows(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        return list(await self.conn.fetch(sql, *args))

    async def row(self, sql: str, *args: Any) -> asyncpg.Record | None:
        record: asyncpg.Record | None = await self.conn.fetchrow(sql, *args)
        return record

    async def write(self, sql: str, *args: Any) -> str:
        self.wrote = True
        status: str = await self.conn.execute(sql, *args)
        return status

    async def write_rows(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        self.wrote = True
        return list(await self.conn.fetch(sql, *args))


TxFn = Callable[[_Conn, Notes], Awaitable[Any]]


@dataclass(slots=True)
class _Tx:
    fn: TxFn
    future: asyncio.Future[Any]
    #: The executions whose rows it locks (FOR UPDATE): locked up front, see `_prelock`.
    keys: tuple[str, ...] = ()
    attempts: int = 0


Outcome = tuple[bool, Any, Notes]


@dataclass(frozen=True, slots=True)
class _Ident:
    """Where a batch's NOTIFY goes, and who sends it."""

    channel: str
    sender: str


class _CommitUnknown(Exception):
    """The connection failed while COMMIT was in flight."""

    def __init__(self, xid: str, outcomes: list[Outcome], cause: BaseException) -> None:
        super().__init__(str(cause))
        self.xid = xid
        self.outcomes = outcomes
        self.cause = cause


# ---------------------------------------------------------------------------------------
# The storage
# ---------------------------------------------------------------------------------------


class PostgresStorage:
    """Open with `await PostgresStorage.open("postgresql://…")`."""

    #: Seconds between re-checks of awaited results and responses (notifications are the
    #: fast path; this only catches what a reconnecting listener missed).
    FINISHED_RECHECK_INTERVAL = 2.0
    RESPONSE_RECHECK_INTERVAL = 2.0
    #: How long the writer keeps reconnecting for one batch before failing its callers.
    RECONNECT_DEADLINE = 60.0
    #: Warn at start when this host's clock and the database server's differ by more.
    SKEW_WARNING = 0.25

    def __init__(self, target: PostgresTarget, pool: asyncpg.Pool, writer: asyncpg.Connection):
        self.target = target
        self.path = target.description  # what messages name, as SqliteStorage.path
        self._pool = pool
        self._writer: asyncpg.Connection | None = writer
        self._channel = f"obelisk_{target.schema}"
        #: Unique per open storage: its own notifications are not announced twice.
        self._sender = f"{os.getpid()}-{random.getrandbits(48):012x}"
        self._ident = _Ident(self._channel, self._sender)
        self._queue: asyncio.Queue[_Tx | None] = asyncio.Queue()
        self.notifier = Notifier()
        self._writer_task: asyncio.Task[None] | None = None
        self._listener_task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._finished_poller: asyncio.Task[None] | None = None
        self._summary_reads: dict[str, list[asyncio.Future[ExecutionSummary]]] = {}
        self._background: set[asyncio.Future[Any]] = set()
        self._closed = False
        self._max_batch = 500
        self._loop = asyncio.get_running_loop()
        #: Which executors are alive (`engine.storage.postgres_leases`).
        self._leases = PostgresLeases(
            lambda: asyncpg.connect(
                target.dsn, timeout=10.0, server_settings=_server_settings(target.schema)
            )
        )
        #: The database server's clock minus ours, in seconds, measured at open.
        self.clock_skew = 0.0
        #: Counters for benchmarks and tests.
        self.stats = {
            "logical": 0,
            "commits": 0,
            "events": 0,
            "reconnects": 0,
            "notifications": 0,
        }

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    async def open(
        cls, url: str, *, max_batch: int = 500, connect_timeout: float = 10.0
    ) -> PostgresStorage:
        target = parse_dsn(url)
        settings = _server_settings(target.schema)
        writer: asyncpg.Connection | None = None
        pool: asyncpg.Pool | None = None
        try:
            writer = await asyncpg.connect(
                target.dsn, timeout=connect_timeout, server_settings=settings
            )
            await _migrate(writer, target)
            skew = await _clock_skew(writer)
            pool = await asyncpg.create_pool(
                target.dsn,
                min_size=1,
                max_size=4,
                timeout=connect_timeout,
                server_settings=settings,
            )
        except StorageError:
            await _close_quietly(writer, pool)
            raise
        except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError, ValueError) as e:
            await _close_quietly(writer, pool)
            raise _start_error(target, e) from None
        except BaseException:
            await _close_quietly(writer, pool)
            raise
        storage = cls(target, pool, writer)
        storage._max_batch = max_batch
        storage.clock_skew = skew
        if abs(skew) > cls.SKEW_WARNING:
            log.warning(
                "the clock of this host differs from the database server's by %.3f s: "
                "keep the hosts' clocks in sync (NTP); lock expiries are compared across hosts",
                skew,
            )
        storage._writer_task = asyncio.create_task(storage._write_loop(), name="pg-writer")
        storage._listener_task = asyncio.create_task(storage._listen_loop(), name="pg-listener")
        # Until the listener is there, other processes' commits would go unnoticed.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(storage._listening.wait()), connect_timeout)
        return storage

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for task in (self._finished_poller, self._listener_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        task = self._writer_task
        if task is not None and not task.done():
            self._queue.put_nowait(None)
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                task.cancel()
                raise
            except Exception:
                pass
        while not self._queue.empty():
            tx = self._queue.get_nowait()
            if tx is not None and not tx.future.done():
                tx.future.set_exception(StorageError("storage closed"))
        for fut in list(self._background):
            fut.cancel()
        await self._leases.close()
        await _close_quietly(self._writer, self._pool)
        self._writer = None

    # -- the writer ----------------------------------------------------------------------
    async def _write(
        self, fn: Callable[[_Conn, Notes], Awaitable[T]], keys: tuple[str, ...] = ()
    ) -> T:
        if self._closed:
            raise StorageError("storage closed")
        if self._writer_task is None or self._writer_task.done():
            raise StorageError(f"the writer of database {self.path} is not running")
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Tx(fn, fut, keys))
        return await fut

    async def _write_loop(self) -> None:
        stop = False
        while not stop:
            queued = [await self._queue.get()]
            while len(queued) < self._max_batch and not self._queue.empty():
                queued.append(self._queue.get_nowait())
            batch = [tx for tx in queued if tx is not None]
            stop = len(batch) < len(queued)  # None (close) is always last
            while batch:
                batch = await self._commit_batch(batch)

    async def _writer_conn(self) -> asyncpg.Connection:
        if self._writer is None or self._writer.is_closed():
            with contextlib.suppress(Exception):
                if self._writer is not None:
                    self._writer.terminate()
            self._writer = None
            self._writer = await asyncpg.connect(
                self.target.dsn, timeout=10.0, server_settings=_server_settings(self.target.schema)
            )
            self.stats["reconnects"] += 1
        return self._writer

    def _drop_writer(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.terminate()
        self._writer = None

    async def _commit_batch(self, batch: list[_Tx]) -> list[_Tx]:
        """Run the batch until it committed (reconnecting as needed), resolve the futures;
        returns the logical transactions to run again (deadlock victims)."""
        deadline = time.monotonic() + self.RECONNECT_DEADLINE
        delay = 0.05
        while True:
            try:
                conn = await self._writer_conn()
                outcomes = await _run_batch(conn, batch, self._ident)
                break
            except _CommitUnknown as unknown:
                self._drop_writer()
                status = await self._xact_status(unknown.xid, deadline)
                if status == "committed":
                    outcomes = unknown.outcomes
                    break
                if status is None:
                    self._fail(batch, f"database connection lost during commit: {unknown.cause}")
                    return []
                # aborted: nothing of it is there; run it again
            except Exception as e:
                if not is_connection_error(e):
                    self._fail(batch, f"database write failed: {e}", write_error(e))
                    return []
                self._drop_writer()
                if time.monotonic() > deadline:
                    self._fail(batch, f"database {self.path} unreachable: {first_line(e)}")
                    return []
                log.warning("database connection lost (%s); reconnecting", first_line(e))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        self.stats["commits"] += 1
        again: list[_Tx] = []
        for tx, (ok, value, notes) in zip(batch, outcomes, strict=True):
            if not ok and _is_retryable(value) and tx.attempts < 5 and not tx.future.done():
                tx.attempts += 1
                again.append(tx)
                continue
            self.stats["logical"] += 1
            if ok:
                try:
                    self._announce(notes)
                except Exception:  # a waiter's bug must not stop the writer
                    log.exception("notification after commit failed")
            if tx.future.done():
                continue
            if ok:
                tx.future.set_result(value)
            else:
                tx.future.set_exception(_translate(value))
        self.notifier.changed()
        return again

    async def _xact_status(self, xid: str, deadline: float) -> str | None:
        """'committed' / 'aborted' for a transaction whose COMMIT got no answer; None when
        the database cannot be reached before `deadline`."""
        delay = 0.05
        while time.monotonic() < deadline:
            try:
                conn = await self._writer_conn()
                status = await conn.fetchval("SELECT pg_xact_status($1::text::xid8)", xid)
                if status in ("committed", "aborted"):
                    return str(status)
                # in progress: the old backend has not finished the commit yet
            except Exception as e:
                # Any failure of the check itself (the connection dropped again, a backend
                # still terminating) is retried until the deadline: the answer decides
                # whether acknowledged writes are lost or done twice.
                log.warning("checking the outcome of a lost commit: %s", first_line(e))
                self._drop_writer()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)
        return None

    def _fail(self, batch: list[_Tx], message: str, error: StorageError | None = None) -> None:
        if isinstance(error, StorageFull):
            report_disk_full(log, error)  # at most once per interval
        else:
            log.error("%s", message)
        for tx in batch:
            if not tx.future.done():
                tx.future.set_exception(error or StorageError(message))

    def _announce(self, notes: Notes) -> None:
        for ffqn in notes.pending:
            self.notifier.pending(ffqn)
        for ffqn, delay in notes.pending_later.items():
            self.notifier.pending_later(ffqn, delay)
        for execution_id, result in notes.finished:
            self.notifier.finished(execution_id, result)
        posted = grouped_responses(notes)
        for execution_id, items in posted.items():
            self.notifier.post_responses(execution_id, items)
        for execution_id in notes.responses:
            self.notifier.response(execution_id, posted=execution_id in posted)
        for execution_id in notes.cancelled:
            self.notifier.cancelled(execution_id)
        for execution_id in notes.cancelling:
            self.notifier.cancelling(execution_id)
        announce_direct(notes)

    # -- the listener (other processes' commits) -----------------------------------------
    async def _listen_loop(self) -> None:
        delay = 0.05
        first = True
        while not self._closed:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(
                    self.target.dsn,
                    timeout=10.0,
                    server_settings=_server_settings(self.target.schema),
                )
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())  # type: ignore[misc]
                await conn.add_listener(self._channel, self._on_notification)
                self._listening.set()
                if not first:
                    # Commits between the loss and now were not heard: wake every waiter
                    # to re-check, as after a missed notification.
                    self._wake_everyone()
                first = False
                delay = 0.05
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), 10.0)
                    if not lost.is_set():
                        await conn.fetchval("SELECT 1", timeout=10.0)  # a silent drop
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if self._closed:
                    break
                log.warning(
                    "database listener: %s; reconnecting", first_line(e) or type(e).__name__
                )
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.terminate()
            if self._closed:
                break
            self._listening.set()  # open() must not wait for a listener that keeps failing
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        sender, _, body = payload.partition("\n")
        if sender == self._sender:
            return  # announced locally after the commit
        self.stats["notifications"] += 1
        checks = apply_remote_notes(self.notifier, body)
        if checks.finished:
            self._spawn(self._announce_finished(checks.finished))
        if checks.stops:
            self._spawn(
                stop_runs_the_log_stops(self.notifier, checks.stops, self._get_summary_batched)
            )
        self.notifier.changed()

    def _wake_everyone(self) -> None:
        self.notifier.wake_all()
        awaited = self.notifier.awaited_results()
        if awaited:
            self._spawn(self._announce_finished(awaited))
        self.notifier.changed()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _announce_finished(self, ids: list[str]) -> None:
        """Wake local waiters of results finished elsewhere (one read per 500)."""
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            try:
                rows = await self._fetch(
                    "SELECT execution_id, summary FROM executions "
                    "WHERE state = 'finished' AND execution_id = ANY($1::text[])",
                    chunk,
                )
            except StorageError:
                return  # the re-check poller tries again
            for execution_id, blob in rows:
                s = summary_decoder.decode(blob)
                if s.result is not None:
                    self.notifier.finished(execution_id, s.result)

    # -- reads (the pool; retried when the connection fails) ------------------------------
    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        deadline = time.monotonic() + 30.0
        delay = 0.05
        while True:
            if self._closed:
                raise StorageError("storage closed")
            try:
                return list(await self._pool.fetch(sql, *args))
            except Exception as e:
                if not is_connection_error(e) or time.monotonic() > deadline:
                    if isinstance(e, asyncpg.PostgresError | asyncpg.InterfaceError | OSError):
                        raise StorageError(f"database read failed: {first_line(e)}") from None
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- writes ----------------------------------------------------------------------------
    async def create(self, request: CreateRequest, now: datetime) -> None:
        await self._write(lambda c, n: _create_many(c, n, [request], now))

    async def lock_pending(
        self,
        *,
        ffqns: Sequence[str],
        batch_size: int,
        now: datetime,
        component_id: ev.ComponentId,
        executor_id: str,
        run_id: str,
        lock_expires_at: datetime,
        retry_config: ev.RetryConfig,
        with_log: bool = False,
        pinned_digest: str | None = None,
    ) -> list[LockedExecution]:
        locked = ev.Locked(component_id, executor_id, run_id, lock_expires_at, retry_config)
        return await self._write(
            lambda c, n: _lock_pending(
                c, n, list(ffqns), batch_size, now, locked, with_log, pinned_digest
            )
        )

    async def append(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None = None,
    ) -> ExecutionSummary:
        self.stats["events"] += len(events)
        backtraces = (
            prepare_backtraces(extras.component_digest, extras.backtraces) if extras else []
        )
        finishes = any(isinstance(e, ev.Finished) for e in events)
        return await self._write(
            lambda c, n: _append(
                c, n, execution_id, expected_version, list(events), now, extras, backtraces
            ),
            _with_parent(execution_id) if finishes else (execution_id,),
        )

    def append_from_thread(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None = None,
        inbox: ResponseInbox | None = None,
    ) -> ExecutionSummary:
        if inbox is not None and not inbox.wait_committed():
            raise Conflict("a response the run was given was not committed")
        # asyncpg lives on the loop: the append runs there.
        coro = self.append(execution_id, expected_version, events, now, extras)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def append_then(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None,
        callback: Callable[[bool, Any], None],
    ) -> None:
        loop = self._loop

        def start() -> None:
            task = loop.create_task(
                self.append(execution_id, expected_version, events, now, extras)
            )

            def done(t: asyncio.Task[ExecutionSummary]) -> None:
                if t.cancelled():
                    callback(False, StorageError("storage closed"))
                elif (e := t.exception()) is not None:
                    callback(False, e)
                else:
                    callback(True, t.result())

            task.add_done_callback(done)

        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:  # a closed loop
            callback(False, StorageError("storage closed"))

    async def append_response(
        self, execution_id: str, response: ev.Response, now: datetime
    ) -> None:
        async def tx(c: _Conn, n: Notes) -> None:
            await _add_response(c, n, execution_id, response, now)

        await self._write(tx, (execution_id,))

    async def append_upgrade_finished(
        self,
        execution_id: str,
        expected_version: int,
        event: ev.ComponentUpgradeFinished,
        pinned_digest: str | None,
        now: datetime,
    ) -> ExecutionSummary:
        async def tx(c: _Conn, n: Notes) -> ExecutionSummary:
            s = await _append(c, n, execution_id, expected_version, [event], now, None)
            await c.write(
                "UPDATE executions SET pinned_digest = $1 WHERE execution_id = $2",
                pinned_digest,
                execution_id,
            )
            return s

        return await self._write(tx, (execution_id,))

    async def append_logs(
        self, execution_id: str, run_id: str | None, lines: Sequence[LogLine], now: datetime
    ) -> None:
        if lines:
            await self._write(lambda c, n: _insert_logs(c, execution_id, run_id, lines, now))

    async def pause(self, execution_id: str, now: datetime) -> ExecutionSummary:
        async def tx(c: _Conn, n: Notes) -> ExecutionSummary:
            s, _ = await _load_for_update(c, execution_id)
            events = pause_events(s, execution_id, now, n)
            return await _append(c, n, execution_id, s.next_version, events, now, None)

        return await self._write(tx, (execution_id,))

    async def unpause(self, execution_id: str, now: datetime) -> ExecutionSummary:
        async def tx(c: _Conn, n: Notes) -> ExecutionSummary:
            s, _ = await _load_for_update(c, execution_id)
            check_unpause(s, execution_id)
            return await _append(c, n, execution_id, s.next_version, [ev.Unpaused()], now, None)

        return await self._write(tx, (execution_id,))

    async def request_cancellation(
        self, execution_id: str, now: datetime, force: bool = False
    ) -> ExecutionSummary:
        async def tx(c: _Conn, n: Notes) -> ExecutionSummary:
            s, _ = await _load_for_update(c, execution_id)
            events = cancel_events(s, execution_id, force)
            return await _append(c, n, execution_id, s.next_version, events, now, None)

        return await self._write(tx, _with_parent(execution_id))

    async def cancel_delay(self, delay_id: str, now: datetime) -> ExecutionSummary:
        try:
            keys: tuple[str, ...] = (str(DelayId.parse(delay_id).owner()[0]),)
        except IdError:
            keys = ()
        return await self._write(lambda c, n: _cancel_delay(c, n, delay_id, now), keys)

    async def cancelling_executions(
        self, after_id: str = "", limit: int = 1000
    ) -> list[tuple[str, ExecutionSummary]]:
        rows = await self._fetch(
            "SELECT execution_id, summary FROM executions WHERE state = 'cancelling' "
            "AND execution_id > $1 ORDER BY execution_id LIMIT $2",
            after_id,
            limit,
        )
        return [(r[0], summary_decoder.decode(r[1])) for r in rows]

    # -- timers ----------------------------------------------------------------------------
    async def expired_timers(
        self, now: datetime, limit: int = 100
    ) -> tuple[list[ExpiredLock], list[ExpiredDelay]]:
        t = us(now)
        locks = await self._fetch(
            "SELECT execution_id, summary FROM executions WHERE lock_expires_at < $1 "
            "ORDER BY lock_expires_at LIMIT $2",
            t,
            limit,
        )
        delays = await self._fetch(
            "SELECT delay_id, execution_id, join_set_id FROM delays WHERE expires_at <= $1 "
            "ORDER BY expires_at LIMIT $2",
            t,
            limit,
        )
        expired = []
        for execution_id, blob in locks:
            s = summary_decoder.decode(blob)
            expired.append(ExpiredLock(execution_id, s.next_version, s))
        return expired, [ExpiredDelay(e, d, j) for d, e, j in delays]

    async def next_timer_at(self) -> datetime | None:
        rows = await self._fetch(
            "SELECT least("
            " (SELECT min(lock_expires_at) FROM executions WHERE lock_expires_at IS NOT NULL),"
            " (SELECT min(expires_at) FROM delays),"
            " (SELECT min(pending_at) FROM executions WHERE pending_at IS NOT NULL))"
        )
        value = rows[0][0]
        return None if value is None else dt(value)

    # -- executor liveness (advisory locks: `engine.storage.postgres_leases`) -----------------
    def hold_executor_lease(self, executor_id: str) -> ExecutorLease:
        return self._leases.hold(executor_id)

    async def dead_executors(self) -> set[str]:
        if self._closed:
            return set()
        return await self._leases.dead()

    async def held_by_executors(self, executor_ids: set[str]) -> list[ExpiredLock]:
        if not executor_ids:
            return []
        # The run that holds an execution, wherever its state keeps it (not the
        # summary's own `last_lock`, which stays after the run ended).
        rows = await self._fetch(
            "SELECT execution_id, summary FROM executions,"
            " LATERAL (SELECT convert_from(summary, 'UTF8')::jsonb -> 'underlying' AS u) s "
            "WHERE state IN ('locked', 'blocked_by_join_set', 'pending_at', 'paused',"
            " 'cancelling') AND coalesce(u ->> 'executor_id',"
            " u #>> '{blocked_run,executor_id}', u #>> '{last_lock,executor_id}')"
            " = ANY($1::text[])",
            sorted(executor_ids),
        )
        return [
            ExpiredLock(execution_id, (s := summary_decoder.decode(blob)).next_version, s)
            for execution_id, blob in rows
        ]

    async def forget_executors(self, executor_ids: set[str]) -> None:
        await self._leases.forget(executor_ids)

    # -- reads -------------------------------------------------------------------------------
    async def get_summary(self, execution_id: str) -> ExecutionSummary:
        rows = await self._fetch(
            "SELECT summary FROM executions WHERE execution_id = $1", execution_id
        )
        if not rows:
            raise NotFound(f"execution {execution_id} not found")
        return summary_decoder.decode(rows[0][0])

    async def get_created(self, execution_id: str) -> ev.Created:
        rows = await self._fetch(
            "SELECT event FROM events WHERE execution_id = $1 AND version = 0", execution_id
        )
        if not rows:
            raise NotFound(f"execution {execution_id} not found")
        created = ev.decode_event(rows[0][0])
        assert isinstance(created, ev.Created)
        return created

    async def get_events(
        self, execution_id: str, from_version: int = 0, length: int | None = None
    ) -> list[ev.StoredEvent]:
        rows = await self._fetch(
            "SELECT version, created_at, event, backtrace_id FROM events "
            "WHERE execution_id = $1 AND version >= $2 ORDER BY version LIMIT $3",
            execution_id,
            from_version,
            length,
        )
        result = [ev.StoredEvent(v, dt(t), ev.decode_event(b), bt) for v, t, b, bt in rows]
        if not result and from_version == 0:
            await self.get_summary(execution_id)  # raises NotFound
        return result

    async def get_responses(
        self, execution_id: str, from_cursor: int = 0
    ) -> list[ev.StoredResponse]:
        rows = await self._fetch(
            "SELECT cursor, created_at, response FROM responses "
            "WHERE execution_id = $1 AND cursor > $2 ORDER BY cursor",
            execution_id,
            from_cursor,
        )
        return [ev.StoredResponse(c, dt(t), ev.decode_response(b)) for c, t, b in rows]

    async def get_row(self, execution_id: str) -> ExecutionRow:
        rows = await self._fetch(
            f"SELECT {_ROW_COLUMNS} FROM executions WHERE execution_id = $1", execution_id
        )
        if not rows:
            raise NotFound(f"execution {execution_id} not found")
        return _row(rows[0])

    async def list_executions(self, flt: ListFilter) -> list[ExecutionRow]:
        where, args = _list_where(flt)
        n = len(args)
        sql = (
            f"SELECT {_ROW_COLUMNS} FROM executions{where} ORDER BY {_ORDER_BY[flt.order]} "
            f"LIMIT ${n + 1} OFFSET ${n + 2}"
        )
        result = [_row(r) for r in await self._fetch(sql, *args, flt.limit, flt.offset)]
        if flt.with_extras and result:
            result = await self.with_extras(result)
        return result

    async def count_executions(self, flt: ListFilter) -> int:
        where, args = _list_where(flt)
        rows = await self._fetch(f"SELECT count(*) FROM executions{where}", *args)
        return int(rows[0][0]) if rows else 0

    async def with_extras(self, rows: list[ExecutionRow]) -> list[ExecutionRow]:
        ids = [r.execution_id for r in rows]
        children = {
            r[0]: int(r[1])
            for r in await self._fetch(
                "SELECT parent_id, count(*) FROM executions WHERE parent_id = ANY($1::text[]) "
                "GROUP BY parent_id",
                ids,
            )
        }
        last = {
            r[0]: event_type(r[1])
            for r in await self._fetch(
                "SELECT e.execution_id, e.event FROM events e JOIN unnest($1::text[], $2::int[]) "
                "AS u(id, v) ON e.execution_id = u.id AND e.version = u.v",
                ids,
                [r.next_version - 1 for r in rows],
            )
        }
        return [
            dataclasses.replace(
                r, children=children.get(r.execution_id, 0), last_event=last.get(r.execution_id)
            )
            for r in rows
        ]

    async def unfinished_executions(
        self, ffqns: Sequence[str] | None = None, *, pinned_only: bool = False
    ) -> list[UnfinishedExecution]:
        if ffqns is not None and not ffqns:
            return []
        sql = "SELECT execution_id, ffqn, pinned_digest FROM executions WHERE "
        args: list[Any] = []
        if pinned_only:
            sql += "pinned_digest IS NOT NULL AND state != 'finished'"
        else:
            sql += "state != 'finished'"
        if ffqns is not None:
            args.append(list(ffqns))
            sql += " AND ffqn = ANY($1::text[])"
        rows = await self._fetch(sql, *args)
        return sorted(UnfinishedExecution(e, f, d) for e, f, d in rows)

    async def count_by_state(self) -> dict[str, int]:
        rows = await self._fetch("SELECT state, count(*) FROM executions GROUP BY state")
        return {state: int(count) for state, count in rows}

    async def get_logs(
        self, execution_id: str, after_id: int = 0, limit: int = 1000
    ) -> list[StoredLog]:
        rows = await self._fetch(
            "SELECT id, execution_id, run_id, created_at, level, stream, message FROM logs "
            "WHERE execution_id = $1 AND id > $2 ORDER BY id LIMIT $3",
            execution_id,
            after_id,
            limit,
        )
        return [StoredLog(i, e, r, dt(t), lv, s, m) for i, e, r, t, lv, s, m in rows]

    # -- backtraces and component sources ---------------------------------------------------
    async def get_backtrace(self, execution_id: str, version: int) -> Backtrace | None:
        rows = await self._fetch(
            "SELECT b.backtrace_id, b.component_digest, b.frames FROM events e "
            "JOIN backtraces b ON b.backtrace_id = e.backtrace_id "
            "WHERE e.execution_id = $1 AND e.version = $2",
            execution_id,
            version,
        )
        if rows:
            backtrace_id, digest, blob = rows[0]
            return Backtrace(int(backtrace_id), digest, frames_decoder.decode(blob))
        await self.get_summary(execution_id)  # NotFound for an unknown execution
        return None

    async def replace_backtraces(
        self,
        execution_id: str,
        component_digest: str,
        backtraces: Sequence[tuple[int, list[Frame]]],
        below_version: int,
    ) -> int:
        prepared = prepare_backtraces(component_digest, backtraces)
        return await self._write(
            lambda c, n: _replace_backtraces(c, execution_id, prepared, below_version),
            (execution_id,),
        )

    async def save_component_sources(self, sources: Sequence[ComponentSource]) -> None:
        if not sources:
            return

        async def tx(c: _Conn, n: Notes) -> None:
            await c.write(
                "INSERT INTO component_sources (digest, file, source) "
                "SELECT * FROM unnest($1::text[], $2::text[], $3::text[]) "
                "ON CONFLICT (digest) DO NOTHING",
                [s.digest for s in sources],
                [s.file for s in sources],
                [s.source for s in sources],
            )

        await self._write(tx)

    async def get_component_source(self, digest: str) -> ComponentSource | None:
        rows = await self._fetch(
            "SELECT digest, file, source FROM component_sources WHERE digest = $1", digest
        )
        return ComponentSource(*rows[0]) if rows else None

    # -- waiting ------------------------------------------------------------------------------
    async def wait_for_finished(
        self, execution_id: str, timeout: float | None = None
    ) -> ev.ExecutionResult:
        fut = self.notifier.result_future(execution_id)
        try:
            s = await self._get_summary_batched(execution_id)
            if s.result is not None:
                return s.result
            self._ensure_finished_poller()
            try:
                return await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                raise TimeoutError(f"execution {execution_id} did not finish in time") from None
        finally:
            self.notifier.drop_result_future(execution_id, fut)

    def _get_summary_batched(self, execution_id: str) -> asyncio.Future[ExecutionSummary]:
        """`get_summary`, with the reads asked for in one loop iteration done as one query."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ExecutionSummary] = loop.create_future()
        if not self._summary_reads:
            loop.call_soon(self._start_summary_reads)
        self._summary_reads.setdefault(execution_id, []).append(fut)
        return fut

    def _start_summary_reads(self) -> None:
        reads, self._summary_reads = self._summary_reads, {}
        self._spawn(self._read_summaries(reads))

    async def _read_summaries(
        self, reads: dict[str, list[asyncio.Future[ExecutionSummary]]]
    ) -> None:
        ids = list(reads)
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            try:
                rows = await self._fetch(
                    "SELECT execution_id, summary FROM executions "
                    "WHERE execution_id = ANY($1::text[])",
                    chunk,
                )
            except Exception as e:
                for execution_id in ids[i:]:
                    for fut in reads[execution_id]:
                        if not fut.done():
                            fut.set_exception(e)
                return
            found = {r[0]: r[1] for r in rows}
            for execution_id in chunk:
                blob = found.get(execution_id)
                summary = None if blob is None else summary_decoder.decode(blob)
                for fut in reads[execution_id]:
                    if fut.done():
                        continue
                    if summary is None:
                        fut.set_exception(NotFound(f"execution {execution_id} not found"))
                    else:
                        fut.set_result(summary)

    def _ensure_finished_poller(self) -> None:
        if self._finished_poller is None or self._finished_poller.done():
            self._finished_poller = asyncio.create_task(
                self._poll_finished(), name="pg-finished-recheck"
            )

    async def _poll_finished(self) -> None:
        """The safety net under the `f` notifications: while anyone waits for a result,
        re-check the awaited executions now and then, in one query per 500."""
        while True:
            await asyncio.sleep(self.FINISHED_RECHECK_INTERVAL)
            ids = self.notifier.awaited_results()
            if not ids:
                return
            await self._announce_finished(ids)

    async def wait_for_response(
        self, execution_id: str, after_cursor: int, timeout: float
    ) -> list[ev.StoredResponse]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            event = self.notifier.response_event(execution_id)
            try:
                found = await self.get_responses(execution_id, after_cursor)
                remaining = deadline - loop.time()
                if found or remaining <= 0:
                    return found
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        event.wait(), min(remaining, self.RESPONSE_RECHECK_INTERVAL)
                    )
            finally:
                self.notifier.drop_response_event(execution_id, event)

    async def wait_for_pending(self, ffqns: Sequence[str], timeout: float) -> None:
        await self.notifier.wait_pending(ffqns, timeout)

    def open_inbox(self, execution_id: str) -> ResponseInbox:
        return self.notifier.open_inbox(execution_id)

    def close_inbox(self, execution_id: str, inbox: ResponseInbox) -> None:
        self.notifier.close_inbox(execution_id, inbox)

    def subscribe_cancellations(self) -> Notifier:
        return self.notifier

    def changes(self) -> Notifier:
        return self.notifier


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


# ---------------------------------------------------------------------------------------
# Batches: one physical transaction, one NOTIFY
# ---------------------------------------------------------------------------------------


async def _run_batch(conn: asyncpg.Connection, batch: list[_Tx], ident: _Ident) -> list[Outcome]:
    """Run a batch of logical transactions as one physical transaction.

    First without savepoints. A logical transaction that raises before it wrote anything
    (a version conflict, an illegal transition: the usual failures) leaves nothing to
    undo and the others go on. One that fails after writing (or with an SQL error, which
    aborts the transaction) makes the batch roll back and run again with a SAVEPOINT per
    logical transaction (they are functions of the database, so running again is fine).
    """
    outcomes = await _run_plain(conn, batch, ident)
    if outcomes is not None:
        return outcomes
    return await _run_savepoints(conn, batch, ident)


async def _run_plain(
    conn: asyncpg.Connection, batch: list[_Tx], ident: _Ident
) -> list[Outcome] | None:
    outcomes: list[Outcome] = []
    await conn.execute("BEGIN")
    await _prelock(conn, batch)
    for tx in batch:
        notes = Notes()
        c = _Conn(conn)
        try:
            value = await tx.fn(c, notes)
        except Exception as e:
            if is_connection_error(e):
                raise
            if not c.wrote and not isinstance(e, asyncpg.PostgresError):
                outcomes.append((False, e, notes))
                continue
            await _rollback(conn)
            if len(batch) > 1:
                return None
            return [(False, e, notes)]
        outcomes.append((True, value, notes))
    try:
        await _commit(conn, outcomes, ident)
    except asyncpg.PostgresError as e:  # the transaction is gone; the statement was ours
        await _rollback(conn)
        if len(batch) > 1:
            return None
        return [(False, e, Notes())]
    return outcomes


async def _run_savepoints(
    conn: asyncpg.Connection, batch: list[_Tx], ident: _Ident
) -> list[Outcome]:
    outcomes: list[Outcome] = []
    await conn.execute("BEGIN")
    await _prelock(conn, batch)
    for tx in batch:
        notes = Notes()
        await conn.execute("SAVEPOINT tx")
        try:
            value = await tx.fn(_Conn(conn), notes)
        except Exception as e:
            if is_connection_error(e):
                raise
            await conn.execute("ROLLBACK TO SAVEPOINT tx")
            await conn.execute("RELEASE SAVEPOINT tx")
            outcomes.append((False, e, notes))
        else:
            await conn.execute("RELEASE SAVEPOINT tx")
            outcomes.append((True, value, notes))
    try:
        await _commit(conn, outcomes, ident)
    except asyncpg.PostgresError as e:
        await _rollback(conn)
        if len(batch) == 1:
            return [(False, e, Notes())]
        results: list[Outcome] = []
        for tx in batch:  # each alone: one bad transaction cannot fail the others
            results += await _run_savepoints(conn, [tx], ident)
        return results
    return outcomes


async def _prelock(conn: asyncpg.Connection, batch: list[_Tx]) -> None:
    """Lock every row the batch's transactions will lock, in one statement and in id
    order. Batches of different processes otherwise lock rows in their own orders (a
    child's row, then its parent's) and deadlock, which PostgreSQL resolves only after
    `deadlock_timeout` (1 s) of stall; in one global order they just wait their turn."""
    keys = sorted({k for tx in batch for k in tx.keys})
    if keys:
        await conn.execute(
            "SELECT 1 FROM executions WHERE execution_id = ANY($1::text[]) "
            "ORDER BY execution_id FOR UPDATE",
            keys,
        )


def _with_parent(execution_id: str) -> tuple[str, ...]:
    """The execution and its parent (whose row a `finished` answers)."""
    try:
        parent = ExecutionId.parse(execution_id).parent()
    except IdError:
        return (execution_id,)
    return (execution_id,) if parent is None else (execution_id, str(parent[0]))


async def _commit(conn: asyncpg.Connection, outcomes: list[Outcome], ident: _Ident) -> None:
    """NOTIFY what the committed transactions changed (nothing when none succeeded),
    note the transaction id, COMMIT.

    The id lets the writer find out, after a connection lost during COMMIT, whether the
    batch is in the database (then its callers are acknowledged, not run again)."""
    if not any(ok for ok, _, _ in outcomes):  # nothing changed: nobody to tell
        xid = await conn.fetchval("SELECT pg_current_xact_id()::text")
        return await _commit_noting(conn, outcomes, str(xid))
    payload = RemoteNotes()
    for ok, _, notes in outcomes:
        if ok:
            payload.add(notes)
    chunks = payload.chunks(ident.sender)
    for chunk in chunks[:-1]:
        await conn.execute("SELECT pg_notify($1, $2)", ident.channel, chunk)
    xid = await conn.fetchval(
        "SELECT pg_current_xact_id()::text FROM pg_notify($1, $2)", ident.channel, chunks[-1]
    )
    await _commit_noting(conn, outcomes, str(xid))


async def _commit_noting(conn: asyncpg.Connection, outcomes: list[Outcome], xid: str) -> None:
    """COMMIT; a connection lost meanwhile leaves it to be asked whether `xid` committed."""
    try:
        await conn.execute("COMMIT")
    except Exception as e:
        if is_connection_error(e):
            raise _CommitUnknown(xid, outcomes, e) from e
        raise


async def _rollback(conn: asyncpg.Connection) -> None:
    try:
        await conn.execute("ROLLBACK")
    except Exception as e:
        if is_connection_error(e):
            raise


def _translate(e: Exception) -> Exception:
    if isinstance(e, StorageError):
        return e
    if isinstance(e, IllegalAppend):
        return Conflict(str(e))
    if is_disk_full(e):  # DiskFullError (SQLSTATE 53100)
        return write_error(e)
    if isinstance(e, asyncpg.PostgresError):
        return StorageError(f"database error: {first_line(e)}")
    return e


# ---------------------------------------------------------------------------------------
# Logical transactions
# ---------------------------------------------------------------------------------------


async def _load_for_update(c: _Conn, execution_id: str) -> tuple[ExecutionSummary, int]:
    """The summary and `updated_at` (µs), the row locked until the commit: appends to one
    execution are serialised here, whichever process makes them."""
    row = await c.row(
        "SELECT summary, updated_at FROM executions WHERE execution_id = $1 FOR UPDATE",
        execution_id,
    )
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    return summary_decoder.decode(row[0]), int(row[1])


_UPDATE_SUMMARY = (
    "UPDATE executions SET state = $2, pending_at = $3, lock_expires_at = $4, "
    "next_version = $5, updated_at = $6, summary = $7 WHERE execution_id = $1"
)


async def _write_summary(
    c: _Conn,
    execution_id: str,
    s: ExecutionSummary,
    at: datetime,
    events: Sequence[tuple[int, int, bytes, int | None]] = (),
) -> None:
    """The new summary and the events (version, created_at, blob, backtrace id): one
    statement, one round trip."""
    state, pending_at, lock_expires_at = projection(s)
    args: list[Any] = [
        execution_id,
        state,
        pending_at,
        lock_expires_at,
        s.next_version,
        us(at),
        ev.encode(s),
    ]
    if not events:
        await c.write(_UPDATE_SUMMARY, *args)
        return
    await c.write(
        f"WITH u AS ({_UPDATE_SUMMARY}) "
        "INSERT INTO events (execution_id, version, created_at, event, backtrace_id) "
        "SELECT $1, v, t, e, b FROM unnest($8::int[], $9::bigint[], $10::bytea[], $11::bigint[]) "
        "AS x(v, t, e, b)",
        *args,
        [e[0] for e in events],
        [e[1] for e in events],
        [e[2] for e in events],
        [e[3] for e in events],
    )


async def _create_many(
    c: _Conn, notes: Notes, requests: Sequence[CreateRequest], now: datetime
) -> None:
    """Insert executions and their `created` events in one statement; an id that exists
    already is fine with the same FFQN and params (idempotent), a Conflict otherwise."""
    unique: dict[str, CreateRequest] = {}
    for req in requests:
        seen = unique.get(req.execution_id)
        if seen is None:
            unique[req.execution_id] = req
        elif (seen.created.ffqn, seen.created.params) != (req.created.ffqn, req.created.params):
            raise Conflict(f"execution {req.execution_id} already exists with other parameters")
    if not unique:
        return
    t = us(now)
    cols: list[list[Any]] = [[] for _ in range(11)]
    locked: dict[str, tuple[DirectLock, ExecutionSummary]] = {}
    for req in unique.values():
        created = req.created
        s = created_summary(created, now)
        lock_blob: bytes | None = None
        if req.lock is not None:
            try:
                s = apply_event(s, req.lock.locked, now)
                locked[req.execution_id] = (req.lock, s)
                lock_blob = ev.encode(req.lock.locked)
            except IllegalAppend:  # not due yet: created pending
                notes.direct.append((req.lock, None))
        state, pending_at, lock_expires_at = projection(s)
        for col, value in zip(
            cols,
            (
                req.execution_id,
                created.ffqn,
                created.component_id.type,
                created.parent[0] if created.parent else None,
                state,
                pending_at,
                lock_expires_at,
                ev.encode(s),
                ev.encode(created),
                s.next_version,
                lock_blob,
            ),
            strict=True,
        ):
            col.append(value)
    inserted = await c.write_rows(
        "WITH x AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], "
        "$5::text[], $6::bigint[], $7::bigint[], $8::bytea[], $9::bytea[], $10::int[], "
        "$11::bytea[]) AS x(id, ffqn, ctype, parent, state, pending_at, lock_expires_at, "
        "summary, created, next_version, locked)), "
        "ins AS (INSERT INTO executions (execution_id, ffqn, component_type, parent_id, state, "
        "pending_at, lock_expires_at, next_version, created_at, updated_at, summary) "
        "SELECT id, ffqn, ctype, parent, state, pending_at, lock_expires_at, next_version, "
        "$12, $12, summary FROM x ON CONFLICT (execution_id) DO NOTHING RETURNING execution_id), "
        "evs AS (INSERT INTO events (execution_id, version, created_at, event) "
        "SELECT x.id, 0, $12, x.created FROM x JOIN ins ON ins.execution_id = x.id "
        "UNION ALL SELECT x.id, 1, $12, x.locked FROM x JOIN ins ON ins.execution_id = x.id "
        "WHERE x.locked IS NOT NULL) "
        "SELECT execution_id FROM ins",
        *cols,
        t,
    )
    done = {r[0] for r in inserted}
    for execution_id in done:
        if execution_id in locked:
            lock, s = locked[execution_id]
            notes.direct.append((lock, direct_locked(unique[execution_id], lock, s)))
        else:
            created = unique[execution_id].created
            notes.became_pending(created.ffqn, created.scheduled_at, now)
    for execution_id, (lock, _) in locked.items():
        if execution_id not in done:  # it existed already: not locked here
            notes.direct.append((lock, None))
    existing = [eid for eid in unique if eid not in done]
    if not existing:
        return
    rows = await c.rows(
        "SELECT execution_id, event FROM events WHERE version = 0 "
        "AND execution_id = ANY($1::text[])",
        existing,
    )
    found = {r[0]: r[1] for r in rows}
    for execution_id in existing:
        blob = found.get(execution_id)
        if blob is None:
            raise StorageError(f"execution {execution_id} exists without its created event")
        old = ev.decode_event(blob)
        assert isinstance(old, ev.Created)
        new = unique[execution_id].created
        if (old.ffqn, old.params) != (new.ffqn, new.params):
            raise Conflict(f"execution {execution_id} already exists with other parameters")


async def _lock_pending(
    c: _Conn,
    notes: Notes,
    ffqns: list[str],
    batch_size: int,
    now: datetime,
    locked: ev.Locked,
    with_log: bool,
    pinned_digest: str | None,
) -> list[LockedExecution]:
    if not ffqns or batch_size <= 0:
        return []
    pin = "e.pinned_digest IS NULL" if pinned_digest is None else "e.pinned_digest = $4"
    args: list[Any] = [ffqns, us(now), batch_size]
    if pinned_digest is not None:
        args.append(pinned_digest)
    # SKIP LOCKED: rows another process's batch is locking right now are left to it.
    rows = await c.rows(
        "SELECT e.execution_id, e.summary, e.updated_at, cr.event FROM executions e "
        "JOIN events cr ON cr.execution_id = e.execution_id AND cr.version = 0 "
        f"WHERE e.ffqn = ANY($1::text[]) AND e.pending_at <= $2 AND {pin} "
        "ORDER BY e.pending_at LIMIT $3 FOR UPDATE OF e SKIP LOCKED",
        *args,
    )
    if not rows:
        return []
    event_blob = ev.encode(locked)
    ids: list[str] = []
    summaries: list[ExecutionSummary] = []
    ats: list[int] = []
    cols: list[list[Any]] = [[] for _ in range(6)]
    for execution_id, blob, updated_at, _ in rows:
        at = not_before(now, updated_at)
        s = apply_event(summary_decoder.decode(blob), locked, at)
        state, pending_at, lock_expires_at = projection(s)
        ids.append(execution_id)
        summaries.append(s)
        ats.append(us(at))
        for col, value in zip(
            cols,
            (state, pending_at, lock_expires_at, s.next_version, us(at), ev.encode(s)),
            strict=True,
        ):
            col.append(value)
    await c.write(
        "WITH x AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], "
        "$5::int[], $6::bigint[], $7::bytea[]) AS x(id, state, pending_at, lock_expires_at, "
        "next_version, updated_at, summary)), "
        "u AS (UPDATE executions e SET state = x.state, pending_at = x.pending_at, "
        "lock_expires_at = x.lock_expires_at, next_version = x.next_version, "
        "updated_at = x.updated_at, summary = x.summary FROM x WHERE e.execution_id = x.id) "
        "INSERT INTO events (execution_id, version, created_at, event) "
        "SELECT id, next_version - 1, updated_at, $8 FROM x",
        ids,
        *cols,
        event_blob,
    )
    events_of: dict[str, list[ev.StoredEvent]] = {}
    responses_of: dict[str, list[ev.StoredResponse]] = {}
    if with_log:
        for eid, v, t, b, bt in await c.rows(
            "SELECT execution_id, version, created_at, event, backtrace_id FROM events "
            "WHERE execution_id = ANY($1::text[]) ORDER BY execution_id, version",
            ids,
        ):
            events_of.setdefault(eid, []).append(ev.StoredEvent(v, dt(t), ev.decode_event(b), bt))
        for eid, cur, t, b in await c.rows(
            "SELECT execution_id, cursor, created_at, response FROM responses "
            "WHERE execution_id = ANY($1::text[]) ORDER BY execution_id, cursor",
            ids,
        ):
            responses_of.setdefault(eid, []).append(
                ev.StoredResponse(cur, dt(t), ev.decode_response(b))
            )
    result: list[LockedExecution] = []
    for (execution_id, _, _, created_blob), s in zip(rows, summaries, strict=True):
        created = ev.decode_event(created_blob)
        assert isinstance(created, ev.Created)
        result.append(
            LockedExecution(
                execution_id=execution_id,
                ffqn=created.ffqn,
                params=created.params,
                next_version=s.next_version,
                run_id=locked.run_id,
                lock_expires_at=locked.lock_expires_at,
                parent=created.parent,
                summary=s,
                events=events_of.get(execution_id, []) if with_log else None,
                responses=responses_of.get(execution_id, []) if with_log else None,
            )
        )
    return result


async def _append(
    c: _Conn,
    notes: Notes,
    execution_id: str,
    expected_version: int,
    events: list[ev.Event],
    now: datetime,
    extras: AppendExtras | None,
    backtraces: Sequence[PreparedBacktrace] = (),
) -> ExecutionSummary:
    s, updated_at = await _load_for_update(c, execution_id)
    now = not_before(now, updated_at)
    if s.next_version != expected_version:
        raise VersionConflict(
            f"execution {execution_id}: expected version {expected_version}, "
            f"but the next version is {s.next_version}"
        )
    creates = {r.execution_id: r for r in (extras.creates if extras else [])}
    # Validate everything first (pure): a rejected append writes nothing at all.
    to_create: list[CreateRequest] = []
    delays: list[tuple[str, str, int]] = []
    due_delays: list[ev.DelayFinished] = []
    finished: ev.ExecutionResult | None = None
    states: list[ExecutionSummary] = []
    for event in events:
        try:
            s = apply_event(s, event, now)
        except IllegalAppend as e:
            raise Conflict(f"execution {execution_id}: {e}") from None
        match event:
            case ev.HistoryEvent(event=ev.JoinSetRequest(join_set_id=js, request=req)):
                if isinstance(req, ev.ChildExecutionRequest):
                    to_create.append(_creation(creates, req.child_execution_id))
                elif req.expires_at <= now:
                    # Already due (e.g. a clock read): answered in the same transaction.
                    response = ev.DelayFinished(req.delay_id, js, "ok")
                    try:
                        s = apply_response(s, response, now)
                    except IllegalAppend as e:
                        raise Conflict(f"execution {execution_id}: {e}") from None
                    due_delays.append(response)
                    notes.responses.add(execution_id)
                else:
                    delays.append((req.delay_id, js, us(req.expires_at)))
            case ev.HistoryEvent(event=ev.Schedule(execution_id=scheduled)):
                to_create.append(_creation(creates, scheduled))
            case ev.Finished(result=result):
                finished = result
                notes.finished.append((execution_id, result))
            case ev.CancellationRequested():
                notes.cancelled.add(execution_id)
            case _:
                pass
        states.append(s)
    backtrace_of = await _backtrace_ids(c, backtraces)
    t = us(now)
    first = expected_version
    rows = [(first + i, t, ev.encode(event), backtrace_of.get(i)) for i, event in enumerate(events)]
    await _write_summary(c, execution_id, s, now, rows)
    if to_create:
        await _create_many(c, notes, to_create, now)
    if delays:
        await c.write(
            "INSERT INTO delays (delay_id, execution_id, join_set_id, expires_at) "
            "SELECT d, $1, j, x FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(d, j, x)",
            execution_id,
            [d[0] for d in delays],
            [d[1] for d in delays],
            [d[2] for d in delays],
        )
    if due_delays:
        # The cursors the summary counted: the last len(due_delays) ones.
        first_cursor = s.responses - len(due_delays) + 1
        notes.response_items += [
            (execution_id, ev.StoredResponse(first_cursor + i, dt(t), d))
            for i, d in enumerate(due_delays)
        ]
        await c.write(
            "INSERT INTO responses (execution_id, cursor, created_at, source_id, response) "
            "SELECT $1, c, $2, src, r FROM unnest($3::int[], $4::text[], $5::bytea[]) "
            "AS u(c, src, r)",
            execution_id,
            t,
            list(range(first_cursor, s.responses + 1)),
            [d.delay_id for d in due_delays],
            [ev.encode(d) for d in due_delays],
        )
    if finished is not None:
        if s.is_workflow:  # only workflows have delays
            await c.write("DELETE FROM delays WHERE execution_id = $1", execution_id)
        parent = ExecutionId.parse(execution_id).parent()
        if parent is not None:
            parent_id, join_set = parent
            await _add_response(
                c,
                notes,
                str(parent_id),
                ev.ChildExecutionFinished(
                    execution_id, str(join_set), s.next_version - 1, finished
                ),
                now,
            )
    if isinstance(s.state, PendingAt):
        notes.became_pending(s.ffqn, s.state.scheduled_at, now)
    if s.cancelling:
        notes.cancelling.add(execution_id)
    if extras and extras.logs:
        await _insert_logs(c, execution_id, extras.run_id, extras.logs, now)
    return s


def _creation(creates: dict[str, CreateRequest], execution_id: str) -> CreateRequest:
    req = creates.get(execution_id)
    if req is None:
        raise StorageError(f"missing creation request for {execution_id}")
    return req


async def _add_response(
    c: _Conn, notes: Notes, execution_id: str, response: ev.Response, now: datetime
) -> ExecutionSummary:
    """A response to `execution_id` (locked here), at `now` or just after its last write;
    a second response from the same child or delay is a Conflict."""
    s, updated_at = await _load_for_update(c, execution_id)
    at = not_before(now, updated_at)
    source = response_source(response)
    try:
        s = apply_response(s, response, at)
    except IllegalAppend as e:
        raise Conflict(f"execution {execution_id}: {e}") from None
    state, pending_at, lock_expires_at = projection(s)
    delete_delay = (
        "d AS (DELETE FROM delays WHERE delay_id = $12 AND EXISTS (SELECT 1 FROM r)), "
        if isinstance(response, ev.DelayFinished)
        else ""
    )
    args: list[Any] = [
        execution_id,
        s.responses,
        us(at),
        source,
        ev.encode(response),
        state,
        pending_at,
        lock_expires_at,
        s.next_version,
        us(at),
        ev.encode(s),
    ]
    if delete_delay:
        args.append(response.delay_id)  # type: ignore[union-attr]
    # One statement: insert unless duplicate, then the delay and summary only if inserted.
    # A duplicate (watchers of several processes answering one delay) changes nothing, so
    # it counts as no write: the batch goes on without a rollback.
    row = await c.row(
        "WITH r AS (INSERT INTO responses (execution_id, cursor, created_at, source_id, "
        "response) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING 1), "
        + delete_delay
        + "u AS (UPDATE executions SET state = $6, pending_at = $7, lock_expires_at = $8, "
        "next_version = $9, updated_at = $10, summary = $11 "
        "WHERE execution_id = $1 AND EXISTS (SELECT 1 FROM r)) "
        "SELECT count(*) FROM r",
        *args,
    )
    if row is None or row[0] == 0:
        raise Conflict(f"execution {execution_id} already has a response for {source}")
    c.wrote = True
    notes.responses.add(execution_id)
    stored = ev.StoredResponse(s.responses, dt(us(at)), response)
    notes.response_items.append((execution_id, stored))
    if isinstance(s.state, PendingAt):
        notes.became_pending(s.ffqn, s.state.scheduled_at, at)
    if s.cancelling:
        notes.cancelling.add(execution_id)
    return s


async def _insert_logs(
    c: _Conn, execution_id: str, run_id: str | None, lines: Sequence[LogLine], now: datetime
) -> None:
    await c.write(
        "INSERT INTO logs (execution_id, run_id, created_at, level, stream, message) "
        "SELECT $1, $2, t, l, s, m FROM unnest($3::bigint[], $4::text[], $5::text[], "
        "$6::text[]) WITH ORDINALITY AS u(t, l, s, m, n) ORDER BY n",
        execution_id,
        run_id,
        [us(line.written_at(now)) for line in lines],
        [line.level for line in lines],
        [line.stream for line in lines],
        [line.message for line in lines],
    )


async def _backtrace_ids(c: _Conn, backtraces: Sequence[PreparedBacktrace]) -> dict[int, int]:
    """`at` → backtrace id, each distinct stack looked up (and inserted if new) once."""
    by_key: dict[bytes, int] = {}
    out: dict[int, int] = {}
    for bt in backtraces:
        found = by_key.get(bt.key)
        if found is None:
            found = by_key[bt.key] = await _backtrace_id(c, bt)
        out[bt.at] = found
    return out


async def _backtrace_id(c: _Conn, bt: PreparedBacktrace) -> int:
    row = await c.row("SELECT backtrace_id FROM backtraces WHERE hash = $1", bt.key)
    if row is None:
        row = await c.row(
            "INSERT INTO backtraces (hash, component_digest, frames) VALUES ($1, $2, $3) "
            "ON CONFLICT (hash) DO NOTHING RETURNING backtrace_id",
            bt.key,
            bt.component_digest,
            bt.frames,
        )
        if row is not None:
            c.wrote = True
        else:  # another process inserted it meanwhile: read it in a fresh snapshot
            row = await c.row("SELECT backtrace_id FROM backtraces WHERE hash = $1", bt.key)
    assert row is not None
    return int(row[0])


async def _replace_backtraces(
    c: _Conn, execution_id: str, backtraces: Sequence[PreparedBacktrace], below_version: int
) -> int:
    await _load_for_update(c, execution_id)  # NotFound
    await c.write(
        "UPDATE events SET backtrace_id = NULL "
        "WHERE execution_id = $1 AND version < $2 AND backtrace_id IS NOT NULL",
        execution_id,
        below_version,
    )
    ids = await _backtrace_ids(c, [bt for bt in backtraces if bt.at < below_version])
    if not ids:
        return 0
    status = await c.write(
        "UPDATE events e SET backtrace_id = u.b FROM unnest($2::int[], $3::bigint[]) AS u(v, b) "
        "WHERE e.execution_id = $1 AND e.version = u.v",
        execution_id,
        list(ids),
        list(ids.values()),
    )
    return int(status.split()[-1])


async def _cancel_delay(c: _Conn, notes: Notes, delay_id: str, now: datetime) -> ExecutionSummary:
    """`delay_finished(cancelled)` to the owner of a live delay (SPEC §8)."""
    row = await c.row("SELECT execution_id, join_set_id FROM delays WHERE delay_id = $1", delay_id)
    if row is None:
        try:
            owner = str(DelayId.parse(delay_id).owner()[0])
        except IdError:
            raise NotFound(f"delay {delay_id} not found") from None
        answered = await c.row(
            "SELECT 1 FROM responses WHERE execution_id = $1 AND source_id = $2", owner, delay_id
        )
        if answered is not None:
            raise Conflict(f"delay {delay_id} has already finished")
        requested = await c.row(
            "SELECT 1 FROM events WHERE execution_id = $1 AND position($2::bytea IN event) > 0 "
            "LIMIT 1",
            owner,
            ev.encode(delay_id),
        )
        if requested is not None:  # its execution finished without it
            raise Conflict(f"delay {delay_id} cannot be cancelled: {owner} is already finished")
        raise NotFound(f"delay {delay_id} not found")
    execution_id, join_set_id = row
    try:
        return await _add_response(
            c, notes, execution_id, ev.DelayFinished(delay_id, join_set_id, "cancelled"), now
        )
    except Conflict:
        # Answered meanwhile by another process (the delay expired there).
        raise Conflict(f"delay {delay_id} has already finished") from None


_ORDER_BY: dict[str, str] = {
    "created_desc": "created_at DESC, execution_id DESC",
    "created_asc": "created_at ASC, execution_id ASC",
    "updated_desc": "updated_at DESC, execution_id DESC",
}


def _list_where(flt: ListFilter) -> tuple[str, list[Any]]:
    """The WHERE clause (with its leading space, or empty) of a list filter, $1…$n."""
    where: list[str] = []
    args: list[Any] = []

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    top = chr(0x10FFFF)  # above every character: the end of a prefix range
    if flt.ffqn_prefix:
        where.append(f"ffqn >= {arg(flt.ffqn_prefix)} AND ffqn < {arg(flt.ffqn_prefix + top)}")
    if flt.states:
        where.append(f"state = ANY({arg(list(flt.states))}::text[])")
    if flt.hide_finished:
        where.append("state != 'finished'")
    if flt.top_level_only:
        where.append("parent_id IS NULL")
    if flt.id_prefix:
        where.append(
            f"execution_id >= {arg(flt.id_prefix)} AND execution_id < {arg(flt.id_prefix + top)}"
        )
    if flt.before_id and flt.before_created_at is not None:
        where.append(
            f"(created_at, execution_id) < ({arg(us(flt.before_created_at))}, {arg(flt.before_id)})"
        )
    elif flt.before_id:
        where.append(
            "(created_at, execution_id) < (SELECT created_at, execution_id FROM executions "
            f"WHERE execution_id = {arg(flt.before_id)})"
        )
    return (" WHERE " + " AND ".join(where) if where else ""), args


_ROW_COLUMNS = "execution_id, ffqn, component_type, parent_id, created_at, updated_at, summary"


def _row(row: Any) -> ExecutionRow:
    execution_id, ffqn, component_type, parent_id, created_at, updated_at, blob = row
    return execution_row(
        execution_id,
        ffqn,
        component_type,
        parent_id,
        created_at,
        updated_at,
        summary_decoder.decode(blob),
    )


__all__ = [
    "DATABASE_URL_ENV",
    "SCHEMA_VERSION",
    "PostgresStorage",
    "PostgresTarget",
    "dsn_from_parts",
    "parse_dsn",
]
