"""The storage contract (SPEC §3, §4, §8, §10): tests every backend must pass unchanged.

Parametrised by the `storage` fixture (tests/storage/conftest.py). Time is always passed
explicitly (`at(seconds)`); waiting is done on futures and tasks, never by sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace as dataclass_replace
from datetime import timedelta

import pytest

from engine.core import events as ev
from engine.core.ids import new_run_id
from engine.core.records import LogLine
from engine.core.state import (
    BlockedByJoinSet,
    Cancelling,
    ExecutionSummary,
    Finished,
    Locked,
    LockRef,
    Paused,
    PendingAt,
    replay,
)
from engine.storage.contract import (
    AppendExtras,
    Conflict,
    CreateRequest,
    ExpiredDelay,
    ListFilter,
    LockedExecution,
    NotCancellable,
    NotFound,
    Storage,
    StorageError,
    VersionConflict,
)

from .conftest import (
    ACTIVITY_FFQN,
    CANCELLABLE_WORKFLOW_FFQN,
    OTHER_FFQN,
    RETRY,
    WORKFLOW,
    WORKFLOW_FFQN,
    Executor,
    at,
    child_id,
    create_request,
    delay_id,
    new_id,
)

OK42 = ev.ResultOk(42)
CANCELLED_KIND = "execution_failure:cancelled"


def kinds(events: list[ev.StoredEvent]) -> list[str]:
    """The event types of a log, history events as `history_event:<type>`."""
    out = []
    for stored in events:
        tag = stored.event.__struct_config__.tag
        if isinstance(stored.event, ev.HistoryEvent):
            tag = f"{tag}:{stored.event.event.__struct_config__.tag}"
        out.append(str(tag))
    return out


async def create(storage: Storage, ffqn: str = ACTIVITY_FFQN, now: float = 0, **kw: object) -> str:
    request = create_request(None, ffqn, **kw)  # type: ignore[arg-type]
    await storage.create(request, at(now))
    return request.execution_id


async def lock(
    storage: Storage, execution_id: str, now: float, executor: Executor | None = None, **kw: object
) -> LockedExecution:
    """Lock exactly `execution_id` (it must be the only due one of its FFQN)."""
    ffqn = (await storage.get_summary(execution_id)).ffqn
    executor = executor or Executor([ffqn])
    locked = await storage.lock_pending(**executor.lock_args(at(now), **kw))
    assert [le.execution_id for le in locked] == [execution_id]
    return locked[0]


async def finish(
    storage: Storage, execution_id: str, now: float, result: ev.ExecutionResult = OK42
) -> None:
    le = await lock(storage, execution_id, now)
    await storage.append(le.execution_id, le.next_version, [ev.Finished(result)], at(now))


class BlockedParent:
    """A workflow that submitted children into join set `g:1` and awaits the first one.

    Built by hand: created → locked → join_set_create → join_set_request × n (children
    created in the same append) → join_next, blocked.
    """

    JOIN_SET = "g:1"

    def __init__(self, parent: str, children: list[str], locked: LockedExecution, exr: str):
        self.parent = parent
        self.children = children
        self.locked = locked
        self.executor_id = exr

    @classmethod
    async def build(
        cls, storage: Storage, *, t: float = 0, n_children: int = 1, ffqn: str = WORKFLOW_FFQN
    ) -> BlockedParent:
        parent = await create(storage, ffqn, now=t, scheduled_at=at(t))
        wf = Executor([ffqn], WORKFLOW)
        locked = await lock(storage, parent, t + 1, wf)
        js = cls.JOIN_SET
        children = [child_id(parent, js, n) for n in range(1, n_children + 1)]
        history: list[ev.Event] = [ev.HistoryEvent(ev.JoinSetCreate(js))]
        history += [
            ev.HistoryEvent(ev.JoinSetRequest(js, ev.ChildExecutionRequest(c, ACTIVITY_FFQN, [n])))
            for n, c in enumerate(children)
        ]
        history.append(ev.HistoryEvent(ev.JoinNext(js, run_expires_at=locked.lock_expires_at)))
        creates = [
            create_request(
                c, ACTIVITY_FFQN, params=[n], parent=(parent, js), scheduled_at=at(t + 2)
            )
            for n, c in enumerate(children)
        ]
        s = await storage.append(
            parent, locked.next_version, history, at(t + 2), AppendExtras(creates=creates)
        )
        assert s.state == BlockedByJoinSet(
            js, locked.lock_expires_at, False, LockRef(wf.executor_id, locked.run_id)
        )
        return cls(parent, children, locked, wf.executor_id)

    @property
    def locked_ref(self) -> LockRef:
        return LockRef(self.executor_id, self.locked.run_id)


# ---------------------------------------------------------------------------------------
# create
# ---------------------------------------------------------------------------------------


async def test_create_then_read_back(storage: Storage) -> None:
    request = create_request(params=[1, "two", {"three": None}], scheduled_at=at(5))
    await storage.create(request, at(1))
    eid = request.execution_id

    assert await storage.get_created(eid) == request.created
    [stored] = await storage.get_events(eid)
    assert stored == ev.StoredEvent(0, at(1), request.created)
    s = await storage.get_summary(eid)
    assert s.next_version == 1
    assert s.ffqn == ACTIVITY_FFQN
    assert s.state == PendingAt(at(5))
    row = await storage.get_row(eid)
    assert (row.execution_id, row.ffqn, row.component_type) == (eid, ACTIVITY_FFQN, "activity_wasm")
    assert row.state == PendingAt(at(5))
    assert row.created_at == at(1)
    assert row.scheduled_at == at(5)
    assert row.parent_id is None
    assert row.result is None
    assert row.next_version == 1


async def test_create_is_idempotent_for_same_id_and_params(storage: Storage) -> None:
    request = create_request(params=[1, 2])
    await storage.create(request, at(0))
    await storage.create(request, at(1))
    assert len(await storage.get_events(request.execution_id)) == 1


async def test_create_same_id_other_params_conflicts(storage: Storage) -> None:
    request = create_request(params=[1, 2])
    await storage.create(request, at(0))
    with pytest.raises(Conflict, match=request.execution_id):
        await storage.create(create_request(request.execution_id, params=[3]), at(1))
    with pytest.raises(Conflict):
        await storage.create(create_request(request.execution_id, OTHER_FFQN, params=[1, 2]), at(1))
    assert (await storage.get_created(request.execution_id)).params == [1, 2]


async def test_unknown_execution_is_not_found(storage: Storage) -> None:
    eid = new_id()
    for read in (
        storage.get_summary(eid),
        storage.get_created(eid),
        storage.get_row(eid),
        storage.get_events(eid),
    ):
        with pytest.raises(NotFound, match=eid):
            await read


# ---------------------------------------------------------------------------------------
# lock_pending
# ---------------------------------------------------------------------------------------


async def test_lock_pending_only_due_executions(storage: Storage) -> None:
    eid = await create(storage, scheduled_at=at(10))
    exr = Executor([ACTIVITY_FFQN])
    assert await storage.lock_pending(**exr.lock_args(at(9))) == []
    [le] = await storage.lock_pending(**exr.lock_args(at(10)))
    assert le.execution_id == eid


async def test_lock_pending_only_listed_ffqns(storage: Storage) -> None:
    a = await create(storage, ACTIVITY_FFQN)
    b = await create(storage, OTHER_FFQN)
    await create(storage, WORKFLOW_FFQN)
    assert await storage.lock_pending(**Executor(["testing:act/ifc.nope"]).lock_args(at(1))) == []
    [le] = await storage.lock_pending(**Executor([OTHER_FFQN]).lock_args(at(1)))
    assert le.execution_id == b
    locked = await storage.lock_pending(**Executor([ACTIVITY_FFQN, OTHER_FFQN]).lock_args(at(1)))
    assert [le.execution_id for le in locked] == [a]


async def test_lock_pending_oldest_first_and_batch_size(storage: Storage) -> None:
    ids = {}
    for name, scheduled in [("c", 3), ("a", 1), ("d", 4), ("b", 2)]:
        ids[name] = await create(storage, scheduled_at=at(scheduled))
    exr = Executor([ACTIVITY_FFQN])
    first = await storage.lock_pending(**exr.lock_args(at(10), batch_size=3))
    assert [le.execution_id for le in first] == [ids["a"], ids["b"], ids["c"]]
    second = await storage.lock_pending(**exr.lock_args(at(10), batch_size=3))
    assert [le.execution_id for le in second] == [ids["d"]]
    assert await storage.lock_pending(**exr.lock_args(at(10))) == []


async def test_lock_pending_returns_what_the_executor_needs(storage: Storage) -> None:
    eid = await create(storage, params=[{"x": 1}, [2]])
    exr = Executor([ACTIVITY_FFQN])
    args = exr.lock_args(at(1), expiry=30)
    [le] = await storage.lock_pending(**args)
    assert le.execution_id == eid
    assert le.ffqn == ACTIVITY_FFQN
    assert le.params == [{"x": 1}, [2]]
    assert le.next_version == 2
    assert le.run_id == args["run_id"]
    assert le.lock_expires_at == at(31)
    assert le.parent is None
    assert le.summary.state == Locked(exr.executor_id, args["run_id"], at(31))
    assert le.events is None and le.responses is None

    [created, locked] = await storage.get_events(eid)
    assert locked == ev.StoredEvent(
        1,
        at(1),
        ev.Locked(exr.component, exr.executor_id, args["run_id"], at(31), RETRY),
    )
    assert created.version == 0
    assert (await storage.get_summary(eid)).state == le.summary.state


async def test_lock_pending_with_log(storage: Storage) -> None:
    eid = await create(storage, params=[5])
    [le] = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1), with_log=True))
    assert le.events is not None and le.responses is not None
    assert [e.version for e in le.events] == [0, 1]
    assert kinds(le.events) == ["created", "locked"]
    assert le.events == await storage.get_events(eid)
    assert le.responses == []


async def test_locked_execution_is_not_locked_again(storage: Storage) -> None:
    await create(storage)
    await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    assert await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(2))) == []


async def test_concurrent_lock_pending_never_locks_twice(storage: Storage) -> None:
    ids = {await create(storage, scheduled_at=at(i)) for i in range(12)}
    executors = [Executor([ACTIVITY_FFQN]) for _ in range(4)]
    batches = await asyncio.gather(
        *(storage.lock_pending(**e.lock_args(at(20), batch_size=5)) for e in executors)
    )
    locked = [le.execution_id for batch in batches for le in batch]
    assert len(locked) == len(set(locked)) == 12
    assert set(locked) == ids


async def test_paused_and_cancelling_are_not_locked(storage: Storage) -> None:
    paused = await create(storage, ACTIVITY_FFQN)
    await storage.pause(paused, at(1))
    cancelling = await create(storage, CANCELLABLE_WORKFLOW_FFQN)
    s = await storage.request_cancellation(cancelling, at(1))
    assert isinstance(s.state, Cancelling)
    for ffqn in (ACTIVITY_FFQN, CANCELLABLE_WORKFLOW_FFQN):
        assert await storage.lock_pending(**Executor([ffqn]).lock_args(at(5))) == []


async def test_unlocked_execution_is_locked_again_after_backoff(storage: Storage) -> None:
    eid = await create(storage)
    le = await lock(storage, eid, 1)
    s = await storage.append(
        eid, le.next_version, [ev.TemporarilyFailed(at(5), "trap", "detail")], at(2)
    )
    assert s.state == PendingAt(at(5))
    assert s.temporary_event_count == 1
    assert await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(4))) == []
    le2 = await lock(storage, eid, 5)
    assert le2.next_version == 4


# ---------------------------------------------------------------------------------------
# append
# ---------------------------------------------------------------------------------------


async def test_append_returns_summary_and_writes_events(storage: Storage) -> None:
    eid = await create(storage)
    le = await lock(storage, eid, 1)
    s = await storage.append(eid, le.next_version, [ev.Finished(OK42)], at(3))
    assert s.state == Finished(2, at(3), "ok")
    assert s.result == OK42
    assert s.next_version == 3
    events = await storage.get_events(eid)
    assert events[-1] == ev.StoredEvent(2, at(3), ev.Finished(OK42))
    assert await storage.get_summary(eid) == s
    row = await storage.get_row(eid)
    assert row.result == OK42
    assert row.state == s.state
    assert row.updated_at == at(3)


async def test_append_with_wrong_version_is_a_version_conflict(storage: Storage) -> None:
    eid = await create(storage)
    le = await lock(storage, eid, 1)
    for wrong in (le.next_version - 1, le.next_version + 1, 0):
        with pytest.raises(VersionConflict):
            await storage.append(eid, wrong, [ev.Finished(OK42)], at(2))
    assert len(await storage.get_events(eid)) == 2


async def test_concurrent_appends_at_one_version_only_one_wins(storage: Storage) -> None:
    eid = await create(storage)
    le = await lock(storage, eid, 1)
    results = await asyncio.gather(
        *(
            storage.append(eid, le.next_version, [ev.Finished(ev.ResultOk(i))], at(2))
            for i in range(5)
        ),
        return_exceptions=True,
    )
    ok = [r for r in results if not isinstance(r, BaseException)]
    assert len(ok) == 1
    assert all(isinstance(r, VersionConflict) for r in results if isinstance(r, BaseException))
    assert kinds(await storage.get_events(eid)) == ["created", "locked", "finished"]


async def test_append_from_thread_writes_and_refuses_like_append(storage: Storage) -> None:
    p = await BlockedParent.build(storage)
    [child] = p.children
    le = await lock(storage, child, 3)
    with pytest.raises(VersionConflict):
        await asyncio.to_thread(
            storage.append_from_thread, child, le.next_version + 1, [ev.Finished(OK42)], at(4)
        )
    s = await asyncio.to_thread(
        storage.append_from_thread, child, le.next_version, [ev.Finished(OK42)], at(4)
    )
    assert s == await storage.get_summary(child)
    assert s.result == OK42
    # The parent's response came with it, as with `append`.
    [response] = await storage.get_responses(p.parent)
    assert response.response == ev.ChildExecutionFinished(child, p.JOIN_SET, 2, OK42)
    with pytest.raises(Conflict):  # nothing after finished
        await asyncio.to_thread(
            storage.append_from_thread, child, s.next_version, [ev.Finished(OK42)], at(5)
        )


async def test_append_illegal_transition_conflicts(storage: Storage) -> None:
    eid = await create(storage)
    # Unlocked needs a locked execution.
    with pytest.raises(Conflict) as info:
        await storage.append(eid, 1, [ev.Unlocked(at(1), "nope")], at(1))
    assert not isinstance(info.value, VersionConflict)
    le = await lock(storage, eid, 1)
    # Another executor cannot take over a running lock.
    other = Executor([ACTIVITY_FFQN])
    stolen = ev.Locked(other.component, other.executor_id, le.run_id, at(20), RETRY)
    with pytest.raises(Conflict):
        await storage.append(eid, le.next_version, [stolen], at(2))
    await storage.append(eid, le.next_version, [ev.Finished(OK42)], at(2))
    # Nothing after finished.
    with pytest.raises(Conflict):
        await storage.append(eid, le.next_version + 1, [ev.Finished(OK42)], at(3))
    assert kinds(await storage.get_events(eid)) == ["created", "locked", "finished"]


async def test_lock_extension_by_the_same_run(storage: Storage) -> None:
    eid = await create(storage)
    exr = Executor([ACTIVITY_FFQN])
    le = await lock(storage, eid, 1, exr)
    extension = ev.Locked(exr.component, exr.executor_id, le.run_id, at(40), RETRY)
    s = await storage.append(eid, le.next_version, [extension], at(5))
    assert s.state == Locked(exr.executor_id, le.run_id, at(40))


async def test_append_unknown_execution_is_not_found(storage: Storage) -> None:
    eid = new_id()
    with pytest.raises(NotFound, match=eid):
        await storage.append(eid, 1, [ev.Finished(OK42)], at(1))


async def test_append_is_atomic_when_a_later_event_is_rejected(storage: Storage) -> None:
    eid = await create(storage)
    le = await lock(storage, eid, 1)
    before = await storage.get_summary(eid)
    with pytest.raises(Conflict):
        # The first unlock is legal, the second is not: neither is written.
        await storage.append(
            eid, le.next_version, [ev.Unlocked(at(2), "a"), ev.Unlocked(at(2), "b")], at(2)
        )
    assert kinds(await storage.get_events(eid)) == ["created", "locked"]
    assert await storage.get_summary(eid) == before
    assert (await storage.get_row(eid)).next_version == le.next_version


async def test_append_is_atomic_with_its_side_writes(storage: Storage) -> None:
    """A rejected append creates no child, no timer and no log line."""
    parent = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    child = child_id(parent, "g:1")
    delay = delay_id(parent, "o:2-sleep")
    history = [
        ev.HistoryEvent(ev.JoinSetCreate("g:1")),
        ev.HistoryEvent(
            ev.JoinSetRequest("g:1", ev.ChildExecutionRequest(child, ACTIVITY_FFQN, []))
        ),
        ev.HistoryEvent(ev.JoinSetCreate("o:2-sleep")),
        ev.HistoryEvent(
            ev.JoinSetRequest("o:2-sleep", ev.DelayRequest(delay, at(3), ev.ScheduleAtIn(1000)))
        ),
        ev.HistoryEvent(ev.JoinSetCreate("g:1")),  # illegal: the join set exists
    ]
    extras = AppendExtras(
        creates=[create_request(child, parent=(parent, "g:1"))],
        logs=[LogLine("info", "hello")],
        run_id=le.run_id,
    )
    with pytest.raises(Conflict):
        await storage.append(parent, le.next_version, history, at(2), extras)
    with pytest.raises(NotFound):
        await storage.get_summary(child)
    assert (await storage.expired_timers(at(5)))[1] == []
    assert await storage.next_timer_at() == le.lock_expires_at  # no delay at 3
    assert await storage.get_logs(parent) == []
    assert kinds(await storage.get_events(parent)) == ["created", "locked"]


async def test_child_request_without_its_create_request_is_rejected(storage: Storage) -> None:
    parent = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    child = child_id(parent, "g:1")
    history = [
        ev.HistoryEvent(ev.JoinSetCreate("g:1")),
        ev.HistoryEvent(
            ev.JoinSetRequest("g:1", ev.ChildExecutionRequest(child, ACTIVITY_FFQN, []))
        ),
    ]
    with pytest.raises(StorageError):
        await storage.append(parent, le.next_version, history, at(2))
    assert kinds(await storage.get_events(parent)) == ["created", "locked"]


async def test_schedule_creates_the_scheduled_execution(storage: Storage) -> None:
    parent = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    scheduled = new_id()
    request = create_request(scheduled, ACTIVITY_FFQN, params=[1], scheduled_at=at(60))
    await storage.append(
        parent,
        le.next_version,
        [ev.HistoryEvent(ev.Schedule(scheduled, ev.ScheduleAtIn(58_000), ACTIVITY_FFQN))],
        at(2),
        AppendExtras(creates=[request]),
    )
    assert await storage.get_created(scheduled) == request.created
    assert (await storage.get_row(scheduled)).parent_id is None
    assert (await storage.get_summary(scheduled)).state == PendingAt(at(60))


# ---------------------------------------------------------------------------------------
# children and responses
# ---------------------------------------------------------------------------------------


async def test_child_finished_writes_parent_response_and_unblocks_it(storage: Storage) -> None:
    p = await BlockedParent.build(storage)
    [child] = p.children
    created = await storage.get_created(child)
    assert created.parent == (p.parent, "g:1")
    assert (await storage.get_row(child)).parent_id == p.parent
    assert await storage.get_responses(p.parent) == []

    child_le = await lock(storage, child, 3)
    assert child_le.parent == (p.parent, "g:1")
    assert child_le.params == [0]
    await storage.append(child, child_le.next_version, [ev.Finished(OK42)], at(4))

    [response] = await storage.get_responses(p.parent)
    assert response == ev.StoredResponse(
        1, at(4), ev.ChildExecutionFinished(child, "g:1", child_le.next_version, OK42)
    )
    s = await storage.get_summary(p.parent)
    # The warm run may continue first: pending at its lock expiry, with its lock.
    run = LockRef(p.executor_id, p.locked.run_id)
    assert s.state == PendingAt(max(p.locked.lock_expires_at, at(4)), run)
    assert s.responses == 1

    # Nobody else takes it before that run's lock expires …
    wf = Executor([WORKFLOW_FFQN], WORKFLOW)
    assert await storage.lock_pending(**wf.lock_args(p.locked.lock_expires_at - _US)) == []
    # … but the same run may extend its lock and continue.
    extension = ev.Locked(WORKFLOW, p.executor_id, p.locked.run_id, at(60), RETRY)
    s = await storage.append(p.parent, s.next_version, [extension], at(5))
    assert s.state == Locked(p.executor_id, p.locked.run_id, at(60))


_US = timedelta(microseconds=1)


async def test_unblocked_parent_is_locked_with_its_responses(storage: Storage) -> None:
    p = await BlockedParent.build(storage)
    await finish(storage, p.children[0], 3)
    wf = Executor([WORKFLOW_FFQN], WORKFLOW)
    [le] = await storage.lock_pending(**wf.lock_args(p.locked.lock_expires_at, with_log=True))
    assert le.execution_id == p.parent
    assert le.events is not None and le.responses is not None
    assert kinds(le.events) == [
        "created",
        "locked",
        "history_event:join_set_create",
        "history_event:join_set_request",
        "history_event:join_next",
        "locked",
    ]
    assert le.responses == await storage.get_responses(p.parent)
    assert len(le.responses) == 1


async def test_child_response_of_a_parent_not_blocked_on_it(storage: Storage) -> None:
    """A response that arrives while the parent runs is recorded; the state stays Locked."""
    parent = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    child = child_id(parent, "g:1")
    await storage.append(
        parent,
        le.next_version,
        [
            ev.HistoryEvent(ev.JoinSetCreate("g:1")),
            ev.HistoryEvent(
                ev.JoinSetRequest("g:1", ev.ChildExecutionRequest(child, ACTIVITY_FFQN, []))
            ),
        ],
        at(2),
        AppendExtras(creates=[create_request(child, parent=(parent, "g:1"))]),
    )
    await finish(storage, child, 3)
    s = await storage.get_summary(parent)
    assert isinstance(s.state, Locked)
    assert s.responses == 1


async def test_responses_in_arrival_order_with_cursor(storage: Storage) -> None:
    p = await BlockedParent.build(storage, n_children=3)
    c1, c2, c3 = p.children
    locked = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3)))
    version = {le.execution_id: le.next_version for le in locked}
    assert set(version) == {c1, c2, c3}
    await storage.append(c2, version[c2], [ev.Finished(ev.ResultErr("e2"))], at(3))
    await storage.append(c3, version[c3], [ev.Finished(OK42)], at(4))
    await storage.append(c1, version[c1], [ev.Finished(OK42)], at(5))
    responses = await storage.get_responses(p.parent)
    assert [r.cursor for r in responses] == [1, 2, 3]
    assert [r.response.child_execution_id for r in responses] == [c2, c3, c1]  # type: ignore[union-attr]
    assert [r.created_at for r in responses] == [at(3), at(4), at(5)]
    assert responses[0].response.result == ev.ResultErr("e2")  # type: ignore[union-attr]
    assert await storage.get_responses(p.parent, from_cursor=1) == responses[1:]
    assert await storage.get_responses(p.parent, from_cursor=3) == []


async def test_duplicate_child_response_is_rejected(storage: Storage) -> None:
    p = await BlockedParent.build(storage)
    [child] = p.children
    await finish(storage, child, 3)
    [stored] = await storage.get_responses(p.parent)
    with pytest.raises(Conflict):
        await storage.append_response(p.parent, stored.response, at(4))
    assert len(await storage.get_responses(p.parent)) == 1


async def test_child_finished_and_parent_response_are_one_transaction(storage: Storage) -> None:
    """When the parent's response cannot be written, the child's finished is not either."""
    p = await BlockedParent.build(storage)
    [child] = p.children
    le = await lock(storage, child, 3)
    # Someone already answered for this child: the child's own response is a duplicate.
    await storage.append_response(
        p.parent, ev.ChildExecutionFinished(child, "g:1", le.next_version, OK42), at(4)
    )
    with pytest.raises(Conflict):
        await storage.append(child, le.next_version, [ev.Finished(OK42)], at(5))
    assert kinds(await storage.get_events(child)) == ["created", "locked"]
    assert not (await storage.get_summary(child)).is_finished
    assert len(await storage.get_responses(p.parent)) == 1


async def test_child_failure_reaches_parent(storage: Storage) -> None:
    p = await BlockedParent.build(storage)
    [child] = p.children
    failure = ev.ExecutionFailure("timed_out", "lock expired")
    le = await lock(storage, child, 3)
    await storage.append(child, le.next_version, [ev.Finished(failure)], at(20))
    [r] = await storage.get_responses(p.parent)
    assert r.response == ev.ChildExecutionFinished(child, "g:1", le.next_version, failure)


# ---------------------------------------------------------------------------------------
# direct locks (a child locked in the transaction that creates it)
# ---------------------------------------------------------------------------------------


class RecordingLock:
    """A `DirectLock` that records what the storage hands over (an executor would run
    it)."""

    def __init__(self, executor: Executor, now: float, expiry: float = 10.0) -> None:
        self.locked = ev.Locked(
            executor.component, executor.executor_id, new_run_id(), at(now + expiry), RETRY
        )
        self.handed: list[LockedExecution | None] = []
        self.released = 0

    def taken(self, execution: LockedExecution | None) -> None:
        self.handed.append(execution)

    def release(self) -> None:
        self.released += 1


async def submit_children(
    storage: Storage, locks: list[RecordingLock | None], now: float = 2
) -> tuple[str, list[str], ExecutionSummary]:
    """A workflow that submits one child per entry of `locks` (locked directly where
    given) and blocks on them."""
    parent = await create(storage, WORKFLOW_FFQN)
    wf = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    js = "g:1"
    children = [child_id(parent, js, n + 1) for n in range(len(locks))]
    history: list[ev.Event] = [ev.HistoryEvent(ev.JoinSetCreate(js))]
    history += [
        ev.HistoryEvent(ev.JoinSetRequest(js, ev.ChildExecutionRequest(c, ACTIVITY_FFQN, [n])))
        for n, c in enumerate(children)
    ]
    history.append(ev.HistoryEvent(ev.JoinNext(js, run_expires_at=wf.lock_expires_at)))
    creates = [
        CreateRequest(
            c,
            create_request(c, ACTIVITY_FFQN, params=[n], parent=(parent, js)).created,
            lock,
        )
        for n, (c, lock) in enumerate(zip(children, locks, strict=True))
    ]
    s = await storage.append(
        parent, wf.next_version, history, at(now), AppendExtras(creates=creates)
    )
    return parent, children, s


async def test_a_child_created_with_a_direct_lock_is_locked_and_handed_over(
    storage: Storage,
) -> None:
    exr = Executor([ACTIVITY_FFQN])
    direct = RecordingLock(exr, 2)
    parent, (locked_child, pending_child), _ = await submit_children(storage, [direct, None])
    # Created and locked in one transaction, at one time.
    events = await storage.get_events(locked_child)
    assert kinds(events) == ["created", "locked"]
    assert [e.created_at for e in events] == [at(2), at(2)]
    assert events[1].event == direct.locked
    s = await storage.get_summary(locked_child)
    assert s.state == Locked(exr.executor_id, direct.locked.run_id, at(12))
    [handed] = direct.handed
    assert handed == LockedExecution(
        execution_id=locked_child,
        ffqn=ACTIVITY_FFQN,
        params=[0],
        next_version=2,
        run_id=direct.locked.run_id,
        lock_expires_at=at(12),
        parent=(parent, "g:1"),
        summary=s,
    )
    assert direct.released == 0
    # Only the other child is there for executors to lock.
    found = await storage.lock_pending(**exr.lock_args(at(3)))
    assert [le.execution_id for le in found] == [pending_child]
    # And it runs to the end like any locked child: the parent gets its response.
    await storage.append(locked_child, handed.next_version, [ev.Finished(OK42)], at(4))
    [response] = await storage.get_responses(parent)
    assert response.response == ev.ChildExecutionFinished(locked_child, "g:1", 2, OK42)


async def test_a_direct_lock_is_not_taken_when_the_execution_exists_or_is_not_due(
    storage: Storage,
) -> None:
    exr = Executor([ACTIVITY_FFQN])
    request = create_request()
    await storage.create(request, at(0))
    again = RecordingLock(exr, 1)
    await storage.create(dataclass_replace(request, lock=again), at(1))  # idempotent
    assert again.handed == [None]
    assert kinds(await storage.get_events(request.execution_id)) == ["created"]
    later = RecordingLock(exr, 1)
    future = CreateRequest(new_id(), create_request(scheduled_at=at(60)).created, later)
    await storage.create(future, at(1))
    assert later.handed == [None]
    s = await storage.get_summary(future.execution_id)
    assert s.state == PendingAt(at(60))


async def test_append_then_calls_back_from_any_thread_with_the_outcome(storage: Storage) -> None:
    """How an activity run's worker thread writes its outcome: no future, a callback."""
    loop = asyncio.get_running_loop()
    eid = await create(storage)
    le = await lock(storage, eid, 1)

    async def append_then(version: int, events: list[ev.Event]) -> tuple[bool, object]:
        got: asyncio.Future[tuple[bool, object]] = loop.create_future()

        def callback(ok: bool, value: object) -> None:
            loop.call_soon_threadsafe(got.set_result, (ok, value))

        await asyncio.to_thread(
            storage.append_then, eid, version, events, at(2), AppendExtras(), callback
        )
        return await asyncio.wait_for(got, 30)

    ok, value = await append_then(le.next_version + 1, [ev.Finished(OK42)])
    assert not ok and isinstance(value, VersionConflict)
    ok, value = await append_then(le.next_version, [ev.Finished(OK42)])
    assert ok and isinstance(value, ExecutionSummary) and value.is_finished
    assert value == await storage.get_summary(eid)
    assert await storage.wait_for_finished(eid, 5) == OK42


