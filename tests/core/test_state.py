# mypy: disable-error-code="comparison-overlap"
# (`log.state` is re-read after each step; mypy narrows it as if it could not change)
"""The pending-state machine (seeds: execution-states.md, execution-log.md; SPEC §4–§6).

Every test builds a log with `Log`, which applies each event/response, records it, and
checks after every step that `replay` of the recorded interleaving gives the same summary.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from engine.core import events as ev
from engine.core.state import (
    ACTIVITY_RETRY,
    EXECUTOR_DIED,
    WORKFLOW_RETRY,
    BlockedByJoinSet,
    Cancelling,
    ExecutionSummary,
    Finished,
    IllegalAppend,
    Locked,
    LockRef,
    Paused,
    PendingAt,
    PendingState,
    apply_event,
    apply_response,
    created_summary,
    interleave_stored,
    is_done_one_off,
    on_executor_died,
    on_lock_expired,
    on_temporary_failure,
    one_off_k,
    ranges_add,
    ranges_contain,
    ranges_remove,
    replay,
    replay_stored,
    retry_backoff,
    state_name,
)

T0 = datetime(2026, 1, 15, 10, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


ACT = ev.ComponentId("activity_wasm", "step", "sha256:" + "ab" * 32)
WF = ev.ComponentId("workflow_js", "serial", "sha256:" + "cd" * 32)
RETRY = ev.RetryConfig(max_retries=3, retry_exp_backoff_ms=1000)
EXEC = "E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC"
A = LockRef("Exr_A", "Run_1")


def created(component: ev.ComponentId = ACT, scheduled_at: datetime = T0) -> ev.Created:
    return ev.Created("myapp:demo/ifc.fn", [], scheduled_at, component, "Dep_1")


def lock(
    exr: str = "Exr_A",
    run: str = "Run_1",
    expires: float = 30,
    component: ev.ComponentId = ACT,
    retry: ev.RetryConfig = RETRY,
) -> ev.Locked:
    return ev.Locked(component, exr, run, at(expires), retry)


def h(event: ev.HistoryEventKind) -> ev.HistoryEvent:
    return ev.HistoryEvent(event)


def create(js: str) -> ev.HistoryEvent:
    return h(ev.JoinSetCreate(js))


def submit(js: str, n: int = 1) -> ev.HistoryEvent:
    child = f"{EXEC}.{js}_{n}"
    return h(ev.JoinSetRequest(js, ev.ChildExecutionRequest(child, "myapp:demo/ifc.c", [])))


def submit_delay(js: str, n: int = 1, expires: float = 10) -> ev.HistoryEvent:
    delay = f"Delay_{EXEC[2:]}.{js}_{n}"
    return h(ev.JoinSetRequest(js, ev.DelayRequest(delay, at(expires), ev.ScheduleAtIn(1000))))


def join_next(js: str, run_expires: float = 30, closing: bool = False) -> ev.HistoryEvent:
    return h(ev.JoinNext(js, at(run_expires), None, closing))


def child_done(js: str, n: int = 1, result: ev.ExecutionResult | None = None) -> ev.Response:
    return ev.ChildExecutionFinished(f"{EXEC}.{js}_{n}", js, 2, result or ev.ResultOk(n))


def delay_done(js: str, n: int = 1) -> ev.Response:
    return ev.DelayFinished(f"Delay_{EXEC[2:]}.{js}_{n}", js)


OK = ev.Finished(ev.ResultOk(42))


class Log:
    """An execution log under construction; checks `replay` after every step."""

    def __init__(
        self, component: ev.ComponentId = ACT, scheduled_at: datetime = T0, now: datetime = T0
    ) -> None:
        c = created(component, scheduled_at)
        self.items: list[tuple[datetime, ev.Event | ev.Response]] = [(now, c)]
        self.s = created_summary(c, now)
        self.events = 1

    def e(self, event: ev.Event, now: datetime | float = 0) -> Log:
        t = now if isinstance(now, datetime) else at(now)
        self.s = apply_event(self.s, event, t)
        self.items.append((t, event))
        self.events += 1
        self._check()
        return self

    def r(self, response: ev.Response, now: datetime | float = 0) -> Log:
        t = now if isinstance(now, datetime) else at(now)
        self.s = apply_response(self.s, response, t)
        self.items.append((t, response))
        self._check()
        return self

    def rejects(
        self, event: ev.Event, now: datetime | float = 0, match: str | None = None
    ) -> IllegalAppend:
        t = now if isinstance(now, datetime) else at(now)
        before = msgspec.json.encode(self.s)
        with pytest.raises(IllegalAppend, match=match) as info:
            apply_event(self.s, event, t)
        assert msgspec.json.encode(self.s) == before, "the input summary was mutated"
        return info.value

    def rejects_response(
        self, response: ev.Response, now: datetime | float = 0, match: str | None = None
    ) -> None:
        t = now if isinstance(now, datetime) else at(now)
        before = msgspec.json.encode(self.s)
        with pytest.raises(IllegalAppend, match=match):
            apply_response(self.s, response, t)
        assert msgspec.json.encode(self.s) == before, "the input summary was mutated"

    def _check(self) -> None:
        assert self.s.next_version == self.events
        assert replay(self.items) == self.s
        # the summary is stored as JSON by the storage backends
        assert msgspec.json.decode(msgspec.json.encode(self.s), type=ExecutionSummary) == self.s

    @property
    def state(self) -> PendingState:
        return self.s.state


def locked_log(component: ev.ComponentId = ACT, **kw: object) -> Log:
    return Log(component).e(lock(component=component, **kw))  # type: ignore[arg-type]


def workflow_blocked() -> Log:
    """A workflow blocked on g:1 with one child submitted, run A expiring at +30 s."""
    return locked_log(WF).e(create("g:1"), 1).e(submit("g:1"), 1).e(join_next("g:1", 30), 2)


# ---------------------------------------------------------------------------
# Created
# ---------------------------------------------------------------------------


def test_created_is_pending_at_scheduled_time() -> None:
    log = Log(scheduled_at=at(60), now=at(-1))
    s = log.s
    assert s.state == PendingAt(at(60), None)
    assert state_name(s.state) == "pending_at"
    assert s.next_version == 1
    assert s.ffqn == "myapp:demo/ifc.fn"
    assert s.component_type == "activity_wasm"
    assert s.created_at == at(-1)
    assert not s.is_finished
    assert not s.is_workflow
    assert Log(WF).s.is_workflow
    assert s.temporary_event_count == 0
    assert s.last_lock is None
    assert s.retry_config is None
    assert s.responses == 0


def test_created_only_first() -> None:
    Log().rejects(created(), match="first event")
    locked_log().rejects(created())


def test_replay_needs_created_first() -> None:
    with pytest.raises(IllegalAppend):
        replay([])
    with pytest.raises(IllegalAppend):
        replay([(T0, lock())])


# ---------------------------------------------------------------------------
# Locks (SPEC §4.2)
# ---------------------------------------------------------------------------


def test_new_lock_from_due_pending_at() -> None:
    log = Log().e(lock(expires=30), now=0)  # scheduled_at == now is due
    assert log.state == Locked("Exr_A", "Run_1", at(30))
    assert state_name(log.state) == "locked"
    assert log.s.last_lock == A
    assert log.s.retry_config == RETRY
    assert log.s.next_version == 2
    Log().e(lock(expires=30), now=5)  # overdue


def test_new_lock_not_due_rejected() -> None:
    log = Log(scheduled_at=at(10))
    log.rejects(lock(expires=30), now=9, match="not due")
    log.e(lock(expires=30), now=10)


@pytest.mark.parametrize("expires", [0, -1])
def test_new_lock_needs_future_expiry(expires: float) -> None:
    Log().rejects(lock(expires=expires), now=0, match="future")


@pytest.mark.parametrize(
    ("exr", "run"),
    [("Exr_B", "Run_2"), ("Exr_A", "Run_2"), ("Exr_B", "Run_1")],
)
def test_lock_by_another_executor_or_run_rejected_while_locked(exr: str, run: str) -> None:
    log = locked_log()
    log.rejects(lock(exr, run, expires=60), now=1, match="locked")
    # even after the lock expired: the watcher releases it first (§6.3)
    log.rejects(lock(exr, run, expires=120), now=60)


def test_extension_by_same_run_from_locked() -> None:
    log = locked_log(WF).e(h(ev.Persist(1, ev.PersistExecutionId())), 1)
    log.e(lock(expires=60, component=WF), now=29)
    assert log.state == Locked("Exr_A", "Run_1", at(60))
    assert log.s.last_lock == A
    # an extension keeps the run's progress (SPEC §6.3 "since its locked event")
    assert log.s.progressed_since_lock
    log.rejects(lock(expires=59, component=WF), now=59.5)
    log.rejects(lock(expires=59, component=WF), now=59, match="future")


def test_lock_from_blocked_rejected_for_everyone() -> None:
    log = workflow_blocked()
    log.rejects(lock(component=WF, expires=40), now=3, match="blocked_by_join_set")
    log.rejects(lock("Exr_B", "Run_2", component=WF, expires=40), now=3)
    log.rejects(lock("Exr_B", "Run_2", component=WF, expires=400), now=300)


def test_extension_from_pending_at_after_response_unblocked_the_run() -> None:
    log = workflow_blocked().r(child_done("g:1"), 5)
    assert log.state == PendingAt(at(30), A)
    # another executor must wait until scheduled_at
    log.rejects(lock("Exr_B", "Run_2", component=WF, expires=60), now=6, match="not due")
    # the warm run continues before scheduled_at: an extension, progress kept
    log.e(lock(component=WF, expires=60), now=6)
    assert log.state == Locked("Exr_A", "Run_1", at(60))
    assert log.s.progressed_since_lock


def test_new_lock_after_unblocked_run_expired() -> None:
    log = workflow_blocked().r(child_done("g:1"), 5)
    log.e(lock("Exr_B", "Run_2", component=WF, expires=60), now=30)
    assert log.state == Locked("Exr_B", "Run_2", at(60))
    assert log.s.last_lock == LockRef("Exr_B", "Run_2")
    assert not log.s.progressed_since_lock
    # the old run can no longer extend
    log.rejects(lock(component=WF, expires=90), now=31)


def test_extension_from_pending_at_needs_matching_last_lock() -> None:
    log = workflow_blocked().r(child_done("g:1"), 5)
    log.rejects(lock("Exr_A", "Run_2", component=WF, expires=60), now=6)
    log.rejects(lock("Exr_B", "Run_1", component=WF, expires=60), now=6)


@pytest.mark.parametrize(
    "release",
    [
        ev.Unlocked(at(10), "executor closing"),
        ev.TemporarilyFailed(at(10), "trap", ""),
        ev.TemporarilyTimedOut(at(10)),
    ],
)
def test_released_run_cannot_skip_its_backoff(release: ev.Event) -> None:
    """After unlocked / temporarily_*, PendingAt has no last_lock: the ended run
    cannot re-lock before the backoff as if it were an extension."""
    log = locked_log().e(release, 1)
    assert log.state == PendingAt(at(10), None)
    log.rejects(lock(expires=60), now=2, match="not due")
    log.e(lock(expires=60), now=10)  # a new lock once due, even by the same run


# ---------------------------------------------------------------------------
# Unlocked / temporarily failed / temporarily timed out
# ---------------------------------------------------------------------------

RELEASES = [
    ev.Unlocked(at(5), "executor closing"),
    ev.TemporarilyFailed(at(5), "trap", "detail"),
    ev.TemporarilyTimedOut(at(5)),
]


@pytest.mark.parametrize("release", RELEASES, ids=lambda e: type(e).__name__)
def test_release_from_locked(release: ev.Event) -> None:
    log = locked_log().e(release, 1)
    assert log.state == PendingAt(at(5), None)
    expected = 0 if isinstance(release, ev.Unlocked) else 1
    assert log.s.temporary_event_count == expected
    assert log.s.last_lock == A  # the summary remembers the last run


@pytest.mark.parametrize("release", RELEASES, ids=lambda e: type(e).__name__)
def test_release_only_from_locked(release: ev.Event) -> None:
    Log().rejects(release, match="needs a locked execution")
    Log().e(ev.Paused()).rejects(release)
    Log().e(ev.CancellationRequested()).rejects(release)
    if not isinstance(release, ev.Unlocked):  # a waiting run may let go: below
        workflow_blocked().rejects(release, 3)
        workflow_blocked().e(ev.Paused(), 3).rejects(release, 3)
        workflow_blocked().r(child_done("g:1"), 5).rejects(release, 6)


def test_unlocked_drops_the_claim_of_a_blocked_run() -> None:
    """A run blocked in memory (`await`) that lets go: the response that comes later
    makes the execution due at once, not at the run's lock expiry (+30 s)."""
    log = workflow_blocked().e(ev.Unlocked(at(4), "executor died"), 4)
    assert log.state == BlockedByJoinSet("g:1", at(4), False, None)
    assert log.s.temporary_event_count == 0
    log.r(child_done("g:1"), 5)
    assert log.state == PendingAt(at(5), None)
    # the run that let go cannot come back as the warm run
    log.rejects(lock(component=WF, expires=60), now=4)
    log.e(lock("Exr_B", "Run_2", component=WF, expires=60), now=6)
    # once the claim is gone, there is nothing more to let go of
    workflow_blocked().e(ev.Unlocked(at(4), "x"), 4).rejects(ev.Unlocked(at(4), "x"), 4)


