"""SQLite backend: WAL, `synchronous=FULL`, group commit, in-process notifications.

All writes go through one writer thread (`_Writer`). Callers enqueue *logical
transactions* (plain functions run on the writer's connection); the writer drains the
queue and runs everything queued as one physical transaction. A failing logical
transaction is rolled back alone and cannot poison the batch: the batch then runs again
with a SAVEPOINT per logical transaction (`_run_batch`; the usual batch, where none fails,
needs none). While one batch is being fsynced, the next one accumulates: concurrency turns
into larger commits, not into more fsyncs. The writer does not wait for the event loop
between batches: outcomes and notifications reach the loop in one callback per batch, in
commit order. Readers use a second connection (aiosqlite) and never block writers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite
import msgspec

from engine import affinity
from engine.core import events as ev
from engine.core.ids import DelayId, ExecutionId
from engine.core.records import Frame, LogLine
from engine.core.state import (
    BlockedByJoinSet,
    ExecutionSummary,
    IllegalAppend,
    PendingAt,
    apply_event,
    apply_response,
    created_summary,
)
from engine.storage import sqlite_peers
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
    frames_decoder,
    grouped_responses,
    not_before,
    pause_events,
    prepare_backtraces,
    projection,
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
    VersionConflict,
)
from engine.storage.data_files import DamagedDatabase, is_damage, private_dir, private_file, probe
from engine.storage.disk_full import is_disk_full, write_error
from engine.storage.leases import ExecutorLeases
from engine.storage.notify import Notifier, ResponseInbox
from engine.storage.sqlite_cache import SummaryCache, record_unknown_writes
from engine.storage.sqlite_optimistic import (
    UPDATE_SUMMARY,
    BufferedConnection,
    NeedsWriteLock,
    Write,
    apply_writes,
    update_summaries_sql,
)
from engine.storage.sqlite_peers import PeerBus
from engine.storage.write_lock import WriteLock

log = logging.getLogger("obelisk.storage")

T = TypeVar("T")

SCHEMA_VERSION = 5

MIGRATIONS: list[str] = [
    # 1: initial schema
    """
    CREATE TABLE executions (
        execution_id TEXT PRIMARY KEY,
        ffqn TEXT NOT NULL,
        component_type TEXT NOT NULL,
        parent_id TEXT,
        state TEXT NOT NULL,
        pending_at INTEGER,          -- set only while the state is exactly PendingAt
        lock_expires_at INTEGER,     -- set only while the underlying state is Locked
        next_version INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        summary BLOB NOT NULL
    );
    CREATE INDEX executions_due ON executions (ffqn, pending_at) WHERE pending_at IS NOT NULL;
    CREATE INDEX executions_lock_expiry ON executions (lock_expires_at)
        WHERE lock_expires_at IS NOT NULL;
    CREATE INDEX executions_created ON executions (created_at DESC, execution_id DESC);
    CREATE INDEX executions_state ON executions (state);
    CREATE INDEX executions_parent ON executions (parent_id) WHERE parent_id IS NOT NULL;

    CREATE TABLE events (
        execution_id TEXT NOT NULL,
        version INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        event BLOB NOT NULL,
        backtrace_id INTEGER,
        PRIMARY KEY (execution_id, version)
    ) WITHOUT ROWID;

    CREATE TABLE responses (
        execution_id TEXT NOT NULL,
        cursor INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        source_id TEXT NOT NULL,     -- child execution id or delay id: one response each
        response BLOB NOT NULL,
        PRIMARY KEY (execution_id, cursor)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX responses_source ON responses (execution_id, source_id);

    CREATE TABLE delays (
        delay_id TEXT PRIMARY KEY,
        execution_id TEXT NOT NULL,
        join_set_id TEXT NOT NULL,
        expires_at INTEGER NOT NULL
    );
    CREATE INDEX delays_expiry ON delays (expires_at);

    CREATE TABLE logs (
        id INTEGER PRIMARY KEY,
        execution_id TEXT NOT NULL,
        run_id TEXT,
        created_at INTEGER NOT NULL,
        level TEXT NOT NULL,
        stream TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX logs_execution ON logs (execution_id, id);
    """,
    # 2: workflow upgrades (SPEC §9.3): an execution whose upgrade failed stays on the
    # component digest that wrote its history; only that version's executor locks it.
    """
    ALTER TABLE executions ADD COLUMN pinned_digest TEXT;
    CREATE INDEX executions_pinned ON executions (pinned_digest)
        WHERE pinned_digest IS NOT NULL;
    """,
    # 3: backtraces (deduplicated guest stacks, SPEC §7.4) and component sources
    """
    CREATE TABLE backtraces (
        backtrace_id INTEGER PRIMARY KEY,
        hash BLOB NOT NULL UNIQUE,   -- sha256 of the component digest and the frames
        component_digest TEXT NOT NULL,
        frames BLOB NOT NULL         -- JSON [{file, line, column, function}], innermost first
    );

    CREATE TABLE component_sources (
        digest TEXT PRIMARY KEY,
        file TEXT NOT NULL,
        source TEXT NOT NULL
    );
    """,
    # 4: the console's "last change first" order pages through an index, not a sort
    """
    CREATE INDEX executions_updated ON executions (updated_at DESC, execution_id DESC);
    """,
    # 5: which executions each physical transaction wrote, so that the other processes
    # sharing the file forget only those (`engine.storage.sqlite_cache`)
    """
    CREATE TABLE row_writes (
        seq INTEGER PRIMARY KEY,     -- consecutive: rows are pruned only from the start
        writer TEXT NOT NULL,        -- the writing storage
        ids TEXT NOT NULL            -- execution ids, one per line; '*': anything
    );
    """,
]

_summary_decoder = summary_decoder
_created_decoder = msgspec.json.Decoder(ev.Event)
_frames_decoder = frames_decoder
_PreparedBacktrace = PreparedBacktrace
_prepare_backtraces = prepare_backtraces
_us = us
_dt = dt
_not_before = not_before
_projection = projection
_Notes = Notes
_grouped_responses = grouped_responses


class _ThreadReply:
    """The outcome of a logical transaction for a caller blocked on another thread: the
    writer hands it over directly (a lock released), without a hop through the loop."""

    __slots__ = ("_answered", "_done", "early", "ok", "seq", "value")

    def __init__(self, early: bool = False) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self._answered = False
        self.ok = False
        self.value: Any = None
        #: Whether the caller takes a success before its COMMIT (`set_early`).
        self.early = early
        #: The `Commits` number of an early success (0: the outcome is final).
        self.seq = 0

    def set(self, ok: bool, value: Any) -> None:
        """The outcome (ignored after an early one: only the first answer counts)."""
        if self._answered:
            return
        self._answered = True
        self.ok, self.value = ok, value
        self._done.release()

    def set_early(self, value: Any, seq: int) -> None:
        if self._answered:
            return
        self._answered = True
        self.ok, self.value, self.seq = True, value, seq
        self._done.release()

    def wait(self) -> Any:
        self._done.acquire()
        if self.ok:
            return self.value
        raise self.value


class _CallbackReply:
    """The outcome of a logical transaction handed to a callback on the writer thread."""

    __slots__ = ("_callback",)

    def __init__(self, callback: Callable[[bool, Any], None]) -> None:
        self._callback = callback

    def set(self, ok: bool, value: Any) -> None:
        try:
            self._callback(ok, value)
        except Exception:  # a caller's bug must not stop the writer
            log.exception("append callback failed")


@dataclass(slots=True)
class _Tx:
    fn: Callable[[sqlite3.Connection, _Notes], Any]
    #: The caller's future (a caller on the event loop) ...
    future: asyncio.Future[Any] | None
    #: Events it appends (benchmark counters, counted once committed).
    events: int = 0
    #: ... or its reply (a caller on another thread).
    reply: _ThreadReply | _CallbackReply | None = None
    #: The execution it appends to (lingering: has a directly locked child reported?).
    execution_id: str | None = None
    #: The `Commits` transactions (earliest, latest) whose early outcomes the caller
    #: computed with ((0, 0): none): refused when one of them failed.
    depends_on: tuple[int, int] = (0, 0)
    #: Whether it may run in an optimistic batch (`engine.storage.sqlite_optimistic`):
    #: the usual writes, whose reads are all of executions they also note or write.
    optimistic: bool = False


@dataclass(slots=True)
class _Call:
    """Something to run on the writer's connection outside any batch (setup, tests)."""

    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]


_Outcome = tuple[bool, Any, _Notes]


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
        #: committed batch changed (`engine.storage.sqlite_peers`).
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
        if self._closed or writer is None or not writer.running:
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
        if self._closed or writer is None or not writer.running or not writer.put(tx):
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

    async def count_by_state(self) -> dict[str, int]:
        rows = await self._reader.execute_fetchall(
            "SELECT state, count(*) FROM executions GROUP BY state"
        )
        return {state: count for state, count in rows}

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
        `engine.storage.sqlite_peers`): while anyone waits for a result, re-check all
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


