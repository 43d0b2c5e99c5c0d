"""The pending-state machine (SPEC §4, §5.2): one pure function, no I/O.

`ExecutionSummary` is the fold of an execution's log and responses in the order they were
written. `apply_event` validates one append and returns the next summary (or raises
`IllegalAppend`); `apply_response` records one response. Storage backends keep the
summary as the projection row of each execution, so validating an append costs one row
read, never a log scan. `replay` rebuilds a summary from scratch (tests, repairs).
"""

from __future__ import annotations

import bisect
from collections.abc import Container, Iterable
from datetime import datetime, timedelta

import msgspec

from engine.core import events as ev
from engine.core.state_names import StateName

# ---------------------------------------------------------------------------
# Pending states (SPEC §4.1)
# ---------------------------------------------------------------------------


class LockRef(msgspec.Struct, frozen=True):
    executor_id: str
    run_id: str


class PendingAt(msgspec.Struct, frozen=True, tag="pending_at", tag_field="type"):
    scheduled_at: datetime
    last_lock: LockRef | None = None


class Locked(msgspec.Struct, frozen=True, tag="locked", tag_field="type"):
    executor_id: str
    run_id: str
    lock_expires_at: datetime


class BlockedByJoinSet(msgspec.Struct, frozen=True, tag="blocked_by_join_set", tag_field="type"):
    join_set_id: str
    lock_expires_at: datetime
    closing: bool
    blocked_run: LockRef | None = None


class Finished(msgspec.Struct, frozen=True, tag="finished", tag_field="type"):
    version: int
    finished_at: datetime
    result_kind: str


Underlying = PendingAt | Locked | BlockedByJoinSet


class Paused(msgspec.Struct, frozen=True, tag="paused", tag_field="type"):
    underlying: PendingAt | BlockedByJoinSet


class Cancelling(msgspec.Struct, frozen=True, tag="cancelling", tag_field="type"):
    underlying: Underlying


PendingState = PendingAt | Locked | BlockedByJoinSet | Paused | Cancelling | Finished


def state_name(state: PendingState) -> StateName:
    return state.__struct_config__.tag  # type: ignore[return-value]


# ---------------------------------------------------------------------------
# The fold
# ---------------------------------------------------------------------------


class JoinSetCounters(msgspec.Struct, array_like=True):
    """Per open join set: requests submitted, responses received, responses consumed."""

    submitted: int = 0
    received: int = 0
    consumed: int = 0


class ExecutionSummary(msgspec.Struct):
    """Everything needed to validate the next append, and the current pending state."""

    next_version: int
    ffqn: str
    component_type: ev.ComponentType
    created_at: datetime
    underlying: Underlying | Finished
    paused: bool = False
    cancelling: bool = False
    last_lock: LockRef | None = None
    retry_config: ev.RetryConfig | None = None
    temporary_event_count: int = 0
    #: A history event was written since the last `locked` (SPEC §6.3 "made progress").
    progressed_since_lock: bool = False
    join_sets: dict[str, JoinSetCounters] = msgspec.field(default_factory=dict)
    #: One-off join sets (`o:<k>-<name>`) with their one request answered and consumed,
    #: out of `join_sets` (whose counters would be (1, 1, 1)) so that the summary of a
    #: long workflow stays small: it is decoded, validated and written on every append.
    #: Kept as the set of their `k` in half-open ranges, flattened: `[start, stop, …]`
    #: (a workflow's k count up, so this is usually one range). See `_forget_if_done`.
    done_one_off_ks: list[int] = msgspec.field(default_factory=list)
    #: Done one-off join sets whose id has no `k` (and the lists of older summaries).
    done_one_off: list[str] = msgspec.field(default_factory=list)
    #: Join sets that were created, including fully processed ones (ids must be unique).
    join_set_count: int = 0
    responses: int = 0
    result: ev.ExecutionResult | None = None

    @property
    def state(self) -> PendingState:
        u = self.underlying
        if isinstance(u, Finished):
            return u
        if self.cancelling:
            return Cancelling(u)
        if self.paused:
            assert not isinstance(u, Locked)
            return Paused(u)
        return u

    @property
    def is_finished(self) -> bool:
        return isinstance(self.underlying, Finished)

    @property
    def is_workflow(self) -> bool:
        return ev.is_workflow_type(self.component_type)