def test_unlocked_drops_the_claim_of_an_unblocked_run_that_did_not_come_back() -> None:
    log = workflow_blocked().r(child_done("g:1"), 5)
    assert log.state == PendingAt(at(30), A)
    log.e(ev.Unlocked(at(6), "executor died"), 6)
    assert log.state == PendingAt(at(6), None)
    log.e(lock("Exr_B", "Run_2", component=WF, expires=60), now=7)
    assert not log.s.progressed_since_lock  # a new run, not the warm one


def test_unlocked_of_a_waiting_run_never_delays() -> None:
    log = workflow_blocked().e(ev.Unlocked(at(100), "x"), 4)
    assert log.state == BlockedByJoinSet("g:1", at(30), False, None)
    log = workflow_blocked().r(child_done("g:1"), 5).e(ev.Unlocked(at(100), "x"), 6)
    assert log.state == PendingAt(at(30), None)


def test_unlocked_of_a_waiting_run_while_paused_keeps_the_pause() -> None:
    log = workflow_blocked().e(ev.Paused(), 3).e(ev.Unlocked(at(4), "x"), 4)
    assert log.state == Paused(BlockedByJoinSet("g:1", at(4), False, None))
    log.r(child_done("g:1"), 5).e(ev.Unpaused(), 6)
    assert log.state == PendingAt(at(5), None)


