"""In-process wake-ups after a commit, so that nothing polls the database.

A backend calls these after its transaction committed; waiters are plain asyncio
futures/events on the engine's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import repeat

from engine.core import events as ev

log = logging.getLogger("obelisk.storage")


class _PendingFlag:
    """One waiting task's wake-up for some FFQNs. It stays set until that task waits
    again, so a notification that comes while the task is busy (locking, between two
    waits) is not lost: the writer does not wait for the loop between batches, so a
    commit can be announced after the lock that ran before it returned, but before the
    executor waits again."""

    __slots__ = ("event", "ffqns")

    def __init__(self, ffqns: tuple[str, ...]) -> None:
        self.ffqns = ffqns
        self.event = asyncio.Event()


class Commits:
    """Physical transactions whose responses were posted to inboxes before their COMMIT
    (SQLite: the run computes while the writer fsyncs), numbered in commit order; each is
    settled once: committed, or failed (rolled back). Thread-safe."""

    def __init__(self) -> None:
        # `with self._lock` rather than `with self._cond` (the same lock): the
        # Condition's `__enter__`/`__exit__` are two Python calls per use, on every write.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._begun = 0
        self._settled = 0
        self._failed: set[int] = set()
        self._closed = False

    def begin(self) -> int:
        with self._lock:
            self._begun += 1
            return self._begun

    def settle(self, seq: int, committed: bool) -> None:
        with self._lock:
            if not committed:
                self._failed.add(seq)
            self._settled = max(self._settled, seq)
            self._cond.notify_all()

    def close(self) -> None:
        """The writer stopped: whatever it did not settle did not commit."""
        with self._lock:
            self._failed.update(range(self._settled + 1, self._begun + 1))
            self._settled = self._begun
            self._closed = True
            self._cond.notify_all()

    def failed_between(self, low: int, high: int) -> bool:
        """Whether a transaction numbered `low`..`high` is settled as failed (no wait)."""
        # Asked for every write, and usually nothing ever failed: a set's truthiness is
        # read atomically, and a failure is added before its transaction is settled.
        if not self._failed:
            return False
        with self._lock:
            return any(low <= seq <= high for seq in self._failed)

    def wait(self, seq: int) -> bool:
        """Whether transaction `seq` committed, waiting until it is settled."""
        with self._lock:
            self._cond.wait_for(lambda: self._settled >= seq)
            return seq not in self._failed


class ResponseInbox:
    """The responses of one execution as they commit, for its workflow run waiting on a
    worker thread: the backend hands them over (`post`, thread-safe) instead of waking a
    loop task that reads them back from the database and wakes the thread in turn.
    When a backend only learns that responses arrived (another process, a reconnect) it
    `poke`s: the run must read the database. `wake` (an interrupt) ends a `take`.

    A response may be posted while its transaction is still being made durable (`seq`
    of `Commits`), and so may the outcome of the run's own write (`note_uncommitted`):
    the run may compute with them. Its next writes carry `uncommitted`, and the storage
    refuses them if one of those transactions failed; before anything else that depends
    on them (a read of the database, the end of the run) it asks `wait_committed`.

    The waiting run sleeps on a C queue holding at most one token (`_signal`), not on a
    `threading.Condition` (Python code: ~4 calls per notify and per wait, on the writer's
    thread and the run's, for every response)."""

    __slots__ = (
        "_commits",
        "_items",
        "_lock",
        "_low",
        "_poked",
        "_seq",
        "_signal",
        "_signalled",
        "_woken",
    )

    def __init__(self, commits: Commits | None = None) -> None:
        self._lock = threading.Lock()
        #: The wake-up token, there while `_signalled` (both changed under `_lock`).
        self._signal: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._signalled = False
        self._items: list[tuple[ev.StoredResponse, int]] = []
        self._poked = False
        self._woken = False
        self._commits = commits
        #: The earliest and the latest not yet confirmed transaction of what the run was
        #: given (responses taken, its own writes answered early; 0: none).
        self._low = 0
        self._seq = 0

    def post(self, items: Sequence[ev.StoredResponse], seq: int = 0) -> None:
        """`seq` 0: committed; else the number of the `Commits` transaction they are in."""
        with self._lock:
            self._items.extend(zip(items, repeat(seq)))  # (no generator: a call less)
            self._notify()

    @property
    def uncommitted(self) -> tuple[int, int]:
        """The earliest and the latest transaction the run computed with that may not be
        durable yet ((0, 0): none)."""
        return self._low, self._seq

    def note_uncommitted(self, seq: int) -> None:
        """The run computed with transaction `seq` (owner thread only)."""
        if seq:
            self._seq = max(self._seq, seq)
            self._low = min(self._low, seq) if self._low else seq

    def wait_committed(self) -> bool:
        """Whether everything the run was given so far is committed, waiting for the
        transactions still being committed. False: one of them was rolled back."""
        low, seq = self._low, self._seq
        if seq == 0 or self._commits is None:
            return True
        self._commits.wait(seq)
        if self._commits.failed_between(low, seq):
            return False
        self._low = self._seq = 0
        return True

    def poke(self) -> None:
        with self._lock:
            self._poked = True
            self._notify()

    def wake(self) -> None:
        with self._lock:
            self._woken = True
            self._notify()

    def _notify(self) -> None:
        """(Under `_lock`.) Wake the `take` waiting, or make the next one return at once."""
        if not self._signalled:
            self._signalled = True
            self._signal.put(None)

    def take(self, timeout: float) -> tuple[list[ev.StoredResponse], bool]:
        """What was posted, and whether it was poked, since the last `take`; waits up to
        `timeout` seconds for either (or a `wake`) when there is none."""
        woken = False
        if timeout > 0 and not (self._items or self._poked or self._woken):
            # (Read without the lock: something posted meanwhile leaves the token.)
            try:
                self._signal.get(True, timeout)
                woken = True
            except queue.Empty:
                pass
        with self._lock:
            if woken:
                self._signalled = False  # the token was taken above
            elif self._signalled:
                self._signal.get_nowait()  # what was posted is taken now: no token left
                self._signalled = False
            items, self._items = self._items, []
            poked, self._poked = self._poked, False
            self._woken = False
        if not items:  # (most takes: no comprehension, which is a call)
            return [], poked
        for _, seq in items:
            self.note_uncommitted(seq)
        return [item for item, _ in items], poked


class Notifier:
    def __init__(self) -> None:
        self._pending_waiters: dict[str, set[_PendingFlag]] = defaultdict(set)
        #: Per waiting task (an executor's loop) and FFQNs.
        self._pending_flags: dict[tuple[asyncio.Task[object], tuple[str, ...]], _PendingFlag] = {}
        self._result_waiters: dict[str, list[asyncio.Future[ev.ExecutionResult]]] = defaultdict(
            list
        )
        self._response_waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._cancel_callbacks: dict[str, Callable[[], None]] = {}
        self._cancelling: set[str] = set()
        self._cancelling_changed = asyncio.Event()
        self._generation = 0
        self._changed = asyncio.Event()
        #: Per FFQN: the wake-up for its earliest execution that is pending but not due.
        self._later: dict[str, asyncio.TimerHandle] = {}
        #: Thread-safe: posted to from a backend's writer thread.
        self._inboxes: dict[str, list[ResponseInbox]] = {}
        self._inbox_lock = threading.Lock()
        self.commits = Commits()

    def close(self) -> None:
        """The storage closed: nothing more will be announced."""
        for timer in self._later.values():
            timer.cancel()
        self._later.clear()

    # -- pending work per FFQN ----------------------------------------------
    async def wait_pending(self, ffqns: Sequence[str], timeout: float) -> None:
        """Return at the first notification for one of `ffqns` since this task's
        previous call (at once if one came meanwhile), or after `timeout` seconds."""
        flag = self._flag(tuple(ffqns))
        if not flag.event.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(flag.event.wait(), timeout)
        flag.event.clear()

    def _flag(self, ffqns: tuple[str, ...]) -> _PendingFlag:
        task = asyncio.current_task()
        assert task is not None
        key = (task, ffqns)
        flag = self._pending_flags.get(key)
        if flag is None:
            flag = self._pending_flags[key] = _PendingFlag(ffqns)
            for f in ffqns:
                self._pending_waiters[f].add(flag)
            task.add_done_callback(lambda _t: self._drop_flag(key))
        return flag

    def _drop_flag(self, key: tuple[asyncio.Task[object], tuple[str, ...]]) -> None:
        flag = self._pending_flags.pop(key, None)
        if flag is None:
            return
        for f in flag.ffqns:
            waiters = self._pending_waiters.get(f)
            if waiters is not None:
                waiters.discard(flag)
                if not waiters:
                    del self._pending_waiters[f]

    def pending(self, ffqn: str) -> None:
        for flag in self._pending_waiters.get(ffqn, ()):
            flag.event.set()

    def pending_later(self, ffqn: str, delay: float) -> None:
        """An execution of `ffqn` becomes due in `delay` seconds: wake its executors
        then (one timer per FFQN, for the earliest)."""
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        timer = self._later.get(ffqn)
        if timer is not None:
            if timer.when() <= when:
                return
            timer.cancel()
        self._later[ffqn] = loop.call_at(when, self._fire_later, ffqn)

    def _fire_later(self, ffqn: str) -> None:
        self._later.pop(ffqn, None)
        self.pending(ffqn)

    # -- results --------------------------------------------------------------
    def result_future(self, execution_id: str) -> asyncio.Future[ev.ExecutionResult]:
        fut: asyncio.Future[ev.ExecutionResult] = asyncio.get_running_loop().create_future()
        self._result_waiters[execution_id].append(fut)
        return fut

    def drop_result_future(
        self, execution_id: str, fut: asyncio.Future[ev.ExecutionResult]
    ) -> None:
        waiters = self._result_waiters.get(execution_id)
        if waiters and fut in waiters:
            waiters.remove(fut)
            if not waiters:
                del self._result_waiters[execution_id]

    def awaited_results(self) -> list[str]:
        """The executions someone waits for the result of."""
        return list(self._result_waiters)

    def awaits_result(self, execution_id: str) -> bool:
        """Someone waits for the result of `execution_id` (any thread may ask)."""
        return execution_id in self._result_waiters

    def awaits_response(self, execution_id: str) -> bool:
        """Someone on the loop waits for responses to `execution_id` (any thread)."""
        return execution_id in self._response_waiters

    def finished(self, execution_id: str, result: ev.ExecutionResult) -> None:
        for fut in self._result_waiters.pop(execution_id, ()):
            if not fut.done():
                fut.set_result(result)

    # -- responses to a workflow ---------------------------------------------
    def response_event(self, execution_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self._response_waiters[execution_id].add(event)
        return event

    def drop_response_event(self, execution_id: str, event: asyncio.Event) -> None:
        waiters = self._response_waiters.get(execution_id)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._response_waiters[execution_id]

    def response(self, execution_id: str, *, posted: bool = False) -> None:
        """Responses to `execution_id` committed: wake its waiters. `posted`: the
        backend already handed them to its inboxes (`post_responses`); otherwise the
        inboxes are poked to read them from the database."""
        for event in self._response_waiters.get(execution_id, ()):
            event.set()
        if not posted:
            self._poke(execution_id)

    # -- response inboxes (workflow runs on worker threads) -------------------
    def open_inbox(self, execution_id: str) -> ResponseInbox:
        inbox = ResponseInbox(self.commits)
        with self._inbox_lock:
            self._inboxes.setdefault(execution_id, []).append(inbox)
        return inbox

    def close_inbox(self, execution_id: str, inbox: ResponseInbox) -> None:
        with self._inbox_lock:
            inboxes = self._inboxes.get(execution_id)
            if inboxes and inbox in inboxes:
                inboxes.remove(inbox)
                if not inboxes:
                    del self._inboxes[execution_id]

    def post_responses(
        self, execution_id: str, items: Sequence[ev.StoredResponse], seq: int = 0
    ) -> None:
        """Hand responses to the inboxes of `execution_id` (any thread): committed, or
        in transaction `seq` of `commits` that is being committed."""
        with self._inbox_lock:
            inboxes = list(self._inboxes.get(execution_id, ()))
        for inbox in inboxes:
            inbox.post(items, seq)

    def _poke(self, execution_id: str | None = None) -> None:
        with self._inbox_lock:
            if execution_id is None:
                inboxes = [i for group in self._inboxes.values() for i in group]
            else:
                inboxes = list(self._inboxes.get(execution_id, ()))
        for inbox in inboxes:
            inbox.poke()

    # -- cancellation of running executions ----------------------------------
    def add(self, execution_id: str, callback: Callable[[], None]) -> None:
        self._cancel_callbacks[execution_id] = callback

    def remove(self, execution_id: str, callback: Callable[[], None] | None = None) -> None:
        """Forget the listener of `execution_id` (only if it is `callback`, when given:
        a new run of the execution may have registered its own)."""
        if callback is None or self._cancel_callbacks.get(execution_id) == callback:
            self._cancel_callbacks.pop(execution_id, None)

    def listens(self, execution_id: str) -> bool:
        """Whether a run here holds `execution_id` (its cancellation listener is added)."""
        return execution_id in self._cancel_callbacks

    def cancelled(self, execution_id: str) -> None:
        callback = self._cancel_callbacks.get(execution_id)
        if callback is not None:
            # Called by the storage's writer after a commit: a failing listener is logged,
            # it must not stop the writer nor the other notifications.
            try:
                callback()
            except Exception:
                log.exception("cancellation listener of %s failed", execution_id)

    # -- cancelling executions (the cancellation driver) ---------------------
    def cancelling(self, execution_id: str) -> None:
        """A cancelling execution changed: cancellation requested, a response arrived,
        its run released it."""
        self._cancelling.add(execution_id)
        self._cancelling_changed.set()

    async def wait_cancelling(self, timeout: float) -> set[str]:
        """The cancelling executions that changed since the last call, waiting up to
        `timeout` seconds for one (an empty set on timeout). One consumer per storage."""
        if not self._cancelling:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._cancelling_changed.wait(), max(0.0, timeout))
        self._cancelling_changed.clear()
        changed, self._cancelling = self._cancelling, set()
        return changed

    # -- after missed notifications ---------------------------------------------
    def wake_all(self) -> None:
        """Wake every executor and workflow waiting, to re-check the database (a backend
        whose cross-process notifications may have been lost)."""
        for waiters in list(self._pending_waiters.values()):
            for flag in waiters:
                flag.event.set()
        for responses in list(self._response_waiters.values()):
            for event in responses:
                event.set()
        self._poke()
        self._cancelling_changed.set()

    # -- generic change feed ---------------------------------------------------
    @property
    def generation(self) -> int:
        return self._generation

    def changed(self) -> None:
        self._generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_changed(self, since: int, timeout: float) -> int:
        if self._generation != since:
            return self._generation
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout)
        return self._generation
