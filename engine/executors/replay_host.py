"""The replaying workflow host: answers a run's host calls from its history, or writes them.

One `ReplayHost` per run. It lives on the guest's worker thread; storage calls are
submitted to the engine's event loop and waited for on that thread, so the loop is never
blocked. Matching follows SPEC §7.1: each call is compared with the next unprocessed
history event by its deterministic key; past the end of the history the call is new and
is written (with the `await` strategy, non-blocking events are buffered and written in
one transaction before the next blocking write).

The log side (the run's state, matching, buffered writes, responses, stopping) is the base
class `ReplayLog` (`engine.executors.replay_log`); this module adds the host API.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import random
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from ulid import ULID

from engine.components import Registry
from engine.core import events as ev
from engine.core.ids import JoinSetId, child_id_text, join_set_text
from engine.core.legality import is_cancellable
from engine.core.records import Frame
from engine.core.state import BlockedByJoinSet
from engine.errors import InvalidParams, UnknownFunction
from engine.executors.cancellation import join_sets_in
from engine.executors.replay_log import (
    AbortReason,
    JoinSetState,
    ReplayLog,
    StaleView,
    describe_event,
)
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
    Conflict,
    CreateRequest,
    NotFound,
    StorageError,
)
from engine.wit.codec import WitValueError, validate_json

log = logging.getLogger("obelisk.workflow")


def _ms(dt: datetime) -> int:
    return int((dt - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(milliseconds=1))


def _from_ms(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def result_hash(result: dict[str, Any]) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest()


class ReplayHost(ReplayLog):
    """Implements `engine.runtimes.workflow_host.WorkflowHost` for one locked run."""

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
            js = join_set_text("o", f"{k}-{name}") if kind == "o" else join_set_text("g", str(k))
        else:
            assert name is not None
            js = join_set_text("n", name)
        if js in self.join_sets:
            raise WorkflowCallError(f"join set {js} already exists")
        want = ev.JoinSetCreate(js)
        if self._match(want) is None:
            self._record(want)
        self.join_sets[js] = JoinSetState(js)
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

    def _open(self, join_set_id: str) -> JoinSetState:
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
        # The join set is open: made by `_new_join_set`, a valid id.
        child = child_id_text(self.execution_id, join_set_id, len(js.members) + 1)
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

    def _answer(self, js: JoinSetState, stored: ev.StoredResponse) -> JoinNextAnswer:
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

    def _unprocessed(self, js: JoinSetState) -> int:
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
            except StaleView:
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

    def _cancel_member(self, member: str, js: JoinSetState) -> None:
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
            js = self.join_sets[view.id] = JoinSetState(view.id)
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
                f"with {describe_event(got)}"
            )
        return None


def registry_interfaces(registry: Registry) -> dict[str, dict[str, FunctionShape]]:
    """The deployed functions by interface, as the runtimes see them: computed once per
    registry (every workflow run asks; the result is shared and must not be changed)."""
    key = ("interfaces", len(registry.functions))
    found: dict[str, dict[str, FunctionShape]] | None = registry.derived.get(key)
    if found is None:
        found = registry.derived[key] = _interfaces(registry)
    return found


def _interfaces(registry: Registry) -> dict[str, dict[str, FunctionShape]]:
    out: dict[str, dict[str, FunctionShape]] = {}
    for ffqn, (info, _) in registry.functions.items():
        ifc, _, fn = ffqn.rpartition(".")
        out.setdefault(ifc, {})[fn] = FunctionShape(
            ffqn, tuple(p.name for p in info.params), ev.is_workflow_type(info.component_type)
        )
    return out