def test_temporary_event_count_accumulates() -> None:
    log = locked_log()
    log.e(ev.TemporarilyFailed(at(2), "x", ""), 1).e(lock(run="Run_2", expires=40), 2)
    log.e(ev.Unlocked(at(3), "closing"), 2).e(lock(run="Run_3", expires=40), 3)
    log.e(ev.TemporarilyTimedOut(at(4)), 3)
    assert log.s.temporary_event_count == 2


# ---------------------------------------------------------------------------
# Join next and responses (SPEC §4.2)
# ---------------------------------------------------------------------------


def test_join_next_without_response_blocks() -> None:
    log = workflow_blocked()
    assert log.state == BlockedByJoinSet("g:1", at(30), False, A)
    assert state_name(log.state) == "blocked_by_join_set"


def test_join_next_with_response_already_there_stays_locked() -> None:
    log = locked_log(WF).e(create("g:1"), 1).e(submit("g:1"), 1).r(child_done("g:1"), 2)
    assert log.state == Locked("Exr_A", "Run_1", at(30))
    log.e(join_next("g:1"), 3)
    assert log.state == Locked("Exr_A", "Run_1", at(30))
    log.e(OK, 4)
    assert log.state == Finished(5, at(4), "ok")


@pytest.mark.parametrize(
    ("response_at", "scheduled"),
    [(5, 30), (45, 45), (30, 30)],
)
def test_response_unblocks_to_max_of_lock_expiry_and_now(
    response_at: float, scheduled: float
) -> None:
    log = workflow_blocked().r(child_done("g:1"), response_at)
    assert log.state == PendingAt(at(scheduled), A)
    assert log.s.responses == 1


def test_delay_response_unblocks() -> None:
    log = locked_log(WF).e(create("o:1-sleep"), 1).e(submit_delay("o:1-sleep"), 1)
    log.e(join_next("o:1-sleep", run_expires=2), 1)
    assert log.state == BlockedByJoinSet("o:1-sleep", at(2), False, A)
    log.r(delay_done("o:1-sleep"), 10)
    assert log.state == PendingAt(at(10), A)


def test_response_on_other_join_set_keeps_blocked() -> None:
    log = locked_log(WF).e(create("g:1"), 1).e(create("g:2"), 1)
    log.e(submit("g:1"), 1).e(submit("g:2"), 1).e(join_next("g:1"), 2)
    log.r(child_done("g:2"), 3)
    assert log.state == BlockedByJoinSet("g:1", at(30), False, A)
    log.r(child_done("g:1"), 4)
    assert log.state == PendingAt(at(30), A)
    # the warm run continues and consumes g:2 without blocking
    log.e(lock(component=WF, expires=60), 5).e(join_next("g:2", 60), 5)
    assert log.state == Locked("Exr_A", "Run_1", at(60))


def test_join_next_consumes_in_order() -> None:
    log = locked_log(WF).e(create("g:1"), 1)
    log.e(submit("g:1", 1), 1).e(submit("g:1", 2), 1).r(child_done("g:1", 2), 1)
    log.e(join_next("g:1"), 2)  # takes the one response there
    assert isinstance(log.state, Locked)
    log.e(join_next("g:1"), 2)  # nothing else: blocks
    assert log.state == BlockedByJoinSet("g:1", at(30), False, A)
    log.r(child_done("g:1", 1), 3)
    assert log.state == PendingAt(at(30), A)


def test_join_next_closing_flag() -> None:
    log = locked_log(WF).e(create("g:1"), 1).e(submit("g:1"), 1)
    log.e(join_next("g:1", 7, closing=True), 2)
    assert log.state == BlockedByJoinSet("g:1", at(7), True, A)


def test_join_next_interrupt_strategy_run_expires_now() -> None:
    """`interrupt`: run_expires_at = now, so the response makes it due at once."""
    log = locked_log(WF).e(create("g:1"), 1).e(submit("g:1"), 1).e(join_next("g:1", 2), 2)
    log.r(child_done("g:1"), 9)
    assert log.state == PendingAt(at(9), A)
    log.e(lock("Exr_B", "Run_2", component=WF, expires=20), 9)


def test_seed_workflow_example() -> None:
    """execution-log.md "Workflow with Child Execution", versions 0–7.

    The seed writes `JoinNextTry(o:1, Found)` at version 6, after `JoinNext` at version 4
    already consumed the only response of o:1; with one request in the set, a poll there
    can only report `all_processed` (a `found` would need a second response), so that is
    what this log records.
    """
    log = Log(WF)
    log.e(lock(component=WF, expires=30), 0)  # v1
    log.e(create("o:1"), 1)  # v2
    log.e(submit("o:1"), 1)  # v3
    log.e(join_next("o:1", 30), 1)  # v4
    assert log.state == BlockedByJoinSet("o:1", at(30), False, A)
    log.r(child_done("o:1", 1, ev.ResultOk(42)), 10)
    assert log.state == PendingAt(at(30), A)
    log.e(lock(component=WF, expires=60), 11)  # v5: lock extension
    assert log.state == Locked("Exr_A", "Run_1", at(60))
    log.rejects(h(ev.JoinNextTry("o:1", "found")), 11)
    log.e(h(ev.JoinNextTry("o:1", "all_processed")), 11)  # v6
    log.e(OK, 12)  # v7
    assert log.state == Finished(7, at(12), "ok")
    assert log.s.next_version == 8


