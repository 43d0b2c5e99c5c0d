"""The writer of a `PostgresStorage`: one task and one connection for all the writes of a
process. The logical transactions queued meanwhile run as one batch
(`engine.storage.postgres.batches`); on a lost connection it reconnects with backoff and
runs the batch again, and a COMMIT without an answer is looked up by its transaction id.
After each commit it announces the batch's notes to the local waiters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import asyncpg

from engine.storage.common import (
    Notes,
    announce_direct,
    first_line,
    grouped_responses,
)
from engine.storage.contract import (
    StorageError,
    StorageFull,
)
from engine.storage.disk_full import report_disk_full, write_error
from engine.storage.notify import Notifier
from engine.storage.postgres.batches import _CommitUnknown, _Ident, _run_batch, _translate, _Tx
from engine.storage.postgres.schema import _server_settings
from engine.storage.postgres.target import PostgresTarget, _is_retryable, is_connection_error

log = logging.getLogger("obelisk.storage")


class _GroupCommit:
    """The writer part of `PostgresStorage` (whose `__init__` sets these attributes)."""

    #: How long the writer keeps reconnecting for one batch before failing its callers.
    RECONNECT_DEADLINE: float
    target: PostgresTarget
    path: str
    notifier: Notifier
    stats: dict[str, int]
    _writer: asyncpg.Connection | None
    _queue: asyncio.Queue[_Tx | None]
    _max_batch: int
    _ident: _Ident

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