async def test_a_failed_transaction_hands_no_direct_lock_over(storage: Storage) -> None:
    exr = Executor([ACTIVITY_FFQN])
    direct = RecordingLock(exr, 2)
    parent = await create(storage, WORKFLOW_FFQN)
    wf = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    child = child_id(parent, "g:1")
    request = ev.HistoryEvent(
        ev.JoinSetRequest("g:1", ev.ChildExecutionRequest(child, ACTIVITY_FFQN, []))
    )
    creates = [CreateRequest(child, create_request(child, parent=(parent, "g:1")).created, direct)]
    with pytest.raises(Conflict):  # no join set g:1
        await storage.append(parent, wf.next_version, [request], at(2), AppendExtras(creates))
    assert direct.handed == []
    with pytest.raises(NotFound):
        await storage.get_summary(child)


# ---------------------------------------------------------------------------------------
# timers
# ---------------------------------------------------------------------------------------


async def test_delay_timer_expires_and_response_removes_it(storage: Storage) -> None:
    parent = await create(storage, WORKFLOW_FFQN)
    wf = Executor([WORKFLOW_FFQN], WORKFLOW)
    le = await lock(storage, parent, 1, wf)
    js = "o:1-sleep"
    delay = delay_id(parent, js)
    s = await storage.append(
        parent,
        le.next_version,
        [
            ev.HistoryEvent(ev.JoinSetCreate(js)),
            ev.HistoryEvent(
                ev.JoinSetRequest(js, ev.DelayRequest(delay, at(30), ev.ScheduleAtIn(28_000)))
            ),
            # Blocking strategy `interrupt`: the run is released at once.
            ev.HistoryEvent(ev.JoinNext(js, run_expires_at=at(2))),
        ],
        at(2),
    )
    assert isinstance(s.state, BlockedByJoinSet)
    assert await storage.next_timer_at() == at(30)
    assert await storage.expired_timers(at(30) - _US) == ([], [])
    locks, delays = await storage.expired_timers(at(30))
    assert locks == []
    assert delays == [ExpiredDelay(parent, delay, js)]

    await storage.append_response(parent, ev.DelayFinished(delay, js), at(31))
    assert await storage.expired_timers(at(100)) == ([], [])
    [r] = await storage.get_responses(parent)
    assert r == ev.StoredResponse(1, at(31), ev.DelayFinished(delay, js, "ok"))
    assert (await storage.get_summary(parent)).state == PendingAt(
        at(31), LockRef(wf.executor_id, le.run_id)
    )
    with pytest.raises(Conflict):
        await storage.append_response(parent, ev.DelayFinished(delay, js), at(32))
    assert len(await storage.get_responses(parent)) == 1