def _stored(
    items: list[tuple[datetime, ev.Event | ev.Response]],
) -> tuple[list[ev.StoredEvent], list[ev.StoredResponse]]:
    """What the storage returns for `items`: events by version, responses by cursor."""
    events: list[ev.StoredEvent] = []
    responses: list[ev.StoredResponse] = []
    for t, item in items:
        if isinstance(item, ev.ChildExecutionFinished | ev.DelayFinished):
            responses.append(ev.StoredResponse(len(responses) + 1, t, item))
        else:
            events.append(ev.StoredEvent(len(events), t, item))  # type: ignore[arg-type]
    return events, responses


def test_a_due_delay_answered_after_a_buffered_join_next_is_read_back_in_write_order() -> None:
    """One transaction (one timestamp): a `join_next` answered by a response that arrived
    earlier (buffered), then a delay already due, answered by the same transaction."""
    log = Log(WF)
    log.e(lock(component=WF, expires=30), 1)
    log.e(create("g:1"), 1)
    log.e(submit("g:1"), 1)
    log.r(child_done("g:1", 1), 2)
    log.e(join_next("g:1"), 3)  # the child's response is there: does not block
    log.e(submit_delay("g:1", 2, expires=3), 3)  # due at once: answered right here
    log.r(delay_done("g:1", 2), 3)
    log.e(join_next("g:1", closing=True), 3)
    log.e(OK, 4)
    events, responses = _stored(log.items)
    order = [item for _, item, _ in interleave_stored(events, responses)]
    assert order == [item for _, item in log.items]
    assert replay_stored(events, responses) == log.s


def test_seed_activity_with_retries_example() -> None:
    retry = ev.RetryConfig(5, 1000)
    log = Log()
    log.e(lock(run="Run_1", retry=retry), 0)
    assert on_temporary_failure(log.s, at(1), "connection refused", "", ev.ResultOk(1)) == (
        ev.TemporarilyFailed(at(2), "connection refused", "")
    )
    log.e(ev.TemporarilyFailed(at(2), "connection refused"), 1)
    assert log.state == PendingAt(at(2))
    log.e(lock(run="Run_2", retry=retry, expires=40), 2)
    assert on_temporary_failure(log.s, at(3), "connection refused", "", ev.ResultOk(1)) == (
        ev.TemporarilyFailed(at(5), "connection refused", "")
    )
    log.e(ev.TemporarilyFailed(at(5), "connection refused"), 3)
    log.e(lock(run="Run_3", retry=retry, expires=40), 5)
    log.e(ev.Finished(ev.ResultOk("success")), 6)
    assert log.state == Finished(6, at(6), "ok")


# ---------------------------------------------------------------------------
# Join sets
# ---------------------------------------------------------------------------


def test_join_set_create_duplicate_rejected() -> None:
    log = locked_log(WF).e(create("g:1"), 1)
    log.rejects(create("g:1"), 1, match="already exists")
    assert log.s.join_set_count == 1
    log.e(create("g:2"), 1)
    assert log.s.join_set_count == 2


def test_join_set_duplicate_rejected_even_when_processed() -> None:
    log = locked_log(WF).e(create("g:1"), 1).e(submit("g:1"), 1).r(child_done("g:1"), 1)
    log.e(join_next("g:1"), 1)
    log.rejects(create("g:1"), 1)


def test_done_one_off_join_sets_are_kept_as_ranges_of_k() -> None:
    """A long workflow's summary stays small: done one-offs are a range of numbers."""
    log = locked_log(WF)
    for k in range(1, 201):
        js = f"o:{k}-step"
        log.e(create(js), 1).e(submit(js), 1).r(child_done(js), 1).e(join_next(js), 1)
    assert log.s.join_sets == {}
    assert log.s.done_one_off_ks == [1, 201] and log.s.done_one_off == []
    assert is_done_one_off(log.s, "o:7-step") and not is_done_one_off(log.s, "o:201-step")
    # still unique: a done one-off id (or its k) cannot be created again
    log.rejects(create("o:7-step"), 1, match="already exists")
    log.rejects(create("o:7-other"), 1, match="already exists")
    # and still usable: join_next_try on it brings it back as (1, 1, 1), then done again
    log.e(ev.HistoryEvent(ev.JoinNextTry("o:7-step", "all_processed")), 1)
    assert log.s.done_one_off_ks == [1, 201]
    log.rejects(join_next("o:7-step"), 1, match="nothing left")


def test_one_off_k_must_be_new_among_open_one_offs() -> None:
    log = locked_log(WF).e(create("o:1-a"), 1)
    log.rejects(create("o:1-b"), 1, match="k = 1")
    log.e(create("o:2-b"), 1).e(create("g:1"), 1)


def test_one_off_ids_without_k_are_kept_by_id() -> None:
    log = locked_log(WF)
    for js in ("o:x-step", "o:01-step"):
        log.e(create(js), 1).e(submit(js), 1).r(child_done(js), 1).e(join_next(js), 1)
    assert log.s.done_one_off == ["o:x-step", "o:01-step"] and log.s.done_one_off_ks == []
    log.rejects(create("o:x-step"), 1, match="already exists")


def test_older_summaries_with_a_list_of_done_one_offs_still_validate() -> None:
    s = msgspec.structs.replace(locked_log(WF).s, done_one_off=["o:1-step"], join_set_count=1)
    with pytest.raises(IllegalAppend, match="already exists"):
        apply_event(s, create("o:1-step"), at(1))
    s = apply_event(s, ev.HistoryEvent(ev.JoinNextTry("o:1-step", "all_processed")), at(1))
    assert s.done_one_off == [] and s.done_one_off_ks == [1, 2]


@pytest.mark.parametrize(
    ("ranges", "k", "added"),
    [
        ([], 5, [5, 6]),
        ([1, 5], 5, [1, 6]),
        ([1, 5], 0, [0, 5]),
        ([1, 5, 6, 9], 5, [1, 9]),
        ([1, 3, 7, 9], 5, [1, 3, 5, 6, 7, 9]),
        ([1, 5], 3, [1, 5]),
    ],
)
def test_ranges_add_contain_remove(ranges: list[int], k: int, added: list[int]) -> None:
    got = ranges_add(ranges, k)
    assert got == added and ranges_contain(got, k)
    assert all(ranges_contain(got, x) == (ranges_contain(ranges, x) or x == k) for x in range(12))
    if not ranges_contain(ranges, k):
        assert ranges_remove(got, k) == ranges
    removed = ranges_remove(got, k)
    assert all(ranges_contain(removed, x) == (ranges_contain(got, x) and x != k) for x in range(12))


