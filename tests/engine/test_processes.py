"""`Engine.start(processes=N)` (`engine.processes`): helper engine processes, each on a
CPU of its own and (SQLite) a shard of the data dir of its own, started again when they
die, stopped with the engine. Real processes: marked slow."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

import pytest

from engine import processes
from engine.core import events as ev
from engine.engine import Engine
from engine.processes import HelperError, Helpers
from engine.storage.contract import ListFilter
from engine.storage.sharded import ShardedStorage, existing_shards
from tests.engine.test_shared_sqlite import SERIAL, serial_deployment
from tests.engine.test_workflow_semantics import checked_log, wait_until
from tests.pg_cluster import drop_schema, schema_dsn

pytestmark = pytest.mark.slow


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_two_processes_share_the_work_and_stop_together(tmp_path: Path) -> None:
    placed = hasattr(os, "sched_getaffinity")
    before = os.sched_getaffinity(0) if placed else set()
    engine = await Engine.start(
        serial_deployment(tmp_path), tmp_path / "data", processes=2, cpu_affinity="split"
    )
    try:
        assert engine.helpers is not None
        [pid] = engine.helpers.pids
        if placed and len(before) >= 2:  # one CPU each
            assert os.sched_getaffinity(pid).isdisjoint(os.sched_getaffinity(0))
        ids = await asyncio.gather(*(engine.submit(SERIAL, [4]) for _ in range(40)))
        results = await asyncio.gather(*(engine.result(eid, 60) for eid in ids))
        assert results == [ev.ResultOk("6")] * 40
        ours = {e.executor_id for e in engine.executors}
        lockers = set()
        for eid in ids:
            for stored in await checked_log(engine, eid):
                if isinstance(stored.event, ev.Locked):
                    lockers.add(stored.event.executor_id)
        assert lockers - ours, "the helper ran none of the workflows"
        # Each process's executions are in its shard; the API sees them all.
        assert (tmp_path / "data" / "obelisk-shard1.sqlite").exists()
        own = await engine.own_storage.count_executions(ListFilter(top_level_only=True))
        assert own == 20  # submissions take the shards in turn
        listed = await engine.storage.list_executions(ListFilter(top_level_only=True))
        assert sorted(r.execution_id for r in listed) == sorted(ids)
    finally:
        await engine.stop()
    await wait_until(lambda: _false_if_alive(pid), 20, "the helper to exit")
    if placed:
        assert os.sched_getaffinity(0) == before  # given back at the stop


async def _false_if_alive(pid: int) -> bool:
    return not _alive(pid)


async def test_a_data_dir_with_shards_is_served_by_as_many_processes(tmp_path: Path) -> None:
    deployment = serial_deployment(tmp_path)
    engine = await Engine.start(deployment, tmp_path / "data", processes=2)
    try:
        ids = [await engine.submit(SERIAL, [2]) for _ in range(2)]  # one per shard
        for eid in ids:
            assert await engine.result(eid, 60) == ev.ResultOk("1")
    finally:
        await engine.stop()
    engine = await Engine.start(deployment, tmp_path / "data")  # processes=1
    try:
        assert engine.helpers is not None and len(engine.helpers.pids) == 1
        for eid in ids:  # both shards are read
            assert await engine.result(eid, 5) == ev.ResultOk("1")
        more = [await engine.submit(SERIAL, [3]) for _ in range(2)]
        for eid in more:  # and both are worked on
            assert await engine.result(eid, 60) == ev.ResultOk("3")
    finally:
        await engine.stop()


async def test_a_helper_that_dies_is_started_again(tmp_path: Path) -> None:
    engine = await Engine.start(serial_deployment(tmp_path), tmp_path / "data", processes=2)
    try:
        assert engine.helpers is not None
        [first] = engine.helpers.pids
        os.kill(first, signal.SIGKILL)

        async def replaced() -> bool:
            assert engine.helpers is not None
            pids = engine.helpers.pids
            return bool(pids) and pids != [first]

        await wait_until(replaced, 60, "a new helper")
        ids = [await engine.submit(SERIAL, [3]) for _ in range(2)]  # one per shard
        for eid in ids:
            assert await engine.result(eid, 60) == ev.ResultOk("3")
    finally:
        await engine.stop()


async def test_workflows_in_a_helpers_shard_survive_its_sigkill(tmp_path: Path) -> None:
    """Killed mid-run, the helper is started again; its shard's workflows finish with
    the results of an uninterrupted run, each log a legal sequence, no child twice."""
    engine = await Engine.start(serial_deployment(tmp_path), tmp_path / "data", processes=2)
    try:
        assert engine.helpers is not None
        [first] = engine.helpers.pids
        ids = await asyncio.gather(*(engine.submit(SERIAL, [40]) for _ in range(16)))
        shard1 = engine.storage.shards[1]  # type: ignore[attr-defined]

        async def progressed() -> bool:
            flt = ListFilter(states=["finished"], limit=1000)
            return await shard1.count_executions(flt) >= 20  # children, mid-way

        await wait_until(progressed, 60, "work in the helper's shard")
        running = ListFilter(hide_finished=True, top_level_only=True)
        assert await shard1.count_executions(running) > 0  # killed mid-run
        os.kill(first, signal.SIGKILL)
        results = await asyncio.gather(*(engine.result(eid, 120) for eid in ids))
        assert results == [ev.ResultOk("780")] * 16
        assert engine.helpers.pids != [first]
        for eid in ids:
            events = await checked_log(engine, eid)
            children = [
                e.event.event.request.child_execution_id  # type: ignore[union-attr]
                for e in events
                if isinstance(e.event, ev.HistoryEvent)
                and isinstance(e.event.event, ev.JoinSetRequest)
                and isinstance(e.event.event.request, ev.ChildExecutionRequest)
            ]
            assert len(children) == len(set(children)) == 40
    finally:
        await engine.stop()


async def test_a_helper_that_cannot_start_says_why(tmp_path: Path) -> None:
    helpers = Helpers(tmp_path / "missing.toml", tmp_path / "data", None, 1)
    with pytest.raises(HelperError, match=r"engine helper 1 could not start: .*missing\.toml"):
        await helpers.start()
    assert helpers.pids == []


async def test_helpers_share_a_postgresql_database(tmp_path: Path, postgres_dsn: str) -> None:
    """With PostgreSQL the helpers get the database's URL (in their environment)."""
    url = schema_dsn(postgres_dsn, tmp_path)
    try:
        engine = await Engine.start(
            serial_deployment(tmp_path), tmp_path / "data", database_url=url, processes=2
        )
        try:
            ids = await asyncio.gather(*(engine.submit(SERIAL, [4]) for _ in range(30)))
            results = await asyncio.gather(*(engine.result(eid, 60) for eid in ids))
            assert results == [ev.ResultOk("6")] * 30
            ours = {e.executor_id for e in engine.executors}
            lockers = {
                stored.event.executor_id
                for eid in ids
                for stored in await engine.storage.get_events(eid)
                if isinstance(stored.event, ev.Locked)
            }
            assert lockers - ours, "the helper ran none of the workflows"
        finally:
            await engine.stop()
    finally:
        await asyncio.to_thread(drop_schema, postgres_dsn, tmp_path)


