"""Backtraces (SPEC §7.4, §11) end to end: a real engine runs JS workflows written to
temporary files; the line of every call that wrote history is stored against the
versions it produced, deduplicated, served by the API, and re-captured by
`persist-backtraces` (API and CLI)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine.cli import main
from engine.core import events as ev
from engine.core.records import Frame
from engine.engine import Engine
from engine.server.api import make_app
from engine.storage.contract import AppendExtras, ComponentSource, NotFound, VersionConflict
from engine.storage.sqlite import SqliteStorage
from engine.storage.sqlite import schema as sqlite_schema
from tests.engine.conftest import StartEngine
from tests.fixtures.deployments import Deployment, ms, seconds
from tests.storage.conftest import WORKFLOW, WORKFLOW_FFQN, Executor, at, create_request

TOKEN = "backtrace-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

STEP_JS = """\
export default function step(idx, sleepMillis) { return idx; }
"""

# No indentation: the line numbers below are those of the file on disk.
MIXED_JS = """\
import { step } from "myapp:demo/activity";
import { stepSubmit, stepAwaitNext } from "myapp:demo-obelisk-ext/activity";
import * as obelisk from "obelisk:workflow@1.0.0";

export default function mixed() {
  const js = obelisk.createJoinSet();
  stepSubmit(js, 1, 0);
  stepSubmit(js, 2, 0);
  let acc = Number(stepAwaitNext(js));
  acc += Number(stepAwaitNext(js));
  obelisk.sleep({ milliseconds: 10 });
  acc += Number(step(3, 0));
  return String(acc);
}
"""

LOOP_JS = """\
import { step } from "myapp:demo/activity";

export default function loop() {
  let acc = 0;
  for (let i = 0; i < 10; i++) {
    acc += Number(step(i, 0));
  }
  return String(acc);
}
"""

# Submits and returns: the implicit close writes a closing join_next without a guest call.
SUBMIT_RETURN_JS = """\
import { stepSubmit } from "myapp:demo-obelisk-ext/activity";
import * as obelisk from "obelisk:workflow@1.0.0";

export default function submitReturn() {
  const js = obelisk.createJoinSet();
  stepSubmit(js, 7, 0);
  return "submitted";
}
"""

# Blocks on a stub until the test writes its result.
WAITING_JS = """\
import { step } from "myapp:demo/activity";
import { approve } from "myapp:demo/approval";