def test_one_off_k() -> None:
    assert one_off_k("o:12-add") == 12 and one_off_k("o:1-sleep") == 1
    for js in ("g:12", "n:12-a", "o:x-a", "o:01-a", "o:12", "o:-a", "o:١-a"):
        assert one_off_k(js) is None, js


def test_request_into_unknown_join_set_rejected() -> None:
    log = locked_log(WF)
    log.rejects(submit("g:1"), 1, match="does not exist")
    log.rejects(submit_delay("g:1"), 1, match="does not exist")


def test_join_next_unknown_or_nothing_left_rejected() -> None:
    log = locked_log(WF)
    log.rejects(join_next("g:1"), 1, match="does not exist")
    log.e(create("g:1"), 1)
    log.rejects(join_next("g:1"), 1, match="nothing left")
    log.e(submit("g:1"), 1).r(child_done("g:1"), 1).e(join_next("g:1"), 1)
    log.rejects(join_next("g:1"), 1, match="nothing left")


def test_join_next_try_outcomes_validated() -> None:
    def try_(outcome: ev.JoinNextTryOutcome) -> ev.HistoryEvent:
        return h(ev.JoinNextTry("g:1", outcome))

    log = locked_log(WF)
    log.rejects(try_("all_processed"), 1, match="does not exist")
    log.e(create("g:1"), 1)
    # empty set: all processed
    log.rejects(try_("found"), 1)
    log.rejects(try_("pending"), 1)
    log.e(try_("all_processed"), 1)
    # one request, no response: pending
    log.e(submit("g:1"), 1)
    log.rejects(try_("found"), 1)
    log.rejects(try_("all_processed"), 1)
    log.e(try_("pending"), 1)
    # response there: found (consumes it)
    log.r(child_done("g:1"), 2)
    log.rejects(try_("pending"), 2)
    log.rejects(try_("all_processed"), 2)
    log.e(try_("found"), 2)
    assert log.s.join_sets["g:1"].consumed == 1
    # consumed: all processed again
    log.rejects(try_("found"), 2)
    log.rejects(try_("pending"), 2)
    log.e(try_("all_processed"), 2)
    assert isinstance(log.state, Locked)


def test_join_next_try_pending_with_an_outstanding_and_a_consumed() -> None:
    log = locked_log(WF).e(create("g:1"), 1).e(submit("g:1", 1), 1).e(submit("g:1", 2), 1)
    log.r(child_done("g:1", 1), 1).e(h(ev.JoinNextTry("g:1", "found")), 1)
    log.e(h(ev.JoinNextTry("g:1", "pending")), 1)
    log.rejects(h(ev.JoinNextTry("g:1", "all_processed")), 1)


def test_join_next_too_many() -> None:
    too_many = h(ev.JoinNextTooMany("g:1", "myapp:demo/ifc.c"))
    log = locked_log(WF)
    log.rejects(too_many, 1, match="does not exist")
    log.e(create("g:1"), 1).e(too_many, 1)  # empty set
    log.e(submit("g:1"), 1)
    log.rejects(too_many, 1, match="requests left")
    log.r(child_done("g:1"), 1)
    log.rejects(too_many, 1, match="requests left")  # received, not yet consumed
    log.e(join_next("g:1"), 1).e(too_many, 1)


def test_response_for_unknown_join_set_rejected() -> None:
    log = locked_log(WF)
    log.rejects_response(child_done("g:1"), 1, match="unknown join set")


def test_more_responses_than_requests_rejected() -> None:
    log = locked_log(WF).e(create("g:1"), 1)
    log.rejects_response(child_done("g:1"), 1, match="more responses")
    log.e(submit("g:1"), 1).r(child_done("g:1"), 1)
    log.rejects_response(child_done("g:1"), 2, match="more responses")
    log.rejects_response(delay_done("g:1"), 2, match="more responses")