async def test_finished_execution_drops_its_delays(storage: Storage) -> None:
    parent = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    js = "o:1-sleep"
    await storage.append(
        parent,
        le.next_version,
        [
            ev.HistoryEvent(ev.JoinSetCreate(js)),
            ev.HistoryEvent(
                ev.JoinSetRequest(
                    js, ev.DelayRequest(delay_id(parent, js), at(30), ev.ScheduleAtNow())
                )
            ),
            ev.Finished(ev.ResultOk()),
        ],
        at(2),
    )
    assert await storage.expired_timers(at(100)) == ([], [])


async def test_expired_locks(storage: Storage) -> None:
    eid = await create(storage)
    le = await lock(storage, eid, 1, expiry=10)
    assert await storage.expired_timers(at(10)) == ([], [])
    locks, delays = await storage.expired_timers(at(12))
    assert delays == []
    [expired] = locks
    assert expired.execution_id == eid
    assert expired.next_version == le.next_version
    assert expired.summary == await storage.get_summary(eid)
    # The watcher's append clears it.
    await storage.append(eid, expired.next_version, [ev.TemporarilyTimedOut(at(13))], at(12))
    assert await storage.expired_timers(at(12)) == ([], [])


async def test_expired_timers_limit(storage: Storage) -> None:
    for i in range(5):
        await create(storage, scheduled_at=at(i))
    exr = Executor([ACTIVITY_FFQN])
    await storage.lock_pending(**exr.lock_args(at(10), batch_size=5))
    locks, _ = await storage.expired_timers(at(100), limit=3)
    assert len(locks) == 3


