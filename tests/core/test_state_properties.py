"""Property tests of the pending-state machine (SPEC §4–§6, the seeds' diagram).

A small reference model of one execution drives random LEGAL interleavings of events and
responses: at every step it lists the actions the current state allows (a lock by a
random executor at a due time, an extension by the holding or warm run, a release, the
watcher's lock expiry, workflow history: join set create / submit child or delay /
join next / join next try / too many / persist / schedule / stub, responses in any order,
pause / unpause, cancel, finish) and draws one, weighted so that deep workflow states
are reached. After every step it checks that

* the implementation's pending state and counters equal the model's;
* the state has a legal shape: Paused never over Locked, Cancelling never nested,
  Finished only at the end (nothing appended after it);
* `next_version` equals the number of events;
* `replay` of the recorded interleaving gives an equal summary (which survives JSON);

and at every step it also tries an ILLEGAL append, drawn from what the current state
forbids, which must raise `IllegalAppend` and leave the input summary unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec
from hypothesis import event, given, note, settings
from hypothesis import strategies as st

from engine.core import events as ev
from engine.core.state import (
    ACTIVITY_RETRY,
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
    is_done_one_off,
    on_lock_expired,
    replay,
    retry_backoff,
)

T0 = datetime(2026, 1, 15, 10, 0, 0, tzinfo=UTC)
EXEC = "E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC"
ACTIVITY = ev.ComponentId("activity_wasm", "act", "sha256:" + "ab" * 32)
WORKFLOW = ev.ComponentId("workflow_js", "wf", "sha256:" + "cd" * 32)
EXECUTORS = ["Exr_A", "Exr_B", "Exr_C"]
ACTIVITY_RETRIES = [
    ev.RetryConfig(0, 100),
    ev.RetryConfig(2, 100),
    ev.RetryConfig(5, 1000),
    ev.RetryConfig(None, 100),
]
RESULTS: list[ev.ExecutionResult] = [
    ev.ResultOk(1),
    ev.ResultErr("e"),
    ev.ExecutionFailure("cancelled"),
    ev.ExecutionFailure("timed_out"),
    ev.ExecutionFailure("nondeterminism_detected"),
]
EVENT_TYPES = ev.Event.__args__  # type: ignore[attr-defined]
RESPONSE_TYPES = (ev.ChildExecutionFinished, ev.DelayFinished)


@dataclass
class JoinSetModel:
    submitted: int = 0
    received: int = 0
    consumed: int = 0
    #: the responses that can still arrive: one per request that has none yet
    outstanding: list[ev.Response] = field(default_factory=list)


Action = Callable[[st.DataObject], object]


class Model:
    """The expected behaviour, written independently of `engine.core.state`.

    `self.s` is the implementation's summary, advanced in lockstep with the model.
    """

    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        workflow = data.draw(st.integers(0, 3)) > 0  # workflows have more states
        self.component = WORKFLOW if workflow else ACTIVITY
        self.retry_config = (
            WORKFLOW_RETRY if workflow else data.draw(st.sampled_from(ACTIVITY_RETRIES))
        )
        self.now = T0
        scheduled = T0 + timedelta(seconds=data.draw(st.integers(-5, 20), label="scheduled"))
        created = ev.Created("myapp:demo/ifc.fn", [], scheduled, self.component, "Dep_1")
        self.s: ExecutionSummary = created_summary(created, self.now)
        self.items: list[tuple[datetime, ev.Event | ev.Response]] = [(self.now, created)]
        self.events = 1
        # the model
        self.u: PendingAt | Locked | BlockedByJoinSet | Finished = PendingAt(scheduled)
        self.paused = False
        self.cancelling = False
        self.last_lock: LockRef | None = None
        self.retry: ev.RetryConfig | None = None
        self.temporary = 0
        self.progressed = False
        self.join_sets: dict[str, JoinSetModel] = {}
        self.created_join_sets = 0
        self.runs = 0

    # -- helpers -----------------------------------------------------------

    @property
    def workflow(self) -> bool:
        return self.component is WORKFLOW

    @property
    def finished(self) -> bool:
        return isinstance(self.u, Finished)

    @property
    def may_lock(self) -> bool:
        return not (self.finished or self.paused or self.cancelling)

    @property
    def may_write_history(self) -> bool:
        return (
            self.workflow and not self.finished and (isinstance(self.u, Locked) or self.cancelling)
        )

    def draw_seconds(self, hi: int = 20) -> timedelta:
        return timedelta(seconds=self.data.draw(st.integers(0, hi)))

    def fresh_run(self) -> str:
        self.runs += 1
        return f"Run_{self.runs}"

    def lock_event(self, exr: str, run: str, expires: datetime) -> ev.Locked:
        return ev.Locked(self.component, exr, run, expires, self.retry_config)

    def append(self, e: ev.Event) -> None:
        note(f"{self.now:%H:%M:%S} event {e!r}")
        self.s = apply_event(self.s, e, self.now)
        self.items.append((self.now, e))
        self.events += 1

    def expected_state(self) -> PendingState:
        u = self.u
        if isinstance(u, Finished):
            return u
        if self.cancelling:
            return Cancelling(u)
        if self.paused:
            return Paused(u)  # type: ignore[arg-type]  # never Locked: checked below
        return u

    # -- the legal actions -------------------------------------------------

    def legal_actions(self) -> list[tuple[int, Action]]:
        """(weight, action) of everything the current state allows."""
        u = self.u
        acts: list[tuple[int, Action]] = []
        if self.may_lock and isinstance(u, PendingAt):
            acts.append((6, self.lock_new))
        if self.may_lock and (
            isinstance(u, Locked) or (isinstance(u, PendingAt) and u.last_lock is not None)
        ):
            acts.append((3, self.extend))
        if isinstance(u, Locked):
            acts += [(2, self.release), (2, self.lock_expires)]
        if self.waiting_run is not None:
            acts.append((1, self.release_waiting_run))
        if self.may_write_history:
            acts += [(2, self.create_join_set), (2, self.other_history), (5, self.direct_call)]
            if self.join_sets:
                acts += [(3, self.submit), (2, self.join_next_try)]
            if any(m.consumed < m.submitted for m in self.join_sets.values()):
                acts.append((3, self.join_next))
            if any(m.consumed == m.submitted for m in self.join_sets.values()):
                acts.append((1, self.join_next_too_many))
        if any(m.outstanding for m in self.join_sets.values()):
            acts.append((6, self.respond))
        if not (self.finished or self.paused or self.cancelling or isinstance(u, Locked)):
            acts.append((2 if isinstance(u, BlockedByJoinSet) else 1, self.pause))
        if self.workflow and not self.cancelling and not self.paused and isinstance(u, Locked):
            acts.append((1, self.pause_locked_workflow))
        if self.paused:
            acts.append((2, self.unpause))
        if not (self.finished or self.cancelling):
            acts.append((1, self.cancel))
        if not self.finished:
            acts += [(1, self.finish), (1, self.upgrade)]
        return acts

    def lock_new(self, data: st.DataObject) -> None:
        assert isinstance(self.u, PendingAt)
        self.now = max(self.now, self.u.scheduled_at) + self.draw_seconds(5)
        exr = data.draw(st.sampled_from(EXECUTORS))
        run = self.fresh_run()
        expires = self.now + timedelta(seconds=data.draw(st.integers(1, 60)))
        self.append(self.lock_event(exr, run, expires))
        self.u = Locked(exr, run, expires)
        self.last_lock = LockRef(exr, run)
        self.retry = self.retry_config
        self.progressed = False

    def extend(self, data: st.DataObject) -> None:
        lk = self.last_lock
        assert lk is not None
        if isinstance(self.u, PendingAt):
            assert self.u.last_lock == lk
            event("extension by the warm run from PendingAt")
        self.now += self.draw_seconds(5)
        expires = self.now + timedelta(seconds=data.draw(st.integers(1, 60)))
        self.append(self.lock_event(lk.executor_id, lk.run_id, expires))
        self.u = Locked(lk.executor_id, lk.run_id, expires)  # the run's progress is kept

    def release(self, data: st.DataObject) -> None:
        self.now += self.draw_seconds(5)
        at = self.now + self.draw_seconds()
        kind = data.draw(st.sampled_from(["unlocked", "failed", "timed_out"]))
        e: ev.Event
        if kind == "unlocked":
            e = ev.Unlocked(at, "executor closing")
        elif kind == "failed":
            e = ev.TemporarilyFailed(at, "trap", "")
            self.temporary += 1
        else:
            e = ev.TemporarilyTimedOut(at)
            self.temporary += 1
        self.append(e)
        self.u = PendingAt(at)  # the run ended: no warm run may extend

    @property
    def waiting_run(self) -> LockRef | None:
        """A run blocked in memory, or unblocked by a response and not back yet."""
        u = self.u
        if isinstance(u, BlockedByJoinSet):
            return u.blocked_run
        if isinstance(u, PendingAt):
            return u.last_lock
        return None

    def release_waiting_run(self, data: st.DataObject) -> None:
        """The waiting run lets go (executor closing) or its process died."""
        self.now += self.draw_seconds(5)
        at = self.now + self.draw_seconds()
        self.append(ev.Unlocked(at, "executor died"))
        u = self.u
        if isinstance(u, BlockedByJoinSet):
            self.u = BlockedByJoinSet(u.join_set_id, min(u.lock_expires_at, at), u.closing)
        else:
            assert isinstance(u, PendingAt)
            self.u = PendingAt(min(u.scheduled_at, at))

    def lock_expires(self, data: st.DataObject) -> None:
        """The timers watcher (SPEC §6.3)."""
        assert isinstance(self.u, Locked)
        self.now = max(self.now, self.u.lock_expires_at) + self.draw_seconds(5)
        e = on_lock_expired(self.s, self.now)
        if self.workflow and self.progressed:
            assert e == ev.Unlocked(self.now, "made progress")
            self.append(e)
            self.u = PendingAt(self.now)
            return
        retry = self.retry or (WORKFLOW_RETRY if self.workflow else ACTIVITY_RETRY)
        count = self.temporary + 1
        if retry.max_retries is not None and count > retry.max_retries:
            assert e == ev.Finished(ev.ExecutionFailure("timed_out", "lock expired"))
            self.do_finish(e)
            return
        when = self.now + timedelta(milliseconds=retry.retry_exp_backoff_ms * 2 ** (count - 1))
        assert retry_backoff(count, retry, self.now) == when
        assert e == ev.TemporarilyTimedOut(when)
        self.append(e)
        self.u = PendingAt(when)
        self.temporary += 1

    # workflow history

    def history(self, h: ev.HistoryEventKind) -> None:
        self.append(ev.HistoryEvent(h))
        self.progressed = True

    def create_join_set(self, data: st.DataObject) -> str:
        kind = data.draw(st.sampled_from(["g", "n", "o"]))
        self.created_join_sets += 1
        js = f"{kind}:{self.created_join_sets}" + ("-step" if kind == "o" else "")
        self.history(ev.JoinSetCreate(js))
        self.join_sets[js] = JoinSetModel()
        return js

    def pick_join_set(self, data: st.DataObject, pred: Callable[[JoinSetModel], bool]) -> str:
        return data.draw(st.sampled_from(sorted(k for k, m in self.join_sets.items() if pred(m))))

    def submit(self, data: st.DataObject, js: str | None = None) -> None:
        js = js or self.pick_join_set(data, lambda m: True)
        m = self.join_sets[js]
        n = m.submitted + 1
        request: ev.JoinSetRequestKind
        response: ev.Response
        if data.draw(st.booleans()):
            delay_id = f"Delay_{EXEC[2:]}.{js}_{n}"
            request = ev.DelayRequest(delay_id, self.now, ev.ScheduleAtIn(5000))
            response = ev.DelayFinished(
                delay_id, js, data.draw(st.sampled_from(["ok", "cancelled"]))
            )
        else:
            child = f"{EXEC}.{js}_{n}"
            request = ev.ChildExecutionRequest(child, "myapp:demo/ifc.child", [n])
            response = ev.ChildExecutionFinished(child, js, 3, data.draw(st.sampled_from(RESULTS)))
        self.history(ev.JoinSetRequest(js, request))
        m.submitted += 1
        m.outstanding.append(response)

    def join_next(self, data: st.DataObject, js: str | None = None) -> None:
        js = js or self.pick_join_set(data, lambda m: m.consumed < m.submitted)
        m = self.join_sets[js]
        run_expires = self.now + self.draw_seconds(30)
        closing = data.draw(st.booleans())
        self.history(ev.JoinNext(js, run_expires, None, closing))
        m.consumed += 1
        if m.received < m.consumed:
            self.u = BlockedByJoinSet(js, run_expires, closing, self.last_lock)

    def direct_call(self, data: st.DataObject) -> None:
        """A direct call or sleep: join set create, submit, join next in one go."""
        js = self.create_join_set(data)
        self.submit(data, js)
        self.join_next(data, js)

    def join_next_try(self, data: st.DataObject) -> None:
        js = self.pick_join_set(data, lambda m: True)
        m = self.join_sets[js]
        outcome: ev.JoinNextTryOutcome
        if m.received > m.consumed:
            outcome = "found"
            m.consumed += 1
        elif m.consumed < m.submitted:
            outcome = "pending"
        else:
            outcome = "all_processed"
        self.history(ev.JoinNextTry(js, outcome))

    def join_next_too_many(self, data: st.DataObject) -> None:
        js = self.pick_join_set(data, lambda m: m.consumed == m.submitted)
        self.history(ev.JoinNextTooMany(js, "myapp:demo/ifc.child"))

    def other_history(self, data: st.DataObject) -> None:
        value = data.draw(st.integers(0, 9))
        choices: list[ev.HistoryEventKind] = [
            ev.Persist(value, ev.PersistRandomU64(0, 9)),
            ev.Schedule(f"E_0{value:025d}", ev.ScheduleAtNow(), "a:b/c.d"),
            ev.Stub(f"{EXEC}.g:1_{value + 1}", "sha256:00", "written"),
        ]
        self.history(data.draw(st.sampled_from(choices)))

    # responses

    def respond(self, data: st.DataObject) -> None:
        js = self.pick_join_set(data, lambda m: bool(m.outstanding))
        m = self.join_sets[js]
        response = m.outstanding.pop(data.draw(st.integers(0, len(m.outstanding) - 1)))
        self.now += self.draw_seconds()
        note(f"{self.now:%H:%M:%S} response {response!r}")
        self.s = apply_response(self.s, response, self.now)
        self.items.append((self.now, response))
        if self.finished:
            return  # kept, but changes nothing
        m.received += 1
        u = self.u
        if isinstance(u, BlockedByJoinSet) and u.join_set_id == js and m.received >= m.consumed:
            self.u = PendingAt(max(u.lock_expires_at, self.now), u.blocked_run)

    # pause, cancel, finish

    def pause(self, data: st.DataObject) -> None:
        self.now += self.draw_seconds()
        self.append(ev.Paused())
        self.paused = True

    def pause_locked_workflow(self, data: st.DataObject) -> None:
        """SPEC §4.3: a locked workflow is released first, then paused."""
        self.now += self.draw_seconds(5)
        self.append(ev.Unlocked(self.now, "paused"))
        self.append(ev.Paused())
        self.u = PendingAt(self.now)
        self.paused = True

    def unpause(self, data: st.DataObject) -> None:
        self.now += self.draw_seconds()
        self.append(ev.Unpaused())
        self.paused = False

    def cancel(self, data: st.DataObject) -> None:
        self.now += self.draw_seconds()
        self.append(ev.CancellationRequested())
        self.cancelling = True
        self.paused = False  # cancel supersedes pause

    def upgrade(self, data: st.DataObject) -> None:
        outcomes: list[ev.UpgradeSuccess | ev.UpgradeFailed] = [
            ev.UpgradeSuccess(),
            ev.UpgradeFailed("nondet"),
        ]
        outcome = data.draw(st.sampled_from(outcomes))
        self.append(ev.ComponentUpgradeFinished("sha256:" + "ef" * 32, "Dep_2", outcome))

    def finish(self, data: st.DataObject) -> None:
        self.now += self.draw_seconds(5)
        self.do_finish(ev.Finished(data.draw(st.sampled_from(RESULTS))))

    def do_finish(self, e: ev.Finished) -> None:
        version = self.events
        self.append(e)
        self.u = Finished(version, self.now, ev.result_kind(e.result))
        self.paused = False
        self.cancelling = False

    # -- illegal appends ---------------------------------------------------

    def illegal_candidates(self) -> list[ev.Event | ev.Response]:
        now = self.now
        later = now + timedelta(seconds=30)
        fresh = self.lock_event("Exr_Z", "Run_new", later)
        c: list[ev.Event | ev.Response] = [
            ev.Created("myapp:demo/ifc.fn", [], now, self.component, "Dep_1"),
            self.lock_event("Exr_Z", "Run_new", now),  # a lock must expire in the future
        ]
        if self.last_lock:
            c.append(self.lock_event(self.last_lock.executor_id, self.last_lock.run_id, now))
        if self.finished:
            return [
                *c,
                fresh,
                ev.Unlocked(now, "x"),
                ev.TemporarilyFailed(now, "x"),
                ev.TemporarilyTimedOut(now),
                ev.Finished(ev.ResultOk(0)),
                ev.HistoryEvent(ev.Persist(0, ev.PersistExecutionId())),
                ev.HistoryEvent(ev.JoinSetCreate("g:999")),
                ev.Paused(),
                ev.Unpaused(),
                ev.CancellationRequested(),
                ev.ComponentUpgradeFinished("sha256:00", "Dep_2", ev.UpgradeSuccess()),
            ]
        u = self.u
        if self.paused or self.cancelling:
            c.append(fresh)  # no lock at all, not even by the last run
            if self.last_lock:
                c.append(self.lock_event(self.last_lock.executor_id, self.last_lock.run_id, later))
        if isinstance(u, Locked):
            c += [
                fresh,
                self.lock_event(u.executor_id, "Run_other", later),
                self.lock_event("Exr_Z", u.run_id, later),
                ev.Paused(),
            ]
        else:
            c += [ev.TemporarilyFailed(now, "x"), ev.TemporarilyTimedOut(now)]
            if self.waiting_run is None:  # only a run can let go
                c.append(ev.Unlocked(now, "x"))
        if isinstance(u, BlockedByJoinSet):
            c.append(fresh)
            if u.blocked_run:
                c.append(self.lock_event(u.blocked_run.executor_id, u.blocked_run.run_id, later))
        if isinstance(u, PendingAt) and u.scheduled_at > now:
            c.append(fresh)  # not due, and not the warm run
        if (
            isinstance(u, PendingAt)
            and u.last_lock is None
            and self.last_lock
            and u.scheduled_at > now
        ):
            # an ended run is not warm: it takes a new lock, which needs a due PendingAt
            c.append(self.lock_event(self.last_lock.executor_id, self.last_lock.run_id, later))
        if not (isinstance(u, Locked) or self.cancelling):
            c += [
                ev.HistoryEvent(ev.Persist(0, ev.PersistExecutionId())),
                ev.HistoryEvent(ev.JoinSetCreate("g:999")),
            ]
        else:
            request = ev.ChildExecutionRequest(f"{EXEC}.g:999_1", "a:b/c.d", [])
            c += [
                ev.HistoryEvent(ev.JoinSetRequest("g:999", request)),
                ev.HistoryEvent(ev.JoinNext("g:999", now)),
                ev.HistoryEvent(ev.JoinNextTry("g:999", "all_processed")),
                ev.HistoryEvent(ev.JoinNextTooMany("g:999")),
            ]
            for js, m in self.join_sets.items():
                c.append(ev.HistoryEvent(ev.JoinSetCreate(js)))
                if m.consumed == m.submitted:
                    c.append(ev.HistoryEvent(ev.JoinNext(js, now)))
                else:
                    c.append(ev.HistoryEvent(ev.JoinNextTooMany(js)))
                if m.received > m.consumed:
                    right = "found"
                elif m.consumed < m.submitted:
                    right = "pending"
                else:
                    right = "all_processed"
                for outcome in ("found", "pending", "all_processed"):
                    if outcome != right:
                        c.append(ev.HistoryEvent(ev.JoinNextTry(js, outcome)))  # type: ignore[arg-type]
        c.append(ev.Paused() if self.paused or self.cancelling else ev.Unpaused())
        if self.cancelling:
            c.append(ev.CancellationRequested())
        # responses: to an unknown join set, or more responses than requests
        c.append(ev.DelayFinished(f"Delay_{EXEC[2:]}.g:999_1", "g:999"))
        for js, m in self.join_sets.items():
            if not m.outstanding:
                c.append(ev.ChildExecutionFinished(f"{EXEC}.{js}_99", js, 1, ev.ResultOk(0)))
        return c

    def try_illegal(self, data: st.DataObject) -> None:
        candidates = self.illegal_candidates()
        item = candidates[data.draw(st.integers(0, len(candidates) - 1))]
        event(f"illegal {type(getattr(item, 'event', item)).__name__}")
        before = msgspec.json.encode(self.s)
        try:
            if isinstance(item, RESPONSE_TYPES):
                apply_response(self.s, item, self.now)
            else:
                apply_event(self.s, item, self.now)
        except IllegalAppend:
            pass
        else:
            raise AssertionError(f"accepted an illegal {item!r} in {self.s.state!r}")
        assert msgspec.json.encode(self.s) == before, "IllegalAppend mutated its input"

    # -- invariants --------------------------------------------------------

    def check(self) -> None:
        s = self.s
        state = s.state
        # agrees with the model
        assert state == self.expected_state()
        assert s.temporary_event_count == self.temporary
        assert s.last_lock == self.last_lock
        if not self.finished:
            assert s.retry_config == self.retry
            assert s.progressed_since_lock == self.progressed
            got = {js: (c.submitted, c.received, c.consumed) for js, c in s.join_sets.items()}
            # done one-off join sets: known by their k only
            got.update((js, (1, 1, 1)) for js in self.join_sets if is_done_one_off(s, js))
            want = {js: (m.submitted, m.received, m.consumed) for js, m in self.join_sets.items()}
            assert got == want
            done = [js for js, m in want.items() if js.startswith("o:") and m == (1, 1, 1)]
            assert len(s.done_one_off_ks) <= 2 * len(done) and not s.done_one_off
            assert s.join_set_count == self.created_join_sets
        # legal shape
        if isinstance(state, Paused):
            assert isinstance(state.underlying, PendingAt | BlockedByJoinSet)
        elif isinstance(state, Cancelling):
            assert isinstance(state.underlying, PendingAt | Locked | BlockedByJoinSet)
        else:
            assert isinstance(state, PendingAt | Locked | BlockedByJoinSet | Finished)
        assert not (s.paused and s.cancelling)
        # Finished only at the end: the last event, nothing appended after it
        finished = [i for i, (_, x) in enumerate(self.items) if isinstance(x, ev.Finished)]
        if isinstance(state, Finished):
            assert len(finished) == 1
            after = self.items[finished[0] + 1 :]
            assert all(isinstance(x, RESPONSE_TYPES) for _, x in after)
            assert state.version == self.events - 1
            assert s.result == self.items[finished[0]][1].result  # type: ignore[union-attr]
        else:
            assert not finished
        # versions and replay
        assert s.next_version == self.events
        assert sum(isinstance(x, EVENT_TYPES) for _, x in self.items) == self.events
        assert s.responses == sum(isinstance(x, RESPONSE_TYPES) for _, x in self.items)
        assert replay(self.items) == s
        assert msgspec.json.decode(msgspec.json.encode(s), type=ExecutionSummary) == s


def _name(state: PendingState) -> str:
    inner = getattr(state, "underlying", None)
    return type(state).__name__ + (f"({type(inner).__name__})" if inner else "")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_legal_interleavings_and_illegal_appends(data: st.DataObject) -> None:
    model = Model(data)
    model.check()
    steps = data.draw(st.integers(10, 40))
    for _ in range(steps):
        model.try_illegal(data)
        actions = model.legal_actions()
        if not actions:
            break
        # weight-1 actions (cancel, finish, upgrade, …) stay rare: the others count 3x
        weighted = [a for w, a in actions for _ in range(w if w == 1 else 3 * w)]
        action = weighted[data.draw(st.integers(0, len(weighted) - 1))]
        action(data)
        model.check()
        event(f"reached {_name(model.s.state)}")
    model.try_illegal(data)
    event(f"log of {min(model.events // 10 * 10, 50)}+ events")