@pytest.mark.parametrize(
    "event",
    [
        ev.Persist(7, ev.PersistRandomU64(0, 10)),
        ev.Schedule(EXEC, ev.ScheduleAtNow(), "myapp:demo/ifc.fn"),
        ev.Stub(f"{EXEC}.g:1_1", "sha256:00", "written"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_history_without_state_change(event: ev.HistoryEventKind) -> None:
    log = locked_log(WF)
    before = log.state
    assert not log.s.progressed_since_lock
    log.e(h(event), 1)
    assert log.state == before
    assert log.s.progressed_since_lock


HISTORY_SAMPLE = [
    create("g:9"),
    h(ev.Persist(7, ev.PersistRandomU64(0, 10))),
    h(ev.Schedule(EXEC, ev.ScheduleAtNow(), "myapp:demo/ifc.fn")),
    h(ev.JoinNextTry("g:1", "pending")),
]


@pytest.mark.parametrize("event", HISTORY_SAMPLE, ids=lambda e: type(e.event).__name__)
def test_history_needs_a_lock(event: ev.HistoryEvent) -> None:
    Log(WF).rejects(event, match="history events need a locked execution")
    workflow_blocked().rejects(event, 3, match="blocked_by_join_set")
    workflow_blocked().r(child_done("g:1"), 4).rejects(event, 5, match="pending_at")
    workflow_blocked().e(ev.Paused(), 3).rejects(event, 3, match="paused")
    locked_log(WF).e(ev.Unlocked(at(1), "paused"), 1).e(ev.Paused(), 1).rejects(event, 2)


# ---------------------------------------------------------------------------
# Pause / unpause (SPEC §4.3)
# ---------------------------------------------------------------------------


def test_pause_pending_at_and_unpause_restores() -> None:
    log = Log(scheduled_at=at(10)).e(ev.Paused(), 1)
    assert log.state == Paused(PendingAt(at(10)))
    assert state_name(log.state) == "paused"
    log.rejects(lock(expires=60), 20, match="paused")  # due, but paused
    log.e(ev.Unpaused(), 21)
    assert log.state == PendingAt(at(10))
    log.e(lock(expires=60), 21)


def test_pause_blocked_and_unpause_restores() -> None:
    log = workflow_blocked().e(ev.Paused(), 3)
    assert log.state == Paused(BlockedByJoinSet("g:1", at(30), False, A))
    log.e(ev.Unpaused(), 4)
    assert log.state == BlockedByJoinSet("g:1", at(30), False, A)


def test_pause_locked_rejected() -> None:
    locked_log().rejects(ev.Paused(), 1, match="locked execution cannot be paused")
    locked_log(WF).rejects(ev.Paused(), 1)


def test_pause_locked_workflow_after_release() -> None:
    """§4.3: a locked workflow is released with unlocked(now, "paused"), then paused."""
    log = locked_log(WF).e(ev.Unlocked(at(3), "paused"), 3).e(ev.Paused(), 3)
    assert log.state == Paused(PendingAt(at(3), None))
    log.rejects(lock(component=WF, expires=60), 4, match="paused")


def test_pause_twice_and_unpause_not_paused_rejected() -> None:
    log = Log()
    log.rejects(ev.Unpaused(), match="not paused")
    log.e(ev.Paused())
    log.rejects(ev.Paused(), match="already paused")
    log.e(ev.Unpaused())
    log.rejects(ev.Unpaused(), match="not paused")
    locked_log().rejects(ev.Unpaused(), 1, match="not paused")
    workflow_blocked().rejects(ev.Unpaused(), 3, match="not paused")


def test_response_while_paused_unblocks_underlying() -> None:
    log = workflow_blocked().e(ev.Paused(), 3).r(child_done("g:1"), 40)
    assert log.state == Paused(PendingAt(at(40), A))
    log.rejects(lock(component=WF, expires=60), 41, match="paused")
    log.rejects(lock("Exr_B", "Run_2", component=WF, expires=60), 41, match="paused")
    log.e(ev.Unpaused(), 42)
    assert log.state == PendingAt(at(40), A)
    log.e(lock("Exr_B", "Run_2", component=WF, expires=60), 42)


def test_response_while_paused_on_other_join_set_stays_blocked() -> None:
    log = locked_log(WF).e(create("g:1"), 1).e(create("g:2"), 1)
    log.e(submit("g:1"), 1).e(submit("g:2"), 1).e(join_next("g:1"), 2).e(ev.Paused(), 3)
    log.r(child_done("g:2"), 4)
    assert log.state == Paused(BlockedByJoinSet("g:1", at(30), False, A))


def test_paused_execution_can_be_finished() -> None:
    log = Log().e(ev.Paused()).e(ev.Finished(ev.ExecutionFailure("cancelled")), 1)
    assert log.state == Finished(2, at(1), "execution_failure:cancelled")
    assert not log.s.paused


# ---------------------------------------------------------------------------
# Cancellation (SPEC §8)
# ---------------------------------------------------------------------------


def test_cancel_overlays_locked() -> None:
    log = locked_log().e(ev.CancellationRequested(), 1)
    assert log.state == Cancelling(Locked("Exr_A", "Run_1", at(30)))
    assert state_name(log.state) == "cancelling"
    # the running activity is interrupted and finishes cancelled
    log.e(ev.Finished(ev.ExecutionFailure("cancelled")), 2)
    assert log.state == Finished(3, at(2), "execution_failure:cancelled")


def test_cancel_overlays_pending_at() -> None:
    log = Log(scheduled_at=at(5)).e(ev.CancellationRequested(), 1)
    assert log.state == Cancelling(PendingAt(at(5)))
    log.rejects(lock(expires=60), 10, match="cancelling")
    log.e(ev.Finished(ev.ExecutionFailure("cancelled")), 10)
    assert isinstance(log.state, Finished)


def test_cancel_overlays_blocked_and_response_unblocks() -> None:
    log = workflow_blocked().e(ev.CancellationRequested(), 3)
    assert log.state == Cancelling(BlockedByJoinSet("g:1", at(30), False, A))
    log.r(child_done("g:1"), 4)
    assert log.state == Cancelling(PendingAt(at(30), A))


def test_cancelling_cannot_be_locked_not_even_extended() -> None:
    """A cancelling execution is not advanced again: no new lock, no extension."""
    log = locked_log(WF).e(ev.CancellationRequested(), 1)
    log.rejects(lock(component=WF, expires=60), 2, match="cancelling")
    log.rejects(lock("Exr_B", "Run_2", component=WF, expires=60), 31, match="cancelling")
    unblocked = workflow_blocked().e(ev.CancellationRequested(), 3).r(child_done("g:1"), 4)
    unblocked.rejects(lock(component=WF, expires=60), 5, match="cancelling")
    unblocked.rejects(lock("Exr_B", "Run_2", component=WF, expires=60), 40, match="cancelling")


def test_cancelling_locked_can_still_be_released() -> None:
    log = locked_log().e(ev.CancellationRequested(), 1).e(ev.TemporarilyTimedOut(at(2)), 30)
    assert log.state == Cancelling(PendingAt(at(2)))


def test_cancel_supersedes_pause() -> None:
    log = workflow_blocked().e(ev.Paused(), 3).e(ev.CancellationRequested(), 4)
    assert log.state == Cancelling(BlockedByJoinSet("g:1", at(30), False, A))
    assert not log.s.paused
    log.rejects(ev.Unpaused(), 5, match="not paused")
    log.rejects(ev.Paused(), 5, match="cancelling")


def test_cancel_twice_rejected() -> None:
    Log().e(ev.CancellationRequested()).rejects(ev.CancellationRequested(), match="already")
    locked_log().e(ev.CancellationRequested(), 1).rejects(ev.CancellationRequested(), 1)


def test_cancelling_cannot_be_paused() -> None:
    Log().e(ev.CancellationRequested()).rejects(ev.Paused(), match="cancelling")
    workflow_blocked().e(ev.CancellationRequested(), 3).rejects(ev.Paused(), 3)


def test_cancellation_teardown_writes_history_without_a_lock() -> None:
    """§7.3/§8: the driver closes the join sets of a cancelled workflow from the log."""
    log = locked_log(WF).e(create("g:1"), 1).e(submit("g:1", 1), 1).e(submit("g:1", 2), 1)
    log.e(join_next("g:1", 30), 2).e(ev.CancellationRequested(), 3)
    log.e(join_next("g:1", 3, closing=True), 3)
    assert log.state == Cancelling(BlockedByJoinSet("g:1", at(3), True, A))
    log.r(child_done("g:1", 2, ev.ExecutionFailure("cancelled")), 4)
    assert log.state == Cancelling(BlockedByJoinSet("g:1", at(3), True, A))
    log.r(child_done("g:1", 1, ev.ExecutionFailure("cancelled")), 5)
    assert log.state == Cancelling(PendingAt(at(5), A))
    log.e(ev.Finished(ev.ExecutionFailure("cancelled")), 5)
    assert log.state == Finished(log.s.next_version - 1, at(5), "execution_failure:cancelled")


# ---------------------------------------------------------------------------
# Finished
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "kind"),
    [
        (ev.ResultOk(1), "ok"),
        (ev.ResultErr("e"), "err"),
        (ev.ExecutionFailure("timed_out"), "execution_failure:timed_out"),
        (
            ev.ExecutionFailure("nondeterminism_detected"),
            "execution_failure:nondeterminism_detected",
        ),
        (ev.ExecutionFailure("cancelled"), "execution_failure:cancelled"),
        (ev.ExecutionFailure("out_of_fuel"), "execution_failure:out_of_fuel"),
        (ev.ExecutionFailure("uncategorized"), "execution_failure:uncategorized"),
    ],
)
def test_finished_from_locked(result: ev.ExecutionResult, kind: str) -> None:
    log = locked_log().e(ev.Finished(result), 2)
    assert log.state == Finished(2, at(2), kind)
    assert state_name(log.state) == "finished"
    assert log.s.result == result
    assert log.s.is_finished
    assert log.s.next_version == 3


def _non_finished_logs() -> dict[str, Log]:
    return {
        "pending_at": Log(scheduled_at=at(100)),
        "locked": locked_log(),
        "blocked": workflow_blocked(),
        "paused_pending": Log().e(ev.Paused()),
        "paused_blocked": workflow_blocked().e(ev.Paused(), 3),
        "cancelling_locked": locked_log().e(ev.CancellationRequested(), 1),
        "cancelling_pending": Log().e(ev.CancellationRequested()),
        "cancelling_blocked": workflow_blocked().e(ev.CancellationRequested(), 3),
    }


@pytest.mark.parametrize("name", list(_non_finished_logs()))
def test_finished_forced_from_any_non_finished_state(name: str) -> None:
    log = _non_finished_logs()[name]
    v = log.s.next_version
    log.e(ev.Finished(ev.ExecutionFailure("cancelled")), 5)
    assert log.state == Finished(v, at(5), "execution_failure:cancelled")
    assert not log.s.paused and not log.s.cancelling


ALL_EVENTS: list[ev.Event] = [
    created(),
    lock(expires=1000),
    lock("Exr_B", "Run_2", expires=1000),
    ev.Unlocked(at(1), "x"),
    ev.TemporarilyFailed(at(1), "x"),
    ev.TemporarilyTimedOut(at(1)),
    OK,
    ev.Finished(ev.ExecutionFailure("cancelled")),
    *HISTORY_SAMPLE,
    create("g:1"),
    submit("g:1"),
    join_next("g:1"),
    ev.Paused(),
    ev.Unpaused(),
    ev.CancellationRequested(),
    ev.ComponentUpgradeFinished("sha256:00", "Dep_2", ev.UpgradeSuccess()),
]


@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: type(e).__name__)
def test_nothing_after_finished(event: ev.Event) -> None:
    log = workflow_blocked().r(child_done("g:1"), 3).e(lock(component=WF, expires=60), 4)
    log.e(OK, 5)
    log.rejects(event, 6, match="finished")