async def test_next_timer_at(storage: Storage) -> None:
    assert await storage.next_timer_at() is None
    a = await create(storage, scheduled_at=at(50))
    assert await storage.next_timer_at() == at(50)
    b = await create(storage, OTHER_FFQN, scheduled_at=at(5))
    assert await storage.next_timer_at() == at(5)
    await lock(storage, a, 50, expiry=3)  # a's lock expires at 53; b is pending at 5
    assert await storage.next_timer_at() == at(5)
    await lock(storage, b, 50, expiry=100)
    assert await storage.next_timer_at() == at(53)


# ---------------------------------------------------------------------------------------
# reads
# ---------------------------------------------------------------------------------------


async def test_get_events_paging(storage: Storage) -> None:
    eid = await create(storage)
    le = await lock(storage, eid, 1)
    await storage.append(eid, le.next_version, [ev.Unlocked(at(2), "x")], at(2))
    await lock(storage, eid, 3)
    await storage.append(eid, 4, [ev.Finished(OK42)], at(4))
    events = await storage.get_events(eid)
    assert [e.version for e in events] == [0, 1, 2, 3, 4]
    assert [e.created_at for e in events] == [at(0), at(1), at(2), at(3), at(4)]
    assert await storage.get_events(eid, from_version=2) == events[2:]
    assert await storage.get_events(eid, length=2) == events[:2]
    assert await storage.get_events(eid, from_version=3, length=1) == events[3:4]
    assert await storage.get_events(eid, from_version=1, length=100) == events[1:]
    assert await storage.get_events(eid, from_version=5) == []


async def _list_fixture(storage: Storage) -> dict[str, str]:
    """a1 finished (t=1), a2 pending (t=2, other FFQN), parent blocked (t=10), child (t=12)."""
    a1 = await create(storage, ACTIVITY_FFQN, now=1, scheduled_at=at(1))
    await finish(storage, a1, 1.5)
    a2 = await create(storage, OTHER_FFQN, now=2, scheduled_at=at(100))
    p = await BlockedParent.build(storage, t=10)
    return {"a1": a1, "a2": a2, "parent": p.parent, "child": p.children[0]}


