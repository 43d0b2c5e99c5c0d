"""The writer thread and group commit (`_Writer`).

All writes of a `SqliteStorage` go through one thread with its own connection: it
drains a queue of logical transactions into batches (`engine.storage.sqlite.batches`),
commits each batch once, and hands the outcomes to the event loop in one callback per
batch, in commit order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from engine import affinity
from engine.core import events as ev
from engine.storage.common import (
    Notes,
    grouped_responses,
)
from engine.storage.contract import (
    StorageError,
)
from engine.storage.disk_full import write_error
from engine.storage.sqlite.batches import _Call, _EarlyResponses, _Outcome, _run_batch_counting, _Tx
from engine.storage.sqlite.connection import (
    _record_unknown,
    _release,
    _summaries,
    _WriterConnection,
)
from engine.storage.sqlite.write_lock import WriteLock

log = logging.getLogger("obelisk.storage")
T = TypeVar("T")
_Notes = Notes
_grouped_responses = grouped_responses


def _no_delivery(batch: list[_Tx], outcomes: list[_Outcome], wrote: bool, committed: bool) -> None:
    for tx, (ok, value, _) in zip(batch, outcomes, strict=True):
        if tx.future is not None:
            _settle(tx.future, ok, value)
        if tx.reply is not None:
            tx.reply.set(ok, value)


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():  # the caller was cancelled
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


#: How long the writer may hold back a delivery that nobody on the loop waits for.
LAZY_DELIVERY = 0.005


class _Writer:
    """The write connection on a thread of its own, fed by a thread-safe queue.

    The thread takes everything queued (up to `max_batch`) as one physical transaction,
    commits it, and hands the outcomes to `deliver` on the event loop with one
    `call_soon_threadsafe` per batch; it then goes on with the next batch at once
    instead of waiting for the loop to ask for it (as a loop task feeding aiosqlite
    did: a writer→loop→writer hop per batch, and a thread wake-up per logical
    transaction submitted). `None` in the queue stops it after what was queued before.
    """

    def __init__(self, path: Path, loop: asyncio.AbstractEventLoop, max_batch: int) -> None:
        self.path = path
        self.loop = loop
        #: Set by the storage once open: (batch, outcomes, wrote, committed), on the loop.
        self.deliver: Callable[[list[_Tx], list[_Outcome], bool, bool], None] = _no_delivery
        #: Set by the storage: committed responses to waiting runs, from this thread...
        self.post_responses: Callable[[str, list[ev.StoredResponse]], None] | None = None
        #: ... or, in the usual batch, while its COMMIT is being made durable.
        self.early: _EarlyResponses | None = None
        #: Set by the storage: whether a committed batch has something for the loop
        #: that must not wait (see `_deliver_later`).
        self.urgent: Callable[[list[_Tx], list[_Outcome]], bool] | None = None
        #: Set by the storage: tell the other processes sharing the file what a
        #: committed batch changed (`engine.storage.sqlite.peers`).
        self.tell_peers: Callable[[list[_Outcome]], None] | None = None
        #: Set by the storage: whether other processes write the file now.
        self.shared: Callable[[], bool] | None = None
        #: Deliveries held back (nothing in them waits), sent with the next one.
        self._later: list[tuple[list[_Tx], list[_Outcome], bool, bool]] = []
        self._later_since = 0.0
        self.max_batch = max_batch
        self.conn: sqlite3.Connection | None = None
        self._queue: queue.SimpleQueue[_Tx | _Call | None] = queue.SimpleQueue()
        #: What `_more` took from the queue but could not add to a transaction.
        self._held: list[_Tx | _Call | None] = []
        #: Serialises `put` against `stop`: nothing can be queued after the `None`.
        self._lock = threading.Lock()
        self._accepting = False
        self.stopped: asyncio.Future[None] = loop.create_future()
        self._thread = threading.Thread(
            target=self._main, name="obelisk-sqlite-writer", daemon=True
        )

    @property
    def running(self) -> bool:
        return self._accepting and self._thread.is_alive()

    async def start(self) -> None:
        connected: asyncio.Future[None] = self.loop.create_future()
        self._connected = connected
        self._accepting = True
        self._thread.start()
        await connected

    def put(self, item: _Tx | _Call) -> bool:
        """Queue `item`; False when the writer has stopped taking work."""
        with self._lock:
            if not self._accepting:
                return False
            self._queue.put(item)
            return True

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        fut: asyncio.Future[T] = self.loop.create_future()
        if not self.put(_Call(fn, fut)):
            raise StorageError(f"the writer of database {self.path} is not running")
        return await fut

    async def stop(self) -> None:
        with self._lock:
            if self._accepting:
                self._accepting = False
                self._queue.put(None)
        if self._thread.is_alive() or not self.stopped.done():
            await asyncio.shield(self.stopped)

    # -- on the writer thread ------------------------------------------------------------
    def _to_loop(self, fn: Callable[..., None], *args: Any) -> None:
        if self._later:  # in commit order: what was held back first
            self._flush_later()
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            self.loop.call_soon_threadsafe(fn, *args)

    def _deliver_later(
        self, batch: list[_Tx], outcomes: list[_Outcome], wrote: bool, committed: bool
    ) -> None:
        """Hand a batch's outcomes to the loop, at once when someone there waits for
        them (`urgent`), else with the next delivery or within `LAZY_DELIVERY` seconds:
        a workflow step's batches have nothing the loop waits for (its run and the
        child's are answered from this thread), and waking the loop for each costs
        more than the rest of the step's loop work."""
        try:
            now = self.urgent is None or not committed or self.urgent(batch, outcomes)
        except Exception:  # a bug: deliver at once
            log.exception("deciding on a delivery failed")
            now = True
        if now:
            self._to_loop(self.deliver, batch, outcomes, wrote, committed)
            return
        if not self._later:
            self._later_since = time.monotonic()
        self._later.append((batch, outcomes, wrote, committed))
        if time.monotonic() - self._later_since >= LAZY_DELIVERY:
            self._flush_later()

    def _flush_later(self) -> None:
        later, self._later = self._later, []
        deliver = self.deliver

        def deliver_all() -> None:
            for args in later:
                deliver(*args)

        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(deliver_all)

    def _next(self) -> _Tx | _Call | None:
        """The next queued item; held-back deliveries go out when none comes soon."""
        if self._later:
            wait = LAZY_DELIVERY - (time.monotonic() - self._later_since)
            try:
                return self._queue.get(timeout=max(0.0, wait))
            except queue.Empty:
                self._flush_later()
        return self._queue.get()

    def _main(self) -> None:
        affinity.pin("writer")
        try:
            conn = sqlite3.connect(
                str(self.path),
                isolation_level=None,
                check_same_thread=False,
                factory=_WriterConnection,
            )
            assert isinstance(conn, _WriterConnection)
            self.conn = conn
        except BaseException as e:
            with self._lock:
                self._accepting = False
            self._to_loop(_settle, self._connected, False, e)
            self._to_loop(_settle, self.stopped, True, None)
            return
        conn.write_lock = WriteLock(Path(f"{os.path.realpath(self.path)}-write-lock"))
        self._to_loop(_settle, self._connected, True, None)
        try:
            self._serve(conn)
        finally:
            conn.write_lock.close()
            with self._lock:
                self._accepting = False
            if self.early is not None:
                self.early.commits.close()
            with contextlib.suppress(sqlite3.Error):
                self.conn.close()
            # Whatever is still queued or held (the thread died): its callers get an error.
            leftovers: list[_Tx] = []
            while True:
                if self._held:
                    item = self._held.pop()
                else:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                if isinstance(item, _Call):
                    self._to_loop(_settle, item.future, False, StorageError("storage closed"))
                elif item is not None:
                    leftovers.append(item)
            if leftovers:
                error = StorageError("storage closed")
                for tx in leftovers:
                    if tx.reply is not None:
                        tx.reply.set(False, error)
                failed = [(False, error, _Notes()) for _ in leftovers]
                self._to_loop(self.deliver, leftovers, failed, False, False)
            self._to_loop(_settle, self.stopped, True, None)

    def _serve(self, conn: sqlite3.Connection) -> None:
        get_nowait = self._queue.get_nowait
        carry: _Tx | _Call | None = None
        held = self._held
        while True:
            item: _Tx | _Call | None
            if carry is not None:
                item = carry
            elif held:
                item = held.pop()
            else:
                item = self._next()
            carry = None
            if item is None:
                if self._later:
                    self._flush_later()
                return
            if isinstance(item, _Call):
                cache = _summaries(conn)
                if cache is not None:  # it may write anything: no cache, then a new one
                    cache.enabled = False
                changes_before = conn.total_changes
                try:
                    value, ok = item.fn(conn), True
                except BaseException as e:
                    value, ok = e, False
                finally:
                    _release(conn)
                    if cache is not None:
                        cache.clear()
                        cache.enabled = True
                        if conn.total_changes != changes_before:
                            _record_unknown(conn, cache.writer_id)
                self._to_loop(_settle, item.future, ok, value)
                continue
            batch = [item]
            stop = False
            while len(batch) < self.max_batch:
                try:
                    nxt = get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                if isinstance(nxt, _Call):
                    carry = nxt
                    break
                batch.append(nxt)
            # Other processes write the file too: compute without the write lock, and
            # hold it as briefly as possible (no lingering).
            optimistic = self.shared is not None and self.shared()
            more = (
                None
                if stop or carry is not None or optimistic
                else functools.partial(self._more, batch)
            )
            self._commit(conn, batch, more, optimistic)
            if stop:
                if self._later:
                    self._flush_later()
                return

    def _more(self, batch: list[_Tx], timeout: float) -> _Tx | None:
        """A logical transaction to add to the open `batch`, waiting up to `timeout`
        seconds; None when none came (what came instead is handled after it)."""
        if self._held or len(batch) >= self.max_batch:
            return None
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, _Tx):
            return item
        self._held.append(item)
        return None

    def _commit(
        self,
        conn: sqlite3.Connection,
        batch: list[_Tx],
        more: Callable[[float], _Tx | None] | None = None,
        optimistic: bool = False,
    ) -> None:
        posted = False
        if conn.in_transaction:  # left open by a failure nobody ended: it wrote nothing
            log.error("the writer's connection was left in a transaction: rolled back")
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        try:
            outcomes, wrote, posted = _run_batch_counting(conn, batch, self.early, more, optimistic)
            committed = True
        except Exception as e:  # the connection itself failed
            error = write_error(e)
            outcomes, wrote, committed = [(False, error, _Notes()) for _ in batch], False, False
        finally:
            _release(conn)  # whatever happened, the next writer may go
        if committed and wrote and self.tell_peers is not None:
            try:
                self.tell_peers(outcomes)
            except Exception:  # a bug: the peers re-check by themselves
                log.exception("telling other processes failed")
        # Waiting workflow runs (unless they got their responses before the COMMIT) and
        # callers on other threads first, straight from here: they need nothing from
        # the loop.
        post = self.post_responses
        try:
            if post is not None and not posted:
                for ok, _, notes in outcomes:
                    if ok and notes.response_items:
                        for execution_id, items in _grouped_responses(notes).items():
                            post(execution_id, items)
        except Exception:  # a bug; the runs re-read the database within a second
            log.exception("posting responses failed")
        finally:
            for tx, (ok, value, _) in zip(batch, outcomes, strict=True):
                if tx.reply is not None:
                    tx.reply.set(ok, value)  # whatever happened: nobody waits forever
            self._deliver_later(batch, outcomes, wrote, committed)