def test_responses_after_finished_change_nothing() -> None:
    log = workflow_blocked().e(ev.Finished(ev.ExecutionFailure("cancelled")), 3)
    state = log.state
    log.r(child_done("g:1"), 4)
    log.r(child_done("g:7", 3), 5)  # even unknown join sets: the parent is gone
    assert log.state == state
    assert log.s.next_version == 6
    assert log.s.responses == 2


# ---------------------------------------------------------------------------
# Component upgrade: no change
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(_non_finished_logs()))
def test_component_upgrade_finished_changes_no_state(name: str) -> None:
    log = _non_finished_logs()[name]
    state = log.state
    log.e(ev.ComponentUpgradeFinished("sha256:00", "Dep_2", ev.UpgradeFailed("nondet")), 3)
    assert log.state == state


# ---------------------------------------------------------------------------
# Purity
# ---------------------------------------------------------------------------


def test_apply_does_not_mutate_input() -> None:
    log = locked_log(WF).e(create("g:1"), 1).e(submit("g:1"), 1)
    s = log.s
    snapshot = msgspec.json.encode(s)
    apply_event(s, submit("g:1", 2), at(1))
    apply_event(s, join_next("g:1"), at(1))
    apply_event(s, h(ev.JoinNextTry("g:1", "pending")), at(1))
    apply_response(s, child_done("g:1"), at(1))
    apply_event(s, ev.CancellationRequested(), at(1))
    apply_event(s, OK, at(1))
    assert msgspec.json.encode(s) == snapshot
    assert s.join_sets["g:1"].submitted == 1


# ---------------------------------------------------------------------------
# Retries (SPEC §5.2)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("count", "delay_ms"), [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1600)])
def test_retry_backoff_exponential(count: int, delay_ms: int) -> None:
    assert retry_backoff(count, ev.RetryConfig(5, 100), T0) == T0 + timedelta(milliseconds=delay_ms)


def test_retry_iff_count_at_most_max_retries() -> None:
    retry = ev.RetryConfig(2, 100)
    assert retry_backoff(1, retry, T0) is not None
    assert retry_backoff(2, retry, T0) is not None
    assert retry_backoff(3, retry, T0) is None
    assert retry_backoff(1, ev.RetryConfig(0, 100), T0) is None


def test_retry_forever_when_max_retries_is_none() -> None:
    retry = ev.RetryConfig(None, 1000)
    for count in (1, 6, 30, 41, 100, 10_000):
        when = retry_backoff(count, retry, T0)
        assert when is not None and when > T0  # no OverflowError either


def test_default_retry_configs() -> None:
    assert ev.RetryConfig(5, 100) == ACTIVITY_RETRY
    assert ev.RetryConfig(None, 100) == WORKFLOW_RETRY


def test_on_temporary_failure_retries_then_finishes() -> None:
    final = ev.ResultErr("boom")
    retry = ev.RetryConfig(2, 1000)
    log = Log().e(lock(retry=retry, expires=30), 0)
    assert on_temporary_failure(log.s, at(1), "trap", "bt", final) == ev.TemporarilyFailed(
        at(2), "trap", "bt"
    )
    assert on_temporary_failure(log.s, at(1), "t", "", final, timed_out=True) == (
        ev.TemporarilyTimedOut(at(2))
    )
    log.e(ev.TemporarilyFailed(at(2), "trap"), 1).e(lock(run="Run_2", retry=retry), 2)
    assert on_temporary_failure(log.s, at(3), "trap", "", final) == ev.TemporarilyFailed(
        at(5), "trap", ""
    )
    log.e(ev.TemporarilyTimedOut(at(5)), 3).e(lock(run="Run_3", retry=retry), 5)
    assert log.s.temporary_event_count == 2
    assert on_temporary_failure(log.s, at(6), "trap", "", final) == ev.Finished(final)
    assert on_temporary_failure(log.s, at(6), "t", "", final, timed_out=True) == (
        ev.Finished(final)
    )


def test_unlocked_does_not_count_as_retry() -> None:
    retry = ev.RetryConfig(1, 1000)
    log = Log().e(lock(retry=retry, expires=30), 0)
    log.e(ev.Unlocked(at(1), "executor closing"), 1).e(lock(run="Run_2", retry=retry), 1)
    log.e(ev.Unlocked(at(2), "executor closing"), 2).e(lock(run="Run_3", retry=retry), 2)
    assert log.s.temporary_event_count == 0
    assert on_temporary_failure(log.s, at(3), "x", "", ev.ResultOk(1)) == (
        ev.TemporarilyFailed(at(4), "x", "")
    )