class IllegalAppend(Exception):
    """An event that the state machine does not allow in the current state."""


def created_summary(created: ev.Created, at: datetime) -> ExecutionSummary:
    return ExecutionSummary(
        next_version=1,
        ffqn=created.ffqn,
        component_type=created.component_id.type,
        created_at=at,
        underlying=PendingAt(created.scheduled_at),
    )


def _copy(s: ExecutionSummary) -> ExecutionSummary:
    # A shallow copy: counters are never changed in place but replaced (`_counters`), and
    # the done one-off lists are replaced, not mutated, so the input summary stays intact.
    return msgspec.structs.replace(s, join_sets=dict(s.join_sets))


_DONE = JoinSetCounters(1, 1, 1)


def one_off_k(js: str) -> int | None:
    """The `k` of a one-off join set id `o:<k>-<name>` (None for other ids): unique per
    execution, as the runtimes number every join set they create."""
    if not js.startswith("o:"):
        return None
    dash = js.find("-", 2)
    digits = js[2:dash]
    if dash < 0 or not digits.isdecimal() or not digits.isascii() or str(int(digits)) != digits:
        return None
    return int(digits)


def ranges_contain(ranges: list[int], k: int) -> bool:
    """Whether `k` is in the flattened half-open ranges `[start, stop, …]`."""
    return bisect.bisect_right(ranges, k) % 2 == 1


def ranges_add(ranges: list[int], k: int) -> list[int]:
    """A new list: `ranges` with `k` (adjacent ranges merged)."""
    p = bisect.bisect_right(ranges, k)
    if p % 2 == 1:
        return ranges
    r = list(ranges)
    left = p > 0 and r[p - 1] == k
    right = p < len(r) and r[p] == k + 1
    if left and right:
        del r[p - 1 : p + 1]
    elif left:
        r[p - 1] = k + 1
    elif right:
        r[p] = k
    else:
        r[p:p] = [k, k + 1]
    return r


def ranges_remove(ranges: list[int], k: int) -> list[int]:
    """A new list: `ranges` without `k` (a range split in two when needed)."""
    p = bisect.bisect_right(ranges, k)
    if p % 2 == 0:
        return ranges
    r = list(ranges)
    start, stop = r[p - 1], r[p]
    r[p - 1 : p + 1] = ([start, k] if start < k else []) + ([k + 1, stop] if k + 1 < stop else [])
    return r


def is_done_one_off(s: ExecutionSummary, js: str) -> bool:
    """Whether `js` is a one-off join set whose one request was answered and consumed."""
    k = one_off_k(js)
    if k is not None and ranges_contain(s.done_one_off_ks, k):
        return True
    return js.startswith("o:") and js in s.done_one_off


def _counters(n: ExecutionSummary, js: str) -> JoinSetCounters | None:
    """The counters of `js` in the new summary `n`, as a private copy that may be changed
    (a done one-off join set is brought back into `join_sets`)."""
    c = n.join_sets.get(js)
    if c is None:
        k = one_off_k(js)
        if k is not None and ranges_contain(n.done_one_off_ks, k):
            n.done_one_off_ks = ranges_remove(n.done_one_off_ks, k)
        elif js.startswith("o:") and js in n.done_one_off:
            n.done_one_off = [d for d in n.done_one_off if d != js]
        else:
            return None
        c = _DONE
    c = n.join_sets[js] = JoinSetCounters(c.submitted, c.received, c.consumed)
    return c