export default function waiting() {
  const first = Number(step(5, 0));
  const ok = approve("order-1");
  return String(first) + ":" + String(ok);
}
"""

FILES = {
    "step.js": STEP_JS,
    "mixed.js": MIXED_JS,
    "loop.js": LOOP_JS,
    "submit_return.js": SUBMIT_RETURN_JS,
    "waiting.js": WAITING_JS,
}


def workflow(d: Deployment, name: str, ffqn_name: str, strategy: str) -> None:
    d.workflow_js(
        name,
        None,  # <name>.js, in FILES
        ffqn=f"myapp:demo/workflow.{ffqn_name}",
        params=[],
        return_type="result<string, string>",
        blocking_strategy=strategy,
        exec={"lock_expiry": seconds(2), "tick_sleep": ms(20)},
    )


def deployment(strategy: str = "await") -> Deployment:
    d = (
        Deployment()
        .activity_js(
            "step",
            None,
            ffqn="myapp:demo/activity.step",
            params=[("idx", "u32"), ("sleep-millis", "u32")],
            return_type="result<u32, string>",
            exec={"tick_sleep": ms(20)},
        )
        .activity_stub(
            "myapp:demo/approval.approve",
            params=[("order", "string")],
            return_type="result<bool, string>",
        )
    )
    for name, ffqn_name in (
        ("mixed", "mixed"),
        ("loop", "loop"),
        ("submit_return", "submit-return"),
        ("waiting", "waiting"),
    ):
        workflow(d, name, ffqn_name, strategy)
    return d


def line_of(source: str, fragment: str) -> int:
    """The 1-based line of the only line of `source` containing `fragment`."""
    lines = [i + 1 for i, text in enumerate(source.splitlines()) if fragment in text]
    assert len(lines) == 1, (fragment, lines)
    return lines[0]


def describe(event: ev.HistoryEventKind) -> str:
    match event:
        case ev.JoinSetCreate(join_set_id=js):
            return f"create {js}"
        case ev.JoinSetRequest(request=ev.ChildExecutionRequest(target_ffqn=f)):
            return f"request {f.rsplit('.', 1)[-1]}"
        case ev.JoinSetRequest(request=ev.DelayRequest()):
            return "request delay"
        case ev.JoinNext(closing=closing):
            return "join_next closing" if closing else "join_next"
    return str(event.__struct_config__.tag)


async def history_lines(engine: Engine, eid: str) -> list[tuple[int, str, int | None]]:
    """(version, event, innermost line or None) for every history event."""
    out: list[tuple[int, str, int | None]] = []
    for stored in await engine.storage.get_events(eid):
        if not isinstance(stored.event, ev.HistoryEvent):
            continue
        bt = await engine.storage.get_backtrace(eid, stored.version)
        assert (bt is None) == (stored.backtrace_id is None)
        line = None if bt is None else bt.frames[0].line
        out.append((stored.version, describe(stored.event.event), line))
    return out


def backtrace_rows(engine: Engine) -> int:
    assert isinstance(engine.storage, SqliteStorage)
    with sqlite3.connect(engine.storage.path) as conn:
        return int(conn.execute("SELECT count(*) FROM backtraces").fetchone()[0])


@pytest.fixture
async def start(start_engine: StartEngine) -> Callable[..., Awaitable[Engine]]:
    async def go(strategy: str = "await") -> Engine:
        return await start_engine(deployment(strategy), files=FILES)

    return go


@pytest.fixture
async def api(
    start: Callable[..., Awaitable[Engine]],
) -> AsyncIterator[tuple[Engine, TestClient[Any, Any]]]:
    engine = await start()
    async with TestClient(TestServer(make_app(engine, TOKEN)), headers=AUTH) as client:
        yield engine, client


# ---------------------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------------------


async def locked_workflow(storage: SqliteStorage) -> tuple[str, int]:
    request = create_request(ffqn=WORKFLOW_FFQN)
    await storage.create(request, at(0))
    [locked] = await storage.lock_pending(
        **Executor([WORKFLOW_FFQN], WORKFLOW).lock_args(at(1), expiry=60)
    )
    return request.execution_id, locked.next_version


_JOIN_SETS = iter(range(1, 1_000_000))


def history(n: int) -> list[ev.Event]:
    """`n` history events (join set creations, each a new join set)."""
    return [ev.HistoryEvent(ev.JoinSetCreate(f"g:{next(_JOIN_SETS)}")) for _ in range(n)]


async def test_storage_stores_deduplicates_and_replaces(tmp_path: Path) -> None:
    storage = await SqliteStorage.open(tmp_path / "db.sqlite")
    try:
        eid, version = await locked_workflow(storage)
        a = [Frame("/w/wf.js", 7, 3, "wf"), Frame("/w/wf.js", 2, 1, "")]
        b = [Frame("/w/wf.js", 9, 3, "wf")]
        # Index 1 has no stack (left out); an empty stack is not stored either.
        extras = AppendExtras(backtraces=[(0, a), (2, b), (3, [])], component_digest="sha256:v1")
        await storage.append(eid, version, history(4), at(2), extras)
        # A failed append stores nothing.
        with pytest.raises(VersionConflict):
            await storage.append(
                eid,
                version,
                history(1),
                at(2),
                AppendExtras(backtraces=[(0, [Frame("/w/x.js", 1, 1)])], component_digest="x"),
            )
        # The same frames in a later append: the same row.
        await storage.append(
            eid,
            version + 4,
            history(1),
            at(3),
            AppendExtras(backtraces=[(0, list(a))], component_digest="sha256:v1"),
        )
        got = {v: await storage.get_backtrace(eid, v) for v in range(version, version + 5)}
        assert got[version + 1] is None and got[version + 3] is None
        first, second, again = got[version], got[version + 2], got[version + 4]
        assert first is not None and second is not None and again is not None
        assert first.frames == a and second.frames == b
        assert first.component_digest == "sha256:v1"
        assert again.backtrace_id == first.backtrace_id
        # Same frames of another component version: another row.
        await storage.append(
            eid,
            version + 5,
            history(1),
            at(4),
            AppendExtras(backtraces=[(0, a)], component_digest="sha256:v2"),
        )
        other = await storage.get_backtrace(eid, version + 5)
        assert other is not None and other.backtrace_id != first.backtrace_id
        with sqlite3.connect(storage.path) as conn:
            assert conn.execute("SELECT count(*) FROM backtraces").fetchone()[0] == 3

        # Replace below a version: the others keep theirs; versions past it are ignored.
        stored = await storage.replace_backtraces(
            eid, "sha256:v3", [(version + 1, b), (version + 5, b)], version + 5
        )
        assert stored == 1
        replaced = await storage.get_backtrace(eid, version + 1)
        assert replaced is not None and replaced.component_digest == "sha256:v3"
        assert await storage.get_backtrace(eid, version) is None
        assert await storage.get_backtrace(eid, version + 5) == other
        with pytest.raises(NotFound):
            await storage.get_backtrace("E_01JAAAAAAAAAAAAAAAAAAAAAAA", 1)
        with pytest.raises(NotFound):
            await storage.replace_backtraces("E_01JAAAAAAAAAAAAAAAAAAAAAAA", "", [], 1)

        # Sources: the first one kept for a digest stays.
        await storage.save_component_sources([ComponentSource("sha256:v1", "/w/wf.js", "one")])
        await storage.save_component_sources([ComponentSource("sha256:v1", "/w/wf.js", "two")])
        assert await storage.get_component_source("sha256:v1") == ComponentSource(
            "sha256:v1", "/w/wf.js", "one"
        )
        assert await storage.get_component_source("sha256:nope") is None
    finally:
        await storage.close()


async def test_schema_2_database_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        for script in sqlite_schema.MIGRATIONS[:2]:
            conn.executescript(script)
        conn.execute("PRAGMA user_version = 2")
    storage = await SqliteStorage.open(path)
    try:
        eid, version = await locked_workflow(storage)
        frames = [Frame("/w/wf.js", 4, 2, "wf")]
        await storage.append(
            eid,
            version,
            history(1),
            at(2),
            AppendExtras(backtraces=[(0, frames)], component_digest="sha256:v1"),
        )
        bt = await storage.get_backtrace(eid, version)
        assert bt is not None and bt.frames == frames
    finally:
        await storage.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_schema.SCHEMA_VERSION


# ---------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_each_call_line_is_recorded_against_its_versions(
    start: Callable[..., Awaitable[Engine]], tmp_path: Path, strategy: str
) -> None:
    engine = await start(strategy)
    eid = await engine.submit("myapp:demo/workflow.mixed", [])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("6")

    create = line_of(MIXED_JS, "createJoinSet()")
    submit1 = line_of(MIXED_JS, "stepSubmit(js, 1, 0)")
    submit2 = line_of(MIXED_JS, "stepSubmit(js, 2, 0)")
    next1 = line_of(MIXED_JS, "let acc = Number(stepAwaitNext(js))")
    next2 = line_of(MIXED_JS, "acc += Number(stepAwaitNext(js))")
    sleep = line_of(MIXED_JS, "obelisk.sleep(")
    direct = line_of(MIXED_JS, "step(3, 0)")
    got = [(event, line) for _, event, line in await history_lines(engine, eid)]
    assert got == [
        ("create g:1", create),
        ("request step", submit1),
        ("request step", submit2),
        ("join_next", next1),
        ("join_next", next2),
        ("create o:1-sleep", sleep),
        ("request delay", sleep),
        ("join_next", sleep),
        ("create o:2-step", direct),
        ("request step", direct),
        ("join_next", direct),
    ]
    # Frames name the workflow's file and function; the digest is the running code's.
    events = await engine.storage.get_events(eid)
    version = next(e.version for e in events if e.backtrace_id is not None)
    bt = await engine.storage.get_backtrace(eid, version)
    assert bt is not None
    assert bt.frames[0].file == str(tmp_path / "mixed.js")
    assert bt.frames[0].function == "mixed"
    assert bt.frames[0].column > 0
    _, component = engine.registry.function("myapp:demo/workflow.mixed")
    assert bt.component_digest == component.component_id.digest
    # Events written without a guest call have none.
    for e in events:
        if not isinstance(e.event, ev.HistoryEvent):
            assert e.backtrace_id is None, e


async def test_a_line_called_in_a_loop_is_stored_once(
    start: Callable[..., Awaitable[Engine]],
) -> None:
    engine = await start()
    eid = await engine.submit("myapp:demo/workflow.loop", [])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("45")
    history = await history_lines(engine, eid)
    assert len(history) == 30  # create, request, join_next per call
    assert {line for _, _, line in history} == {line_of(LOOP_JS, "step(i, 0)")}
    ids = {e.backtrace_id for e in await engine.storage.get_events(eid) if e.backtrace_id}
    assert len(ids) == 1
    assert backtrace_rows(engine) == 1
    # Another execution of the same code reuses the row.
    eid2 = await engine.submit("myapp:demo/workflow.loop", [])
    assert await engine.result(eid2, timeout=30) == ev.ResultOk("45")
    ids2 = {e.backtrace_id for e in await engine.storage.get_events(eid2) if e.backtrace_id}
    assert ids2 == ids
    assert backtrace_rows(engine) == 1


async def test_implicit_close_has_no_backtrace(start: Callable[..., Awaitable[Engine]]) -> None:
    engine = await start()
    eid = await engine.submit("myapp:demo/workflow.submit-return", [])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("submitted")
    got = [(event, line) for _, event, line in await history_lines(engine, eid)]
    assert got == [
        ("create g:1", line_of(SUBMIT_RETURN_JS, "createJoinSet()")),
        ("request step", line_of(SUBMIT_RETURN_JS, "stepSubmit(js, 7, 0)")),
        ("join_next closing", None),
    ]


# ---------------------------------------------------------------------------------------
# API
# ---------------------------------------------------------------------------------------


async def test_backtrace_events_and_source_endpoints(
    api: tuple[Engine, TestClient[Any, Any]], tmp_path: Path
) -> None:
    engine, client = api
    eid = await engine.submit("myapp:demo/workflow.mixed", [])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("6")
    submit2 = line_of(MIXED_JS, "stepSubmit(js, 2, 0)")

    r = await client.get(f"/v1/executions/{eid}/events", params={"include_backtrace_id": "true"})
    assert r.status == 200
    entries = await r.json()
    assert all("backtrace_id" in e for e in entries)
    requests = [
        e
        for e in entries
        if e["event"]["type"] == "history_event"
        and e["event"]["event"]["type"] == "join_set_request"
    ]
    second = requests[1]
    assert second["backtrace_id"] is not None
    r = await client.get(f"/v1/executions/{eid}/events")
    assert all("backtrace_id" not in e for e in await r.json())

    r = await client.get(f"/v1/executions/{eid}/backtrace", params={"version": second["version"]})
    assert r.status == 200, await r.text()
    bt = await r.json()
    assert bt["execution_id"] == eid
    assert bt["version"] == second["version"]
    assert bt["backtrace_id"] == second["backtrace_id"]
    frame = bt["frames"][0]
    assert set(frame) == {"file", "line", "column", "function"}
    assert frame["line"] == submit2
    assert frame["file"] == str(tmp_path / "mixed.js")

    # The source of that code, even after the file changed on disk.
    (tmp_path / "mixed.js").write_text(MIXED_JS.replace("stepSubmit(js, 2, 0)", "// gone"))
    r = await client.get(f"/v1/components/{bt['component_digest']}/source")
    assert r.status == 200, await r.text()
    source = await r.json()
    assert source["digest"] == bt["component_digest"]
    assert source["file"] == str(tmp_path / "mixed.js")
    assert source["source"] == MIXED_JS
    assert "stepSubmit(js, 2, 0);" in source["source"].splitlines()[frame["line"] - 1]

    # No backtrace: the created event, a version past the end; bad or missing version.
    r = await client.get(f"/v1/executions/{eid}/backtrace", params={"version": "0"})
    assert r.status == 404
    assert "no backtrace for version 0" in (await r.json())["error"]
    r = await client.get(f"/v1/executions/{eid}/backtrace", params={"version": "999"})
    assert r.status == 404
    for params in ({}, {"version": "x"}, {"version": "-1"}):
        r = await client.get(f"/v1/executions/{eid}/backtrace", params=params)
        assert r.status == 400, params
        assert "version" in (await r.json())["error"]
    unknown = "E_01JAAAAAAAAAAAAAAAAAAAAAAA"
    r = await client.get(f"/v1/executions/{unknown}/backtrace", params={"version": "1"})
    assert r.status == 404
    assert "not found" in (await r.json())["error"]
    r = await client.get("/v1/components/sha256:0000/source")
    assert r.status == 404
    assert "sha256:0000" in (await r.json())["error"]


async def test_sources_of_deployed_components_are_stored_at_start(
    start: Callable[..., Awaitable[Engine]],
) -> None:
    engine = await start()
    for component in engine.registry.components:
        stored = await engine.storage.get_component_source(component.component_id.digest)
        if component.config.type in ("workflow_js", "activity_js"):
            assert stored is not None
            assert stored.source == component.source
            assert stored.file == str(component.config.location)
        else:
            assert stored is None


# ---------------------------------------------------------------------------------------
# persist-backtraces
# ---------------------------------------------------------------------------------------


async def test_persist_backtraces_recreates_deleted_ones(
    api: tuple[Engine, TestClient[Any, Any]],
) -> None:
    engine, client = api
    eid = await engine.submit("myapp:demo/workflow.mixed", [])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("6")
    before = await history_lines(engine, eid)
    events = await engine.storage.get_events(eid)
    ids_before = [e.backtrace_id for e in events]
    _, component = engine.registry.function("myapp:demo/workflow.mixed")
    digest = component.component_id.digest

    # Delete them (as if they were never recorded).
    cleared = await engine.storage.replace_backtraces(eid, digest, [], events[-1].version + 1)
    assert cleared == 0
    assert {line for _, _, line in await history_lines(engine, eid)} == {None}

    r = await client.put(f"/v1/executions/{eid}/backtraces")
    assert r.status == 200, await r.text()
    answer = await r.json()
    assert answer == {
        "execution_id": eid,
        "component_digest": digest,
        "history_events": len(before),
        "stored": len(before),
    }
    assert await history_lines(engine, eid) == before
    # Same frames, same rows: deduplicated by content.
    assert [e.backtrace_id for e in await engine.storage.get_events(eid)] == ids_before
    # The log was not touched.
    assert [e.event for e in await engine.storage.get_events(eid)] == [e.event for e in events]


async def test_persist_backtraces_of_a_running_execution(
    api: tuple[Engine, TestClient[Any, Any]],
) -> None:
    engine, client = api
    eid = await engine.submit("myapp:demo/workflow.waiting", [])
    # Wait until it blocks on the stub child.
    for _ in range(300):
        s = await engine.storage.get_summary(eid)
        if s.state.__struct_config__.tag == "blocked_by_join_set":
            events = await engine.storage.get_events(eid)
            if any(
                isinstance(e.event, ev.HistoryEvent)
                and isinstance(e.event.event, ev.JoinSetRequest)
                and isinstance(e.event.event.request, ev.ChildExecutionRequest)
                and e.event.event.request.target_ffqn.endswith("approve")
                for e in events
            ):
                break
        await asyncio.sleep(0.05)
    else:
        pytest.fail("the workflow did not block on its stub")
    before = await history_lines(engine, eid)
    step_line = line_of(WAITING_JS, "step(5, 0)")
    approve_line = line_of(WAITING_JS, 'approve("order-1")')
    assert [line for _, _, line in before] == [step_line] * 3 + [approve_line] * 3
    next_version = (await engine.storage.get_summary(eid)).next_version
    await engine.storage.replace_backtraces(eid, "", [], next_version)

    r = await client.put(f"/v1/executions/{eid}/backtraces")
    assert r.status == 200, await r.text()
    assert (await r.json())["stored"] == 6
    assert await history_lines(engine, eid) == before
    assert (await engine.storage.get_summary(eid)).next_version == next_version  # no writes

    # It goes on (and records its later events) as usual.
    child = next(
        e.event.event.request.child_execution_id
        for e in await engine.storage.get_events(eid)
        if isinstance(e.event, ev.HistoryEvent)
        and isinstance(e.event.event, ev.JoinSetRequest)
        and isinstance(e.event.event.request, ev.ChildExecutionRequest)
        and e.event.event.request.target_ffqn.endswith("approve")
    )
    await engine.stub(child, {"ok": True})
    assert await engine.result(eid, timeout=30) == ev.ResultOk("5:true")


async def test_persist_backtraces_errors(api: tuple[Engine, TestClient[Any, Any]]) -> None:
    engine, client = api
    activity = await engine.submit("myapp:demo/activity.step", [1, 0])
    await engine.result(activity, timeout=30)
    r = await client.put(f"/v1/executions/{activity}/backtraces")
    assert r.status == 409
    assert "not a JS workflow" in (await r.json())["error"]
    r = await client.put("/v1/executions/E_01JAAAAAAAAAAAAAAAAAAAAAAA/backtraces")
    assert r.status == 404
    r = await client.put("/v1/executions/nonsense/backtraces")
    assert r.status == 400


async def test_persist_backtraces_cli(
    api: tuple[Engine, TestClient[Any, Any]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine, client = api
    eid = await engine.submit("myapp:demo/workflow.loop", [])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("45")
    next_version = (await engine.storage.get_summary(eid)).next_version
    await engine.storage.replace_backtraces(eid, "", [], next_version)
    monkeypatch.setenv("OBELISK_API_URL", str(client.make_url("")).rstrip("/"))
    monkeypatch.setenv("OBELISK_API_TOKEN", TOKEN)

    capsys.readouterr()
    code = await asyncio.to_thread(main, ["execution", "persist-backtraces", eid])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith(f"stored 30 backtraces for {eid} (30 history events replayed on sha256:")
    assert {line for _, _, line in await history_lines(engine, eid)} == {
        line_of(LOOP_JS, "step(i, 0)")
    }

    code = await asyncio.to_thread(main, ["execution", "persist-backtraces", eid, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert '"stored": 30' in out

    code = await asyncio.to_thread(
        main, ["execution", "persist-backtraces", "E_01JAAAAAAAAAAAAAAAAAAAAAAA"]
    )
    out, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("error: ") and "not found" in err


async def test_persist_backtraces_after_the_code_changed(
    api: tuple[Engine, TestClient[Any, Any]], tmp_path: Path
) -> None:
    engine, client = api
    eid = await engine.submit("myapp:demo/workflow.mixed", [])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("6")
    before = await history_lines(engine, eid)
    _, old = engine.registry.function("myapp:demo/workflow.mixed")
    old_digest = old.component_id.digest

    # A compatible edit that moves every line down by two.
    shifted = "// a comment\n// another one\n" + MIXED_JS
    (tmp_path / "mixed.js").write_text(shifted)
    status = await engine.reload()
    assert status.ok, status.error
    _, new = engine.registry.function("myapp:demo/workflow.mixed")
    new_digest = new.component_id.digest
    assert new_digest != old_digest

    r = await client.put(f"/v1/executions/{eid}/backtraces")
    assert r.status == 200, await r.text()
    assert (await r.json())["component_digest"] == new_digest
    after = await history_lines(engine, eid)
    assert after == [(v, e, None if line is None else line + 2) for v, e, line in before]
    bt = await engine.storage.get_backtrace(eid, after[1][0])
    assert bt is not None and bt.component_digest == new_digest
    r = await client.get(f"/v1/components/{new_digest}/source")
    source = (await r.json())["source"]
    assert source == shifted
    assert "stepSubmit(js, 1, 0)" in source.splitlines()[after[1][2] - 1]  # type: ignore[operator]
    r = await client.get(f"/v1/components/{old_digest}/source")
    assert (await r.json())["source"] == MIXED_JS

    # An incompatible edit: refused, the stored backtraces stay.
    (tmp_path / "mixed.js").write_text(MIXED_JS.replace("stepSubmit(js, 2, 0);", ""))
    status = await engine.reload()
    assert status.ok, status.error
    r = await client.put(f"/v1/executions/{eid}/backtraces")
    assert r.status == 409
    assert "does not replay" in (await r.json())["error"]
    assert await history_lines(engine, eid) == after