async def test_list_executions_newest_first_with_rows(storage: Storage) -> None:
    x = await _list_fixture(storage)
    rows = await storage.list_executions(ListFilter())
    assert [r.execution_id for r in rows] == [x["child"], x["parent"], x["a2"], x["a1"]]
    by_id = {r.execution_id: r for r in rows}
    assert by_id[x["a1"]].result == OK42
    assert isinstance(by_id[x["a1"]].state, Finished)
    assert by_id[x["a2"]].state == PendingAt(at(100))
    assert by_id[x["a2"]].ffqn == OTHER_FFQN
    assert isinstance(by_id[x["parent"]].state, BlockedByJoinSet)
    assert by_id[x["parent"]].component_type == "workflow_js"
    assert by_id[x["child"]].parent_id == x["parent"]
    assert by_id[x["child"]].created_at == at(12)
    for r in rows:
        assert r == await storage.get_row(r.execution_id)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (ListFilter(ffqn_prefix="testing:act/"), ["child", "a2", "a1"]),
        (ListFilter(ffqn_prefix="testing:act/ifc.o"), ["a2"]),
        (ListFilter(ffqn_prefix=ACTIVITY_FFQN), ["child", "a1"]),
        (ListFilter(ffqn_prefix="testing:wf/"), ["parent"]),
        (ListFilter(ffqn_prefix="nothing:"), []),
        (ListFilter(states=["pending_at"]), ["child", "a2"]),
        (ListFilter(states=["finished", "blocked_by_join_set"]), ["parent", "a1"]),
        (ListFilter(states=["locked"]), []),
        (ListFilter(hide_finished=True), ["child", "parent", "a2"]),
        (ListFilter(top_level_only=True), ["parent", "a2", "a1"]),
        (ListFilter(top_level_only=True, hide_finished=True), ["parent", "a2"]),
        (ListFilter(ffqn_prefix="testing:act/", top_level_only=True), ["a2", "a1"]),
        (ListFilter(limit=2), ["child", "parent"]),
        (ListFilter(limit=0), []),
    ],
)
async def test_list_executions_filters(
    storage: Storage, flt: ListFilter, expected: list[str]
) -> None:
    x = await _list_fixture(storage)
    rows = await storage.list_executions(flt)
    assert [r.execution_id for r in rows] == [x[k] for k in expected]


async def test_list_executions_id_prefix(storage: Storage) -> None:
    x = await _list_fixture(storage)
    rows = await storage.list_executions(ListFilter(id_prefix=x["parent"]))
    assert [r.execution_id for r in rows] == [x["child"], x["parent"]]
    rows = await storage.list_executions(ListFilter(id_prefix=x["child"]))
    assert [r.execution_id for r in rows] == [x["child"]]
    rows = await storage.list_executions(ListFilter(id_prefix=x["a1"]))
    assert [r.execution_id for r in rows] == [x["a1"]]
    assert await storage.list_executions(ListFilter(id_prefix="E_ZZZ")) == []


async def test_list_executions_paging_with_before_id(storage: Storage) -> None:
    ids = [await create(storage, now=i, scheduled_at=at(i)) for i in range(7)]
    # Two created at the same instant are still paged without loss or repetition.
    ids += [await create(storage, now=7), await create(storage, now=7)]
    seen: list[str] = []
    before = None
    while True:
        page = await storage.list_executions(ListFilter(limit=2, before_id=before))
        if not page:
            break
        assert len(page) <= 2
        seen += [r.execution_id for r in page]
        before = page[-1].execution_id
    assert len(seen) == len(set(seen)) == 9
    assert set(seen) == set(ids)
    assert seen[2:] == list(reversed(ids[:7]))
    # Filters apply together with paging.
    page = await storage.list_executions(
        ListFilter(limit=3, before_id=ids[5], ffqn_prefix=ACTIVITY_FFQN)
    )
    assert [r.execution_id for r in page] == [ids[4], ids[3], ids[2]]


async def test_list_executions_paging_after_a_row_held_elsewhere(storage: Storage) -> None:
    """`before_id` with `before_created_at`: after a row another database (shard) holds,
    ordered by (created_at, execution_id) like every row."""
    ids = [await create(storage, now=i) for i in range(4)]

    async def before(created: float, execution_id: str) -> list[str]:
        flt = ListFilter(before_id=execution_id, before_created_at=at(created))
        listed = [r.execution_id for r in await storage.list_executions(flt)]
        assert await storage.count_executions(flt) == len(listed)
        return listed

    assert await before(2, "E_0") == [ids[1], ids[0]]  # "E_0" < every ULID id
    assert await before(2, "E_~") == [ids[2], ids[1], ids[0]]
    assert await before(0, "E_0") == []


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (ListFilter(offset=1), ["parent", "a2", "a1"]),
        (ListFilter(offset=1, limit=2), ["parent", "a2"]),
        (ListFilter(offset=4), []),
        (ListFilter(order="created_asc"), ["a1", "a2", "parent", "child"]),
        (ListFilter(order="created_asc", offset=1, limit=1), ["a2"]),
        # a1 finished at 1.5 < a2 created at 2 < child created at 12 = parent's last write
        (ListFilter(order="updated_desc", hide_finished=True), ["child", "parent", "a2"]),
        (ListFilter(order="updated_desc", offset=3), ["a1"]),
        (ListFilter(states=["pending_at"], offset=1), ["a2"]),
    ],
)
async def test_list_executions_offset_and_order(
    storage: Storage, flt: ListFilter, expected: list[str]
) -> None:
    x = await _list_fixture(storage)
    rows = await storage.list_executions(flt)
    assert [r.execution_id for r in rows] == [x[k] for k in expected]


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (ListFilter(), 4),
        (ListFilter(limit=1, offset=3, order="updated_desc"), 4),  # paging is ignored
        (ListFilter(hide_finished=True), 3),
        (ListFilter(top_level_only=True), 3),
        (ListFilter(states=["pending_at", "finished"]), 3),
        (ListFilter(ffqn_prefix="testing:wf/"), 1),
        (ListFilter(id_prefix="E_ZZZ"), 0),
    ],
)
async def test_count_executions(storage: Storage, flt: ListFilter, expected: int) -> None:
    await _list_fixture(storage)
    assert await storage.count_executions(flt) == expected


async def test_list_executions_with_extras(storage: Storage) -> None:
    x = await _list_fixture(storage)
    plain = await storage.list_executions(ListFilter())
    assert {(r.children, r.last_event) for r in plain} == {(None, None)}
    rows = {r.execution_id: r for r in await storage.list_executions(ListFilter(with_extras=True))}
    assert {k: (rows[v].children, rows[v].last_event) for k, v in x.items()} == {
        "a1": (0, "finished"),
        "a2": (0, "created"),
        "parent": (1, "join_next"),  # the inner type of a history event
        "child": (0, "created"),
    }


async def test_count_by_state(storage: Storage) -> None:
    assert {k: v for k, v in (await storage.count_by_state()).items() if v} == {}
    await _list_fixture(storage)
    paused = await create(storage, now=20)
    await storage.pause(paused, at(21))
    counts = {k: v for k, v in (await storage.count_by_state()).items() if v}
    assert counts == {"finished": 1, "pending_at": 2, "blocked_by_join_set": 1, "paused": 1}


async def test_count_and_list_by_result(storage: Storage) -> None:
    assert await storage.count_by_state(results=True) == {"ok": 0, "err": 0, "failed": 0}
    x = await _list_fixture(storage)  # a1 finished ok
    # A result whose value reads like the summary's own field does not fool the SQL.
    err = await create(storage, OTHER_FFQN, now=20)
    await finish(storage, err, 21, ev.ResultErr({"result_kind": "ok", "x": '"result_kind":"ok"'}))
    failed = await create(storage, OTHER_FFQN, now=22)
    await finish(storage, failed, 23, ev.ExecutionFailure("timed_out", "too slow"))
    ok = await create(storage, OTHER_FFQN, now=24)
    await finish(storage, ok, 25, ev.ResultOk('"result_kind":"err"'))
    counts = {k: v for k, v in (await storage.count_by_state(results=True)).items() if v}
    assert counts == {
        "finished": 4,
        "pending_at": 2,
        "blocked_by_join_set": 1,
        "ok": 2,
        "err": 1,
        "failed": 1,
    }

    async def ids(*results: str) -> list[str]:
        rows = await storage.list_executions(ListFilter(results=results))
        assert await storage.count_executions(ListFilter(results=results)) == len(rows)
        return [r.execution_id for r in rows]

    assert await ids("ok") == [ok, x["a1"]]
    assert await ids("err") == [err]
    assert await ids("err", "failed") == [failed, err]
    assert await ids("failed") == [failed]


# ---------------------------------------------------------------------------------------
# logs
# ---------------------------------------------------------------------------------------