def test_on_temporary_failure_defaults_without_a_lock() -> None:
    activity = Log().s
    assert on_temporary_failure(activity, T0, "r", "", ev.ResultOk(1)) == ev.TemporarilyFailed(
        T0 + timedelta(milliseconds=100), "r", ""
    )
    workflow = Log(WF).s
    assert on_temporary_failure(workflow, T0, "r", "", ev.ResultOk(1), timed_out=True) == (
        ev.TemporarilyTimedOut(T0 + timedelta(milliseconds=100))
    )


def test_retry_uses_config_of_latest_lock() -> None:
    log = Log().e(lock(retry=ev.RetryConfig(5, 100), expires=30), 0)
    log.e(ev.Unlocked(at(1), "x"), 1).e(
        lock(run="Run_2", retry=ev.RetryConfig(0, 1), expires=30), 1
    )
    assert on_temporary_failure(log.s, at(2), "x", "", ev.ResultOk(1)) == (
        ev.Finished(ev.ResultOk(1))
    )


# ---------------------------------------------------------------------------
# Lock expiry (SPEC §6.3)
# ---------------------------------------------------------------------------


def test_lock_expired_workflow_with_progress_is_unlocked() -> None:
    log = locked_log(WF, retry=WORKFLOW_RETRY).e(create("g:1"), 1)
    out = on_lock_expired(log.s, at(31))
    assert out == ev.Unlocked(at(31), "made progress")
    log.e(out, 31)
    assert log.state == PendingAt(at(31), None)
    assert log.s.temporary_event_count == 0
    # the next run starts without progress
    log.e(lock("Exr_B", "Run_2", component=WF, retry=WORKFLOW_RETRY, expires=60), 31)
    assert not log.s.progressed_since_lock
    assert on_lock_expired(log.s, at(61)) == ev.TemporarilyTimedOut(
        at(61) + timedelta(milliseconds=100)
    )


def test_lock_expired_workflow_without_progress_times_out_forever() -> None:
    log = locked_log(WF, retry=WORKFLOW_RETRY)
    for i in range(1, 8):
        out = on_lock_expired(log.s, log.s.state.lock_expires_at)  # type: ignore[union-attr]
        assert isinstance(out, ev.TemporarilyTimedOut)
        assert out.backoff_expires_at - log.s.state.lock_expires_at == timedelta(  # type: ignore[union-attr]
            milliseconds=100 * 2 ** (i - 1)
        )
        log.e(out, log.s.state.lock_expires_at)  # type: ignore[union-attr]
        due = log.s.state.scheduled_at  # type: ignore[union-attr]
        log.e(
            ev.Locked(WF, "Exr_A", f"Run_{i + 1}", due + timedelta(seconds=30), WORKFLOW_RETRY), due
        )
    assert log.s.temporary_event_count == 7


def test_executor_died_lock_expires_now() -> None:
    dead = {"Exr_A"}
    log = locked_log(WF, retry=WORKFLOW_RETRY).e(create("g:1"), 1)
    assert on_executor_died(log.s, {"Exr_B"}, at(2)) is None  # someone else's lock
    assert on_executor_died(log.s, dead, at(2)) == ev.Unlocked(at(2), "made progress")
    activity = locked_log(retry=RETRY)
    assert on_executor_died(activity.s, dead, at(2)) == ev.TemporarilyTimedOut(at(3))
    cancelling = locked_log(retry=RETRY).e(ev.CancellationRequested(), 1)
    out = on_executor_died(cancelling.s, dead, at(2))
    assert out == ev.Finished(ev.ExecutionFailure("cancelled", "cancellation requested"))


def test_executor_died_drops_the_claims_of_waiting_runs() -> None:
    dead = {"Exr_A"}
    blocked = workflow_blocked()
    assert on_executor_died(blocked.s, {"Exr_B"}, at(4)) is None
    out = on_executor_died(blocked.s, dead, at(4))
    assert out == ev.Unlocked(at(4), EXECUTOR_DIED)
    blocked.e(out, 4)  # legal
    assert on_executor_died(blocked.s, dead, at(5)) is None  # nothing left to drop
    assert on_executor_died(workflow_blocked().s, dead, at(30)) is None  # claim over
    unblocked = workflow_blocked().r(child_done("g:1"), 5)
    out = on_executor_died(unblocked.s, dead, at(6))
    assert out == ev.Unlocked(at(6), EXECUTOR_DIED)
    unblocked.e(out, 6)
    assert unblocked.state == PendingAt(at(6), None)
    paused = workflow_blocked().e(ev.Paused(), 3)
    assert on_executor_died(paused.s, dead, at(4)) == ev.Unlocked(at(4), EXECUTOR_DIED)
    # pending (retry backoff) or finished: no run holds anything
    released = locked_log().e(ev.TemporarilyFailed(at(10), "trap", ""), 1)
    assert on_executor_died(released.s, dead, at(2)) is None
    assert on_executor_died(locked_log().e(ev.Finished(ev.ResultOk(1)), 1).s, dead, at(2)) is None


def test_lock_expired_activity_times_out_then_finishes() -> None:
    retry = ev.RetryConfig(1, 100)
    log = locked_log(retry=retry).e(ev.HistoryEvent(ev.Persist(1, ev.PersistExecutionId())), 1)
    # activities never count "progress"
    out = on_lock_expired(log.s, at(30))
    assert out == ev.TemporarilyTimedOut(at(30) + timedelta(milliseconds=100))
    log.e(out, 30).e(lock(run="Run_2", retry=retry, expires=60), 31)
    out = on_lock_expired(log.s, at(60))
    assert isinstance(out, ev.Finished)
    assert isinstance(out.result, ev.ExecutionFailure)
    assert out.result.kind == "timed_out"
    log.e(out, 60)
    assert log.state == Finished(log.s.next_version - 1, at(60), "execution_failure:timed_out")


# ---------------------------------------------------------------------------
# State shapes
# ---------------------------------------------------------------------------


def test_state_names_and_json() -> None:
    states: list[PendingState] = [
        PendingAt(T0),
        PendingAt(T0, A),
        Locked("Exr_A", "Run_1", T0),
        BlockedByJoinSet("g:1", T0, False, A),
        Paused(PendingAt(T0)),
        Paused(BlockedByJoinSet("g:1", T0, True)),
        Cancelling(Locked("Exr_A", "Run_1", T0)),
        Finished(3, T0, "ok"),
    ]
    for st in states:
        data = msgspec.json.encode(st)
        assert msgspec.json.decode(data, type=PendingState) == st
        assert re.search(rf'"type":"{state_name(st)}"', data.decode())
