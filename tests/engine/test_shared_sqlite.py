"""Two engines on one SQLite file (two processes sharing a data dir; here two engines in
one process, which is the same to SQLite, the write lock and the peer bus).

Workflows submitted to one engine are locked by either, and so are their children: a
child finished by one engine must wake its parent's run waiting in the other at once.
The re-checks that would also find the responses and results (1 s) are made longer than
the test's deadline, so only the wake-ups over the bus can make it pass.
"""

from __future__ import annotations

import asyncio
import textwrap
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from engine.core import events as ev
from engine.core.state import BlockedByJoinSet
from engine.engine import Engine
from engine.executors import replay_log as host_module
from engine.storage.notify import ResponseInbox
from engine.storage.sqlite import SqliteStorage
from engine.storage.sqlite import peers as sqlite_peers
from tests.engine.test_workflow_semantics import (
    ACTIVITIES,
    STEP_JS,
    checked_log,
    child_requests,
    workflow,
)

pytestmark = pytest.mark.skipif(not sqlite_peers.supported(), reason="the peer bus is Linux-only")

SERIAL_JS = """
import { step } from "myapp:demo/activity";
export default function serial(n) {
  let acc = 0;
  for (let i = 0; i < n; i++) {
    acc += step(i, 0);
  }
  return String(acc);
}
"""


SERIAL = "myapp:demo/workflow.serial"


def serial_deployment(tmp_path: Path) -> Path:
    """`SERIAL(n)`: n calls of the JS activity `step`, one after the other → "0+…+(n−1)"."""
    (tmp_path / "step.js").write_text(textwrap.dedent(STEP_JS))
    (tmp_path / "serial.js").write_text(textwrap.dedent(SERIAL_JS))
    return (ACTIVITIES + workflow("serial", params=[("n", "u32")])).write(tmp_path)


async def test_two_engines_on_one_file_share_workflows_and_wake_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_module, "RESPONSE_RECHECK", 60.0)
    monkeypatch.setattr(SqliteStorage, "FINISHED_RECHECK_INTERVAL", 60.0)
    deployment = serial_deployment(tmp_path)
    engines: list[Engine] = []
    try:
        for _ in range(2):
            engines.append(await Engine.start(deployment, tmp_path / "data", watch=False))
        a, b = engines
        ids = await asyncio.gather(*(a.submit(SERIAL, [6]) for _ in range(30)))
        results = await asyncio.wait_for(
            asyncio.gather(*(a.result(eid, 30) for eid in ids)), timeout=30
        )
        assert results == [ev.ResultOk("15")] * 30
        # Both engines ran children (of workflows run by either: responses crossed).
        runners: dict[str, set[str]] = {"workflows": set(), "children": set()}
        for eid in ids:
            for stored in await checked_log(a, eid):
                if isinstance(stored.event, ev.Locked):
                    runners["workflows"].add(stored.event.executor_id)
            for request in child_requests(await a.storage.get_events(eid)):
                for stored in await checked_log(b, request.child_execution_id):
                    if isinstance(stored.event, ev.Locked):
                        runners["children"].add(stored.event.executor_id)
        by_engine = [
            {e.executor_id for e in engine.executors} & runners["children"] for engine in engines
        ]
        assert all(by_engine), "the children ran on one engine only"
        assert runners["workflows"]
        for engine in engines:
            assert isinstance(engine.storage, SqliteStorage)
            assert engine.storage.peers.stats["received"] > 0
    finally:
        for engine in engines:
            await engine.stop()


ASK_JS = """
import { answer } from "myapp:demo/stubs";
export default function ask() {
  return answer("q");
}
"""


async def test_a_response_from_another_process_right_after_the_runs_write_is_not_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's write commits; before the run looks at its inbox, another process
    finishes the child and the bus pokes the inbox: the run must read the database then,
    not wait for the next re-check (it used to forget the poke)."""
    monkeypatch.setattr(host_module, "RESPONSE_RECHECK", 60.0)
    (tmp_path / "step.js").write_text(textwrap.dedent(STEP_JS))
    (tmp_path / "ask.js").write_text(textwrap.dedent(ASK_JS))
    deployment = (ACTIVITIES + workflow("ask", lock_ms=120_000)).write(tmp_path)
    engine = await Engine.start(deployment, tmp_path / "data", watch=False)
    other = await SqliteStorage.open(tmp_path / "data" / "obelisk.sqlite")
    storage = engine.storage
    assert isinstance(storage, SqliteStorage)
    loop = asyncio.get_running_loop()
    real_append = storage.append_from_thread

    def append_then_answered_elsewhere(execution_id: str, *args: Any, **kwargs: Any) -> Any:
        summary = real_append(execution_id, *args, **kwargs)
        if isinstance(summary.state, BlockedByJoinSet):
            child = f"{execution_id}.o:1-answer_1"

            async def finish_elsewhere() -> None:
                s = await other.get_summary(child)
                await other.append(child, s.next_version, [ev.Finished(ev.ResultOk("a"))], at())

            asyncio.run_coroutine_threadsafe(finish_elsewhere(), loop).result(30)
            inbox = kwargs["inbox"] if "inbox" in kwargs else args[-1]
            with poked:  # the bus's poke is in before the run goes on
                assert poked.wait_for(lambda: inbox._poked, 30)
        return summary

    poked = threading.Condition()
    real_poke = ResponseInbox.poke

    def poke(inbox: ResponseInbox) -> None:
        real_poke(inbox)
        with poked:
            poked.notify_all()

    monkeypatch.setattr(ResponseInbox, "poke", poke)
    monkeypatch.setattr(storage, "append_from_thread", append_then_answered_elsewhere)
    try:
        eid = await engine.submit("myapp:demo/workflow.ask", [])
        assert await engine.result(eid, 20) == ev.ResultOk("a")
    finally:
        await other.close()
        await engine.stop()


def at() -> datetime:
    return datetime.now(UTC)