async def test_logs_append_and_page(storage: Storage) -> None:
    eid = await create(storage)
    other = await create(storage, OTHER_FFQN)
    le = await lock(storage, eid, 1)
    await storage.append_logs(
        eid,
        le.run_id,
        [
            LogLine("info", "one"),
            LogLine("error", "two", "stderr"),
            LogLine("debug", "three", "stdout"),
        ],
        at(2),
    )
    await storage.append_logs(other, None, [LogLine("warn", "elsewhere")], at(2))
    await storage.append_logs(eid, le.run_id, [], at(2))
    await storage.append(
        eid,
        le.next_version,
        [ev.Finished(OK42)],
        at(3),
        AppendExtras(logs=[LogLine("info", "four")], run_id=le.run_id),
    )
    logs = await storage.get_logs(eid)
    assert [(g.message, g.level, g.stream) for g in logs] == [
        ("one", "info", "log"),
        ("two", "error", "stderr"),
        ("three", "debug", "stdout"),
        ("four", "info", "log"),
    ]
    assert all(g.execution_id == eid and g.run_id == le.run_id for g in logs)
    assert [g.created_at for g in logs] == [at(2), at(2), at(2), at(3)]
    ids = [g.id for g in logs]
    assert ids == sorted(ids) and len(set(ids)) == 4
    assert await storage.get_logs(eid, after_id=ids[1]) == logs[2:]
    assert await storage.get_logs(eid, limit=2) == logs[:2]
    assert await storage.get_logs(eid, after_id=ids[0], limit=2) == logs[1:3]
    assert await storage.get_logs(eid, after_id=ids[-1]) == []
    [o] = await storage.get_logs(other)
    assert (o.message, o.run_id) == ("elsewhere", None)


# ---------------------------------------------------------------------------------------
# pause / unpause (SPEC §4.3)
# ---------------------------------------------------------------------------------------


async def test_pause_and_unpause_pending(storage: Storage) -> None:
    eid = await create(storage, scheduled_at=at(1))
    s = await storage.pause(eid, at(2))
    assert s.state == Paused(PendingAt(at(1)))
    assert (await storage.get_row(eid)).state == s.state
    assert await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3))) == []
    s = await storage.unpause(eid, at(4))
    assert s.state == PendingAt(at(1))
    assert kinds(await storage.get_events(eid)) == ["created", "paused", "unpaused"]
    await lock(storage, eid, 5)


async def test_pause_locked_activity_conflicts(storage: Storage) -> None:
    eid = await create(storage)
    await lock(storage, eid, 1)
    with pytest.raises(Conflict, match="cancel"):
        await storage.pause(eid, at(2))
    assert isinstance((await storage.get_summary(eid)).state, Locked)


async def test_pause_locked_workflow_releases_it(storage: Storage) -> None:
    eid = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, eid, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    s = await storage.pause(eid, at(2))
    assert isinstance(s.state, Paused)
    assert isinstance(s.state.underlying, PendingAt)
    assert s.state.underlying.scheduled_at == at(2)
    events = await storage.get_events(eid)
    assert kinds(events) == ["created", "locked", "unlocked", "paused"]
    assert events[2].event == ev.Unlocked(at(2), "paused")
    assert events[2].version == le.next_version
    # The released run cannot go on.
    with pytest.raises(VersionConflict):
        await storage.append(eid, le.next_version, [ev.Finished(OK42)], at(3))
    s = await storage.unpause(eid, at(3))
    assert isinstance(s.state, PendingAt)
    await lock(storage, eid, 4, Executor([WORKFLOW_FFQN], WORKFLOW))


async def test_pause_finished_or_twice_conflicts(storage: Storage) -> None:
    done = await create(storage)
    await finish(storage, done, 1)
    with pytest.raises(Conflict, match="finished"):
        await storage.pause(done, at(2))
    with pytest.raises(Conflict):
        await storage.unpause(done, at(2))

    eid = await create(storage, OTHER_FFQN)
    await storage.pause(eid, at(1))
    with pytest.raises(Conflict, match="paused"):
        await storage.pause(eid, at(2))
    await storage.unpause(eid, at(3))
    with pytest.raises(Conflict, match="not paused"):
        await storage.unpause(eid, at(4))
    assert kinds(await storage.get_events(eid)) == ["created", "paused", "unpaused"]


async def test_pause_unknown_is_not_found(storage: Storage) -> None:
    eid = new_id()
    with pytest.raises(NotFound):
        await storage.pause(eid, at(1))
    with pytest.raises(NotFound):
        await storage.unpause(eid, at(1))
    with pytest.raises(NotFound):
        await storage.request_cancellation(eid, at(1))


async def test_paused_blocked_parent_still_receives_responses(storage: Storage) -> None:
    p = await BlockedParent.build(storage)
    s = await storage.pause(p.parent, at(3))
    assert isinstance(s.state, Paused)
    assert isinstance(s.state.underlying, BlockedByJoinSet)
    await finish(storage, p.children[0], 4)
    s = await storage.get_summary(p.parent)
    assert isinstance(s.state, Paused)
    assert isinstance(s.state.underlying, PendingAt)
    wf = Executor([WORKFLOW_FFQN], WORKFLOW)
    assert await storage.lock_pending(**wf.lock_args(at(100))) == []
    s = await storage.unpause(p.parent, at(100))
    assert isinstance(s.state, PendingAt)
    await lock(storage, p.parent, 101, wf)


async def test_cancelling_cannot_be_paused(storage: Storage) -> None:
    eid = await create(storage)
    await lock(storage, eid, 1)
    await storage.request_cancellation(eid, at(2))
    with pytest.raises(Conflict, match="cancel"):
        await storage.pause(eid, at(3))


# ---------------------------------------------------------------------------------------
# cancellation (SPEC §8)
# ---------------------------------------------------------------------------------------


async def test_cancel_pending_activity_finishes_it(storage: Storage) -> None:
    eid = await create(storage)
    s = await storage.request_cancellation(eid, at(1))
    assert isinstance(s.state, Finished)
    assert s.state.result_kind == CANCELLED_KIND
    assert isinstance(s.result, ev.ExecutionFailure) and s.result.kind == "cancelled"
    assert kinds(await storage.get_events(eid)) == ["created", "cancellation_requested", "finished"]
    assert await storage.wait_for_finished(eid, timeout=5) == s.result
    assert await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(2))) == []


async def test_cancel_paused_activity_finishes_it(storage: Storage) -> None:
    eid = await create(storage)
    await storage.pause(eid, at(1))
    s = await storage.request_cancellation(eid, at(2))
    assert isinstance(s.state, Finished)
    assert s.state.result_kind == CANCELLED_KIND


async def test_cancel_pending_child_activity_answers_parent(storage: Storage) -> None:
    p = await BlockedParent.build(storage)
    [child] = p.children
    await storage.request_cancellation(child, at(3))
    [r] = await storage.get_responses(p.parent)
    assert isinstance(r.response, ev.ChildExecutionFinished)
    assert r.response.child_execution_id == child
    assert isinstance(r.response.result, ev.ExecutionFailure)
    assert r.response.result.kind == "cancelled"
    assert isinstance((await storage.get_summary(p.parent)).state, PendingAt)


async def test_cancel_locked_activity_notifies_its_executor(storage: Storage) -> None:
    eid = await create(storage)
    le = await lock(storage, eid, 1)
    loop = asyncio.get_running_loop()
    called: asyncio.Future[str] = loop.create_future()
    other_called: list[str] = []
    listener = storage.subscribe_cancellations()
    listener.add(eid, lambda: called.done() or called.set_result(eid))
    listener.add(new_id(), lambda: other_called.append("wrong"))

    s = await storage.request_cancellation(eid, at(2))
    assert s.state == Cancelling(
        Locked(le.summary.state.executor_id, le.run_id, le.lock_expires_at)
    )  # type: ignore[union-attr]
    assert await asyncio.wait_for(called, 5) == eid
    assert other_called == []
    assert (await storage.get_row(eid)).state == s.state
    listener.remove(eid)

    # The executor interrupts the run and finishes it.
    failure = ev.ExecutionFailure("cancelled", "cancelled while running")
    s = await storage.append(eid, s.next_version, [ev.Finished(failure)], at(3))
    assert isinstance(s.state, Finished) and s.state.result_kind == CANCELLED_KIND


async def test_removed_cancellation_listener_is_not_called(storage: Storage) -> None:
    eid = await create(storage)
    await lock(storage, eid, 1)
    calls: list[str] = []
    listener = storage.subscribe_cancellations()
    listener.add(eid, lambda: calls.append(eid))
    listener.remove(eid)
    listener.remove(new_id())  # removing an unknown id is harmless
    await storage.request_cancellation(eid, at(2))
    # A barrier: one more committed write, after which any notification was delivered.
    await create(storage, OTHER_FFQN)
    assert calls == []


async def test_cancel_workflow_not_cancellable(storage: Storage) -> None:
    eid = await create(storage, WORKFLOW_FFQN)
    with pytest.raises(NotCancellable, match=eid):
        await storage.request_cancellation(eid, at(1))
    assert kinds(await storage.get_events(eid)) == ["created"]


async def test_cancel_cancellable_workflow(storage: Storage) -> None:
    eid = await create(storage, CANCELLABLE_WORKFLOW_FFQN, scheduled_at=at(0))
    s = await storage.request_cancellation(eid, at(1))
    assert s.state == Cancelling(PendingAt(at(0)))
    assert (await storage.get_row(eid)).state == s.state
    assert kinds(await storage.get_events(eid)) == ["created", "cancellation_requested"]
    # The cancellation driver finishes it once its join sets are torn down.
    s = await storage.append(
        eid, s.next_version, [ev.Finished(ev.ExecutionFailure("cancelled"))], at(2)
    )
    assert isinstance(s.state, Finished)


