"""Forced cancellation (SPEC §8 lifted by an operator): every backend records it in the
log, reads it back, and still refuses what no force allows. Part of the storage contract
(the `storage` fixture runs each test on every backend)."""

from __future__ import annotations

import asyncio

import pytest

from engine.core import events as ev
from engine.core.legality import cancel_refusal
from engine.core.state import Cancelling, Finished, PendingAt, replay_stored
from engine.storage.contract import Conflict, NotCancellable, Storage

from .conftest import CANCELLABLE_WORKFLOW_FFQN, WORKFLOW_FFQN, at
from .test_contract import create, finish, kinds, lock


def cancellations(events: list[ev.StoredEvent]) -> list[ev.CancellationRequested]:
    return [e.event for e in events if isinstance(e.event, ev.CancellationRequested)]


async def test_forced_cancel_of_a_locked_workflow_is_recorded_and_interrupts_it(
    storage: Storage,
) -> None:
    eid = await create(storage, WORKFLOW_FFQN)
    le = await lock(storage, eid, 1)
    with pytest.raises(NotCancellable, match="a forced cancel ends it anyway"):
        await storage.request_cancellation(eid, at(2))
    assert kinds(await storage.get_events(eid)) == ["created", "locked"]

    called: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    storage.subscribe_cancellations().add(eid, lambda: called.done() or called.set_result(None))
    s = await storage.request_cancellation(eid, at(2), force=True)
    assert isinstance(s.state, Cancelling)
    await asyncio.wait_for(called, 5)  # its run is told to stop, as for any cancel
    storage.subscribe_cancellations().remove(eid)

    events = await storage.get_events(eid)
    assert cancellations(events) == [ev.CancellationRequested(forced=True)]
    assert replay_stored(events, []) == await storage.get_summary(eid)
    with pytest.raises(Conflict, match="already requested"):
        await storage.request_cancellation(eid, at(3), force=True)

    # The run lets go and the cancellation driver finishes it (as in SPEC §8).
    s = await storage.append(eid, s.next_version, [ev.Unlocked(at(3), "cancelled")], at(3))
    assert s.state == Cancelling(PendingAt(at(3)))
    failure = ev.ExecutionFailure("cancelled", "cancellation requested")
    s = await storage.append(eid, s.next_version, [ev.Finished(failure)], at(4))
    assert isinstance(s.state, Finished)
    assert le.execution_id == eid


async def test_forcing_what_is_cancellable_is_a_plain_cancel(storage: Storage) -> None:
    eid = await create(storage, CANCELLABLE_WORKFLOW_FFQN)
    await storage.request_cancellation(eid, at(1), force=True)
    events = await storage.get_events(eid)
    assert cancellations(events) == [ev.CancellationRequested(forced=False)]
    # Stored exactly as before forced cancels existed: old logs and new agree.
    assert ev.encode(ev.CancellationRequested()) == b'{"type":"cancellation_requested"}'


async def test_forced_cancel_of_a_finished_workflow_conflicts(storage: Storage) -> None:
    eid = await create(storage, WORKFLOW_FFQN)
    await finish(storage, eid, 1)
    with pytest.raises(Conflict, match="already finished"):
        await storage.request_cancellation(eid, at(2), force=True)
    assert kinds(await storage.get_events(eid)) == ["created", "locked", "finished"]


def test_cancel_refusal_is_one_rule() -> None:
    def refusal(ffqn: str, **kw: bool) -> str | None:
        args = {"is_workflow": True, "finished": False, "cancelling": False, **kw}
        error = cancel_refusal("E_1", ffqn, **args)
        return None if error is None else type(error).__name__

    assert refusal(WORKFLOW_FFQN) == "NotCancellable"
    assert refusal(WORKFLOW_FFQN, force=True) is None
    assert refusal(WORKFLOW_FFQN, force=True, finished=True) == "Conflict"
    assert refusal(WORKFLOW_FFQN, force=True, cancelling=True) == "Conflict"
    assert refusal(CANCELLABLE_WORKFLOW_FFQN) is None
    assert refusal("a:b/c.d", is_workflow=False) is None
