"""The replaying workflow host: answers a run's host calls from its history, or writes them.

One `ReplayHost` per run. It lives on the guest's worker thread; storage calls are
submitted to the engine's event loop and waited for on that thread, so the loop is never
blocked. Matching follows SPEC §7.1: each call is compared with the next unprocessed
history event by its deterministic key; past the end of the history the call is new and
is written (with the `await` strategy, non-blocking events are buffered and written in
one transaction before the next blocking write).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import random
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

from ulid import ULID

from engine.components import Registry
from engine.core import events as ev
from engine.core.clock import Clock
from engine.core.ids import ExecutionId, JoinSetId
from engine.core.legality import is_cancellable
from engine.core.records import Frame
from engine.core.state import BlockedByJoinSet
from engine.errors import InvalidParams, UnknownFunction
from engine.executors.cancellation import join_sets_in
from engine.runtimes.outcome import LogLine
from engine.runtimes.workflow_host import (
    AllProcessed,
    ChildResponse,
    DelayResponse,
    FunctionMismatch,
    FunctionShape,
    JoinNextAnswer,
    Pending,
    RunAborted,
    ScheduleAtArg,
    WorkflowCallError,
)
from engine.storage.contract import (
    AppendExtras,
    Conflict,
    CreateRequest,
    DirectLock,
    LockedExecution,
    NotFound,
    Storage,
    StorageError,
    VersionConflict,
)
from engine.storage.notify import ResponseInbox
from engine.wit.codec import WitValueError, validate_json

log = logging.getLogger("obelisk.workflow")
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


class _StaleView(Exception):
    """An append was refused because responses arrived after the host looked (e.g. a
    `join_next_try{pending}` written while a response came in): look again."""


@dataclass(slots=True)
class _JoinSet:
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


def _ms(dt: datetime) -> int:
    return int((dt - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(milliseconds=1))


def _from_ms(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def result_hash(result: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest()


class ReplayHost:
    """Implements `engine.runtimes.workflow_host.WorkflowHost` for one locked run."""

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
        self.join_sets: dict[str, _JoinSet] = {}
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
        #: While set, `flush` raises `_StaleView` for an append the state machine refused.
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
        self._check()
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
        recorded = self._next_recorded()
        if recorded is None:
            return None
        version, got = recorded
        if not (matches(got) if matches is not None else got == want):
            raise self._nondeterminism(
                f"at version {version} the log has {_describe(got)}, but the code now asks for "
                f"{_describe(want)}"
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
        conflict) raises `_StaleView` instead of aborting the run; nothing was written.
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
        inbox = self._open_inbox()  # before the commit: see below
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
                raise _StaleView(str(e)) from None
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

    # ------------------------------------------------------------------------------
    # determinism
    # ------------------------------------------------------------------------------
    def _rng(self) -> random.Random:
        self._persist_counter += 1
        return random.Random(f"{self.execution_id}/{self._persist_counter}")

    def _persist(self, kind: ev.PersistKind, generate: Any) -> Any:
        self._enter()
        rng = self._rng()
        recorded = self._match(
            ev.Persist(None, kind), lambda g: isinstance(g, ev.Persist) and g.kind == kind
        )
        if recorded is not None:
            assert isinstance(recorded, ev.Persist)
            return recorded.value
        value = generate(rng)
        self._record(ev.Persist(value, kind))
        return value

    def random_u64(self, min_: int, max_inclusive: int) -> int:
        if not 0 <= min_ <= max_inclusive < 2**64:
            raise WorkflowCallError(f"random_u64: invalid range [{min_}, {max_inclusive}]")
        value: int = self._persist(
            ev.PersistRandomU64(min_, max_inclusive), lambda r: r.randint(min_, max_inclusive)
        )
        return value

    def random_string(self, min_len: int, max_len_exclusive: int) -> str:
        if not 0 <= min_len < max_len_exclusive:
            raise WorkflowCallError(
                f"random_string: invalid length range [{min_len}, {max_len_exclusive})"
            )
        alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

        def generate(r: random.Random) -> str:
            n = r.randrange(min_len, max_len_exclusive)
            return "".join(r.choice(alphabet) for _ in range(n))

        value: str = self._persist(ev.PersistRandomString(min_len, max_len_exclusive), generate)
        return value

    def _generated_id(self) -> str:
        def generate(r: random.Random) -> str:
            ms = _ms(self.clock.now())
            return "E_" + str(ULID.from_bytes(ms.to_bytes(6, "big") + r.randbytes(10)))

        value: str = self._persist(ev.PersistExecutionId(), generate)
        return value

    def execution_id_generate(self) -> str:
        return self._generated_id()

    def now_ms(self) -> int:
        """A clock read is an already-due delay in a one-off join set (SPEC §7.4)."""
        js = self._new_join_set("o", "sleep")
        delay_id = self._submit_delay(js, "now")
        answer = self.join_next(js)
        self.join_sets[js].closed = True
        assert isinstance(answer, DelayResponse)
        return self._delay_expiry_ms(delay_id)

    # ------------------------------------------------------------------------------
    # join sets
    # ------------------------------------------------------------------------------
    def _new_join_set(self, kind: str, name: str | None) -> str:
        self._enter()
        self._join_sets_created += 1
        if kind != "n":
            self._join_set_counts[kind] += 1
            k = self._join_set_counts[kind]
            if self._numbered_across_kinds or self._logged_across_kinds(kind, name):
                k = self._join_sets_created
            js = str(JoinSetId("o", f"{k}-{name}") if kind == "o" else JoinSetId("g", str(k)))
        else:
            assert name is not None
            js = str(JoinSetId("n", JoinSetId.validate_name(name)))
        if js in self.join_sets:
            raise WorkflowCallError(f"join set {js} already exists")
        want = ev.JoinSetCreate(js)
        if self._match(want) is None:
            self._record(want)
        self.join_sets[js] = _JoinSet(js)
        return js

    def _logged_across_kinds(self, kind: str, name: str | None) -> bool:
        """Whether the history was written by an engine that numbered join sets of all
        kinds with one counter (before 2026-12-04): then this run numbers them so too,
        so that executions started before the change replay. Told by the first join set
        whose number differs between the two ways."""
        k = self._join_sets_created
        if k == self._join_set_counts[kind] or not self.replaying:
            return False
        old = str(JoinSetId("o", f"{k}-{name}") if kind == "o" else JoinSetId("g", str(k)))
        _, recorded = self.history[self.cursor]
        if isinstance(recorded, ev.JoinSetCreate) and recorded.join_set_id == old:
            self._numbered_across_kinds = True
        return self._numbered_across_kinds

    def join_set_create(self, name: str | None = None) -> str:
        if name is None:
            return self._new_join_set("g", None)
        try:
            return self._new_join_set("n", name)
        except ValueError as e:
            raise WorkflowCallError(str(e)) from None

    def _open(self, join_set_id: str) -> _JoinSet:
        js = self.join_sets.get(join_set_id)
        if js is None:
            raise WorkflowCallError(f"unknown join set {join_set_id}")
        if js.closed:
            raise self._constraint_violation(f"join set {join_set_id} is closed")
        return js

    def submit(self, join_set_id: str, ffqn: str, params: list[Any]) -> str:
        self._enter()
        js = self._open(join_set_id)
        try:
            _, component = self.registry.function(ffqn)
            checked = self.registry.validate_params(ffqn, params)
        except (UnknownFunction, InvalidParams) as e:
            raise WorkflowCallError(str(e)) from None
        child = str(self._eid.child(JoinSetId.parse(join_set_id), len(js.members) + 1))
        want = ev.JoinSetRequest(join_set_id, ev.ChildExecutionRequest(child, ffqn, checked))
        if self._match(want) is None:
            now = self.clock.now()
            created = ev.Created(
                ffqn=ffqn,
                params=checked,
                scheduled_at=now,
                component_id=component.component_id,
                deployment_id=self.deployment_id,
                parent=(self.execution_id, join_set_id),
            )
            self._record(want, [CreateRequest(child, created)])
        js.members.append(child)
        js.member_ffqn[child] = ffqn
        return child

    def _schedule_at(self, schedule_at: ScheduleAtArg) -> tuple[ev.ScheduleAt, datetime]:
        now = self.clock.now()
        if schedule_at == "now":
            return ev.ScheduleAtNow(), now
        kind, value = schedule_at
        if kind == "in":
            return ev.ScheduleAtIn(int(value)), now + timedelta(milliseconds=int(value))
        at = _from_ms(int(value))
        return ev.ScheduleAtTime(at), at

    def _submit_delay(self, join_set_id: str, schedule_at: ScheduleAtArg) -> str:
        js = self._open(join_set_id)
        delay_id = str(self._eid.delay(JoinSetId.parse(join_set_id), len(js.members) + 1))
        intent, expires_at = self._schedule_at(schedule_at)
        want = ev.JoinSetRequest(join_set_id, ev.DelayRequest(delay_id, expires_at, intent))
        recorded = self._match(
            want,
            lambda g: (
                isinstance(g, ev.JoinSetRequest)
                and g.join_set_id == join_set_id
                and isinstance(g.request, ev.DelayRequest)
                and g.request.delay_id == delay_id
                and g.request.schedule_at == intent
            ),
        )
        if recorded is None:
            self._record(want)
        else:
            assert isinstance(recorded, ev.JoinSetRequest)
            assert isinstance(recorded.request, ev.DelayRequest)
            expires_at = recorded.request.expires_at  # the recorded time is the answer
        self._delay_expiry[delay_id] = expires_at
        js.members.append(delay_id)
        js.member_ffqn[delay_id] = None
        return delay_id

    def _delay_expiry_ms(self, delay_id: str) -> int:
        return _ms(self._delay_expiry[delay_id])

    def submit_delay(self, join_set_id: str, schedule_at: ScheduleAtArg) -> str:
        self._enter()
        return self._submit_delay(join_set_id, schedule_at)

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
        items, poked = self._open_inbox().take(0)
        before = self.max_cursor
        if not self._accept(items) or poked:
            self._stale = True
        return self.max_cursor > before

    def _accept(self, items: list[ev.StoredResponse]) -> bool:
        """Add posted responses in cursor order; False on a gap (one we were not
        given, e.g. written by another process: the database has it)."""
        for r in sorted(items, key=lambda r: r.cursor):
            if r.cursor <= self.max_cursor:
                continue  # read from the database already
            if r.cursor != self.max_cursor + 1:
                return False
            self._add_responses([r])
        return True

    def _answer(self, js: _JoinSet, stored: ev.StoredResponse) -> JoinNextAnswer:
        r = stored.response
        if isinstance(r, ev.ChildExecutionFinished):
            result = ev.result_to_json(r.result)
            self._results[r.child_execution_id] = result
            js.processed.add(r.child_execution_id)
            return ChildResponse(
                r.child_execution_id, js.member_ffqn.get(r.child_execution_id) or "", result
            )
        js.processed.add(r.delay_id)
        return DelayResponse(r.delay_id, r.outcome)

    def _unprocessed(self, js: _JoinSet) -> int:
        return len(js.members) - self._consumed_by_js.get(js.id, 0)

    def join_next(
        self, join_set_id: str, requested_ffqn: str | None = None, *, closing: bool = False
    ) -> JoinNextAnswer | AllProcessed | FunctionMismatch:
        self._enter()
        js = self.join_sets.get(join_set_id)
        if js is None:
            raise WorkflowCallError(f"unknown join set {join_set_id}")
        if js.closed and not closing:
            raise self._constraint_violation(f"join set {join_set_id} is closed")
        if self._unprocessed(js) == 0:
            want_too_many = ev.JoinNextTooMany(join_set_id, requested_ffqn)
            if self._match(want_too_many) is None:
                self._record(want_too_many)
            return AllProcessed()
        want = ev.JoinNext(join_set_id, self.lock_expires_at, requested_ffqn, closing)
        recorded = self._match(
            want,
            lambda g: (
                isinstance(g, ev.JoinNext)
                and g.join_set_id == join_set_id
                and g.requested_ffqn == requested_ffqn
                and g.closing == closing
            ),
        )
        if recorded is not None:
            stored = self._take_response(join_set_id)
            if stored is None:
                stored = self._wait_response(join_set_id, blocked=True)
        else:
            stored = self._new_join_next(join_set_id, requested_ffqn, closing)
        answer = self._answer(js, stored)
        if (
            requested_ffqn is not None
            and isinstance(answer, ChildResponse)
            and answer.ffqn != requested_ffqn
        ):
            return FunctionMismatch(answer, requested_ffqn)
        return answer

    def _new_join_next(
        self, join_set_id: str, requested_ffqn: str | None, closing: bool
    ) -> ev.StoredResponse:
        if self.strategy == "await":
            stored = self._take_response(join_set_id)
            if stored is not None:
                # Already in the database (fetched with an earlier one): this join_next
                # does not block, so it is buffered like the other non-blocking events.
                self._record(
                    ev.JoinNext(join_set_id, self.lock_expires_at, requested_ffqn, closing)
                )
                return stored
        now = self.clock.now()
        lead = self._take_lead(now)  # first: the join_next waits until the new expiry
        run_expires_at = self.lock_expires_at if self.strategy == "await" else now
        event = ev.HistoryEvent(ev.JoinNext(join_set_id, run_expires_at, requested_ffqn, closing))
        summary = self.flush([event], lead)
        if isinstance(summary.underlying, BlockedByJoinSet):
            return self._wait_response(join_set_id, blocked=True)
        # Answered already: the response is in the database.
        stored = self._take_response(join_set_id)
        while stored is None:
            self._fetch_responses(0)
            stored = self._take_response(join_set_id)
        return stored

    def _wait_response(self, join_set_id: str, *, blocked: bool) -> ev.StoredResponse:
        """Wait for the join set's next response (strategy `await`), or unload the run."""
        while True:
            stored = self._take_response(join_set_id)
            if stored is not None:
                break
            self._check()
            if self.strategy != "await":
                raise self._abort("interrupted")
            remaining = (self.lock_expires_at - self.clock.now()).total_seconds()
            if remaining <= 0:
                raise self._abort("unloaded", "lock expired while waiting for a response")
            self._fetch_responses(remaining)
        if blocked:
            # The response unblocked us: continue this warm run; its lock extension is
            # written first by the next flush.
            self._extension_due = True
        return stored

    def join_next_try(self, join_set_id: str) -> JoinNextAnswer | Pending | AllProcessed:
        self._enter()
        js = self._open(join_set_id)
        version = self.history[self.cursor][0] if self.replaying else self.version
        got = self._match(
            ev.JoinNextTry(join_set_id, "found"),
            lambda g: isinstance(g, ev.JoinNextTry) and g.join_set_id == join_set_id,
        )
        if got is not None:
            assert isinstance(got, ev.JoinNextTry)
            if got.outcome == "pending":
                return Pending()
            if got.outcome == "all_processed":
                return AllProcessed()
            stored = self._take_response(join_set_id)
            if stored is None:
                raise self._nondeterminism(f"join_next_try at version {version} found no response")
            return self._answer(js, stored)
        if self._unprocessed(js) == 0:
            self._record(ev.JoinNextTry(join_set_id, "all_processed"))
            return AllProcessed()
        stored = self._take_response(join_set_id)
        if stored is None:
            # Look at the database, with our buffered requests written first: an
            # already-due delay is answered in the transaction that requests it.
            self.flush()
            self._fetch_responses(0)
            stored = self._take_response(join_set_id)
        if stored is None:
            # `pending` is written at once: it is only legal while no response is there,
            # and one may arrive any moment (then the append is refused: look again).
            self._stale_ok = True
            try:
                self.flush([ev.HistoryEvent(ev.JoinNextTry(join_set_id, "pending"))])
                return Pending()
            except _StaleView:
                self._fetch_responses(0)
                stored = self._take_response(join_set_id)
                if stored is None:
                    raise self._abort("lock_lost", "join_next_try: the log moved on") from None
            finally:
                self._stale_ok = False
        self._record(ev.JoinNextTry(join_set_id, "found"))
        return self._answer(js, stored)

    def join_set_close(self, join_set_id: str) -> None:
        """Close: cancel what may be cancelled, await the rest (SPEC §7.3)."""
        self._enter()
        js = self.join_sets.get(join_set_id)
        if js is None:
            raise WorkflowCallError(f"unknown join set {join_set_id}")
        if js.closed:
            return
        js.closed = True
        if self._unprocessed(js) > 0 and not self.replaying:
            # Reverse submission order; cancelling twice on a later replay is harmless.
            for member in reversed([m for m in js.members if m not in js.processed]):
                self._cancel_member(member, js)
        while self._unprocessed(js) > 0:
            self.join_next(js.id, None, closing=True)

    def _cancel_member(self, member: str, js: _JoinSet) -> None:
        ffqn = js.member_ffqn.get(member)
        if ffqn is not None and not is_cancellable(ffqn, self._is_workflow(ffqn)):
            return  # a child workflow that is not cancellable: awaited
        # The request must be in the log before its cancellation (and `now` read after
        # that write: a response is never older than the request it answers).
        self.flush()
        now = self.clock.now()
        try:
            if ffqn is None:
                self._sync(
                    self.storage.append_response(
                        self.execution_id, ev.DelayFinished(member, js.id, "cancelled"), now
                    )
                )
            else:
                self._sync(self.storage.request_cancellation(member, now))
        except (Conflict, StorageError):
            pass  # already finished or already answered: fine

    def _is_workflow(self, ffqn: str) -> bool:
        try:
            info, _ = self.registry.function(ffqn)
        except UnknownFunction:
            return False
        return ev.is_workflow_type(info.component_type)

    def close_all(self) -> None:
        """Implicit close of every open join set when the function returns or traps."""
        self.stack = []  # no guest call writes these: they get no backtrace
        for js_id in reversed(list(self.join_sets)):
            js = self.join_sets[js_id]
            if not js.closed or self._unprocessed(js) > 0:
                js.closed = False
                self.join_set_close(js_id)

    def close_from_log(self) -> None:
        """Close the join sets the log has (SPEC §7.3), with no guest code: after a
        nondeterminism or a constraint violation the code's view is not the log's, yet a
        child never outlives its parent. The state is rebuilt from the whole recorded
        history, then closed as on return; a later run that fails the same way again
        continues where this one stopped (waiting for awaited children)."""
        if self.aborted is not None and self.aborted.kind not in (
            "nondeterminism",
            "constraint_violation",
        ):
            raise RunAborted(self.aborted.kind)  # e.g. the lock was lost before
        self.aborted = None
        if self._interrupt.is_set():  # cancelled, paused or stopping meanwhile: not now
            why = self._interrupted_by or AbortReason("interrupted")
            raise self._abort(why.kind, why.detail)
        # What the code did before a constraint violation is kept (its children are
        # closed with the rest); after a nondeterminism nothing is buffered.
        self.flush()
        log_events = self._sync(self.storage.get_events(self.execution_id))
        self.history = [
            (e.version, e.event.event) for e in log_events if isinstance(e.event, ev.HistoryEvent)
        ]
        self._fetch_responses(0)
        self.join_sets = {}
        self._consumed_by_js = {}
        waiting: str | None = None  # a recorded join_next whose response has not come
        for view in join_sets_in(h for _, h in self.history).values():
            js = self.join_sets[view.id] = _JoinSet(view.id)
            for member in view.members:
                js.members.append(member.id)
                js.member_ffqn[member.id] = member.ffqn
            for _ in range(view.consumed):
                stored = self._take_response(js.id)
                if stored is None:
                    waiting = js.id  # the run was blocked on its last join_next
                else:
                    self._answer(js, stored)
        self.cursor = len(self.history)
        if waiting is not None:
            # The run that wrote the log was blocked on it: its response comes first.
            self._answer(self.join_sets[waiting], self._wait_response(waiting, blocked=True))
        self.close_all()

    def get_result(self, child_execution_id: str) -> dict[str, Any]:
        result = self._results.get(child_execution_id)
        if result is None:
            raise WorkflowCallError(
                f"no processed response for {child_execution_id}: await it in its join set first"
            )
        return result

    # ------------------------------------------------------------------------------
    # conveniences
    # ------------------------------------------------------------------------------
    def call(self, ffqn: str, params: list[Any]) -> dict[str, Any]:
        function = ffqn.rsplit(".", 1)[-1]
        js = self._new_join_set("o", function)
        self.submit(js, ffqn, params)
        answer = self.join_next(js)
        self.join_sets[js].closed = True
        assert isinstance(answer, ChildResponse)
        return answer.result

    def sleep(self, schedule_at: ScheduleAtArg, name: str | None = None) -> int | None:
        js = self._new_join_set("o", name or "sleep")
        delay_id = self._submit_delay(js, schedule_at)
        answer = self.join_next(js)
        self.join_sets[js].closed = True
        assert isinstance(answer, DelayResponse)
        if answer.outcome == "cancelled":
            return None
        return self._delay_expiry_ms(delay_id)

    def schedule(self, ffqn: str, params: list[Any], schedule_at: ScheduleAtArg) -> str:
        self._enter()
        try:
            _, component = self.registry.function(ffqn)
            checked = self.registry.validate_params(ffqn, params)
        except (UnknownFunction, InvalidParams) as e:
            raise WorkflowCallError(str(e)) from None
        new_id = self._generated_id()
        intent, at = self._schedule_at(schedule_at)
        want = ev.Schedule(new_id, intent, ffqn)
        if self._match(want) is None:
            created = ev.Created(
                ffqn=ffqn,
                params=checked,
                scheduled_at=at,
                component_id=component.component_id,
                deployment_id=self.deployment_id,
                scheduled_by=self.execution_id,
            )
            self._record(want, [CreateRequest(new_id, created)])
        return new_id

    def stub(self, execution_id: str, result: dict[str, Any]) -> None:
        """Write the result of an `activity_stub` child (SPEC §7.2). The same result again
        is fine (idempotent); another result is recorded as a conflict and raised, on
        every replay too. Misuse (not a stub child, a result of the wrong type) is checked
        before the history is consulted, so it is raised identically on replay."""
        self._enter()
        try:
            parsed = ev.result_from_json(result)
        except ValueError as e:
            raise WorkflowCallError(f"stub result: {e}") from None
        if isinstance(parsed, ev.ExecutionFailure):
            raise WorkflowCallError('stub result must be {"ok": value} or {"err": value}')
        member = next((js for js in self.join_sets.values() if execution_id in js.members), None)
        ffqn = member.member_ffqn.get(execution_id) if member is not None else None
        if ffqn is None:
            raise WorkflowCallError(
                f"cannot stub {execution_id}: it is not a child execution of this workflow"
            )
        try:
            info, _ = self.registry.function(ffqn)
            if not ev.accepts_stub(info.component_type):
                raise WorkflowCallError(
                    f"cannot stub {execution_id} ({ffqn}): it is not an activity_stub"
                )
            if info.return_type is not None:
                validate_json(ev.result_to_json(parsed), info.return_type, "result")
        except (UnknownFunction, WitValueError) as e:
            raise WorkflowCallError(f"cannot stub {execution_id} ({ffqn}): {e}") from None
        digest = result_hash(result)
        want = ev.Stub(execution_id, digest, "written")
        recorded = self._match(
            want,
            lambda g: (
                isinstance(g, ev.Stub)
                and g.target_execution_id == execution_id
                and g.result_hash == digest
            ),
        )
        if recorded is None:
            self.flush()  # the target may be a child requested in this very batch
            outcome = self._write_stub(execution_id, parsed)
            self._record(ev.Stub(execution_id, digest, outcome))
        else:
            assert isinstance(recorded, ev.Stub)
            outcome = recorded.outcome
        if outcome == "conflict":
            raise WorkflowCallError(
                f"cannot stub {execution_id}: it is already finished with another result"
            )

    def _write_stub(
        self, execution_id: str, result: ev.ExecutionResult
    ) -> Literal["written", "conflict"]:
        for _ in range(10):
            try:
                s = self._sync(self.storage.get_summary(execution_id))
            except NotFound:
                raise WorkflowCallError(f"cannot stub {execution_id}: no such execution") from None
            if s.result is not None:
                return "written" if s.result == result else "conflict"
            try:
                self._sync(
                    self.storage.append(
                        execution_id, s.next_version, [ev.Finished(result)], self.clock.now()
                    )
                )
                return "written"
            except Conflict:
                continue  # it changed meanwhile (finished by someone else?): look again
        raise WorkflowCallError(f"cannot stub {execution_id}: it keeps changing")

    # ------------------------------------------------------------------------------
    # not history
    # ------------------------------------------------------------------------------
    def log(self, level: str, message: str) -> None:
        if level not in ("trace", "debug", "info", "warn", "error"):
            level = "info"
        if self.replaying and self._already_logged(level, message):
            return
        self.logs.append(LogLine(level, message, at=self.clock.now()))  # type: ignore[arg-type]

    def _already_logged(self, level: str, message: str) -> bool:
        """A line emitted while replaying recorded history was stored by the run that
        wrote that history (logs go out with each write): it is kept once. A line that
        no earlier run stored (code edited since, or the lines leading to a
        nondeterminism) is new and kept. The stored lines are read on first need."""
        if self._stored_lines is None:
            self._stored_lines = collections.Counter()
            try:
                after = 0
                while page := self._sync(self.storage.get_logs(self.execution_id, after)):
                    self._stored_lines.update((x.level, x.message) for x in page)
                    after = page[-1].id
            except RunAborted:
                raise  # the run is over (a lost lock): nothing to log any more
            except Exception as e:  # store rather than lose a line
                log.debug("workflow %s: cannot read its logs: %s", self.execution_id, e)
        key = (level, message)
        if self._stored_lines[key] > 0:
            self._stored_lines[key] -= 1
            return True
        return False

    def set_stack(self, frames: list[Frame]) -> None:
        self.stack = frames

    def function_exists(self, ffqn: str) -> bool:
        return ffqn in self.registry.functions

    def interfaces(self) -> dict[str, dict[str, FunctionShape]]:
        return registry_interfaces(self.registry)

    # ------------------------------------------------------------------------------
    # end of run
    # ------------------------------------------------------------------------------
    def close_on_return(self) -> str | None:
        """After the function returned (or threw): close its join sets (SPEC §7.3), which
        may match recorded closing `join_next`s. Returns the recorded history the code
        did not reach, if any (nondeterminism), reported as such rather than as a
        mismatch of the closing `join_next`s the close would write."""
        leftover = self.leftover_history(closing_next=True)
        if leftover is None:
            self.close_all()
            leftover = self.leftover_history()
        return leftover

    def leftover_history(self, *, closing_next: bool = False) -> str | None:
        """After the function returned: the recorded history it did not reach, if any.
        With `closing_next`, a closing `join_next` next is fine (the implicit close that
        follows matches it)."""
        if self.cursor < len(self.history):
            version, got = self.history[self.cursor]
            if closing_next and isinstance(got, ev.JoinNext) and got.closing:
                return None
            return (
                f"the function returned, but the log continues at version {version} "
                f"with {_describe(got)}"
            )
        return None


def registry_interfaces(registry: Registry) -> dict[str, dict[str, FunctionShape]]:
    out: dict[str, dict[str, FunctionShape]] = {}
    for ffqn, (info, _) in registry.functions.items():
        ifc, _, fn = ffqn.rpartition(".")
        out.setdefault(ifc, {})[fn] = FunctionShape(
            ffqn, tuple(p.name for p in info.params), ev.is_workflow_type(info.component_type)
        )
    return out


def _describe(h: ev.HistoryEventKind) -> str:
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