# ---------------------------------------------------------------------------------------
# Logical transactions: synchronous, run on the writer thread inside a SAVEPOINT.
# ---------------------------------------------------------------------------------------


async def _connect(path: Path) -> aiosqlite.Connection:
    conn = aiosqlite.connect(path, isolation_level=None)
    try:
        return await conn
    except BaseException:
        # On a failed connect aiosqlite stops its worker thread without waiting for it:
        # wait here, or the thread outlives the event loop ("Event loop is closed").
        thread = conn._thread
        if thread.is_alive():
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 5.0)
        raise


def _set_wal(conn: sqlite3.Connection, path: str) -> None:
    # Switching a new file to WAL while another engine does the same can fail with
    # "database is locked" at once, without waiting for busy_timeout: retry for a while.
    deadline = time.monotonic() + 10.0
    while True:
        try:
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)
    if str(mode).lower() != "wal":
        raise StorageError(f"database {path} cannot use WAL journal mode (it is in {mode} mode)")


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    def check(current: int) -> None:
        if current > SCHEMA_VERSION:
            raise StorageError(
                f"database {path} was created by a newer version of obelisk "
                f"(schema {current}, this version knows up to {SCHEMA_VERSION})"
            )

    (current,) = conn.execute("PRAGMA user_version").fetchone()
    check(current)
    if current == SCHEMA_VERSION:
        return
    # Several engines may open a new file at once: take the write lock first, then read
    # the version again, so that each migration runs exactly once. Statements are run one
    # by one because executescript would commit this transaction.
    conn.execute("BEGIN IMMEDIATE")
    try:
        (current,) = conn.execute("PRAGMA user_version").fetchone()
        check(current)
        for version in range(current + 1, SCHEMA_VERSION + 1):
            for statement in _statements(MIGRATIONS[version - 1]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _check_writable(conn: sqlite3.Connection) -> None:
    """Fail at open, not at the first write, when the file cannot be written."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        conn.execute(f"PRAGMA user_version = {int(version)}")  # a write, rolled back
    finally:
        conn.execute("ROLLBACK")


def _statements(script: str) -> list[str]:
    """Split a migration script into complete SQL statements."""
    statements: list[str] = []
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip().rstrip(";").strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip().rstrip(";").strip():
        raise ValueError(f"incomplete SQL statement in migration: {buffer!r}")
    return statements


class _EarlyResponses:
    """Hands a batch's outcomes to runs on other threads just before its COMMIT, so that
    a workflow computes its next step while the writer waits for the fsync, instead of
    after it: responses to the waiting runs, and the summaries of the appends of callers
    that take them early (`_ThreadReply.early`). Each physical transaction that handed
    something over has a `Commits` number, settled once its COMMIT succeeded or failed.
    Safe because a run depends on such a transaction only through the writer: its next
    write (`_Tx.depends_on`) is refused when that transaction failed, and it reads or
    finishes only after `ResponseInbox.wait_committed`."""

    def __init__(self, notifier: Notifier) -> None:
        self.notifier = notifier
        self.commits = notifier.commits
        #: The open physical transaction's `Commits` number (0: none yet).
        self.seq = 0
        #: Whether every response so far was handed over (else: post again after the
        #: COMMIT; a run ignores a response it has).
        self.complete = True
        #: Early outcomes of appends that left their execution blocked, by execution:
        #: its run has nothing to do before a response comes, so it is answered with the
        #: first one this transaction posts to it (one wake-up instead of two), else at
        #: the COMMIT.
        self.deferred: dict[str, list[tuple[_ThreadReply, Any]]] = {}

    def number(self) -> int:
        if not self.seq:
            self.seq = self.commits.begin()
        return self.seq

    def began(self) -> None:
        self.seq = 0
        self.complete = True

    def post(self, batch: Sequence[_Tx], outcomes: Sequence[_Outcome]) -> None:
        """Hand over what these logical transactions (all written) have for other
        threads. Never raises: the transaction is open and must be ended."""
        try:
            for tx, (ok, value, notes) in zip(batch, outcomes, strict=True):
                if not ok:
                    continue
                if notes.response_items:
                    seq = self.number()
                    for execution_id, items in _grouped_responses(notes).items():
                        self.notifier.post_responses(execution_id, items, seq)
                        for waiting, summary in self.deferred.pop(execution_id, ()):
                            waiting.set_early(summary, seq)
                reply = tx.reply
                if isinstance(reply, _ThreadReply) and reply.early:
                    if tx.execution_id is not None and isinstance(
                        getattr(value, "underlying", None), BlockedByJoinSet
                    ):
                        self.number()
                        self.deferred.setdefault(tx.execution_id, []).append((reply, value))
                    else:
                        reply.set_early(value, self.number())
        except Exception:  # a bug: the responses go out after the commit instead
            log.exception("posting responses before the commit failed")
            self.complete = False

    def settle(self, committed: bool) -> None:
        """The COMMIT succeeded (the deferred early outcomes go out now) or failed (they
        are dropped: the batch's retry answers those callers with its own outcome)."""
        if not self.seq:
            return
        seq, self.seq = self.seq, 0
        deferred, self.deferred = self.deferred, {}
        if committed:
            for replies in deferred.values():
                for reply, summary in replies:
                    reply.set_early(summary, seq)
        self.commits.settle(seq, committed)

    def refused(self, tx: _Tx) -> bool:
        """Whether `tx` depends on a transaction that failed."""
        low, high = tx.depends_on
        return bool(high) and self.commits.failed_between(low, high)


def _run_batch_counting(
    conn: sqlite3.Connection,
    batch: list[_Tx],
    early: _EarlyResponses | None = None,
    more: Callable[[float], _Tx | None] | None = None,
    optimistic: bool = False,
) -> tuple[list[tuple[bool, Any, _Notes]], bool, bool]:
    """`_run_batch`, whether it changed any row, and whether its responses were posted
    before the COMMIT (`early`)."""
    before = conn.total_changes
    outcomes, posted = _run_batch(conn, batch, early, more, optimistic)
    return outcomes, conn.total_changes != before, posted


def _run_batch(
    conn: sqlite3.Connection,
    batch: list[_Tx],
    early: _EarlyResponses | None = None,
    more: Callable[[float], _Tx | None] | None = None,
    optimistic: bool = False,
) -> tuple[list[tuple[bool, Any, _Notes]], bool]:
    """Run a batch of logical transactions as one physical transaction; also whether its
    responses were posted early (only on the first, usual path).

    First without savepoints (two statements less per logical transaction): when every
    one succeeds, which is the usual case, that is the outcome. When one raises, its
    partial writes cannot be undone alone: everything is rolled back and the batch runs
    again with a SAVEPOINT per logical transaction. (Logical transactions are functions
    of the database only, so running one again is fine; the split retry below relies on
    that too.) A batch of one needs no savepoint at all: its rollback is the whole one.
    `more` (see `_linger`) may add logical transactions to `batch` before the COMMIT.
    With `optimistic` (other processes write the file) a batch of such transactions is
    first computed without the write lock (`_run_batch_optimistic`).
    """
    if optimistic and all(tx.optimistic for tx in batch):
        outcomes = _run_batch_optimistic(conn, batch, early)
        _count(conn, "optimistic" if outcomes is not None else "optimistic_failed")
        if outcomes is not None:
            return outcomes, early is not None and early.complete
    outcomes = _run_batch_plain(conn, batch, early, more)
    if outcomes is not None:
        return outcomes, early is not None and early.complete
    outcomes = _run_batch_savepoints(conn, batch, early)
    _hand_over_direct(outcomes)  # committed (a second hand-over of a lock is a no-op)
    return outcomes, False


def _count(conn: sqlite3.Connection, what: str, n: int = 1) -> None:
    counters = getattr(conn, "counters", None)
    if counters is not None:
        counters[what] = counters.get(what, 0) + n


def _run_batch_optimistic(
    conn: sqlite3.Connection, batch: list[_Tx], early: _EarlyResponses | None
) -> list[tuple[bool, Any, _Notes]] | None:
    """The batch computed without the write lock, then written under it
    (`engine.storage.sqlite_optimistic`); None when it must run the usual way (a write
    failed, a write's result was needed): nothing of it was written then.

    The logical transactions that read what another writer changed meanwhile (and those
    that share an execution with them) run again under the lock, after the others' writes
    and each in a savepoint: when two processes lock the same due executions, only
    their locks are redone, not the whole batch."""
    cache = _summaries(conn)
    if cache is None or not cache.enabled:
        return None
    computed = _compute_optimistic(conn, cache, batch, early)
    if computed is None:
        return None
    _begin_write(conn)
    try:
        changed = cache.catch_up(conn)
        if changed is None:  # anything may have changed: all again, the usual way
            _count(conn, "occ_everything")
            _end(conn, "ROLLBACK")
            cache.tx.clear()
            return None
        stale = _stale(computed, changed)
        for i in stale:  # their entries are redone below
            for execution_id in computed[i].touched:
                cache.tx.pop(execution_id, None)
        changes_before = conn.total_changes
        outcomes = [c.outcome for c in computed]
        # The others' writes, coalesced across the batch (they share no execution with
        # the stale ones, so these run after them as if they came later).
        apply_writes(conn, [w for i, c in enumerate(computed) if i not in stale for w in c.writes])
        for i in sorted(stale):
            outcomes[i] = _refused(early, batch[i]) or _in_savepoint(conn, batch[i])
        _count(conn, "occ_redone", len(stale))
    except Exception:
        _count(conn, "occ_write_failed")
        with contextlib.suppress(sqlite3.Error):
            _end(conn, "ROLLBACK")
        cache.tx.clear()
        return None
    if early is not None:
        early.began()
    return _finish_batch(conn, batch, outcomes, changes_before, early, None)


@dataclass(slots=True)
class _Computed:
    """Phase 1 of one logical transaction of an optimistic batch."""

    outcome: _Outcome
    writes: list[Write]
    #: The executions it read or wrote.
    touched: set[str]


def _compute_optimistic(
    conn: sqlite3.Connection,
    cache: SummaryCache,
    batch: list[_Tx],
    early: _EarlyResponses | None,
) -> list[_Computed] | None:
    """Phase 1: each logical transaction's outcome, the writes to make and what it read
    or wrote; None when one needs a write's result (the batch runs the usual way)."""
    try:
        conn.execute("BEGIN")  # deferred: a read snapshot, no write lock
    except sqlite3.Error:
        return None
    try:
        cache.began(conn)
        buffered = BufferedConnection(conn)
        computed: list[_Computed] = []
        for tx in batch:
            if (refusal := _refused(early, tx)) is not None:
                computed.append(_Computed(refusal, [], set()))  # it writes nothing
                continue
            buffered.writes = []
            touched = cache.touched = set()
            undo = cache.undo = []
            notes = _Notes()
            try:
                value = tx.fn(buffered, notes)  # type: ignore[arg-type]
            except (NeedsWriteLock, sqlite3.Error):  # the usual way decides
                _count(conn, "occ_needs_lock")
                cache.tx.clear()
                return None
            except Exception as e:  # its own failure: its writes are dropped, not made
                cache.revert(undo)
                computed.append(_Computed((False, _translate(e), _Notes()), [], touched))
                continue
            computed.append(_Computed((True, value, notes), buffered.writes, touched))
        return computed
    except sqlite3.Error:  # (busy in a rare WAL state): the usual way
        cache.tx.clear()
        return None
    finally:
        cache.touched = None
        cache.undo = None
        with contextlib.suppress(sqlite3.Error):
            conn.execute("COMMIT")  # the read transaction: nothing was written


def _stale(computed: Sequence[_Computed], changed: set[str]) -> set[int]:
    """The logical transactions that read or wrote an execution in `changed`, and those
    that share an execution with them (they may have read their writes)."""
    stale = {i for i, c in enumerate(computed) if not c.touched.isdisjoint(changed)}
    if not stale:
        return stale
    ids = set().union(*(computed[i].touched for i in stale))
    grew = True
    while grew:
        grew = False
        for i, c in enumerate(computed):
            if i not in stale and not c.touched.isdisjoint(ids):
                stale.add(i)
                ids |= c.touched
                grew = True
    return stale


def _hand_over_direct(outcomes: Sequence[tuple[bool, Any, _Notes]]) -> None:
    """Directly locked executions to their executors from the writer's thread, not
    after a hop through the loop: their runs start on worker threads at once."""
    for ok, _, notes in outcomes:
        if ok and notes.direct:
            announce_direct(notes)


#: How long a physical transaction that handed directly locked children to their
#: executors stays open for their outcomes before its COMMIT (`_linger`).
LINGER = 0.002


def _refused(early: _EarlyResponses | None, tx: _Tx) -> _Outcome | None:
    """The outcome of `tx` when it depends on a transaction that failed (it writes
    nothing), else None."""
    if early is None or not early.refused(tx):
        return None
    return (False, Conflict("a response the run was given was not committed"), _Notes())


def _run_batch_plain(
    conn: sqlite3.Connection,
    batch: list[_Tx],
    early: _EarlyResponses | None = None,
    more: Callable[[float], _Tx | None] | None = None,
) -> list[tuple[bool, Any, _Notes]] | None:
    """The batch without savepoints; None (after a rollback) to run it with them."""
    outcomes: list[tuple[bool, Any, _Notes]] = []
    _begin(conn)  # failing: the connection itself failed (as below)
    changes_before = conn.total_changes
    if early is not None:
        early.began()
    for tx in batch:
        if (refusal := _refused(early, tx)) is not None:
            outcomes.append(refusal)  # it wrote nothing: the others stand
            continue
        notes = _Notes()
        try:
            value = tx.fn(conn, notes)
        except Exception as e:
            with contextlib.suppress(sqlite3.Error):
                _end(conn, "ROLLBACK")
            if len(batch) > 1:
                return None
            return [(False, _translate(e), notes)]
        if not conn.in_transaction:  # it ended the transaction (see the savepoint path)
            _release(conn)
            return None
        outcomes.append((True, value, notes))
    return _finish_batch(conn, batch, outcomes, changes_before, early, more)


def _finish_batch(
    conn: sqlite3.Connection,
    batch: list[_Tx],
    outcomes: list[tuple[bool, Any, _Notes]],
    changes_before: int,
    early: _EarlyResponses | None,
    more: Callable[[float], _Tx | None] | None,
) -> list[tuple[bool, Any, _Notes]] | None:
    """Everything of `batch` is written (`outcomes`): hand over what waits for it,
    COMMIT. None (after a rollback) when the COMMIT failed."""
    if more is None:
        # Named before anything wakes the process's other threads: each statement gives
        # the GIL up, and getting it back from them can take milliseconds.
        try:
            _record_writes(conn, changes_before)
        except Exception:
            with contextlib.suppress(sqlite3.Error):
                _end(conn, "ROLLBACK")
            return None
    # Directly locked children start now: their runs overlap the fsync of the COMMIT
    # that creates them. Should that COMMIT fail, the savepoint retry writes the same
    # locks again (a second hand-over is a no-op) or the runs' outcomes find no such
    # execution and are dropped: an activity may run once more, never be lost.
    _hand_over_direct(outcomes)
    if early is not None:
        early.post(batch, outcomes)
    try:
        if more is not None:
            _linger(conn, batch, outcomes, early, more)
            _record_writes(conn, changes_before)
        _end(conn, "COMMIT")
    except Exception:
        with contextlib.suppress(sqlite3.Error):
            _end(conn, "ROLLBACK")
        if early is not None:
            early.settle(False)
        return None
    cache = _summaries(conn)
    if cache is not None:
        cache.commit()
    if early is not None:
        early.settle(True)
    return outcomes


def _linger(
    conn: sqlite3.Connection,
    batch: list[_Tx],
    outcomes: list[tuple[bool, Any, _Notes]],
    early: _EarlyResponses | None,
    more: Callable[[float], _Tx | None],
) -> None:
    """Keep the transaction open, up to `LINGER` seconds, while children it locked
    directly are running (a quick activity reports in a fraction of a millisecond):
    their outcomes, and whatever else is queued meanwhile, join it, each in a savepoint,
    instead of waiting for this COMMIT and making a second one. Nobody waits for the
    durability of what was handed over early."""
    waiting = {
        execution.execution_id
        for ok, _, notes in outcomes
        if ok
        for _, execution in notes.direct
        if execution is not None
    }
    if not waiting:
        return
    deadline = time.monotonic() + LINGER
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        tx = more(remaining)
        if tx is None:
            return
        # In the batch first: should the savepoint itself fail, the batch is run again
        # with everything it took from the queue.
        batch.append(tx)
        outcome = _refused(early, tx) or _in_savepoint(conn, tx)
        outcomes.append(outcome)
        if tx.execution_id is not None:
            waiting.discard(tx.execution_id)
        _hand_over_direct(outcomes[-1:])
        if early is not None:
            early.post(batch[-1:], outcomes[-1:])


def _in_savepoint(conn: sqlite3.Connection, tx: _Tx) -> _Outcome:
    """One logical transaction in a savepoint of the open physical one: when it raises,
    only its own writes (and its entries in the summary cache) are undone."""
    cache = _summaries(conn)
    saved = dict(cache.tx) if cache is not None else None
    notes = _Notes()
    conn.execute("SAVEPOINT tx")
    try:
        value = tx.fn(conn, notes)
    except Exception as e:
        conn.execute("ROLLBACK TO tx")
        conn.execute("RELEASE tx")
        if cache is not None and saved is not None:
            cache.tx = saved
        return (False, _translate(e), _Notes())
    conn.execute("RELEASE tx")
    return (True, value, notes)


def _run_batch_savepoints(
    conn: sqlite3.Connection, batch: list[_Tx], early: _EarlyResponses | None = None
) -> list[tuple[bool, Any, _Notes]]:
    cache = _summaries(conn)
    if cache is None or not cache.enabled:
        return _run_batch_savepoints_uncached(conn, batch, early)
    # A rollback to a savepoint undoes part of a transaction: no cache on this rare path.
    cache.clear()
    cache.enabled = False
    try:
        return _run_batch_savepoints_uncached(conn, batch, early)
    finally:
        cache.clear()
        cache.enabled = True


def _run_batch_savepoints_uncached(
    conn: sqlite3.Connection, batch: list[_Tx], early: _EarlyResponses | None = None
) -> list[tuple[bool, Any, _Notes]]:
    outcomes: list[tuple[bool, Any, _Notes]] = []
    _begin(conn)
    changes_before = conn.total_changes
    try:
        for tx in batch:
            outcomes.append(_refused(early, tx) or _in_savepoint(conn, tx))
        _record_writes(conn, changes_before)
        _end(conn, "COMMIT")
    except sqlite3.Error as e:
        with contextlib.suppress(sqlite3.Error):
            _end(conn, "ROLLBACK")
        if len(batch) == 1:
            return [(False, write_error(e), _Notes())]
        # Retry each alone so that one bad transaction cannot fail the others.
        return [o for tx in batch for o in _run_batch_savepoints_uncached(conn, [tx], early)]
    return outcomes


def _translate(e: Exception) -> Exception:
    if isinstance(e, StorageError):
        return e
    if isinstance(e, IllegalAppend):
        return Conflict(str(e))
    if isinstance(e, sqlite3.Error) or is_disk_full(e):
        return write_error(e, "database error")
    return e


def _load_summary(conn: sqlite3.Connection, execution_id: str) -> ExecutionSummary:
    cache = _summaries(conn)
    if cache is not None and (found := cache.get(execution_id)) is not None:
        return found[0]
    row = conn.execute(
        "SELECT summary FROM executions WHERE execution_id = ?", (execution_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    return _summary_decoder.decode(row[0])


def _load_summary_for_write(
    conn: sqlite3.Connection, execution_id: str, now: datetime
) -> tuple[ExecutionSummary, datetime]:
    """The summary, and `now` or just after the execution's last write if that is later,
    with one read of the row.

    Callers take `now` before their transaction is queued (a workflow run on its worker
    thread, the watcher before a read), so transactions can commit out of timestamp
    order. A log is read back by interleaving events and responses by time
    (`replay_stored`, the console): a transaction of an execution never gets a timestamp
    before the previous one, so that this order is the commit order.
    """
    cache = _summaries(conn)
    if cache is not None and (found := cache.get(execution_id)) is not None:
        return found[0], _not_before(now, found[1])
    row = conn.execute(
        "SELECT summary, updated_at FROM executions WHERE execution_id = ?", (execution_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    s: ExecutionSummary = _summary_decoder.decode(row[0])
    if cache is not None:
        cache.put(execution_id, s, row[1])
    return s, _not_before(now, row[1])


def _write_summary(
    conn: sqlite3.Connection, execution_id: str, s: ExecutionSummary, now: datetime
) -> None:
    state, pending_at, lock_expires_at = _projection(s)
    t = _us(now)
    conn.execute(
        UPDATE_SUMMARY,
        (state, pending_at, lock_expires_at, s.next_version, t, ev.encode(s), execution_id),
    )
    cache = _summaries(conn)
    if cache is not None:
        cache.put(execution_id, s, t)


def _create(
    conn: sqlite3.Connection,
    notes: _Notes,
    req: CreateRequest,
    now: datetime,
    event_rows: list[Any] | None = None,
) -> None:
    """Create `req`'s execution. With `event_rows` (a parent's `_append`), its events
    go there, to be inserted with the parent's in one statement."""
    created = req.created
    s = created_summary(created, now)
    lock = req.lock
    if lock is not None:
        try:
            s = apply_event(s, lock.locked, now)
        except IllegalAppend:  # not due yet (or a lock in the past): created pending
            notes.direct.append((lock, None))
            lock = None
    state, pending_at, lock_expires_at = _projection(s)
    parent_id = created.parent[0] if created.parent else None
    try:
        # Insert first: the id exists only on a re-submission (no read on the usual path).
        conn.execute(
            "INSERT INTO executions (execution_id, ffqn, component_type, parent_id, state, "
            "pending_at, lock_expires_at, next_version, created_at, updated_at, summary) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                req.execution_id,
                created.ffqn,
                created.component_id.type,
                parent_id,
                state,
                pending_at,
                lock_expires_at,
                s.next_version,
                _us(now),
                _us(now),
                ev.encode(s),
            ),
        )
    except sqlite3.IntegrityError:
        existing = conn.execute(
            "SELECT event FROM events WHERE execution_id = ? AND version = 0", (req.execution_id,)
        ).fetchone()
        if existing is None:
            raise
        old = ev.decode_event(existing[0])
        assert isinstance(old, ev.Created)
        if old.ffqn == created.ffqn and old.params == created.params:
            if lock is not None:
                notes.direct.append((lock, None))  # someone else's: not locked here
            return  # idempotent re-submission
        raise Conflict(
            f"execution {req.execution_id} already exists with other parameters"
        ) from None
    t = _us(now)
    cache = _summaries(conn)
    if cache is not None:
        cache.put(req.execution_id, s, t)
    if lock is None:
        if event_rows is not None:
            event_rows += (req.execution_id, 0, t, ev.encode(created), None)
        else:
            conn.execute(
                "INSERT INTO events (execution_id, version, created_at, event) VALUES (?,?,?,?)",
                (req.execution_id, 0, t, ev.encode(created)),
            )
        notes.became_pending(created.ffqn, created.scheduled_at, now)
        return
    rows: list[Any] = [req.execution_id, 0, t, ev.encode(created), None]
    rows += (req.execution_id, 1, t, ev.encode(lock.locked), None)
    if event_rows is not None:
        event_rows += rows
    else:
        conn.execute(
            "INSERT INTO events (execution_id, version, created_at, event, backtrace_id) "
            "VALUES (?,?,?,?,?),(?,?,?,?,?)",
            rows,
        )
    notes.direct.append((lock, direct_locked(req, lock, s)))


def _due_rows(
    conn: sqlite3.Connection,
    ffqns: list[str],
    limit: int,
    now_us: int,
    pinned_digest: str | None,
) -> list[tuple[str, int, bytes, int]]:
    """The first `limit` due executions of `ffqns` by `pending_at`:
    (execution_id, pending_at, summary, updated_at).

    One ordered, limited index range per FFQN (`UNION ALL`), merged here. A single
    `ffqn IN (…) ORDER BY pending_at LIMIT n` sorts *every* due row of those FFQNs first
    (a temp b-tree): with a backlog of N due executions each lock would read all N.
    """
    pin = "pinned_digest IS NULL" if pinned_digest is None else "pinned_digest = ?"
    one = (
        "SELECT * FROM (SELECT execution_id, pending_at, summary, updated_at FROM executions "
        f"WHERE ffqn = ? AND pending_at <= ? AND {pin} ORDER BY pending_at LIMIT ?)"
    )
    pin_args = [] if pinned_digest is None else [pinned_digest]
    rows: list[tuple[str, int, bytes, int]] = []
    for i in range(0, len(ffqns), 200):  # SQLite allows up to 500 terms in a compound select
        chunk = ffqns[i : i + 200]
        args: list[Any] = []
        for ffqn in chunk:
            args += [ffqn, now_us, *pin_args, limit]
        rows += conn.execute(" UNION ALL ".join([one] * len(chunk)), args).fetchall()
    if len(ffqns) > 1:
        rows.sort(key=lambda row: row[1])
        del rows[limit:]
    return rows


def _write_locks(
    conn: sqlite3.Connection,
    locks: list[tuple[str, datetime, ExecutionSummary]],
    event_blob: bytes,
) -> None:
    """The `locked` events and new summaries of a lock batch, in two statements per 500
    executions (not two each: every statement is a GIL hand-off on the writer thread)."""
    for i in range(0, len(locks), 500):
        chunk = locks[i : i + 500]
        conn.execute(
            "INSERT INTO events (execution_id, version, created_at, event) VALUES "
            + ",".join(["(?,?,?,?)"] * len(chunk)),
            [
                v
                for execution_id, at, s in chunk
                for v in (execution_id, s.next_version - 1, _us(at), event_blob)
            ],
        )
        values: list[Any] = []
        cache = _summaries(conn)
        for execution_id, at, s in chunk:
            state, pending_at, lock_expires_at = _projection(s)
            t = _us(at)
            values += (
                execution_id,
                state,
                pending_at,
                lock_expires_at,
                s.next_version,
                t,
                ev.encode(s),
            )
            if cache is not None:
                cache.put(execution_id, s, t)
        conn.execute(update_summaries_sql(len(chunk)), values)


def _lock_pending(
    conn: sqlite3.Connection,
    notes: _Notes,
    ffqns: list[str],
    batch_size: int,
    now: datetime,
    locked: ev.Locked,
    with_log: bool,
    pinned_digest: str | None = None,
) -> list[LockedExecution]:
    rows = _due_rows(conn, ffqns, batch_size, _us(now), pinned_digest)
    cache = _summaries(conn)
    # An optimistic batch reads the database as it was before the batch: a row an earlier
    # transaction of the batch wrote is not as read here. (Every row is noted as touched
    # when its lock is written below.)
    if (
        cache is not None
        and isinstance(conn, BufferedConnection)
        and any(row[0] in cache.tx for row in rows)
    ):
        raise NeedsWriteLock("a due execution was written earlier in the batch")
    created_blobs: dict[str, bytes] = {}
    if rows and not with_log:
        ids = [row[0] for row in rows]
        created_blobs = dict(
            conn.execute(
                "SELECT execution_id, event FROM events WHERE version = 0 "
                f"AND execution_id IN ({','.join('?' * len(ids))})",
                ids,
            ).fetchall()
        )
    locks: list[tuple[str, datetime, ExecutionSummary]] = []
    for execution_id, _, summary_blob, updated_at in rows:
        at = _not_before(now, updated_at)
        s = apply_event(_summary_decoder.decode(summary_blob), locked, at)
        locks.append((execution_id, at, s))
    # The logs are read before the locks are written (an optimistic batch does not see
    # its own writes): each gets its `locked` event added here.
    logs: dict[str, tuple[list[ev.StoredEvent], list[ev.StoredResponse]]] = {}
    if with_log:
        for execution_id, at, s in locks:
            logs[execution_id] = (
                [
                    ev.StoredEvent(v, _dt(t), ev.decode_event(b), bt)
                    for v, t, b, bt in conn.execute(
                        "SELECT version, created_at, event, backtrace_id FROM events "
                        "WHERE execution_id = ? ORDER BY version",
                        (execution_id,),
                    )
                ]
                + [ev.StoredEvent(s.next_version - 1, _dt(_us(at)), locked, None)],
                [
                    ev.StoredResponse(c, _dt(t), ev.decode_response(b))
                    for c, t, b in conn.execute(
                        "SELECT cursor, created_at, response FROM responses "
                        "WHERE execution_id = ? ORDER BY cursor",
                        (execution_id,),
                    )
                ],
            )
    _write_locks(conn, locks, ev.encode(locked))
    result: list[LockedExecution] = []
    for execution_id, _, s in locks:
        stored_events = None
        stored_responses = None
        if with_log:
            stored_events, stored_responses = logs[execution_id]
            created = stored_events[0].event
        else:
            created = ev.decode_event(created_blobs[execution_id])
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
                events=stored_events,
                responses=stored_responses,
            )
        )
    return result


def _append_fn(
    execution_id: str,
    expected_version: int,
    events: Sequence[ev.Event],
    now: datetime,
    extras: AppendExtras | None,
) -> Callable[[sqlite3.Connection, _Notes], ExecutionSummary]:
    """The logical transaction of an append (backtraces prepared by the caller's thread,
    not the writer's)."""
    backtraces = _prepare_backtraces(extras.component_digest, extras.backtraces) if extras else []
    events = list(events)
    return lambda c, n: _append(
        c, n, execution_id, expected_version, events, now, extras, backtraces
    )


def _append(
    conn: sqlite3.Connection,
    notes: _Notes,
    execution_id: str,
    expected_version: int,
    events: list[ev.Event],
    now: datetime,
    extras: AppendExtras | None,
    backtraces: Sequence[_PreparedBacktrace] = (),
) -> ExecutionSummary:
    s, now = _load_summary_for_write(conn, execution_id, now)
    if s.next_version != expected_version:
        raise VersionConflict(
            f"execution {execution_id}: expected version {expected_version}, "
            f"but the next version is {s.next_version}"
        )
    creates = {c.execution_id: c for c in (extras.creates if extras else [])}
    backtrace_of = _backtrace_ids(conn, backtraces)
    t = _us(now)
    # Nothing below reads this execution's events: they are inserted at the end, in one
    # statement (each statement is a GIL hand-off on this thread).
    rows: list[Any] = []
    for index, event in enumerate(events):
        try:
            s = apply_event(s, event, now)
        except IllegalAppend as e:
            raise Conflict(f"execution {execution_id}: {e}") from None
        rows += (execution_id, s.next_version - 1, t, ev.encode(event), backtrace_of.get(index))
        match event:
            case ev.HistoryEvent(event=ev.JoinSetRequest(join_set_id=js, request=req)):
                if isinstance(req, ev.ChildExecutionRequest):
                    _create_side(conn, notes, creates, req.child_execution_id, now, rows)
                elif req.expires_at <= now:
                    # Already due (e.g. a clock read): answered in the same transaction.
                    response = ev.DelayFinished(req.delay_id, js, "ok")
                    s = _add_response(conn, notes, execution_id, response, now, summary=s)
                else:
                    conn.execute(
                        "INSERT INTO delays (delay_id, execution_id, join_set_id, expires_at) "
                        "VALUES (?,?,?,?)",
                        (req.delay_id, execution_id, js, _us(req.expires_at)),
                    )
            case ev.HistoryEvent(event=ev.Schedule(execution_id=scheduled)):
                _create_side(conn, notes, creates, scheduled, now, rows)
            case ev.Finished(result=result):
                notes.finished.append((execution_id, result))
                if s.is_workflow:  # only workflows have delays
                    conn.execute("DELETE FROM delays WHERE execution_id = ?", (execution_id,))
                parent = ExecutionId.parse(execution_id).parent()
                if parent is not None:
                    parent_id, join_set = parent
                    _add_response(
                        conn,
                        notes,
                        str(parent_id),
                        ev.ChildExecutionFinished(
                            execution_id, str(join_set), s.next_version - 1, result
                        ),
                        now,
                    )
            case ev.CancellationRequested():
                notes.cancelled.add(execution_id)
            case _:
                pass
    for i in range(0, len(rows), 2500):  # 500 events per statement
        chunk = rows[i : i + 2500]
        conn.execute(
            "INSERT INTO events (execution_id, version, created_at, event, backtrace_id) VALUES "
            + ",".join(["(?,?,?,?,?)"] * (len(chunk) // 5)),
            chunk,
        )
    _write_summary(conn, execution_id, s, now)
    if isinstance(s.state, PendingAt):
        notes.became_pending(s.ffqn, s.state.scheduled_at, now)
    if s.cancelling:
        notes.cancelling.add(execution_id)
    if extras and extras.logs:
        _insert_logs(conn, execution_id, extras.run_id, extras.logs, now)
    return s


def _backtrace_id(conn: sqlite3.Connection, bt: _PreparedBacktrace) -> int:
    """The id of the stored backtrace with these frames, inserted when new (dedup)."""
    known = getattr(conn, "backtrace_ids", None)
    if known is not None and (found := known.get(bt.key)) is not None:
        return int(found)
    row = conn.execute("SELECT backtrace_id FROM backtraces WHERE hash = ?", (bt.key,)).fetchone()
    if row is not None:
        if known is not None and bt.key not in conn.new_backtraces:  # type: ignore[attr-defined]
            known[bt.key] = int(row[0])  # committed: it stays (backtraces are never deleted)
        return int(row[0])
    cursor = conn.execute(
        "INSERT INTO backtraces (hash, component_digest, frames) VALUES (?,?,?)",
        (bt.key, bt.component_digest, bt.frames),
    )
    if known is not None:
        conn.new_backtraces.add(bt.key)  # type: ignore[attr-defined]
    assert cursor.lastrowid is not None
    return cursor.lastrowid


class _WriterConnection(sqlite3.Connection):
    """The writer's connection, with what it remembers across its transactions."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Backtrace hash → id of rows known to be committed: a workflow's stacks
        #: repeat, and each one is looked up once instead of at every write.
        self.backtrace_ids: dict[bytes, int] = {}
        #: Hashes the current physical transaction inserted (a rollback undoes them).
        self.new_backtraces: set[bytes] = set()
        self.summaries = SummaryCache(f"{os.getpid()}-{os.urandom(6).hex()}")
        #: Taken before BEGIN IMMEDIATE, let go after COMMIT / ROLLBACK (set at start).
        self.write_lock: WriteLock | None = None
        #: Batches written optimistically, those that then ran the usual way, and why
        #: (`_count`).
        self.counters: dict[str, int] = {}


def _summaries(conn: sqlite3.Connection) -> SummaryCache | None:
    return getattr(conn, "summaries", None)


def _begin(conn: sqlite3.Connection) -> None:
    _begin_write(conn)
    cache = _summaries(conn)
    if cache is not None:
        try:
            cache.began(conn)
        except BaseException:  # nothing written yet: no transaction may stay open
            with contextlib.suppress(sqlite3.Error):
                _end(conn, "ROLLBACK")
            raise


#: How long a writer retries BEGIN IMMEDIATE while another one holds the database.
BEGIN_TIMEOUT = 10.0


def _begin_write(conn: sqlite3.Connection) -> None:
    """Take the write lock: the lock file, then SQLite's. The writer's connection has
    no busy timeout (SQLite's busy handler sleeps a millisecond or more between tries):
    the previous holder is at most finishing its COMMIT, so retry at once, then back
    off."""
    lock: WriteLock | None = getattr(conn, "write_lock", None)
    if lock is not None:
        lock.acquire()
    try:
        pause = 0.00005
        deadline = 0.0
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as e:
                if not _is_busy(e):
                    raise
                now = time.monotonic()
                if not deadline:
                    deadline = now + BEGIN_TIMEOUT
                elif now > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.002)
    except BaseException:
        _release(conn)
        raise
    new = getattr(conn, "new_backtraces", None)
    if new:
        new.clear()


def _is_busy(e: sqlite3.Error) -> bool:
    text = str(e)
    return "locked" in text or "busy" in text


def _end(conn: sqlite3.Connection, how: str) -> None:
    """COMMIT or ROLLBACK the physical transaction, letting the next writer go.

    The lock file goes first: SQLite lets go of its own lock inside the COMMIT, right
    after the fsync, without waiting for this thread to get the GIL back (which can
    take milliseconds while the process's runs take turns). The next writer meanwhile
    retries its BEGIN (`_begin_write`)."""
    _release(conn)
    conn.execute(how)


def _release(conn: sqlite3.Connection) -> None:
    lock: WriteLock | None = getattr(conn, "write_lock", None)
    if lock is not None:
        lock.release()


def _record_unknown(conn: sqlite3.Connection, writer_id: str) -> None:
    """After a `_Call` changed rows outside a batch: the other writers forget everything
    (before the first migration there is no table to tell them: nothing to forget)."""
    if conn.in_transaction:
        return  # it left its own transaction open: its owner decides (tests only)
    try:
        _begin_write(conn)
    except sqlite3.OperationalError:  # before the first migration: nobody to tell
        return
    try:
        record_unknown_writes(conn, writer_id)
        _end(conn, "COMMIT")
    except sqlite3.Error:
        with contextlib.suppress(sqlite3.Error):
            _end(conn, "ROLLBACK")


def _record_writes(conn: sqlite3.Connection, changes_before: int) -> None:
    """Before the COMMIT: name what this transaction wrote for the other writers
    (`engine.storage.sqlite_cache`), when it changed anything."""
    cache = _summaries(conn)
    if cache is not None and conn.total_changes != changes_before:
        cache.record_writes(conn)


def _backtrace_ids(
    conn: sqlite3.Connection, backtraces: Sequence[_PreparedBacktrace]
) -> dict[int, int]:
    """`at` → backtrace id, looking each distinct stack up once."""
    by_key: dict[bytes, int] = {}
    out: dict[int, int] = {}
    for bt in backtraces:
        found = by_key.get(bt.key)
        if found is None:
            found = by_key[bt.key] = _backtrace_id(conn, bt)
        out[bt.at] = found
    return out


def _replace_backtraces(
    conn: sqlite3.Connection,
    execution_id: str,
    backtraces: Sequence[_PreparedBacktrace],
    below_version: int,
) -> int:
    _load_summary(conn, execution_id)  # NotFound
    conn.execute(
        "UPDATE events SET backtrace_id = NULL "
        "WHERE execution_id = ? AND version < ? AND backtrace_id IS NOT NULL",
        (execution_id, below_version),
    )
    count = 0
    ids = _backtrace_ids(conn, [bt for bt in backtraces if bt.at < below_version])
    for version, backtrace_id in ids.items():
        cursor = conn.execute(
            "UPDATE events SET backtrace_id = ? WHERE execution_id = ? AND version = ?",
            (backtrace_id, execution_id, version),
        )
        count += cursor.rowcount
    return count


def _create_side(
    conn: sqlite3.Connection,
    notes: _Notes,
    creates: dict[str, CreateRequest],
    execution_id: str,
    now: datetime,
    event_rows: list[Any] | None = None,
) -> None:
    req = creates.get(execution_id)
    if req is None:
        raise StorageError(f"missing creation request for {execution_id}")
    _create(conn, notes, req, now, event_rows)


def _add_response(
    conn: sqlite3.Connection,
    notes: _Notes,
    execution_id: str,
    response: ev.Response,
    now: datetime,
    summary: ExecutionSummary | None = None,
) -> ExecutionSummary:
    """Write a response to `execution_id`, at `now` or just after its last write, and
    its new summary. With `summary` (the execution's own append, which writes it at the
    end) the response is applied to that instead and the summary is not written."""
    if summary is None:
        s, now = _load_summary_for_write(conn, execution_id, now)
    else:
        s = summary
    source = (
        response.child_execution_id
        if isinstance(response, ev.ChildExecutionFinished)
        else response.delay_id
    )
    try:
        s = apply_response(s, response, now)
    except IllegalAppend as e:
        raise Conflict(f"execution {execution_id}: {e}") from None
    t = _us(now)
    try:
        conn.execute(
            "INSERT INTO responses (execution_id, cursor, created_at, source_id, response) "
            "VALUES (?,?,?,?,?)",
            (execution_id, s.responses, t, source, ev.encode(response)),
        )
    except sqlite3.IntegrityError:
        raise Conflict(f"execution {execution_id} already has a response for {source}") from None
    if isinstance(response, ev.DelayFinished):
        conn.execute("DELETE FROM delays WHERE delay_id = ?", (response.delay_id,))
    notes.responses.add(execution_id)
    notes.response_items.append((execution_id, ev.StoredResponse(s.responses, _dt(t), response)))
    if summary is not None:
        return s
    _write_summary(conn, execution_id, s, now)
    if isinstance(s.state, PendingAt):
        notes.became_pending(s.ffqn, s.state.scheduled_at, now)
    if s.cancelling:
        notes.cancelling.add(execution_id)
    return s


def _insert_logs(
    conn: sqlite3.Connection,
    execution_id: str,
    run_id: str | None,
    lines: Sequence[LogLine],
    now: datetime,
) -> None:
    conn.executemany(
        "INSERT INTO logs (execution_id, run_id, created_at, level, stream, message) "
        "VALUES (?,?,?,?,?,?)",
        [
            (execution_id, run_id, _us(line.written_at(now)), line.level, line.stream, line.message)
            for line in lines
        ],
    )


def _pause(
    conn: sqlite3.Connection, notes: _Notes, execution_id: str, now: datetime
) -> ExecutionSummary:
    s = _load_summary(conn, execution_id)
    events = pause_events(s, execution_id, now, notes)
    return _append(conn, notes, execution_id, s.next_version, events, now, None)


def _cancel(
    conn: sqlite3.Connection, notes: _Notes, execution_id: str, now: datetime, force: bool
) -> ExecutionSummary:
    s = _load_summary(conn, execution_id)
    events = cancel_events(s, execution_id, force)
    return _append(conn, notes, execution_id, s.next_version, events, now, None)


def _cancel_delay(
    conn: sqlite3.Connection, notes: _Notes, delay_id: str, now: datetime
) -> ExecutionSummary:
    """`delay_finished(cancelled)` to the owner of a live delay (SPEC §8)."""
    row = conn.execute(
        "SELECT execution_id, join_set_id FROM delays WHERE delay_id = ?", (delay_id,)
    ).fetchone()
    if row is None:
        owner = str(DelayId.parse(delay_id).owner()[0])
        answered = conn.execute(
            "SELECT 1 FROM responses WHERE execution_id = ? AND source_id = ?", (owner, delay_id)
        ).fetchone()
        if answered is not None:
            raise Conflict(f"delay {delay_id} has already finished")
        requested = conn.execute(
            "SELECT 1 FROM events WHERE execution_id = ? AND instr(event, ?) > 0 LIMIT 1",
            (owner, ev.encode(delay_id)),
        ).fetchone()
        if requested is not None:  # its execution finished without it
            raise Conflict(f"delay {delay_id} cannot be cancelled: {owner} is already finished")
        raise NotFound(f"delay {delay_id} not found")
    execution_id, join_set_id = row
    return _add_response(
        conn, notes, execution_id, ev.DelayFinished(delay_id, join_set_id, "cancelled"), now
    )


_ORDER_BY: dict[str, str] = {
    "created_desc": "created_at DESC, execution_id DESC",
    "created_asc": "created_at ASC, execution_id ASC",
    "updated_desc": "updated_at DESC, execution_id DESC",
}


def _list_where(flt: ListFilter) -> tuple[str, list[Any]]:
    """The WHERE clause (with its leading space, or empty) of a list filter."""
    where: list[str] = []
    args: list[Any] = []
    if flt.ffqn_prefix:
        where.append("ffqn >= ? AND ffqn < ?")
        args += [flt.ffqn_prefix, flt.ffqn_prefix + "\U0010ffff"]
    if flt.states:
        where.append(f"state IN ({','.join('?' * len(flt.states))})")
        args += list(flt.states)
    if flt.hide_finished:
        where.append("state != 'finished'")
    if flt.top_level_only:
        where.append("parent_id IS NULL")
    if flt.id_prefix:
        where.append("execution_id >= ? AND execution_id < ?")
        args += [flt.id_prefix, flt.id_prefix + "\U0010ffff"]
    if flt.before_id and flt.before_created_at is not None:
        where.append("(created_at, execution_id) < (?, ?)")
        args += [us(flt.before_created_at), flt.before_id]
    elif flt.before_id:
        where.append(
            "(created_at, execution_id) < (SELECT created_at, execution_id FROM executions "
            "WHERE execution_id = ?)"
        )
        args.append(flt.before_id)
    return (" WHERE " + " AND ".join(where) if where else ""), args


_event_type = event_type


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
        _summary_decoder.decode(blob),
    )