def _forget_if_done(n: ExecutionSummary, js: str) -> None:
    """A one-off join set (a direct call, a sleep, a clock read) whose one request was
    answered and consumed leaves `join_sets` for the done ones: the summary of a long
    workflow is decoded, validated and encoded on every write, and a range of numbers
    costs nothing next to a map of counters (or a list of ids) that grows with every
    step. Nothing changes for validation: `_counters` brings it back as (1, 1, 1) if
    it is ever used again."""
    c = n.join_sets.get(js)
    if js.startswith("o:") and c == _DONE:
        del n.join_sets[js]
        k = one_off_k(js)
        if k is not None:
            n.done_one_off_ks = ranges_add(n.done_one_off_ks, k)
        else:
            n.done_one_off = [*n.done_one_off, js]


def _require(cond: bool, message: str) -> None:
    """For constant messages: a message naming values is formatted only when the rule
    is broken (`if …: raise IllegalAppend(f"…")`), not on every event appended."""
    if not cond:
        raise IllegalAppend(message)


def apply_event(s: ExecutionSummary, event: ev.Event, now: datetime) -> ExecutionSummary:
    """Validate `event` against `s` at time `now`; return the summary after it.

    Rules (SPEC §4.2–4.3, §8): nothing after `finished`; a new lock only from a due
    `PendingAt`; an extension only by the same executor and run; history only while
    locked (or while cancelling, for the teardown driver); pause only of a pending or
    blocked execution; cancellation requested once.
    """
    u = s.underlying
    if isinstance(u, Finished):
        raise IllegalAppend("the execution is finished: nothing can be appended")
    n = _copy(s)
    n.next_version = s.next_version + 1
    # The cases are disjoint; the most frequent come first (each case is a type test).
    match event:
        case ev.HistoryEvent(event=h):
            if not (isinstance(u, Locked) or s.cancelling):
                raise IllegalAppend(
                    f"history events need a locked execution, state is {state_name(s.state)}"
                )
            _apply_history(n, h, now)
        case ev.Locked():
            _apply_locked(s, n, event, now)
        case ev.Unlocked(backoff_expires_at=at) if _waiting_run(u) is not None:
            # A run waiting in memory for a response (`await`) let go of the execution,
            # or its process died (`released_waiting_run`): a response makes the
            # execution due at once instead of at that run's lock expiry.
            if isinstance(u, BlockedByJoinSet):
                n.underlying = BlockedByJoinSet(
                    u.join_set_id, min(u.lock_expires_at, at), u.closing
                )
            else:
                assert isinstance(u, PendingAt)
                n.underlying = PendingAt(min(u.scheduled_at, at))
        case (
            ev.Unlocked(backoff_expires_at=at)
            | ev.TemporarilyTimedOut(backoff_expires_at=at)
            | ev.TemporarilyFailed(backoff_expires_at=at)
        ):
            if not isinstance(u, Locked):
                raise IllegalAppend(f"{event.__struct_config__.tag} needs a locked execution")
            # The run has ended: only a response unblocking a waiting run (apply_response)
            # leaves a `last_lock` that may extend; a released or failed run must not skip
            # its backoff by "extending" from PendingAt.
            n.underlying = PendingAt(at)
            if not isinstance(event, ev.Unlocked):
                n.temporary_event_count += 1
        case ev.Finished(result=result):
            # Normal completion from Locked; forced from any other state (stub writes,
            # cancellation, lock expiry with retries exhausted).
            n.underlying = Finished(s.next_version, now, ev.result_kind(result))
            n.result = result
            n.paused = False
            n.cancelling = False
            n.join_sets = {}
            n.done_one_off_ks = []
            n.done_one_off = []
        case ev.Created():
            raise IllegalAppend("created can only be the first event")
        case ev.Paused():
            _require(not s.cancelling, "a cancelling execution cannot be paused")
            _require(not s.paused, "the execution is already paused")
            _require(
                not isinstance(u, Locked),
                "a locked execution cannot be paused: release its run first",
            )
            n.paused = True
        case ev.Unpaused():
            _require(s.paused, "the execution is not paused")
            n.paused = False
        case ev.CancellationRequested():
            _require(not s.cancelling, "cancellation was already requested")
            n.cancelling = True
            n.paused = False  # cancel supersedes pause
        case ev.ComponentUpgradeFinished():
            pass
        case _:
            raise IllegalAppend(f"unknown event {event!r}")
    return n