async def test_cancel_finished_or_twice_conflicts(storage: Storage) -> None:
    done = await create(storage)
    await finish(storage, done, 1)
    with pytest.raises(Conflict, match="finished"):
        await storage.request_cancellation(done, at(2))

    eid = await create(storage, OTHER_FFQN)
    await lock(storage, eid, 1)
    await storage.request_cancellation(eid, at(2))
    with pytest.raises(Conflict, match="already"):
        await storage.request_cancellation(eid, at(3))
    assert kinds(await storage.get_events(eid)) == ["created", "locked", "cancellation_requested"]


async def test_cancel_supersedes_pause(storage: Storage) -> None:
    eid = await create(storage, CANCELLABLE_WORKFLOW_FFQN)
    await storage.pause(eid, at(1))
    s = await storage.request_cancellation(eid, at(2))
    assert isinstance(s.state, Cancelling)
    assert not s.paused
    with pytest.raises(Conflict):
        await storage.unpause(eid, at(3))


# ---------------------------------------------------------------------------------------
# waiting and notifications
# ---------------------------------------------------------------------------------------


async def test_wait_for_finished_wakes_when_another_task_finishes(storage: Storage) -> None:
    eid = await create(storage)
    waiter = asyncio.create_task(storage.wait_for_finished(eid, timeout=30))
    await asyncio.sleep(0)  # let it subscribe (a yield, not a timed wait)
    assert not waiter.done()
    le = await lock(storage, eid, 1)
    assert not waiter.done()
    await storage.append(eid, le.next_version, [ev.Finished(ev.ResultErr({"x": 1}))], at(2))
    assert await asyncio.wait_for(waiter, 5) == ev.ResultErr({"x": 1})


async def test_wait_for_finished_many_waiters(storage: Storage) -> None:
    eid = await create(storage)
    waiters = [asyncio.create_task(storage.wait_for_finished(eid, timeout=30)) for _ in range(5)]
    await finish(storage, eid, 1)
    assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [OK42] * 5


async def test_wait_for_finished_returns_at_once_when_finished(storage: Storage) -> None:
    eid = await create(storage)
    await finish(storage, eid, 1)
    assert await asyncio.wait_for(storage.wait_for_finished(eid, timeout=30), 5) == OK42


async def test_wait_for_finished_times_out(storage: Storage) -> None:
    eid = await create(storage)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(TimeoutError):
        await storage.wait_for_finished(eid, timeout=0.05)
    assert loop.time() - start < 2


async def test_wait_for_finished_unknown_is_not_found(storage: Storage) -> None:
    with pytest.raises(NotFound):
        await asyncio.wait_for(storage.wait_for_finished(new_id(), timeout=1), 5)


async def test_wait_for_pending_wakes_on_create(storage: Storage) -> None:
    waiter = asyncio.create_task(storage.wait_for_pending([OTHER_FFQN, ACTIVITY_FFQN], 30))
    await asyncio.sleep(0)  # let it subscribe (a yield, not a timed wait)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await create(storage, ACTIVITY_FFQN)
    await asyncio.wait_for(waiter, 5)
    assert loop.time() - start < 5


async def test_wait_for_pending_wakes_when_a_parent_is_unblocked(storage: Storage) -> None:
    p = await BlockedParent.build(storage)  # its run's lock expires at 11
    le = await lock(storage, p.children[0], 3)
    waiter = asyncio.create_task(storage.wait_for_pending([WORKFLOW_FFQN], 30))
    await asyncio.sleep(0)
    # After the expiry: the parent is due at once (its run is presumed gone).
    await storage.append(p.children[0], le.next_version, [ev.Finished(OK42)], at(12))
    await asyncio.wait_for(waiter, 5)


async def test_wait_for_pending_wakes_when_the_execution_becomes_due(storage: Storage) -> None:
    # A response before the expiry leaves the parent to its warm run until the lock
    # expires: its executor is woken then, not at once (it would lock nothing).
    p = await BlockedParent.build(storage)  # its run's lock expires at 11
    le = await lock(storage, p.children[0], 3)
    loop = asyncio.get_running_loop()
    waiter = asyncio.create_task(storage.wait_for_pending([WORKFLOW_FFQN], 30))
    await asyncio.sleep(0)
    start = loop.time()
    await storage.append(p.children[0], le.next_version, [ev.Finished(OK42)], at(10.7))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await asyncio.wait_for(waiter, 5)
    assert loop.time() - start >= 0.25  # due 0.3 s after the response


async def test_wait_for_pending_keeps_a_wake_up_that_came_between_waits(
    storage: Storage,
) -> None:
    # An executor is busy (locking) when the next execution is created: its next wait
    # returns at once instead of sleeping through its tick.
    await storage.wait_for_pending([ACTIVITY_FFQN], 0.01)  # subscribed, nothing came
    await create(storage, ACTIVITY_FFQN)  # announced while nobody waits
    loop = asyncio.get_running_loop()
    start = loop.time()
    await storage.wait_for_pending([ACTIVITY_FFQN], 30)
    assert loop.time() - start < 5
    # Consumed: the next wait does wait.
    start = loop.time()
    await storage.wait_for_pending([ACTIVITY_FFQN], 0.2)
    assert loop.time() - start >= 0.15


async def test_inbox_gets_the_responses_committed_after_it_opened(storage: Storage) -> None:
    p = await BlockedParent.build(storage, n_children=2)
    c1, c2 = p.children
    locked = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3)))
    version = {le.execution_id: le.next_version for le in locked}
    await storage.append(c1, version[c1], [ev.Finished(OK42)], at(4))
    inbox = storage.open_inbox(p.parent)
    try:
        assert await asyncio.to_thread(inbox.take, 0) == ([], False)  # c1 came before
        await storage.append(c2, version[c2], [ev.Finished(ev.ResultOk(7))], at(5))
        items, poked = await asyncio.to_thread(inbox.take, 5)
        # Exactly what a read returns, without reading.
        assert items == (await storage.get_responses(p.parent))[1:]
        assert [r.response.child_execution_id for r in items] == [c2]  # type: ignore[union-attr]
        assert not poked
        # `wake` (an interrupt) ends a wait at once.
        loop = asyncio.get_running_loop()
        start = loop.time()
        waiting = asyncio.create_task(asyncio.to_thread(inbox.take, 30))
        await asyncio.sleep(0.05)
        inbox.wake()
        assert await asyncio.wait_for(waiting, 5) == ([], False)
        assert loop.time() - start < 5
    finally:
        storage.close_inbox(p.parent, inbox)


async def test_closed_inbox_gets_nothing(storage: Storage) -> None:
    p = await BlockedParent.build(storage)
    [child] = p.children
    le = await lock(storage, child, 3)
    inbox = storage.open_inbox(p.parent)
    storage.close_inbox(p.parent, inbox)
    await storage.append(child, le.next_version, [ev.Finished(OK42)], at(4))
    assert await asyncio.to_thread(inbox.take, 0) == ([], False)


async def test_wait_for_pending_returns_after_timeout(storage: Storage) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    await storage.wait_for_pending([ACTIVITY_FFQN], 0.05)
    assert loop.time() - start < 2


async def test_changes_generation_increases_after_writes(storage: Storage) -> None:
    feed = storage.changes()
    g0 = feed.generation
    eid = await create(storage)
    g1 = feed.generation
    assert g1 > g0
    assert await feed.wait_changed(g0, timeout=5) >= g1  # already changed: returns at once

    waiter = asyncio.create_task(feed.wait_changed(g1, timeout=30))
    await asyncio.sleep(0)
    await storage.pause(eid, at(1))
    assert await asyncio.wait_for(waiter, 5) > g1
    assert feed.generation > g1


async def test_wait_changed_times_out_without_writes(storage: Storage) -> None:
    feed = storage.changes()
    g = feed.generation
    assert await feed.wait_changed(g, timeout=0.05) == g


async def test_a_raising_cancellation_callback_does_not_break_storage(storage: Storage) -> None:
    eid = await create(storage)
    await lock(storage, eid, 1)

    def broken() -> None:
        raise RuntimeError("listener bug")

    storage.subscribe_cancellations().add(eid, broken)
    s = await asyncio.wait_for(storage.request_cancellation(eid, at(2)), 5)
    assert isinstance(s.state, Cancelling)
    # The storage still writes.
    await asyncio.wait_for(create(storage, OTHER_FFQN), 5)


# ---------------------------------------------------------------------------------------
# closing
# ---------------------------------------------------------------------------------------


async def test_close_completes_or_fails_queued_writes(
    storage: Storage, open_storage: Callable[[], Awaitable[Storage]]
) -> None:
    requests = [create_request() for _ in range(50)]
    tasks = [asyncio.create_task(storage.create(r, at(0))) for r in requests]
    await asyncio.sleep(0)  # let them queue
    await asyncio.wait_for(storage.close(), 10)
    done, pending = await asyncio.wait(tasks, timeout=5)
    assert not pending, "a write queued before close() never completed"
    failed = [t.exception() for t in done if t.exception() is not None]
    assert all(isinstance(e, StorageError) for e in failed), failed
    with pytest.raises(StorageError):
        await storage.create(create_request(), at(1))

    reopened = await open_storage()
    try:
        for r, t in zip(requests, tasks, strict=True):
            if t.exception() is None:  # acknowledged: must be durable
                assert await reopened.get_created(r.execution_id) == r.created
    finally:
        await reopened.close()


