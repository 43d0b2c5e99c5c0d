"""Batches of logical transactions, as the writer thread runs them.

A logical transaction (`_Tx`) is a plain function on the writer's connection
(`engine.storage.sqlite.transactions`); the writer runs everything queued as one
physical transaction. The usual batch runs without savepoints (`_run_batch_plain`); when
one transaction fails, the batch runs again with a SAVEPOINT per transaction, so that the
failing one is rolled back alone. When other processes share the file, a batch may be
computed before taking the write lock and written in a short phase 2
(`_run_batch_optimistic`, `engine.storage.sqlite.optimistic`). Outcomes reach runs on
other threads just before the COMMIT (`_EarlyResponses`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.core.state import (
    BlockedByJoinSet,
    IllegalAppend,
)
from engine.storage.common import (
    Notes,
    announce_direct,
    grouped_responses,
)
from engine.storage.contract import (
    Conflict,
    StorageError,
)
from engine.storage.disk_full import is_disk_full, write_error
from engine.storage.notify import Notifier
from engine.storage.sqlite.cache import SummaryCache
from engine.storage.sqlite.connection import (
    _begin,
    _begin_write,
    _end,
    _record_writes,
    _release,
    _summaries,
)
from engine.storage.sqlite.optimistic import (
    BufferedConnection,
    NeedsWriteLock,
    Write,
    apply_writes,
)

log = logging.getLogger("obelisk.storage")
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
    #: Whether it may run in an optimistic batch (`engine.storage.sqlite.optimistic`):
    #: the usual writes, whose reads are all of executions they also note or write.
    optimistic: bool = False


@dataclass(slots=True)
class _Call:
    """Something to run on the writer's connection outside any batch (setup, tests)."""

    fn: Callable[[sqlite3.Connection], Any]
    future: asyncio.Future[Any]


_Outcome = tuple[bool, Any, _Notes]


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
    (`engine.storage.sqlite.optimistic`); None when it must run the usual way (a write
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
            # (`tx.depends_on[1]` first: most depend on nothing, and a call is dear here.)
            if tx.depends_on[1] and (refusal := _refused(early, tx)) is not None:
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
    if early is None or not tx.depends_on[1] or not early.refused(tx):  # (most: none)
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
        if tx.depends_on[1] and (refusal := _refused(early, tx)) is not None:  # (see above)
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
    waiting = _lingering_for(outcomes) if more is not None else None
    if not waiting:
        # Named before anything wakes the process's other threads: each statement gives
        # the GIL up, and getting it back from the runs just woken takes milliseconds
        # (2.4 ms at the median in (b) when it came after `early.post`).
        try:
            _record_writes(conn, changes_before)
        except Exception:
            with contextlib.suppress(sqlite3.Error):
                _end(conn, "ROLLBACK")
            return None
        # The lock file too (`_end` would let go of it right after the wake-ups, and
        # `flock` gives the GIL up as well); SQLite's lock holds until the COMMIT.
        _release(conn)
    # Directly locked children start now: their runs overlap the fsync of the COMMIT
    # that creates them. Should that COMMIT fail, the savepoint retry writes the same
    # locks again (a second hand-over is a no-op) or the runs' outcomes find no such
    # execution and are dropped: an activity may run once more, never be lost.
    _hand_over_direct(outcomes)
    if early is not None:
        early.post(batch, outcomes)
    try:
        if waiting and more is not None:
            _linger(conn, batch, outcomes, early, more, waiting)
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
    waiting: set[str],
) -> None:
    """Keep the transaction open, up to `LINGER` seconds, while children it locked
    directly are running (`waiting`; a quick activity reports in a fraction of a
    millisecond): their outcomes, and whatever else is queued meanwhile, join it, each
    in a savepoint, instead of waiting for this COMMIT and making a second one. Nobody
    waits for the durability of what was handed over early."""
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


def _lingering_for(outcomes: Sequence[_Outcome]) -> set[str]:
    """The children that these outcomes locked directly: what `_linger` waits for."""
    return {
        execution.execution_id
        for ok, _, notes in outcomes
        if ok
        for _, execution in notes.direct
        if execution is not None
    }


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