def _apply_locked(
    s: ExecutionSummary, n: ExecutionSummary, event: ev.Locked, now: datetime
) -> None:
    # Every execution is locked at least once (twice per step of (b)): the rules are
    # written out here rather than through `_require` (a call each).
    u = s.underlying
    expires = event.lock_expires_at
    if expires <= now:
        raise IllegalAppend("lock_expires_at must be in the future")
    lock = LockRef(event.executor_id, event.run_id)
    same_run = s.last_lock == lock
    # A cancelling execution is not advanced again (SPEC §8): no new lock, and no
    # extension either, not even by the warm run a response just unblocked.
    if s.cancelling:
        raise IllegalAppend("a cancelling execution cannot be locked")
    if s.paused:
        raise IllegalAppend("a paused execution cannot be locked")
    if isinstance(u, Locked) and same_run:
        pass  # extension of a running lock
    elif isinstance(u, PendingAt) and same_run and u.last_lock == lock:
        pass  # the warm run continues after a response
    else:
        if not isinstance(u, PendingAt):
            raise IllegalAppend(f"cannot lock from state {state_name(s.state)}")
        if u.scheduled_at > now:
            raise IllegalAppend("the execution is not due yet")
        n.progressed_since_lock = False
    n.underlying = Locked(event.executor_id, event.run_id, expires)
    n.last_lock = lock
    n.retry_config = event.retry_config


def _apply_history(n: ExecutionSummary, h: ev.HistoryEventKind, now: datetime) -> None:
    n.progressed_since_lock = True
    match h:
        case ev.JoinSetCreate(join_set_id=js):
            if js in n.join_sets or is_done_one_off(n, js):
                raise IllegalAppend(f"join set {js} already exists")
            k = one_off_k(js)
            # A one-off join set is known by its k once done: k must be new.
            if k is not None and any(one_off_k(o) == k for o in n.join_sets):
                raise IllegalAppend(f"one-off join set {js}: another one-off join set has k = {k}")
            n.join_sets[js] = JoinSetCounters()
            n.join_set_count += 1
        case ev.JoinSetRequest(join_set_id=js):
            c = _counters(n, js)
            if c is None:
                raise IllegalAppend(f"join set {js} does not exist or is closed")
            c.submitted += 1
        case ev.JoinNext(join_set_id=js, run_expires_at=run_expires_at, closing=closing):
            c = _counters(n, js)
            if c is None:
                raise IllegalAppend(f"join set {js} does not exist")
            if c.consumed >= c.submitted:
                raise IllegalAppend(f"join_next on {js} with nothing left to await")
            c.consumed += 1
            if c.received < c.consumed:
                blocked_run = n.last_lock
                n.underlying = BlockedByJoinSet(js, run_expires_at, closing, blocked_run)
            else:
                _forget_if_done(n, js)
        case ev.JoinNextTry(join_set_id=js, outcome=outcome):
            _apply_join_next_try(n, js, outcome)
        case ev.JoinNextTooMany(join_set_id=js):
            c = _counters(n, js)
            if c is None:
                raise IllegalAppend(f"join set {js} does not exist")
            if c.consumed != c.submitted:
                raise IllegalAppend(f"join_next_too_many on {js} with requests left")
            _forget_if_done(n, js)
        case ev.Persist() | ev.Schedule() | ev.Stub():
            pass


def _apply_join_next_try(n: ExecutionSummary, js: str, outcome: str) -> None:
    c = _counters(n, js)
    if c is None:
        raise IllegalAppend(f"join set {js} does not exist")
    if outcome == "found":
        if c.received <= c.consumed:
            raise IllegalAppend(f"join_next_try found on {js} without a response")
        c.consumed += 1
    elif outcome == "pending":
        # no unconsumed response (fewer, while a join_next still waits)
        if not (c.received <= c.consumed < c.submitted):
            raise IllegalAppend(f"join_next_try pending on {js} is wrong")
    else:
        if c.consumed != c.submitted:
            raise IllegalAppend(f"join_next_try all_processed on {js} is wrong")
    _forget_if_done(n, js)