# ---------------------------------------------------------------------------------------
# more scenarios: concurrency, projections
# ---------------------------------------------------------------------------------------


async def assert_projection_matches_log(storage: Storage, execution_id: str) -> None:
    """The stored summary is the fold of the stored log and responses (SPEC §4.1)."""
    events = await storage.get_events(execution_id)
    responses = await storage.get_responses(execution_id)
    items: list[tuple[object, int, int, ev.Event | ev.Response]] = [
        (e.created_at, 0, e.version, e.event) for e in events
    ]
    items += [(r.created_at, 1, r.cursor, r.response) for r in responses]
    items.sort(key=lambda i: (i[0], i[1], i[2]))
    folded = replay((at_, item) for at_, _, _, item in items)  # type: ignore[misc]
    assert folded == await storage.get_summary(execution_id)


async def test_log_lines_keep_when_they_were_emitted(storage: Storage) -> None:
    eid = await create(storage)
    le = await lock(storage, eid, 1)
    await storage.append(
        eid,
        le.next_version,
        [ev.Finished(OK42)],
        at(5),
        AppendExtras(
            logs=[
                LogLine("info", "early", at=at(2)),
                LogLine("info", "unstamped"),
                # A clock ahead of the write's: never later than the write.
                LogLine("info", "ahead", at=at(9)),
            ],
            run_id=le.run_id,
        ),
    )
    logs = await storage.get_logs(eid)
    assert [(g.message, g.created_at) for g in logs] == [
        ("early", at(2)),
        ("unstamped", at(5)),
        ("ahead", at(5)),
    ]


async def test_projection_is_the_fold_of_the_log(storage: Storage) -> None:
    p = await BlockedParent.build(storage, n_children=2)
    c1, c2 = p.children
    locked = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3)))
    version = {le.execution_id: le.next_version for le in locked}
    await storage.append(c1, version[c1], [ev.Finished(OK42)], at(4))
    await storage.pause(p.parent, at(5))
    await storage.unpause(p.parent, at(6))
    await storage.append(c2, version[c2], [ev.TemporarilyFailed(at(8), "trap")], at(7))
    for eid in (p.parent, c1, c2):
        await assert_projection_matches_log(storage, eid)


async def test_delay_can_be_cancelled(storage: Storage) -> None:
    parent = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    js = "o:1-sleep"
    delay = delay_id(parent, js)
    await storage.append(
        parent,
        le.next_version,
        [
            ev.HistoryEvent(ev.JoinSetCreate(js)),
            ev.HistoryEvent(
                ev.JoinSetRequest(js, ev.DelayRequest(delay, at(30), ev.ScheduleAtNow()))
            ),
            ev.HistoryEvent(ev.JoinNext(js, run_expires_at=at(2))),
        ],
        at(2),
    )
    await storage.append_response(parent, ev.DelayFinished(delay, js, "cancelled"), at(3))
    [r] = await storage.get_responses(parent)
    assert r.response == ev.DelayFinished(delay, js, "cancelled")
    assert await storage.expired_timers(at(100)) == ([], [])
    assert isinstance((await storage.get_summary(parent)).state, PendingAt)
    await assert_projection_matches_log(storage, parent)


async def test_join_next_after_the_response_arrived_does_not_block(storage: Storage) -> None:
    parent = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    child = child_id(parent, "g:1")
    s = await storage.append(
        parent,
        le.next_version,
        [
            ev.HistoryEvent(ev.JoinSetCreate("g:1")),
            ev.HistoryEvent(
                ev.JoinSetRequest("g:1", ev.ChildExecutionRequest(child, ACTIVITY_FFQN, []))
            ),
        ],
        at(2),
        AppendExtras(creates=[create_request(child, parent=(parent, "g:1"))]),
    )
    await finish(storage, child, 3)
    s = await storage.append(
        parent,
        s.next_version,
        [ev.HistoryEvent(ev.JoinNext("g:1", run_expires_at=le.lock_expires_at))],
        at(4),
    )
    assert isinstance(s.state, Locked)


async def test_pausing_a_locked_workflow_notifies_its_run(storage: Storage) -> None:
    eid = await create(storage, WORKFLOW_FFQN)
    await lock(storage, eid, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    called: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    storage.subscribe_cancellations().add(eid, lambda: called.done() or called.set_result(None))
    await storage.pause(eid, at(2))
    await asyncio.wait_for(called, 5)


async def test_expired_lock_of_a_cancelling_activity(storage: Storage) -> None:
    """An executor that died after a cancellation request: the watcher still sees it."""
    eid = await create(storage)
    await lock(storage, eid, 1, expiry=10)
    await storage.request_cancellation(eid, at(2))
    [expired], _ = await storage.expired_timers(at(12))
    assert expired.execution_id == eid
    assert isinstance(expired.summary.state, Cancelling)


async def test_paused_is_not_a_timer(storage: Storage) -> None:
    eid = await create(storage, scheduled_at=at(5))
    await storage.pause(eid, at(1))
    assert await storage.next_timer_at() is None
    await storage.unpause(eid, at(2))
    assert await storage.next_timer_at() == at(5)


async def test_concurrent_pause_and_lock(storage: Storage) -> None:
    for i in range(10):
        eid = await create(storage, ACTIVITY_FFQN if i % 2 else OTHER_FFQN, now=i)
        ffqn = (await storage.get_summary(eid)).ffqn
        paused, locked = await asyncio.gather(
            storage.pause(eid, at(i + 0.5)),
            storage.lock_pending(**Executor([ffqn]).lock_args(at(i + 0.5))),
            return_exceptions=True,
        )
        s = await storage.get_summary(eid)
        if isinstance(paused, BaseException):
            assert isinstance(paused, Conflict)
            assert [le.execution_id for le in locked] == [eid]  # type: ignore[union-attr]
            assert isinstance(s.state, Locked)
        else:
            assert locked == []
            assert isinstance(s.state, Paused)
            await storage.request_cancellation(eid, at(i + 0.7))  # out of the way


async def test_concurrent_children_finishing_get_distinct_cursors(storage: Storage) -> None:
    p = await BlockedParent.build(storage, n_children=10)
    locked = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3), batch_size=10))
    assert len(locked) == 10
    await asyncio.gather(
        *(
            storage.append(le.execution_id, le.next_version, [ev.Finished(OK42)], at(4))
            for le in locked
        )
    )
    responses = await storage.get_responses(p.parent)
    assert [r.cursor for r in responses] == list(range(1, 11))
    assert {r.response.child_execution_id for r in responses} == set(p.children)  # type: ignore[union-attr]
    s = await storage.get_summary(p.parent)
    assert s.responses == 10
    assert isinstance(s.state, PendingAt)


async def test_concurrent_creates_of_one_id(storage: Storage) -> None:
    request = create_request(params=[1])
    await asyncio.gather(*(storage.create(request, at(0)) for _ in range(5)))
    assert len(await storage.get_events(request.execution_id)) == 1
    assert len(await storage.list_executions(ListFilter())) == 1


async def test_wait_for_response(storage: Storage) -> None:
    p = await BlockedParent.build(storage, n_children=2)
    c1, c2 = p.children
    locked = await storage.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3)))
    version = {le.execution_id: le.next_version for le in locked}
    # Nothing yet: [] after the timeout.
    assert await storage.wait_for_response(p.parent, 0, timeout=0.05) == []
    # A waiter wakes when the response arrives.
    waiter = asyncio.create_task(storage.wait_for_response(p.parent, 0, timeout=30))
    await asyncio.sleep(0)  # let it subscribe (a yield, not a timed wait)
    await storage.append(c1, version[c1], [ev.Finished(OK42)], at(4))
    [r1] = await asyncio.wait_for(waiter, 5)
    assert r1.cursor == 1 and r1.response.child_execution_id == c1  # type: ignore[union-attr]
    # Already there: at once; only those after the cursor.
    await storage.append(c2, version[c2], [ev.Finished(OK42)], at(5))
    assert [r.cursor for r in await storage.wait_for_response(p.parent, 0, timeout=30)] == [1, 2]
    [r2] = await asyncio.wait_for(storage.wait_for_response(p.parent, 1, timeout=30), 5)
    assert r2.cursor == 2


async def test_already_due_delay_is_answered_in_the_same_append(storage: Storage) -> None:
    parent = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, parent, 1, Executor([WORKFLOW_FFQN], WORKFLOW))
    js = "o:1-sleep"
    delay = delay_id(parent, js)
    s = await storage.append(
        parent,
        le.next_version,
        [
            ev.HistoryEvent(ev.JoinSetCreate(js)),
            ev.HistoryEvent(
                ev.JoinSetRequest(js, ev.DelayRequest(delay, at(2), ev.ScheduleAtNow()))
            ),
            ev.HistoryEvent(ev.JoinNext(js, run_expires_at=le.lock_expires_at)),
        ],
        at(2),
    )
    assert isinstance(s.state, Locked)  # the response was there: join_next did not block
    [r] = await storage.get_responses(parent)
    assert r.response == ev.DelayFinished(delay, js, "ok")
    assert (await storage.expired_timers(at(100)))[1] == []
