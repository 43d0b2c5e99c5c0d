"""SQLite backend: WAL, `synchronous=FULL`, group commit, in-process notifications.

All writes go through one writer thread (`_Writer`, in `.writer`). Callers enqueue
*logical transactions* (plain functions in `.transactions`, run on the writer's
connection); the writer drains the queue and runs everything queued as one physical
transaction. A failing logical transaction is rolled back alone and cannot poison the
batch: the batch then runs again with a SAVEPOINT per logical transaction (`_run_batch`,
in `.batches`; the usual batch, where none fails, needs none). While one batch is being
fsynced, the next one accumulates: concurrency turns into larger commits, not into more
fsyncs. The writer does not wait for the event loop between batches: outcomes and
notifications reach the loop in one callback per batch, in commit order. Readers use a
second connection (aiosqlite) and never block writers.

This module holds `SqliteStorage`, the contract's methods; the package's `__init__` lists
where the rest lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from engine.core import events as ev
from engine.core.records import Frame, LogLine
from engine.core.state import (
    ExecutionSummary,
)
from engine.storage.common import (
    Notes,
    RemoteNotes,
    apply_remote_notes,
    check_unpause,
    counts_with_results,
    dt,
    frames_decoder,
    prepare_backtraces,
    stop_runs_the_log_stops,
    summary_decoder,
    us,
)
from engine.storage.contract import (
    AppendExtras,
    Backtrace,
    ComponentSource,
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
from engine.storage.data_files import DamagedDatabase, is_damage, private_dir, private_file, probe
from engine.storage.leases import ExecutorLeases
from engine.storage.notify import Notifier, ResponseInbox
from engine.storage.sqlite import peers as sqlite_peers
from engine.storage.sqlite.batches import (
    _CallbackReply,
    _EarlyResponses,
    _Outcome,
    _ThreadReply,
    _Tx,
)
from engine.storage.sqlite.peers import PeerBus
from engine.storage.sqlite.queries import (
    _ORDER_BY,
    _ROW_COLUMNS,
    RESULT_CLASS_SQL,
    _event_type,
    _list_where,
    _row,
)
from engine.storage.sqlite.schema import _check_writable, _connect, _migrate, _set_wal
from engine.storage.sqlite.transactions import (
    _add_response,
    _append,
    _append_fn,
    _cancel,
    _cancel_delay,
    _create,
    _insert_logs,
    _load_summary,
    _lock_pending,
    _pause,
    _replace_backtraces,
)
from engine.storage.sqlite.writer import _settle, _Writer

log = logging.getLogger("obelisk.storage")
T = TypeVar("T")
_summary_decoder = summary_decoder
_frames_decoder = frames_decoder
_prepare_backtraces = prepare_backtraces
_us = us
_dt = dt
_Notes = Notes


class SqliteStorage:
    """The embedded default backend. Open with `await SqliteStorage.open(path)`."""

    def __init__(self, path: Path, reader: aiosqlite.Connection, *, observer: bool = False) -> None:
        self.path = path
        self._reader = reader
        self.notifier = Notifier()
        self._writer: _Writer | None = None
        self._finished_poller: asyncio.Task[None] | None = None
        #: Leases of the executors of the processes sharing this file (one host).
        self.leases = ExecutorLeases(Path(f"{path}-executors"))
        self._summary_reads: dict[str, list[asyncio.Future[ExecutionSummary]]] = {}
        self._summary_read_tasks: set[asyncio.Future[None]] = set()
        self._closed = False
        #: Counters for benchmarks: logical transactions and physical commits.
        self.stats = {"logical": 0, "commits": 0, "events": 0}
        #: Wake-ups to and from the other processes sharing the file.
        self.peers = PeerBus(path, self._on_peer_message, observer=observer)
        self._background: set[asyncio.Future[Any]] = set()

    # -- opening ----------------------------------------------------------------
    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], *, max_batch: int = 1000, observer: bool = False
    ) -> SqliteStorage:
        """Open (creating and migrating) the database at `path`. An `observer` mostly
        reads it while another process does the work (a shard of a sharded engine:
        `engine.storage.sharded`): that one keeps writing the way a single process
        does (`PeerBus.has_engine_peers`)."""
        p = Path(path)
        try:
            private_dir(p.parent)
            private_file(p)  # its -wal and -shm get its mode from SQLite
            writer = _Writer(p, asyncio.get_running_loop(), max_batch)
            await writer.start()
        except (OSError, sqlite3.Error) as e:
            raise StorageError(f"cannot open database {p}: {e}") from None
        try:
            await writer.call(lambda c: c.execute("PRAGMA busy_timeout = 10000"))
            await writer.call(probe)  # before anything is written into a damaged file
            await writer.call(lambda c: _set_wal(c, str(p)))
            await writer.call(lambda c: c.execute("PRAGMA synchronous = FULL"))
            await writer.call(lambda c: c.execute("PRAGMA foreign_keys = OFF"))
            await writer.call(lambda c: _migrate(c, str(p)))
            await writer.call(_check_writable)
            # From now on the writer waits for other writers itself (`_begin_write`).
            await writer.call(lambda c: c.execute("PRAGMA busy_timeout = 0"))
            reader = await _connect(p)
        except sqlite3.Error as e:
            await writer.stop()
            if is_damage(e):
                raise DamagedDatabase([p], e) from None
            raise StorageError(f"cannot use database {p}: {e}") from None
        except StorageError:
            await writer.stop()
            raise
        try:
            await reader.execute("PRAGMA busy_timeout = 10000")
            await reader.execute("PRAGMA query_only = ON")
        except sqlite3.Error as e:
            await reader.close()
            await writer.stop()
            if is_damage(e):
                raise DamagedDatabase([p], e) from None
            raise StorageError(f"cannot use database {p}: {e}") from None
        storage = cls(p, reader, observer=observer)
        writer.deliver = storage._deliver  # no batch was queued before this
        writer.urgent = storage._urgent
        writer.post_responses = storage.notifier.post_responses
        writer.early = _EarlyResponses(storage.notifier)
        if storage.peers.open(asyncio.get_running_loop()):
            writer.tell_peers = storage._tell_peers
            writer.shared = storage.peers.has_engine_peers
        storage._writer = writer
        return storage

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # from now on `_write` refuses new transactions
        if self._finished_poller is not None:
            self._finished_poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._finished_poller
        if self._writer is not None:
            # The writer finishes what was queued before the close, then stops: every
            # caller gets its outcome instead of awaiting a future nobody completes.
            await self._writer.stop()
        self.peers.close()
        for task in list(self._background):
            task.cancel()
        self.notifier.close()
        await self._reader.close()

    # -- group commit -------------------------------------------------------------
    async def _write(
        self,
        fn: Callable[[sqlite3.Connection, _Notes], T],
        events: int = 0,
        *,
        optimistic: bool = False,
    ) -> T:
        if self._closed:
            raise StorageError("storage closed")
        writer = self._writer
        if writer is None or not writer.running:
            raise StorageError(f"the writer of database {self.path} is not running")
        fut: asyncio.Future[T] = writer.loop.create_future()
        if not writer.put(_Tx(fn, fut, events, optimistic=optimistic)):
            raise StorageError("storage closed")
        return await fut

    def _deliver(
        self, batch: list[_Tx], outcomes: list[_Outcome], wrote: bool, committed: bool
    ) -> None:
        """On the loop, once per batch, in commit order: notifications, then outcomes."""
        if committed:
            self.stats["commits"] += 1
            self.stats["logical"] += len(batch)
        for tx, (ok, value, notes) in zip(batch, outcomes, strict=True):
            if ok:
                self.stats["events"] += tx.events
                try:
                    self._announce(notes)
                except Exception:  # a waiter's bug must not stop the writer
                    log.exception("notification after commit failed")
            if tx.future is not None:
                _settle(tx.future, ok, value)
        if wrote:  # an idle executor's empty lock_pending is no change to watch
            self.notifier.changed()

    def _urgent(self, batch: list[_Tx], outcomes: list[_Outcome]) -> bool:
        """On the writer thread: whether the loop must get this batch at once (a caller
        or an executor waits there for it), else it may wait a few milliseconds
        (`_Writer._deliver_later`). Looking at the loop's waiters from this thread is
        racy only the harmless way: a waiter added just now learns it that much later."""
        n = self.notifier
        for tx in batch:
            if tx.future is not None:
                return True
        for ok, _, notes in outcomes:
            if not ok:
                continue
            if notes.pending or notes.cancelled or notes.cancelling:
                return True
            if any(delay < 0.1 for delay in notes.pending_later.values()):
                return True
            if any(n.awaits_result(execution_id) for execution_id, _ in notes.finished):
                return True
            if any(n.awaits_response(execution_id) for execution_id in notes.responses):
                return True
        return False

    def _announce(self, notes: _Notes) -> None:
        # (Direct locks are handed over by the writer thread: `_Writer._commit`.)
        for ffqn in notes.pending:
            self.notifier.pending(ffqn)
        for ffqn, delay in notes.pending_later.items():
            self.notifier.pending_later(ffqn, delay)
        for execution_id, result in notes.finished:
            self.notifier.finished(execution_id, result)
        for execution_id in notes.responses:
            # The writer thread posted them to the waiting runs already.
            self.notifier.response(execution_id, posted=True)
        for execution_id in notes.cancelled:
            self.notifier.cancelled(execution_id)
        for execution_id in notes.cancelling:
            self.notifier.cancelling(execution_id)

    # -- other processes sharing the file ----------------------------------------------
    def _tell_peers(self, outcomes: list[_Outcome]) -> None:
        """On the writer thread, after a COMMIT: what it changed, to the other processes."""
        if not self.peers.has_peers():
            return
        payload = RemoteNotes()
        for ok, _, notes in outcomes:
            if ok:
                payload.add(notes)
        # Even with no line: the others' change feeds (the console) learn of the commit.
        self.peers.send(payload.chunks(self.peers.name, sqlite_peers.MAX_DATAGRAM))

    def _on_peer_message(self, payload: str) -> None:
        """On the loop: another process committed."""
        _sender, _, body = payload.partition("\n")
        checks = apply_remote_notes(self.notifier, body)
        # Read back in the same loop iteration: one batched summary read for both.
        if checks.finished:
            self._spawn(self._announce_finished(checks.finished))
        if checks.stops:
            self._spawn(
                stop_runs_the_log_stops(self.notifier, checks.stops, self._get_summary_batched)
            )
        self.notifier.changed()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _announce_finished(self, ids: list[str]) -> None:
        """Local waiters of results another process finished (read together: one query
        per 500, `_get_summary_batched`)."""
        summaries = await asyncio.gather(
            *(self._get_summary_batched(e) for e in ids), return_exceptions=True
        )
        for execution_id, s in zip(ids, summaries, strict=True):
            # (A failed read, e.g. while closing: the re-check poller tries again.)
            if isinstance(s, ExecutionSummary) and s.result is not None:
                self.notifier.finished(execution_id, s.result)

    # -- writes -----------------------------------------------------------------------
    async def create(self, request: CreateRequest, now: datetime) -> None:
        await self._write(lambda c, n: _create(c, n, request, now), optimistic=True)

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
            ),
            optimistic=True,
        )

    async def append(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None = None,
    ) -> ExecutionSummary:
        fn = _append_fn(execution_id, expected_version, events, now, extras)
        return await self._write(fn, len(events), optimistic=True)

    def append_from_thread(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None = None,
        inbox: ResponseInbox | None = None,
    ) -> ExecutionSummary:
        fn = _append_fn(execution_id, expected_version, events, now, extras)
        writer = self._writer
        # (`writer.running` is left to `put`: it refuses once the writer stops taking
        # work, and a writer thread that ends fails whatever is still queued.)
        if self._closed or writer is None:
            raise StorageError("storage closed")
        reply = _ThreadReply(early=inbox is not None)
        depends_on = inbox.uncommitted if inbox is not None else (0, 0)
        if not writer.put(_Tx(fn, None, len(events), reply, execution_id, depends_on, True)):
            raise StorageError("storage closed")
        summary: ExecutionSummary = reply.wait()
        if reply.seq and inbox is not None:
            inbox.note_uncommitted(reply.seq)
        return summary

    def append_then(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None,
        callback: Callable[[bool, Any], None],
    ) -> None:
        fn = _append_fn(execution_id, expected_version, events, now, extras)
        tx = _Tx(fn, None, len(events), _CallbackReply(callback), execution_id, optimistic=True)
        writer = self._writer
        if self._closed or writer is None or not writer.put(tx):  # (`put`: see above)
            callback(False, StorageError("storage closed"))

    async def append_response(
        self, execution_id: str, response: ev.Response, now: datetime
    ) -> None:
        await self._write(
            lambda c, n: _add_response(c, n, execution_id, response, now), optimistic=True
        )

    async def append_upgrade_finished(
        self,
        execution_id: str,
        expected_version: int,
        event: ev.ComponentUpgradeFinished,
        pinned_digest: str | None,
        now: datetime,
    ) -> ExecutionSummary:
        def tx(c: sqlite3.Connection, n: _Notes) -> ExecutionSummary:
            s = _append(c, n, execution_id, expected_version, [event], now, None)
            c.execute(
                "UPDATE executions SET pinned_digest = ? WHERE execution_id = ?",
                (pinned_digest, execution_id),
            )
            return s

        return await self._write(tx)

    async def append_logs(
        self, execution_id: str, run_id: str | None, lines: Sequence[LogLine], now: datetime
    ) -> None:
        if lines:
            await self._write(lambda c, n: _insert_logs(c, execution_id, run_id, lines, now))

    async def pause(self, execution_id: str, now: datetime) -> ExecutionSummary:
        return await self._write(lambda c, n: _pause(c, n, execution_id, now))

    async def unpause(self, execution_id: str, now: datetime) -> ExecutionSummary:
        def tx(c: sqlite3.Connection, n: _Notes) -> ExecutionSummary:
            s = _load_summary(c, execution_id)
            check_unpause(s, execution_id)
            return _append(c, n, execution_id, s.next_version, [ev.Unpaused()], now, None)

        return await self._write(tx)

    async def request_cancellation(
        self, execution_id: str, now: datetime, force: bool = False
    ) -> ExecutionSummary:
        return await self._write(lambda c, n: _cancel(c, n, execution_id, now, force))

    async def cancel_delay(self, delay_id: str, now: datetime) -> ExecutionSummary:
        return await self._write(lambda c, n: _cancel_delay(c, n, delay_id, now))

    async def cancelling_executions(
        self, after_id: str = "", limit: int = 1000
    ) -> list[tuple[str, ExecutionSummary]]:
        rows = await self._reader.execute_fetchall(
            "SELECT execution_id, summary FROM executions WHERE state = 'cancelling' "
            "AND execution_id > ? ORDER BY execution_id LIMIT ?",
            (after_id, limit),
        )
        return [(execution_id, _summary_decoder.decode(blob)) for execution_id, blob in rows]

    # -- timers -------------------------------------------------------------------------
    async def expired_timers(
        self, now: datetime, limit: int = 100
    ) -> tuple[list[ExpiredLock], list[ExpiredDelay]]:
        t = _us(now)
        locks = await self._reader.execute_fetchall(
            "SELECT execution_id, summary FROM executions WHERE lock_expires_at < ? "
            "ORDER BY lock_expires_at LIMIT ?",
            (t, limit),
        )
        delays = await self._reader.execute_fetchall(
            "SELECT delay_id, execution_id, join_set_id FROM delays WHERE expires_at <= ? "
            "ORDER BY expires_at LIMIT ?",
            (t, limit),
        )
        expired_locks = []
        for execution_id, blob in locks:
            s = _summary_decoder.decode(blob)
            expired_locks.append(ExpiredLock(execution_id, s.next_version, s))
        return expired_locks, [ExpiredDelay(e, d, j) for d, e, j in delays]

    async def next_timer_at(self) -> datetime | None:
        rows = await self._reader.execute_fetchall(
            "SELECT min(t) FROM ("
            " SELECT min(lock_expires_at) AS t FROM executions WHERE lock_expires_at IS NOT NULL"
            " UNION ALL SELECT min(expires_at) FROM delays"
            " UNION ALL SELECT min(pending_at) FROM executions WHERE pending_at IS NOT NULL)"
        )
        value = next(iter(rows))[0]
        return None if value is None else _dt(value)

    # -- executor liveness -----------------------------------------------------------------
    def hold_executor_lease(self, executor_id: str) -> ExecutorLease:
        return self.leases.hold(executor_id)

    async def dead_executors(self) -> set[str]:
        return await asyncio.to_thread(self.leases.dead)

    async def held_by_executors(self, executor_ids: set[str]) -> list[ExpiredLock]:
        if not executor_ids:
            return []
        # The run that holds an execution, wherever its state keeps it (not the
        # summary's own `last_lock`, which stays after the run ended).
        rows = await self._reader.execute_fetchall(
            "SELECT execution_id, summary FROM executions "
            "WHERE state IN ('locked', 'blocked_by_join_set', 'pending_at', 'paused', "
            "'cancelling') AND coalesce("
            " json_extract(CAST(summary AS TEXT), '$.underlying.executor_id'),"
            " json_extract(CAST(summary AS TEXT), '$.underlying.blocked_run.executor_id'),"
            " json_extract(CAST(summary AS TEXT), '$.underlying.last_lock.executor_id')"
            ") IN (SELECT value FROM json_each(?))",
            (ev.encode(sorted(executor_ids)).decode(),),
        )
        held = []
        for execution_id, blob in rows:
            summary = _summary_decoder.decode(blob)
            held.append(ExpiredLock(execution_id, summary.next_version, summary))
        return held

    async def forget_executors(self, executor_ids: set[str]) -> None:
        await asyncio.to_thread(self.leases.forget, executor_ids)

    # -- reads -----------------------------------------------------------------------------
    async def get_summary(self, execution_id: str) -> ExecutionSummary:
        rows = await self._reader.execute_fetchall(
            "SELECT summary FROM executions WHERE execution_id = ?", (execution_id,)
        )
        for (blob,) in rows:
            return _summary_decoder.decode(blob)
        raise NotFound(f"execution {execution_id} not found")

    async def get_created(self, execution_id: str) -> ev.Created:
        rows = await self._reader.execute_fetchall(
            "SELECT event FROM events WHERE execution_id = ? AND version = 0", (execution_id,)
        )
        for (blob,) in rows:
            created = ev.decode_event(blob)
            assert isinstance(created, ev.Created)
            return created
        raise NotFound(f"execution {execution_id} not found")

    async def get_events(
        self, execution_id: str, from_version: int = 0, length: int | None = None
    ) -> list[ev.StoredEvent]:
        rows = await self._reader.execute_fetchall(
            "SELECT version, created_at, event, backtrace_id FROM events "
            "WHERE execution_id = ? AND version >= ? ORDER BY version LIMIT ?",
            (execution_id, from_version, -1 if length is None else length),
        )
        result = [ev.StoredEvent(v, _dt(t), ev.decode_event(b), bt) for v, t, b, bt in rows]
        if not result and from_version == 0:
            await self.get_summary(execution_id)  # raises NotFound
        return result

    async def get_responses(
        self, execution_id: str, from_cursor: int = 0
    ) -> list[ev.StoredResponse]:
        rows = await self._reader.execute_fetchall(
            "SELECT cursor, created_at, response FROM responses "
            "WHERE execution_id = ? AND cursor > ? ORDER BY cursor",
            (execution_id, from_cursor),
        )
        return [ev.StoredResponse(c, _dt(t), ev.decode_response(b)) for c, t, b in rows]

    async def get_row(self, execution_id: str) -> ExecutionRow:
        rows = await self._reader.execute_fetchall(
            f"SELECT {_ROW_COLUMNS} FROM executions WHERE execution_id = ?", (execution_id,)
        )
        for row in rows:
            return _row(row)
        raise NotFound(f"execution {execution_id} not found")

    async def list_executions(self, flt: ListFilter) -> list[ExecutionRow]:
        where, args = _list_where(flt)
        sql = f"SELECT {_ROW_COLUMNS} FROM executions{where} ORDER BY {_ORDER_BY[flt.order]}"
        sql += " LIMIT ? OFFSET ?"
        rows = await self._reader.execute_fetchall(sql, [*args, flt.limit, flt.offset])
        result = [_row(r) for r in rows]
        if flt.with_extras and result:
            result = await self.with_extras(result)
        return result

    async def count_executions(self, flt: ListFilter) -> int:
        where, args = _list_where(flt)
        rows = await self._reader.execute_fetchall(f"SELECT count(*) FROM executions{where}", args)
        for (count,) in rows:
            return int(count)
        return 0

    async def with_extras(self, rows: list[ExecutionRow]) -> list[ExecutionRow]:
        ids = [r.execution_id for r in rows]
        marks = ",".join("?" * len(ids))
        children: dict[str, int] = dict(
            await self._reader.execute_fetchall(  # type: ignore[arg-type]
                f"SELECT parent_id, count(*) FROM executions WHERE parent_id IN ({marks}) "
                "GROUP BY parent_id",
                ids,
            )
        )
        pairs = ",".join("(?, ?)" for _ in rows)
        last_args: list[Any] = []
        for r in rows:
            last_args += [r.execution_id, r.next_version - 1]
        last = {
            eid: _event_type(blob)
            for eid, blob in await self._reader.execute_fetchall(
                # A join from the wanted (id, version) pairs: SQLite plans a row-value
                # `IN (VALUES …)` as a scan of the whole events table.
                f"WITH want(e, v) AS (VALUES {pairs}) SELECT events.execution_id, events.event "
                "FROM want JOIN events ON events.execution_id = want.e AND events.version = want.v",
                last_args,
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
        sql = "SELECT execution_id, ffqn, pinned_digest FROM executions WHERE "
        args: list[Any] = []
        if pinned_only:
            # Through the partial index of pinned executions (few), not the state index.
            sql += "pinned_digest IS NOT NULL AND state != 'finished'"
        else:
            states = ("pending_at", "locked", "blocked_by_join_set", "paused", "cancelling")
            sql += f"state IN ({','.join('?' * len(states))})"
            args += states
        if ffqns is not None:
            if not ffqns:
                return []
            sql += f" AND ffqn IN ({','.join('?' * len(ffqns))})"
            args += list(ffqns)
        rows = await self._reader.execute_fetchall(sql, args)
        return sorted(UnfinishedExecution(e, f, d) for e, f, d in rows)

    async def count_by_state(self, *, results: bool = False) -> dict[str, int]:
        if not results:
            rows = await self._reader.execute_fetchall(
                "SELECT state, count(*) FROM executions GROUP BY state"
            )
            return {state: count for state, count in rows}
        # Two index-only counts: by state, and the finished by result class (the
        # partial index of migration 6; named, or SQLite picks the state index and
        # reads every finished summary). In one statement: one snapshot, so that an
        # execution finishing (or created) meanwhile is counted once, and the counts add
        # up to the executions there are (the console's list total is their sum).
        rows = await self._reader.execute_fetchall(
            "SELECT state, NULL, count(*) FROM executions WHERE state != 'finished' "
            f"GROUP BY state UNION ALL SELECT 'finished', {RESULT_CLASS_SQL}, count(*) "
            "FROM executions INDEXED BY executions_result_class WHERE state = 'finished' "
            "GROUP BY 2"
        )
        split: list[tuple[str, str | None, int]] = [(state, kind, n) for state, kind, n in rows]
        return counts_with_results(split)

    async def get_logs(
        self, execution_id: str, after_id: int = 0, limit: int = 1000
    ) -> list[StoredLog]:
        rows = await self._reader.execute_fetchall(
            "SELECT id, execution_id, run_id, created_at, level, stream, message FROM logs "
            "WHERE execution_id = ? AND id > ? ORDER BY id LIMIT ?",
            (execution_id, after_id, limit),
        )
        return [StoredLog(i, e, r, _dt(t), lv, s, m) for i, e, r, t, lv, s, m in rows]

    # -- backtraces and component sources ------------------------------------------------------
    async def get_backtrace(self, execution_id: str, version: int) -> Backtrace | None:
        rows = await self._reader.execute_fetchall(
            "SELECT b.backtrace_id, b.component_digest, b.frames FROM events e "
            "JOIN backtraces b ON b.backtrace_id = e.backtrace_id "
            "WHERE e.execution_id = ? AND e.version = ?",
            (execution_id, version),
        )
        for backtrace_id, digest, blob in rows:
            return Backtrace(backtrace_id, digest, _frames_decoder.decode(blob))
        await self.get_summary(execution_id)  # NotFound for an unknown execution
        return None

    async def replace_backtraces(
        self,
        execution_id: str,
        component_digest: str,
        backtraces: Sequence[tuple[int, list[Frame]]],
        below_version: int,
    ) -> int:
        prepared = _prepare_backtraces(component_digest, backtraces)
        return await self._write(
            lambda c, n: _replace_backtraces(c, execution_id, prepared, below_version)
        )

    async def save_component_sources(self, sources: Sequence[ComponentSource]) -> None:
        rows = [(s.digest, s.file, s.source) for s in sources]
        if rows:
            await self._write(
                lambda c, n: c.executemany(
                    "INSERT OR IGNORE INTO component_sources (digest, file, source) VALUES (?,?,?)",
                    rows,
                )
            )

    async def get_component_source(self, digest: str) -> ComponentSource | None:
        rows = await self._reader.execute_fetchall(
            "SELECT digest, file, source FROM component_sources WHERE digest = ?", (digest,)
        )
        for d, file, source in rows:
            return ComponentSource(d, file, source)
        return None

    # -- waiting -----------------------------------------------------------------------------
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
        """`get_summary`, with the reads asked for in the same loop iteration done as one
        query (many clients waiting for results: one reader round trip, not one each)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ExecutionSummary] = loop.create_future()
        if not self._summary_reads:
            loop.call_soon(self._start_summary_reads)
        self._summary_reads.setdefault(execution_id, []).append(fut)
        return fut

    def _start_summary_reads(self) -> None:
        reads, self._summary_reads = self._summary_reads, {}
        task = asyncio.ensure_future(self._read_summaries(reads))
        self._summary_read_tasks.add(task)
        task.add_done_callback(self._summary_read_tasks.discard)

    async def _read_summaries(
        self, reads: dict[str, list[asyncio.Future[ExecutionSummary]]]
    ) -> None:
        ids = list(reads)
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            try:
                rows = await self._reader.execute_fetchall(
                    "SELECT execution_id, summary FROM executions "
                    f"WHERE execution_id IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
                found = {execution_id: blob for execution_id, blob in rows}
            except Exception as e:  # the callers get the error get_summary would raise
                for execution_id in ids[i:]:
                    for fut in reads[execution_id]:
                        if not fut.done():
                            fut.set_exception(e)
                return
            for execution_id in chunk:
                blob = found.get(execution_id)
                summary = None if blob is None else _summary_decoder.decode(blob)
                for fut in reads[execution_id]:
                    if fut.done():
                        continue
                    if summary is None:
                        fut.set_exception(NotFound(f"execution {execution_id} not found"))
                    else:
                        fut.set_result(summary)

    #: Seconds between re-checks of awaited executions (for writers in other processes).
    FINISHED_RECHECK_INTERVAL = 1.0

    def _ensure_finished_poller(self) -> None:
        if self._finished_poller is None or self._finished_poller.done():
            self._finished_poller = asyncio.create_task(
                self._poll_finished(), name="sqlite-finished-recheck"
            )

    async def _poll_finished(self) -> None:
        """A safety net for a wake-up from another process that was lost (see
        `engine.storage.sqlite.peers`): while anyone waits for a result, re-check all
        awaited executions now and then, in one query per chunk (rather than one timer
        and one query per waiter)."""
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
                # Other processes sharing the file do not notify: re-check now and then.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(remaining, 1.0))
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