def apply_response(s: ExecutionSummary, response: ev.Response, now: datetime) -> ExecutionSummary:
    """Record a response; it unblocks the execution if it is blocked on that join set."""
    n = _copy(s)
    n.responses += 1
    if s.is_finished:
        return n  # late responses of a finished parent are kept, but change nothing
    js = response.join_set_id
    c = _counters(n, js)
    if c is None:
        raise IllegalAppend(f"response for unknown join set {js}")
    if c.received >= c.submitted:
        raise IllegalAppend(f"more responses than requests in join set {js}")
    c.received += 1
    u = n.underlying
    if isinstance(u, BlockedByJoinSet) and u.join_set_id == js and c.received >= c.consumed:
        n.underlying = PendingAt(max(u.lock_expires_at, now), u.blocked_run)
    _forget_if_done(n, js)
    return n


def replay(
    items: Iterable[tuple[datetime, ev.Event | ev.Response]],
) -> ExecutionSummary:
    """Fold a log and its responses, interleaved in write order, into a summary."""
    it = iter(items)
    first = next(it, None)
    if first is None or not isinstance(first[1], ev.Created):
        raise IllegalAppend("a log starts with created")
    s = created_summary(first[1], first[0])
    for at, item in it:
        if isinstance(item, ev.ChildExecutionFinished | ev.DelayFinished):
            s = apply_response(s, item, at)
        else:
            s = apply_event(s, item, at)
    return s


# ---------------------------------------------------------------------------
# Retries (SPEC §5.2) and lock expiry (SPEC §6.3)
# ---------------------------------------------------------------------------

ACTIVITY_RETRY = ev.RetryConfig(max_retries=5, retry_exp_backoff_ms=100)
WORKFLOW_RETRY = ev.RetryConfig(max_retries=None, retry_exp_backoff_ms=100)


def retry_backoff(
    temporary_event_count: int, retry: ev.RetryConfig, now: datetime
) -> datetime | None:
    """When a new temporary failure should be retried, or None when retries are exhausted.

    `temporary_event_count` counts the temporary failures *including* the new one.
    """
    if retry.max_retries is not None and temporary_event_count > retry.max_retries:
        return None
    exponent = min(max(temporary_event_count - 1, 0), 40)
    try:
        return now + timedelta(milliseconds=retry.retry_exp_backoff_ms * (2**exponent))
    except OverflowError:  # past year 9999: as good as never, but still a retry
        return datetime.max.replace(tzinfo=now.tzinfo)


def on_temporary_failure(
    s: ExecutionSummary,
    now: datetime,
    reason: str,
    detail: str,
    final: ev.ExecutionResult,
    *,
    timed_out: bool = False,
) -> ev.Event:
    """A trap, an err or a timeout of the current run: retry with backoff or finish.

    `final` is the result to finish with when retries are exhausted.
    """
    retry = s.retry_config or (WORKFLOW_RETRY if s.is_workflow else ACTIVITY_RETRY)
    at = retry_backoff(s.temporary_event_count + 1, retry, now)
    if at is None:
        return ev.Finished(final)
    if timed_out:
        return ev.TemporarilyTimedOut(at)
    return ev.TemporarilyFailed(at, reason, detail)


def _waiting_run(u: Underlying | Finished) -> LockRef | None:
    """The warm run that may still continue the execution without a new lock: blocked
    on a join set in memory (`await`), or unblocked by a response and not yet back."""
    if isinstance(u, BlockedByJoinSet):
        return u.blocked_run
    if isinstance(u, PendingAt):
        return u.last_lock
    return None


def on_lock_expired(s: ExecutionSummary, now: datetime) -> ev.Event:
    """What the timers watcher appends for an execution whose lock expired."""
    if s.is_workflow and s.progressed_since_lock:
        return ev.Unlocked(now, "made progress")
    return on_temporary_failure(
        s, now, "timed out", "", ev.ExecutionFailure("timed_out", "lock expired"), timed_out=True
    )


