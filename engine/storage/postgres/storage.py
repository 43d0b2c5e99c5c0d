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
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import asyncpg

from engine.core import events as ev
from engine.core.ids import DelayId, IdError
from engine.core.records import Frame, LogLine
from engine.core.state import (
    ExecutionSummary,
)
from engine.storage.common import (
    Notes,
    apply_remote_notes,
    cancel_events,
    check_unpause,
    counts_with_results,
    dt,
    event_type,
    first_line,
    frames_decoder,
    pause_events,
    prepare_backtraces,
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
    ExecutionRow,
    ExecutorLease,
    ExpiredDelay,
    ExpiredLock,
    ListFilter,
    LockedExecution,
    NotFound,
    StorageError,
    StoredLog,
    UnfinishedExecution,
)
from engine.storage.notify import Notifier, ResponseInbox
from engine.storage.postgres.batches import (
    _Conn,
    _Ident,
    _Tx,
    _with_parent,
)
from engine.storage.postgres.leases import PostgresLeases
from engine.storage.postgres.queries import (
    _ORDER_BY,
    _ROW_COLUMNS,
    _list_where,
    _row,
)
from engine.storage.postgres.schema import _clock_skew, _close_quietly, _migrate, _server_settings
from engine.storage.postgres.target import (
    PostgresTarget,
    _start_error,
    is_connection_error,
    parse_dsn,
)
from engine.storage.postgres.transactions import (
    _add_response,
    _append,
    _cancel_delay,
    _create_many,
    _insert_logs,
    _load_for_update,
    _lock_pending,
    _replace_backtraces,
)
from engine.storage.postgres.writer import _GroupCommit

log = logging.getLogger("obelisk.storage")
T = TypeVar("T")


# ---------------------------------------------------------------------------------------
# The storage
# ---------------------------------------------------------------------------------------


class PostgresStorage(_GroupCommit):
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
        #: Which executors are alive (`engine.storage.postgres.leases`).
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

    # -- executor liveness (advisory locks: `engine.storage.postgres.leases`) -----------------
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

    async def count_by_state(self, *, results: bool = False) -> dict[str, int]:
        if not results:
            rows = await self._fetch("SELECT state, count(*) FROM executions GROUP BY state")
            return {state: int(count) for state, count in rows}
        rows = await self._fetch(
            "SELECT state, result_class, count(*) FROM executions GROUP BY 1, 2"
        )
        return counts_with_results([(state, kind, int(n)) for state, kind, n in rows])

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
