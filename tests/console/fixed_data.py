"""A fixed set of executions, written through the storage layer with fixed ids and times,
so that what the console draws of them is the same on every run (snapshot tests).

`build(directory)` writes the console test deployment and a data dir; `connect(...)`
opens an engine on it that runs nothing (no executors, no timers, no file watching).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from engine.core import events as ev
from engine.core.ids import ExecutionId, JoinSetId
from engine.core.records import LogLine
from engine.engine import Engine
from engine.storage.contract import AppendExtras, CreateRequest
from engine.storage.sqlite import SqliteStorage
from obelisk_tui.backend import ConsoleBackend, EmbeddedBackend
from tests.console.conftest import APPROVE, FANOUT, SPIN, STEP, write_deployment

T0 = datetime(2026, 3, 14, 9, 26, 53, 589000, tzinfo=UTC)
#: The console's "now": a minute after the first execution.
NOW = T0 + timedelta(seconds=60)

STEP_C = ev.ComponentId("activity_js", "step", "sha256:" + "1" * 64)
SPIN_C = ev.ComponentId("activity_js", "spin", "sha256:" + "2" * 64)
STUB_C = ev.ComponentId("activity_stub", "approval", "sha256:" + "3" * 64)
FANOUT_C = ev.ComponentId("workflow_js", "fanout", "sha256:" + "4" * 64)
RETRY = ev.RetryConfig(max_retries=3, retry_exp_backoff_ms=100)
WF_RETRY = ev.RetryConfig(max_retries=None, retry_exp_backoff_ms=100)
DEPLOYMENT_ID = "Dep_01KP0000000000000000000000"

IDS = {
    "ok": "E_01KP0000000000000000000001",
    "pending": "E_01KP0000000000000000000002",
    "locked": "E_01KP0000000000000000000003",
    "fanout": "E_01KP0000000000000000000004",
    "paused": "E_01KP0000000000000000000005",
    "err": "E_01KP0000000000000000000006",
}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _created(
    ffqn: str,
    params: list[object],
    component: ev.ComponentId,
    t: float,
    parent: tuple[str, str] | None = None,
) -> ev.Created:
    return ev.Created(
        ffqn=ffqn,
        params=params,
        scheduled_at=at(t),
        component_id=component,
        deployment_id=DEPLOYMENT_ID,
        parent=parent,
    )


async def _lock(
    s: SqliteStorage,
    eid: str,
    ffqn: str,
    component: ev.ComponentId,
    t: float,
    n: int,
    retry: ev.RetryConfig = RETRY,
    expiry: float = 30,
) -> int:
    locked = await s.lock_pending(
        ffqns=[ffqn],
        batch_size=1,
        now=at(t),
        component_id=component,
        executor_id=f"Exr_01KP00000000000000000000{n:02d}",
        run_id=f"Run_01KP00000000000000000000{n:02d}",
        lock_expires_at=at(t + expiry),
        retry_config=retry,
    )
    assert [x.execution_id for x in locked] == [eid], locked
    return locked[0].next_version


async def build(directory: Path) -> tuple[Path, Path]:
    """(deployment, data dir) of the fixed executions."""
    deployment = write_deployment(directory)
    data = directory / "data"
    data.mkdir(exist_ok=True)
    s = await SqliteStorage.open(data / "obelisk.sqlite")
    try:
        # finished ok, with a log line
        eid = IDS["ok"]
        await s.create(CreateRequest(eid, _created(STEP, [4], STEP_C, 0)), at(0))
        v = await _lock(s, eid, STEP, STEP_C, 0.5, 1)
        await s.append(
            eid,
            v,
            [ev.Finished(ev.ResultOk(40))],
            at(0.6),
            AppendExtras(logs=[LogLine("info", "step 4 done")]),
        )
        # a stub waiting for its answer
        await s.create(
            CreateRequest(IDS["pending"], _created(APPROVE, ["order-7"], STUB_C, 5)), at(5)
        )
        # a long activity, running
        eid = IDS["locked"]
        await s.create(CreateRequest(eid, _created(SPIN, [600000], SPIN_C, 10)), at(10))
        await _lock(s, eid, SPIN, SPIN_C, 10.2, 2, expiry=120)
        # a workflow with two children: one finished, one pending; blocked on them
        eid = IDS["fanout"]
        await s.create(CreateRequest(eid, _created(FANOUT, [2], FANOUT_C, 20)), at(20))
        v = await _lock(s, eid, FANOUT, FANOUT_C, 20.1, 3, WF_RETRY)
        js = "g:1"
        kids = [str(ExecutionId.parse(eid).child(JoinSetId.parse(js), n)) for n in (1, 2)]
        history: list[ev.Event] = [ev.HistoryEvent(ev.JoinSetCreate(js))]
        creates = []
        for i, kid in enumerate(kids):
            history.append(
                ev.HistoryEvent(ev.JoinSetRequest(js, ev.ChildExecutionRequest(kid, STEP, [i])))
            )
            # the second is due later: "pending, in 40s" (and out of the other locks' way)
            due = 20.2 if i == 0 else 100
            creates.append(CreateRequest(kid, _created(STEP, [i], STEP_C, due, parent=(eid, js))))
        history.append(ev.HistoryEvent(ev.JoinNext(js, at(50.1), None, False)))
        await s.append(eid, v, history, at(20.2), AppendExtras(creates=creates))
        kv = await _lock(s, kids[0], STEP, STEP_C, 21, 4)
        await s.append(kids[0], kv, [ev.Finished(ev.ResultOk(0))], at(21.1))
        # a paused stub
        await s.create(
            CreateRequest(IDS["paused"], _created(APPROVE, ["order-8"], STUB_C, 30)), at(30)
        )
        await s.pause(IDS["paused"], at(31))
        # an activity that failed, was retried and finished with its err
        eid = IDS["err"]
        await s.create(CreateRequest(eid, _created(STEP, [13], STEP_C, 40)), at(40))
        v = await _lock(s, eid, STEP, STEP_C, 40.1, 5)
        await s.append(
            eid, v, [ev.TemporarilyFailed(at(40.4), "returned err", '"unlucky"')], at(40.2)
        )
        v = await _lock(s, eid, STEP, STEP_C, 40.5, 6)
        await s.append(eid, v, [ev.Finished(ev.ResultErr("unlucky 13"))], at(40.6))
    finally:
        await s.close()
    return deployment, data


def connector(deployment: Path, data: Path):  # type: ignore[no-untyped-def]
    async def connect() -> ConsoleBackend:
        engine = await Engine.start(
            deployment, data, run_executors=False, run_watcher=False, watch=False
        )
        return EmbeddedBackend(engine, label="fixed data")

    return connect