def expired_lock_event(s: ExecutionSummary, now: datetime) -> ev.Event:
    """What the timers watcher appends for an expired lock: a cancelling execution is
    finished `cancelled` (SPEC §8), anything else as `on_lock_expired` says."""
    if s.cancelling:
        return ev.Finished(ev.ExecutionFailure("cancelled", "cancellation requested"))
    return on_lock_expired(s, now)


#: The reason of the `unlocked` that drops the claim of a run whose executor is gone.
EXECUTOR_DIED = "executor died"


def on_executor_died(
    s: ExecutionSummary, dead_executors: Container[str], now: datetime
) -> ev.Event | None:
    """What to append for an execution that a run of one of `dead_executors` (whose
    process is known to have died) still holds, or None when it holds nothing of it.

    A lock of a dead run is handled as if it had expired now (`expired_lock_event`). A run that
    was waiting for a response in memory keeps a claim until its lock's expiry (SPEC
    §4.2: the warm run may continue first); a dead one's claim is dropped with
    `unlocked`, so that the execution is due as soon as its response is there.
    """
    u = s.underlying
    if isinstance(u, Locked):
        return expired_lock_event(s, now) if u.executor_id in dead_executors else None
    run = _waiting_run(u)
    if run is None or run.executor_id not in dead_executors:
        return None
    if isinstance(u, BlockedByJoinSet):
        claim_until = u.lock_expires_at
    else:
        assert isinstance(u, PendingAt)
        claim_until = u.scheduled_at
    if claim_until <= now:
        return None  # nothing to wait for any more
    return ev.Unlocked(now, EXECUTOR_DIED)


def replay_stored(
    events: Iterable[ev.StoredEvent], responses: Iterable[ev.StoredResponse]
) -> ExecutionSummary:
    """`replay` of a stored log and its responses, interleaved by write time."""
    return replay((at, item) for at, item, _ in interleave_stored(events, responses))


def interleave_stored(
    events: Iterable[ev.StoredEvent], responses: Iterable[ev.StoredResponse]
) -> list[tuple[datetime, ev.Event | ev.Response, int | None]]:
    """A log and its responses in write order: (time, item, version — None for a response).

    Transactions of one execution have increasing timestamps, and everything a
    transaction writes shares its timestamp. The only responses written by the
    transaction of the execution's own events are the answers of delays already due when
    requested (clock reads, `sleep(0)`): each is placed right after its request, which is
    where the writer adds it — after a `join_next` buffered before that request, too.
    Any other response at an event's time goes after the events before the first
    `join_next` of that transaction.
    """
    events = list(events)
    pending = sorted(responses, key=lambda r: r.cursor)
    requested_at: dict[str, tuple[datetime, int]] = {}
    for stored in events:
        e = stored.event
        if (
            isinstance(e, ev.HistoryEvent)
            and isinstance(e.event, ev.JoinSetRequest)
            and isinstance(e.event.request, ev.DelayRequest)
        ):
            requested_at[e.event.request.delay_id] = (stored.created_at, stored.version)
    answers: dict[int, list[ev.StoredResponse]] = {}  # by the version of the request
    others: list[ev.StoredResponse] = []
    for r in pending:
        request = (
            requested_at.get(r.response.delay_id)
            if isinstance(r.response, ev.DelayFinished)
            else None
        )
        if request is not None and request[0] == r.created_at:
            answers.setdefault(request[1], []).append(r)
        else:
            others.append(r)
    items: list[tuple[datetime, ev.Event | ev.Response, int | None]] = []
    i = 0
    for stored in events:
        is_join_next = isinstance(stored.event, ev.HistoryEvent) and isinstance(
            stored.event.event, ev.JoinNext
        )
        while i < len(others) and (
            others[i].created_at < stored.created_at
            or (is_join_next and others[i].created_at == stored.created_at)
        ):
            items.append((others[i].created_at, others[i].response, None))
            i += 1
        items.append((stored.created_at, stored.event, stored.version))
        items.extend((r.created_at, r.response, None) for r in answers.get(stored.version, ()))
    items.extend((r.created_at, r.response, None) for r in others[i:])
    return items
