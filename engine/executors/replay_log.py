"""The log side of a replaying workflow run (`engine.executors.replay_host`): the state one
`ReplayHost` keeps, matching each host call against the next recorded history event
(SPEC §7.1), buffering and writing new events with lock extensions (SPEC §6.2), the
response inbox, and stopping the run (interrupts, lost locks, nondeterminism).

`ReplayLog` is the base class of `ReplayHost`, which adds the host API (`WorkflowHost`)
on top of it.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import json
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from engine.components import Registry
from engine.core import events as ev
from engine.core.clock import Clock
from engine.core.ids import ExecutionId
from engine.core.records import Frame
from engine.runtimes.outcome import LogLine
from engine.runtimes.workflow_host import RunAborted, WorkflowCallError
from engine.storage.contract import (
    AppendExtras,
    Conflict,
    CreateRequest,
    DirectLock,
    LockedExecution,
    Storage,
    VersionConflict,
)
from engine.storage.notify import ResponseInbox

T = TypeVar("T")

#: Extend the lock when a host call comes this close to its expiry (SPEC §6.2).
LOCK_EXTENSION_LEEWAY = timedelta(milliseconds=100)
#: Buffered events are written once this many are waiting, even without a blocking call.
MAX_BUFFERED = 200
#: Seconds a waiting run goes without looking at the database (responses written by
#: other processes sharing it are not posted to its inbox).
RESPONSE_RECHECK = 1.0


class Nondeterminism(Exception):
    """The code asked for something other than what its history recorded."""


class StaleView(Exception):
    """An append was refused because responses arrived after the host looked (e.g. a
    `join_next_try{pending}` written while a response came in): look again."""


@dataclass(slots=True)
class JoinSetState:
    id: str
    members: list[str] = field(default_factory=list)  # child / delay ids, submission order
    member_ffqn: dict[str, str | None] = field(default_factory=dict)  # None for delays
    processed: set[str] = field(default_factory=set)
    closed: bool = False


@dataclass(frozen=True, slots=True)
class AbortReason:
    #: "interrupted" | "unloaded" | "lock_lost" | "nondeterminism" | "constraint_violation"
    #: | "cancelled"
    kind: str
    detail: str = ""


class ReplayLog:
    """The log of one locked run: history matching, buffered writes, responses, stopping.
    The host API is `ReplayHost`'s (a subclass)."""

    def __init__(
        self,
        *,
        locked: LockedExecution,
        storage: Storage,
        registry: Registry,
        clock: Clock,
        loop: asyncio.AbstractEventLoop,
        component_id: ev.ComponentId,
        executor_id: str,
        deployment_id: str,
        lock_expiry: timedelta,
        strategy: str,
        direct_locks: Callable[[str, datetime], DirectLock | None] | None = None,
    ) -> None:
        assert locked.events is not None and locked.responses is not None
        #: Asks an executor of this process to lock a child as it is created (FFQN, now).
        self.direct_locks = direct_locks
        self.execution_id = locked.execution_id
        self._eid = ExecutionId.parse(locked.execution_id)
        self.storage = storage
        self.registry = registry
        self.clock = clock
        self.loop = loop
        self.component_id = component_id
        self.executor_id = executor_id
        self.run_id = locked.run_id
        self.deployment_id = deployment_id
        self.lock_expiry = lock_expiry
        self.strategy = strategy
        self.retry_config = ev.RetryConfig(None, 100)
        self.version = locked.next_version
        self.lock_expires_at = locked.lock_expires_at
        self.history: list[tuple[int, ev.HistoryEventKind]] = [
            (e.version, e.event.event)
            for e in locked.events
            if isinstance(e.event, ev.HistoryEvent)
        ]
        self.cursor = 0
        self._responses_by_js: dict[str, list[ev.StoredResponse]] = {}
        self.max_cursor = 0
        self._add_responses(locked.responses)
        self._delay_expiry: dict[str, datetime] = {}
        self._consumed_by_js: dict[str, int] = {}
        self._results: dict[str, dict[str, Any]] = {}
        self.join_sets: dict[str, JoinSetState] = {}
        #: Join sets created so far per kind, which numbers them (`o:1-step`, `g:1`, SPEC
        #: §2): one-off and generated ones count separately; named ones are not numbered.
        self._join_set_counts = {"o": 0, "g": 0}
        self._join_sets_created = 0
        #: Numbered with one counter across kinds, as logs written before 2026-12-04.
        self._numbered_across_kinds = False
        self._persist_counter = 0
        self._buffer: list[ev.Event] = []
        self._creates: list[CreateRequest] = []
        self.logs: list[LogLine] = []
        #: (level, message) of the lines earlier runs stored, not yet seen again.
        self._stored_lines: collections.Counter[tuple[str, str]] | None = None
        self.stack: list[Frame] = []
        #: The guest stack of each buffered event's call (backtraces, SPEC §7.4).
        self._buffer_stacks: list[list[Frame]] = []
        self.aborted: AbortReason | None = None
        self.failure: ev.ExecutionFailure | None = None
        self._interrupt = threading.Event()
        #: Why `interrupt()` was called last (`aborted` keeps the first reason only).
        self._interrupted_by: AbortReason | None = None
        #: A response unblocked this warm run: its lock extension is written first by
        #: the next flush instead of in a transaction of its own (one commit less per
        #: blocking call; until then the execution is PendingAt, due at the old expiry).
        self._extension_due = False
        self._waiting: concurrent.futures.Future[Any] | None = None
        #: Responses committed once it is open come here (no database read, no loop
        #: hop); opened before the first write or wait (a replay may need neither)...
        self._inbox: ResponseInbox | None = None
        #: ... and the database may know responses the inbox did not bring: those
        #: committed before it opened, those of other processes.
        self._stale = True
        #: While set, `flush` raises `StaleView` for an append the state machine refused.
        self._stale_ok = False
        self.on_interrupt: list[Any] = []  # runtime callbacks (e.g. stop spinning JS)

    # ------------------------------------------------------------------------------
    # plumbing
    # ------------------------------------------------------------------------------
    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            self._committed()
        except RunAborted:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _committed(self) -> None:
        """Before a read of the database or a write through the loop: what this run was
        given or told before it was durable (`ResponseInbox`: responses, the outcomes of
        its own writes) did commit; a run that computed with something rolled back
        stops without writing (a new run replays the log). Its writes through
        `append_from_thread` need no wait: the storage refuses them in that case."""
        if self._inbox is not None and not self._inbox.wait_committed():
            raise self._abort("lock_lost", "a response it was given was not committed")

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        """`_sync` for a read that may wait long: `interrupt()` cancels it at once."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        self._waiting = fut
        try:
            if self.aborted is not None:
                fut.cancel()
            return fut.result()
        except concurrent.futures.CancelledError:
            self._check()
            raise
        finally:
            self._waiting = None

    def wait_durable(self) -> None:
        """Until everything this run wrote or computed with is durable or known lost."""
        if self._inbox is not None:
            self._inbox.wait_committed()

    def close(self) -> None:
        """The run is over: no more responses for it."""
        if self._inbox is not None:
            self.storage.close_inbox(self.execution_id, self._inbox)

    def _open_inbox(self) -> ResponseInbox:
        if self._inbox is None:
            self._inbox = self.storage.open_inbox(self.execution_id)
        return self._inbox

    def interrupt(self, kind: str, detail: str = "") -> None:
        """Stop the run from outside (cancellation, pause, shutdown). Thread-safe."""
        # The flag first: `close_from_log` clears `aborted`, then looks at the flag.
        self._interrupted_by = AbortReason(kind, detail)
        self._interrupt.set()
        if self.aborted is None:
            self.aborted = AbortReason(kind, detail)
        waiting = self._waiting
        if waiting is not None:
            waiting.cancel()
        if self._inbox is not None:
            self._inbox.wake()
        for callback in self.on_interrupt:
            callback()

    def _abort(self, kind: str, detail: str = "") -> RunAborted:
        if self.aborted is None:
            self.aborted = AbortReason(kind, detail)
        return RunAborted(f"{kind}: {detail}" if detail else kind)

    def _check(self) -> None:
        if self.aborted is not None:
            raise RunAborted(self.aborted.kind)

    def _enter(self) -> None:
        """Start of a host call: stop if aborted; extend the lock when it is about to
        expire (SPEC §6.2), also while replaying or buffering (nothing else writes then)."""
        if self.aborted is not None:  # `_check`, inline: this runs for every host call
            raise RunAborted(self.aborted.kind)
        if self.lock_expires_at - self.clock.now() < LOCK_EXTENSION_LEEWAY:
            self.flush()

    def _constraint_violation(self, detail: str) -> Exception:
        """A misuse of the host API the code may not catch (SPEC §7.3: submitting into a
        closed join set): the execution finishes `uncategorized`, its join sets closed.
        While replaying, the log was written by an engine that let the code catch it
        (before 2026-12-04): it is catchable again, so that such executions replay."""
        if self.replaying:
            return WorkflowCallError(detail)
        self.failure = ev.ExecutionFailure(
            "uncategorized", f"constraint violation: {detail}", detail
        )
        return self._abort("constraint_violation", detail)

    def _nondeterminism(self, detail: str) -> RunAborted:
        self.failure = ev.ExecutionFailure(
            "nondeterminism_detected", "nondeterminism detected", detail
        )
        return self._abort("nondeterminism", detail)

    def _next_recorded(self) -> tuple[int, ev.HistoryEventKind] | None:
        if self.cursor < len(self.history):
            item = self.history[self.cursor]
            self.cursor += 1
            return item
        return None

    @property
    def replaying(self) -> bool:
        return self.cursor < len(self.history)

    def _match(
        self,
        want: ev.HistoryEventKind,
        matches: Callable[[ev.HistoryEventKind], bool] | None = None,
    ) -> ev.HistoryEventKind | None:
        """Match the next recorded event against the call's deterministic key (by default
        equality with `want`); None when the call is new (past the end of the history)."""
        recorded = self._next_recorded()  # (a hook: the upgrade dry run stops there)
        if recorded is None:
            return None
        version, got = recorded
        if not (matches(got) if matches is not None else got == want):
            raise self._nondeterminism(
                f"at version {version} the log has {describe_event(got)}, but the code now asks for "
                f"{describe_event(want)}"
            )
        return got

    # -- writing -------------------------------------------------------------------
    def _record(
        self, event: ev.HistoryEventKind, creates: list[CreateRequest] | None = None
    ) -> None:
        self._buffer.append(ev.HistoryEvent(event))
        self._buffer_stacks.append(self.stack)
        if creates:
            self._creates.extend(creates)
        if self.strategy != "await" or len(self._buffer) >= MAX_BUFFERED:
            self.flush()

    def _take_lead(self, now: datetime) -> list[ev.Event]:
        """The lock extension the next write starts with, if one is due (SPEC §6.2)."""
        if self._extension_due or self.lock_expires_at - now < LOCK_EXTENSION_LEEWAY:
            return [self._extension(now)]
        return []

    def flush(self, extra: list[ev.Event] | None = None, lead: list[ev.Event] | None = None) -> Any:
        """Write buffered events (and `extra`) in one transaction, with a lock extension
        first when the lock is about to expire; returns the summary (None: nothing to do).

        While `_stale_ok` is set, an append refused by the state machine (not a version
        conflict) raises `StaleView` instead of aborting the run; nothing was written.
        """
        events = self._buffer + (extra or [])
        now = self.clock.now()
        expiring = self.lock_expires_at - now < LOCK_EXTENSION_LEEWAY
        if not events and not expiring and not lead:
            return None
        self._check()
        lock_expires_at = self.lock_expires_at
        if lead is None:
            lead = self._take_lead(now)
        # Backtraces (SPEC §7.4): buffered events keep the stack of the call that made
        # them; history events in `extra` are written by the call in progress.
        stacks: list[list[Frame]] = (
            [[] for _ in lead]
            + self._buffer_stacks
            + [self.stack if isinstance(e, ev.HistoryEvent) else [] for e in extra or ()]
        )
        events = lead + events
        creates = self._with_direct_locks(self._creates, now)
        extras = AppendExtras(
            creates=creates,
            logs=self.logs,
            run_id=self.run_id,
            backtraces=[(i, frames) for i, frames in enumerate(stacks) if frames],
            component_digest=self.component_id.digest,
        )
        inbox = self._inbox or self._open_inbox()  # before the commit: see below
        try:
            try:
                # Straight to the storage's writer from this thread (no loop hop).
                summary = self.storage.append_from_thread(
                    self.execution_id, self.version, events, now, extras, inbox
                )
            except BaseException:
                for c in creates:
                    if c.lock is not None:
                        c.lock.release()
                raise
        except VersionConflict as e:
            raise self._abort("lock_lost", str(e)) from None
        except Conflict as e:
            if self._stale_ok:
                self.lock_expires_at = lock_expires_at
                raise StaleView(str(e)) from None
            raise self._abort("lock_lost", str(e)) from None
        self._buffer = []
        self._buffer_stacks = []
        self._creates = []
        self.logs = []
        self._extension_due = False
        self.version = summary.next_version
        # The inbox was open before this commit: every later response will come to it
        # (posted, or a poke when another process wrote it: that sets `_stale`), so the
        # database knows more only then, or if it counted more responses than we have.
        self._stale = False
        self._pull_inbox()
        self._stale = self._stale or summary.responses > self.max_cursor
        return summary

    def _with_direct_locks(
        self, creates: list[CreateRequest], now: datetime
    ) -> list[CreateRequest]:
        """The creations of this write, children locked at once by an idle executor of
        this process where one takes them (`Storage` `CreateRequest.lock`): the child
        runs as soon as the write commits, without a pending notification and a lock
        transaction of its own. (Asked for at each write, so a write that is retried
        asks again and a failed one gives the slots back.)"""
        direct = self.direct_locks
        if direct is None or not creates:
            return creates
        out = []
        for c in creates:
            if c.created.parent is not None and c.created.scheduled_at <= now:
                lock = direct(c.created.ffqn, now)
                if lock is not None:
                    c = dataclasses.replace(c, lock=lock)
            out.append(c)
        return out

    def _extension(self, now: datetime) -> ev.Locked:
        self.lock_expires_at = now + self.lock_expiry
        return ev.Locked(
            self.component_id,
            self.executor_id,
            self.run_id,
            self.lock_expires_at,
            self.retry_config,
        )

    # -- responses -----------------------------------------------------------------
    def _add_responses(self, responses: list[ev.StoredResponse]) -> None:
        for r in responses:
            if r.cursor > self.max_cursor:
                self._responses_by_js.setdefault(r.response.join_set_id, []).append(r)
                self.max_cursor = r.cursor

    def _take_response(self, join_set_id: str) -> ev.StoredResponse | None:
        """The next response of the join set in arrival order, if it has arrived."""
        index = self._consumed_by_js.get(join_set_id, 0)
        matching = self._responses_by_js.get(join_set_id, ())
        if index < len(matching):
            self._consumed_by_js[join_set_id] = index + 1
            return matching[index]
        return None

    def _fetch_responses(self, timeout: float) -> None:
        """Bring in the responses that arrived, waiting up to `timeout` seconds for the
        first new one. With `timeout` 0: what is committed now (the database is read
        unless the inbox brought something)."""
        inbox = self._open_inbox()
        if self._pull_inbox():
            return
        if self._stale or timeout <= 0:
            self._stale = False
            found = self._sync(self.storage.get_responses(self.execution_id, self.max_cursor))
            self._add_responses(found)
            if found or timeout <= 0:
                return
        # Other processes sharing the database do not post: re-read now and then.
        items, poked = inbox.take(min(timeout, RESPONSE_RECHECK))
        if not (items or poked):
            self._stale = True  # nothing came: look at the database next time
        if not self._accept(items) or poked:
            self._stale = True

    def _pull_inbox(self) -> bool:
        """Take what the inbox holds now; True when it brought a new response."""
        items, poked = (self._inbox or self._open_inbox()).take(0)
        before = self.max_cursor
        if not self._accept(items) or poked:
            self._stale = True
        return self.max_cursor > before

    def _accept(self, items: list[ev.StoredResponse]) -> bool:
        """Add posted responses in cursor order; False on a gap (one we were not
        given, e.g. written by another process: the database has it)."""
        if not items:
            return True
        for r in sorted(items, key=lambda r: r.cursor) if len(items) > 1 else items:
            if r.cursor <= self.max_cursor:
                continue  # read from the database already
            if r.cursor != self.max_cursor + 1:
                return False
            self._add_responses([r])
        return True


def describe_event(h: ev.HistoryEventKind) -> str:
    match h:
        case ev.JoinSetCreate(join_set_id=js):
            return f"join_set_create({js})"
        case ev.JoinSetRequest(join_set_id=js, request=ev.ChildExecutionRequest() as r):
            return f"submit({js}, {r.child_execution_id}, {r.target_ffqn}, {json.dumps(r.params)})"
        case ev.JoinSetRequest(join_set_id=js, request=ev.DelayRequest() as d):
            return f"delay({js}, {d.delay_id}, {json.dumps(ev.to_builtins(d.schedule_at))})"
        case ev.JoinNext(join_set_id=js, requested_ffqn=f, closing=c):
            return f"join_next({js}{', ' + f if f else ''}{', closing' if c else ''})"
        case ev.JoinNextTry(join_set_id=js):
            return f"join_next_try({js})"
        case ev.JoinNextTooMany(join_set_id=js):
            return f"join_next_too_many({js})"
        case ev.Persist(kind=k):
            return f"persist({k.__struct_config__.tag})"
        case ev.Schedule(execution_id=e, target_ffqn=f):
            return f"schedule({f}, {e})"
        case ev.Stub(target_execution_id=t):
            return f"stub({t})"
    return repr(h)