async def test_processes_must_be_at_least_one(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="processes must be at least 1, not 0"):
        await Engine.start(serial_deployment(tmp_path), tmp_path / "data", processes=0)
    assert not (tmp_path / "data").exists()  # nothing was started


async def test_a_failed_start_leaves_no_shard_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Else every later start, even with one process, would need a helper again."""
    monkeypatch.setattr(processes, "HELPER_COMMAND", ["false"])
    deployment = serial_deployment(tmp_path)
    with pytest.raises(HelperError, match="engine helper 1 exited with 1"):
        await Engine.start(deployment, tmp_path / "data", processes=2)
    assert existing_shards(tmp_path / "data") == 1
    assert sorted(p.name for p in (tmp_path / "data").iterdir() if "shard" in p.name) == []
    engine = await Engine.start(deployment, tmp_path / "data")
    try:
        assert engine.helpers is None
        eid = await engine.submit(SERIAL, [2])
        assert await engine.result(eid, 60) == ev.ResultOk("1")
    finally:
        await engine.stop()


async def test_an_engine_that_runs_no_executors_starts_no_helper(tmp_path: Path) -> None:
    engine = await Engine.start(
        serial_deployment(tmp_path), tmp_path / "data", processes=2, run_executors=False
    )
    try:
        assert engine.helpers is None
        assert isinstance(engine.storage, ShardedStorage)  # it reads both shards
    finally:
        await engine.stop()


async def test_helper_log_lines_go_where_this_processs_go(tmp_path: Path) -> None:
    """The console logs to a file (the terminal is its screen): so do its helpers."""
    log_file = tmp_path / "console.log"
    handler = logging.FileHandler(log_file)
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)  # as the console's: helpers log at this level
    try:
        engine = await Engine.start(serial_deployment(tmp_path), tmp_path / "data", processes=2)
        try:
            assert engine.helpers is not None
            [pid] = engine.helpers.pids
        finally:
            await engine.stop()
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
        handler.close()
    assert f"[helper {pid}]: executor" in log_file.read_text()
