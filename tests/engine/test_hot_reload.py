"""Hot reload and workflow upgrades (SPEC §9.3) on a real engine with real files.

Files are edited while the engine runs; the tests wait for the reload status published
on `engine.reload_events()`, never for a fixed time.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import textwrap
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from engine.core import events as ev
from engine.core.state import ExecutionSummary
from engine.engine import Engine
from engine.errors import UnknownFunction
from engine.reload import OrphanedFunction, ReloadStatus
from engine.server.api import make_app
from engine.storage.contract import CreateRequest, VersionConflict
from engine.storage.sqlite import SqliteStorage
from tests.engine.conftest import StartEngine
from tests.fixtures.deployments import Deployment, ParamSpec, ms, seconds

GREET = "myapp:demo/activity.greet"
OTHER = "myapp:demo/activity.other"
ORDER = "myapp:demo/workflow.order"
APPROVE = "myapp:demo/approval.approve"


def js_activity(
    name: str, ffqn: str, params: list[ParamSpec], location: str | None = None
) -> Deployment:
    """`[[activity_js]]` in `<name>.js` (written by each test)."""
    return Deployment().activity_js(
        name,
        None,
        location=location,
        ffqn=ffqn,
        params=params,
        return_type="result<string, string>",
        exec={"tick_sleep": ms(20)},
    )


GREET_TOML = js_activity("greet", GREET, [("name", "string")])
OTHER_TOML = js_activity("other", OTHER, [])


def greet_js(word: str) -> str:
    return f'export default function greet(name) {{ return "{word} " + name; }}\n'


APPROVE_STUB = Deployment().activity_stub(
    APPROVE, params=[("order", "string")], return_type="result<string, string>"
)


def workflow_toml(strategy: str = "await", id_type: str = "string") -> Deployment:
    return APPROVE_STUB + Deployment().workflow_js(
        "order",
        None,  # order.js: each test writes its version
        ffqn=ORDER,
        params=[("id", id_type)],
        return_type="result<string, string>",
        blocking_strategy=strategy,
        exec={"lock_expiry": seconds(1), "tick_sleep": ms(20)},
    )


ORDER_V1 = """
import { approve } from "myapp:demo/approval";
export default function order(id) {
  const answer = approve(id);  // blocks until someone stubs the child
  return "v1 " + answer;
}
"""

# Compatible: the same history, a log line more and another result.
ORDER_V2_COMPATIBLE = """
import { approve } from "myapp:demo/approval";
export default function order(id) {
  console.log("running version 2");
  const answer = approve(id);
  return "v2 " + answer;
}
"""

# Incompatible: the child is requested with other params.
ORDER_V2_INCOMPATIBLE = """
import { approve } from "myapp:demo/approval";
export default function order(id) {
  const answer = approve(id + "!");
  return "v2 " + answer;
}
"""

# Incompatible: returns before the call its log records.
ORDER_V2_RETURNS_EARLY = """
export default function order(id) {
  return "v2 without approval";
}
"""

# Does not load: imports a function nobody exports.
ORDER_BROKEN_IMPORT = """
import { reject } from "myapp:demo/approval";
export default function order(id) { return reject(id); }
"""


def write(path: Path, text: str | Deployment) -> None:
    if isinstance(text, Deployment):
        text = text.render()
    path.write_text(textwrap.dedent(text))


async def edit_and_wait(
    engine: Engine,
    path: Path,
    text: str | Deployment,
    until: Callable[[ReloadStatus], bool],
    timeout: float = 30.0,
) -> ReloadStatus:
    """Write `path` and wait for the first reload status satisfying `until`."""
    with engine.reload_events() as events:
        write(path, text)
        return await events.wait_for(until, timeout)


def changed(name: str) -> Callable[[ReloadStatus], bool]:
    return lambda s: not s.ok or any(c.name == name for c in s.changes)


async def wait_summary(
    engine: Engine,
    execution_id: str,
    predicate: Callable[[ExecutionSummary], bool],
    timeout: float = 30.0,
) -> ExecutionSummary:
    """Wait (on the storage's change feed) until the execution's summary satisfies it."""
    feed = engine.storage.changes()
    async with asyncio.timeout(timeout):
        while True:
            generation = feed.generation
            summary = await engine.storage.get_summary(execution_id)
            if predicate(summary):
                return summary
            await feed.wait_changed(generation, 0.5)


async def blocked_child(engine: Engine, execution_id: str) -> str:
    """Wait until the workflow waits for its stub child; return the child's id."""
    await wait_summary(
        engine,
        execution_id,
        lambda s: (
            s.state.__struct_config__.tag in ("blocked_by_join_set", "pending_at")
            and s.join_set_count > 0
            and any(c.submitted > c.received for c in s.join_sets.values())
        ),
    )
    events = await engine.storage.get_events(execution_id)
    children = [
        e.event.event.request.child_execution_id
        for e in events
        if isinstance(e.event, ev.HistoryEvent)
        and isinstance(e.event.event, ev.JoinSetRequest)
        and isinstance(e.event.event.request, ev.ChildExecutionRequest)
    ]
    assert len(children) == 1, children
    return children[0]


def upgrade_events(events: list[ev.StoredEvent]) -> list[ev.ComponentUpgradeFinished]:
    return [e.event for e in events if isinstance(e.event, ev.ComponentUpgradeFinished)]


# ---------------------------------------------------------------------------------------
# Activities and the deployment file
# ---------------------------------------------------------------------------------------


async def test_start_status_and_subscription(start_engine: StartEngine, tmp_path: Path) -> None:
    engine = await start_engine(GREET_TOML, files={"greet.js": greet_js("hello")})
    status = engine.reload_status()
    assert status.ok and status.trigger == "start" and status.generation == 0
    assert status.deployment_id == engine.deployment_id
    assert status.to_json()["deployment_path"] == str((tmp_path / "deployment.toml").resolve())
    manual = await engine.reload()  # nothing changed: still reported
    assert manual.ok and manual.changes == [] and manual.generation == 1
    assert engine.reload_status() == manual


async def test_edited_js_activity_runs_the_new_code(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(GREET_TOML, files={"greet.js": greet_js("hello")})
    eid = await engine.submit(GREET, ["ann"])
    assert await engine.result(eid, timeout=10) == ev.ResultOk("hello ann")
    old_digest = engine.registry.function(GREET)[1].component_id.digest
    old_deployment = engine.deployment_id

    status = await edit_and_wait(engine, tmp_path / "greet.js", greet_js("hi"), changed("greet"))
    assert status.ok, status.error
    assert status.trigger == "watch"
    assert str(tmp_path / "greet.js") in status.changed_paths
    [change] = status.changes
    assert (change.type, change.change, change.old_digest) == ("activity_js", "changed", old_digest)
    assert change.new_digest == engine.registry.function(GREET)[1].component_id.digest
    assert change.new_digest != old_digest
    assert status.deployment_id == engine.deployment_id != old_deployment

    eid = await engine.submit(GREET, ["bob"])
    assert await engine.result(eid, timeout=10) == ev.ResultOk("hi bob")
    created = await engine.storage.get_created(eid)
    assert created.component_id.digest == change.new_digest
    assert created.deployment_id == engine.deployment_id
    # One executor for the component, the new one.
    assert [e.component.component_id.digest for e in engine.executors] == [change.new_digest]

    # Editors often write a temporary file and rename it over the original.
    with engine.reload_events() as events:
        temporary = tmp_path / ".greet.js.tmp"
        temporary.write_text(greet_js("howdy"))
        os.replace(temporary, tmp_path / "greet.js")
        status = await events.wait_for(changed("greet"))
    assert status.ok, status.error
    eid = await engine.submit(GREET, ["cy"])
    assert await engine.result(eid, timeout=10) == ev.ResultOk("howdy cy")


async def test_broken_edit_is_reported_and_the_old_version_keeps_running(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(GREET_TOML, files={"greet.js": greet_js("hello")})
    before = engine.registry
    status = await edit_and_wait(
        engine,
        tmp_path / "greet.js",
        'export default function greet(name) { return "oops" + ; }\n',
        lambda s: s.generation > 0,
    )
    assert not status.ok
    assert status.error is not None
    assert str(tmp_path / "deployment.toml") in status.error and "greet" in status.error
    assert engine.reload_status() == status
    assert engine.registry is before
    eid = await engine.submit(GREET, ["ann"])
    assert await engine.result(eid, timeout=10) == ev.ResultOk("hello ann")

    # Fixed again: the reload succeeds and the new code runs.
    status = await edit_and_wait(engine, tmp_path / "greet.js", greet_js("hey"), changed("greet"))
    assert status.ok, status.error
    eid = await engine.submit(GREET, ["ann"])
    assert await engine.result(eid, timeout=10) == ev.ResultOk("hey ann")


async def test_deployment_errors_keep_the_previous_deployment(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(GREET_TOML, files={"greet.js": greet_js("hello")})
    toml = tmp_path / "deployment.toml"
    cases = {
        "malformed TOML": (GREET_TOML.render() + "[[activity_js]\n", "malformed TOML"),
        "missing file": (GREET_TOML + OTHER_TOML, "other.js"),
        "duplicate FFQN": (
            GREET_TOML + js_activity("other", GREET, [], location="greet.js"),
            f"exports {GREET}",
        ),
    }
    for case, (text, expected) in cases.items():
        status = await edit_and_wait(engine, toml, text, lambda s: s.generation > 0)
        assert not status.ok, case
        assert status.error is not None and expected in status.error, (case, status.error)
        assert str(toml) in status.error, case
        eid = await engine.submit(GREET, ["ann"])
        assert await engine.result(eid, timeout=10) == ev.ResultOk("hello ann"), case


async def test_a_component_added_to_the_toml_becomes_submittable(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(GREET_TOML, files={"greet.js": greet_js("hello")})
    with pytest.raises(UnknownFunction):
        await engine.submit(OTHER, [])
    greet_component = engine.registry.function(GREET)[1]
    greet_executor = next(e for e in engine.executors if e.component is greet_component)

    write(tmp_path / "other.js", 'export default function other() { return "other"; }\n')
    status = await edit_and_wait(
        engine, tmp_path / "deployment.toml", GREET_TOML + OTHER_TOML, changed("other")
    )
    assert status.ok, status.error
    assert [(c.name, c.change) for c in status.changes] == [("other", "added")]
    eid = await engine.submit(OTHER, [])
    assert await engine.result(eid, timeout=10) == ev.ResultOk("other")
    # The unchanged component was neither reloaded nor restarted.
    assert engine.registry.function(GREET)[1] is greet_component
    assert greet_executor in engine.executors

    # The new file is watched from now on.
    status = await edit_and_wait(
        engine,
        tmp_path / "other.js",
        'export default function other() { return "other 2"; }\n',
        changed("other"),
    )
    assert status.ok, status.error
    eid = await engine.submit(OTHER, [])
    assert await engine.result(eid, timeout=10) == ev.ResultOk("other 2")

    # Removed again: its FFQN is gone, its executor stopped.
    status = await edit_and_wait(engine, tmp_path / "deployment.toml", GREET_TOML, changed("other"))
    assert [(c.name, c.change) for c in status.changes] == [("other", "removed")]
    with pytest.raises(UnknownFunction):
        await engine.submit(OTHER, [])
    assert [e.component for e in engine.executors] == [greet_component]


async def test_api_deployment_reports_the_last_reload(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(GREET_TOML, files={"greet.js": greet_js("hello")})
    async with TestClient(TestServer(make_app(engine, None))) as client:
        response = await client.get("/v1/deployment")
        assert response.status == 200
        body = await response.json()
        assert body["deployment_id"] == engine.deployment_id
        assert [c["name"] for c in body["components"]] == ["greet"]
        assert body["reload"]["ok"] is True and body["reload"]["trigger"] == "start"

        status = await edit_and_wait(
            engine, tmp_path / "greet.js", "export default function (", lambda s: s.generation > 0
        )
        body = await (await client.get("/v1/deployment")).json()
        assert body["reload"]["ok"] is False
        assert body["reload"]["error"] == status.error
        assert body["reload"]["generation"] == 1

        status = await edit_and_wait(
            engine, tmp_path / "greet.js", greet_js("hi"), changed("greet")
        )
        body = await (await client.get("/v1/deployment")).json()
        assert body["reload"]["ok"] is True
        [change] = body["reload"]["changes"]
        assert change == {
            "type": "activity_js",
            "name": "greet",
            "change": "changed",
            "old_digest": status.changes[0].old_digest,
            "new_digest": body["components"][0]["digest"],
        }
        assert "/v1/deployment" in (await (await client.get("/openapi.json")).json())["paths"]


# ---------------------------------------------------------------------------------------
# Workflow upgrades
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_compatible_workflow_upgrade_continues_on_the_new_code(
    start_engine: StartEngine, tmp_path: Path, strategy: str
) -> None:
    engine = await start_engine(workflow_toml(strategy), files={"order.js": ORDER_V1})
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)
    before = await engine.storage.get_events(eid)

    status = await edit_and_wait(
        engine, tmp_path / "order.js", ORDER_V2_COMPATIBLE, changed("order")
    )
    assert status.ok, status.error
    # The check wrote nothing but its outcome (a run holding the lock is released first).
    after = await engine.storage.get_events(eid)
    added = [type(e.event) for e in after[len(before) :]]
    assert added[-1] is ev.ComponentUpgradeFinished
    assert set(added[:-1]) <= {ev.Unlocked}, added
    new_digest = engine.registry.function(ORDER)[1].component_id.digest
    [upgrade] = status.upgrades
    assert (upgrade.execution_id, upgrade.outcome, upgrade.to_digest) == (
        eid,
        "success",
        new_digest,
    )
    assert upgrade.pinned_digest is None
    [event] = upgrade_events(await engine.storage.get_events(eid))
    assert event == ev.ComponentUpgradeFinished(
        new_digest, status.deployment_id, ev.UpgradeSuccess()
    )

    await engine.stub(child, {"ok": "yes"})
    assert await engine.result(eid, timeout=10) == ev.ResultOk("v2 yes")
    logs = await engine.storage.get_logs(eid)
    assert any("running version 2" in line.message for line in logs)
    assert engine.reloader.pinned_executors == {}


async def test_workflow_that_does_not_load_keeps_the_old_version(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(workflow_toml(), files={"order.js": ORDER_V1})
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)
    status = await edit_and_wait(
        engine, tmp_path / "order.js", ORDER_BROKEN_IMPORT, lambda s: s.generation > 0
    )
    assert not status.ok
    assert status.error is not None and "reject" in status.error, status.error
    assert upgrade_events(await engine.storage.get_events(eid)) == []
    await engine.stub(child, {"ok": "yes"})
    assert await engine.result(eid, timeout=10) == ev.ResultOk("v1 yes")


@pytest.mark.parametrize(
    ("strategy", "edit", "reason"),
    [
        ("await", ORDER_V2_INCOMPATIBLE, '["o-1!"]'),
        ("interrupt", ORDER_V2_INCOMPATIBLE, '["o-1!"]'),
        ("await", ORDER_V2_RETURNS_EARLY, "the function returned, but the log continues"),
    ],
    ids=["other-params-await", "other-params-interrupt", "returns-early"],
)
async def test_incompatible_workflow_upgrade_finishes_on_the_old_code(
    start_engine: StartEngine, tmp_path: Path, strategy: str, edit: str, reason: str
) -> None:
    engine = await start_engine(workflow_toml(strategy), files={"order.js": ORDER_V1})
    old_digest = engine.registry.function(ORDER)[1].component_id.digest
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)

    status = await edit_and_wait(engine, tmp_path / "order.js", edit, changed("order"))
    assert status.ok, status.error
    new_digest = engine.registry.function(ORDER)[1].component_id.digest
    [upgrade] = status.upgrades
    assert (upgrade.execution_id, upgrade.outcome) == (eid, "failed")
    assert (upgrade.from_digest, upgrade.to_digest, upgrade.pinned_digest) == (
        old_digest,
        new_digest,
        old_digest,
    )
    assert reason in upgrade.reason and "version" in upgrade.reason, upgrade.reason
    [event] = upgrade_events(await engine.storage.get_events(eid))
    assert event.digest == new_digest
    assert event.outcome == ev.UpgradeFailed(upgrade.reason)
    assert [(p.digest, p.executions, p.running) for p in status.pinned] == [(old_digest, 1, True)]
    assert set(engine.reloader.pinned_executors) == {old_digest}

    # New executions run the new code meanwhile.
    fresh = await engine.submit(ORDER, ["o-2"])
    if edit == ORDER_V2_INCOMPATIBLE:
        fresh_child = await blocked_child(engine, fresh)
        fresh_events = await engine.storage.get_events(fresh)
        assert any(
            isinstance(e.event, ev.HistoryEvent)
            and isinstance(e.event.event, ev.JoinSetRequest)
            and isinstance(e.event.event.request, ev.ChildExecutionRequest)
            and e.event.event.request.params == ["o-2!"]
            for e in fresh_events
        )
        await engine.stub(fresh_child, {"ok": "no"})
        assert await engine.result(fresh, timeout=10) == ev.ResultOk("v2 no")
    else:
        assert await engine.result(fresh, timeout=10) == ev.ResultOk("v2 without approval")

    # The old execution finishes on the old code.
    await engine.stub(child, {"ok": "yes"})
    assert await engine.result(eid, timeout=10) == ev.ResultOk("v1 yes")
    locks = [
        e.event for e in await engine.storage.get_events(eid) if isinstance(e.event, ev.Locked)
    ]
    assert locks[-1].component_id.digest == old_digest

    # The old version is retired once nothing is pinned to it.
    async with asyncio.timeout(10):
        while engine.reloader.pinned_executors:
            await asyncio.sleep(0.05)
    assert all(e.component.component_id.digest != old_digest for e in engine.executors)


ORDER_V1_LOGGING = ORDER_V1.replace(
    "  const answer = approve(id);", '  console.log("ordering", id);\n  const answer = approve(id);'
)


@pytest.mark.parametrize("while_stopped", [False, True], ids=["reload", "edited-while-stopped"])
async def test_logging_before_the_history_does_not_pass_a_bad_upgrade(
    start_engine: StartEngine, tmp_path: Path, while_stopped: bool
) -> None:
    """A log line replayed before the recorded steps is no reason to stop the check."""
    assert ORDER_V1_LOGGING != ORDER_V1
    engine = await start_engine(workflow_toml(), files={"order.js": ORDER_V1_LOGGING})
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)
    incompatible = ORDER_V2_INCOMPATIBLE.replace(
        "  const answer", '  console.log("ordering", id);\n  const answer'
    )
    if while_stopped:
        await engine.stop()
        write(tmp_path / "order.js", incompatible)
        engine = await Engine.start(tmp_path / "deployment.toml", tmp_path / "data", watch=False)
    else:
        status = await edit_and_wait(engine, tmp_path / "order.js", incompatible, changed("order"))
        assert [u.outcome for u in status.upgrades] == ["failed"]
    try:
        await engine.stub(child, {"ok": "yes"})
        assert await engine.result(eid, timeout=10) == ev.ResultOk("v1 yes")
        [upgrade] = upgrade_events(await engine.storage.get_events(eid))
        assert isinstance(upgrade.outcome, ev.UpgradeFailed)
        assert '["o-1!"]' in upgrade.outcome.reason
        logs = [x.message for x in await engine.storage.get_logs(eid)]
        assert logs == ["ordering o-1"]  # stored once, by the run that wrote it
    finally:
        if while_stopped:
            await engine.stop()


async def test_removing_a_workflow_stops_its_pinned_version_too(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(workflow_toml(), files={"order.js": ORDER_V1})
    old_digest = engine.registry.function(ORDER)[1].component_id.digest
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)
    await edit_and_wait(engine, tmp_path / "order.js", ORDER_V2_INCOMPATIBLE, changed("order"))
    assert set(engine.reloader.pinned_executors) == {old_digest}
    without_workflow = APPROVE_STUB
    status = await edit_and_wait(
        engine, tmp_path / "deployment.toml", without_workflow, changed("order")
    )
    assert status.orphaned == [OrphanedFunction(ORDER, 1)]
    assert engine.reloader.pinned_executors == {}
    assert [(p.digest, p.running) for p in status.pinned] == [(old_digest, False)]
    await engine.stub(child, {"ok": "yes"})
    with pytest.raises(TimeoutError):  # waits, like every execution of a removed function
        await engine.result(eid, timeout=0.5)
    # Back (with version 2): version 1 runs it again.
    status = await edit_and_wait(
        engine, tmp_path / "deployment.toml", workflow_toml(), changed("order")
    )
    assert await engine.result(eid, timeout=10) == ev.ResultOk("v1 yes")


async def test_a_check_made_twice_records_one_outcome(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    """Two engines (here: a second check with the row read before the first pinned the
    execution) checking one execution against one version record one outcome."""
    engine = await start_engine(workflow_toml(), files={"order.js": ORDER_V1})
    eid = await engine.submit(ORDER, ["o-1"])
    await blocked_child(engine, eid)
    [stale] = await engine.storage.unfinished_executions([ORDER])
    status = await edit_and_wait(
        engine, tmp_path / "order.js", ORDER_V2_INCOMPATIBLE, changed("order")
    )
    assert [u.outcome for u in status.upgrades] == ["failed"]
    assert stale.pinned_digest is None
    target = engine.registry.function(ORDER)[1]
    again = await engine.reloader.upgrader.upgrade(
        stale, target, engine.registry, engine.deployment_id, None
    )
    assert again is None
    assert len(upgrade_events(await engine.storage.get_events(eid))) == 1


async def test_moving_back_to_a_version_upgraded_from_is_logged(
    start_engine: StartEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = await start_engine(workflow_toml(), files={"order.js": ORDER_V1})
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)
    status = await edit_and_wait(
        engine, tmp_path / "order.js", ORDER_V2_COMPATIBLE, changed("order")
    )
    assert [u.outcome for u in status.upgrades] == ["success"]
    await engine.stop()
    write(tmp_path / "order.js", ORDER_V1)  # back, while stopped (or: a lagging engine)
    again = await Engine.start(tmp_path / "deployment.toml", tmp_path / "data", watch=False)
    try:
        with caplog.at_level("WARNING", logger="obelisk.workflow"):
            await again.stub(child, {"ok": "yes"})
            assert await again.result(eid, timeout=10) == ev.ResultOk("v1 yes")
        assert any("which it was upgraded from" in r.getMessage() for r in caplog.records)
        outcomes = [type(u.outcome) for u in upgrade_events(await again.storage.get_events(eid))]
        assert outcomes == [ev.UpgradeSuccess, ev.UpgradeSuccess]
    finally:
        await again.stop()


async def test_changed_param_types_are_an_incompatible_upgrade(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(workflow_toml(), files={"order.js": ORDER_V1})
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)
    # The same code, which would replay; but "o-1" is no u32.
    retyped = workflow_toml(id_type="u32")
    assert retyped.render() != workflow_toml().render()
    status = await edit_and_wait(engine, tmp_path / "deployment.toml", retyped, changed("order"))
    assert status.ok, status.error
    [upgrade] = status.upgrades
    assert (upgrade.execution_id, upgrade.outcome) == (eid, "failed")
    assert "its params do not fit the new version's types" in upgrade.reason, upgrade.reason
    assert "params[0] (id)" in upgrade.reason, upgrade.reason
    await engine.stub(child, {"ok": "yes"})
    assert await engine.result(eid, timeout=10) == ev.ResultOk("v1 yes")


async def test_reverting_to_the_pinned_version_unpins(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(workflow_toml(), files={"order.js": ORDER_V1})
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)
    status = await edit_and_wait(
        engine, tmp_path / "order.js", ORDER_V2_INCOMPATIBLE, changed("order")
    )
    assert [u.outcome for u in status.upgrades] == ["failed"]
    status = await edit_and_wait(engine, tmp_path / "order.js", ORDER_V1, changed("order"))
    assert status.ok, status.error
    [upgrade] = status.upgrades
    assert (upgrade.execution_id, upgrade.outcome, upgrade.pinned_digest) == (eid, "success", None)
    assert [type(e.outcome) for e in upgrade_events(await engine.storage.get_events(eid))] == [
        ev.UpgradeFailed,
        ev.UpgradeSuccess,
    ]
    await engine.stub(child, {"ok": "yes"})
    assert await engine.result(eid, timeout=10) == ev.ResultOk("v1 yes")


async def pinned_then_stopped(start_engine: StartEngine, tmp_path: Path) -> tuple[str, str, str]:
    """An execution pinned to version 1 by an incompatible edit, then the engine stopped:
    (version 1's digest, the execution, its stub child)."""
    engine = await start_engine(workflow_toml("interrupt"), files={"order.js": ORDER_V1})
    old_digest = engine.registry.function(ORDER)[1].component_id.digest
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)
    await edit_and_wait(engine, tmp_path / "order.js", ORDER_V2_INCOMPATIBLE, changed("order"))
    await engine.stop()
    return old_digest, eid, child


async def test_pinned_execution_finishes_on_its_version_after_a_restart(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    old_digest, eid, child = await pinned_then_stopped(start_engine, tmp_path)

    # Restarted with version 2 only: version 1 is rebuilt from its stored source.
    again = await Engine.start(tmp_path / "deployment.toml", tmp_path / "data", watch=False)
    try:
        status = again.reload_status()
        assert status.upgrades == []  # already known to be incompatible with version 2
        assert [(p.digest, p.executions, p.running) for p in status.pinned] == [
            (old_digest, 1, True)
        ]
        fresh = await again.submit(ORDER, ["o-2"])
        await again.stub(child, {"ok": "yes"})
        assert await again.result(eid, timeout=10) == ev.ResultOk("v1 yes")
        locks = [
            e.event for e in await again.storage.get_events(eid) if isinstance(e.event, ev.Locked)
        ]
        assert locks[-1].component_id.digest == old_digest
        # New executions run version 2 meanwhile.
        await again.stub(await blocked_child(again, fresh), {"ok": "no"})
        assert await again.result(fresh, timeout=10) == ev.ResultOk("v2 no")
        # The rebuilt version is retired once nothing is pinned to it, and the status
        # read now says so.
        async with asyncio.timeout(10):
            while again.reloader.pinned_executors:
                await asyncio.sleep(0.05)
        assert (await again.reload_status_now()).pinned == []
        assert again.reload_status().pinned != []  # what the start reported
    finally:
        await again.stop()


async def test_pinned_execution_waits_when_its_version_cannot_be_rebuilt(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    old_digest, eid, child = await pinned_then_stopped(start_engine, tmp_path)
    # As if the database had been copied without version 1's source.
    with sqlite3.connect(tmp_path / "data" / "obelisk.sqlite") as db:
        db.execute("DELETE FROM component_sources WHERE digest = ?", (old_digest,))

    again = await Engine.start(tmp_path / "deployment.toml", tmp_path / "data", watch=False)
    try:
        status = again.reload_status()
        assert [(p.digest, p.executions, p.running) for p in status.pinned] == [
            (old_digest, 1, False)
        ]
        await again.stub(child, {"ok": "yes"})
        with pytest.raises(TimeoutError):
            await again.result(eid, timeout=0.5)
    finally:
        await again.stop()

    # Version 1 deployed again: the execution is unpinned at start and finishes.
    write(tmp_path / "order.js", ORDER_V1)
    again = await Engine.start(tmp_path / "deployment.toml", tmp_path / "data", watch=False)
    try:
        [upgrade] = again.reload_status().upgrades
        assert (upgrade.execution_id, upgrade.outcome) == (eid, "success")
        assert await again.result(eid, timeout=10) == ev.ResultOk("v1 yes")
    finally:
        await again.stop()


@pytest.mark.parametrize("strategy", ["await", "interrupt"])
async def test_workflow_edited_while_stopped_is_checked_when_locked(
    start_engine: StartEngine, tmp_path: Path, strategy: str
) -> None:
    """The file changed while no engine ran: the first lock replays the history against
    the new code — compatible continues on it, incompatible stays on the old version."""
    engine = await start_engine(workflow_toml(strategy), files={"order.js": ORDER_V1})
    old_digest = engine.registry.function(ORDER)[1].component_id.digest
    compatible = await engine.submit(ORDER, ["o-1"])
    incompatible = await engine.submit(ORDER, ["o-2"])
    children = [await blocked_child(engine, compatible), await blocked_child(engine, incompatible)]
    await engine.stop()

    # Compatible with the first one's history only: the second asked for "o-2".
    write(
        tmp_path / "order.js",
        ORDER_V2_INCOMPATIBLE.replace('id + "!"', 'id === "o-1" ? id : id + "!"'),
    )
    again = await Engine.start(tmp_path / "deployment.toml", tmp_path / "data", watch=False)
    try:
        new_digest = again.registry.function(ORDER)[1].component_id.digest
        for child in children:
            await again.stub(child, {"ok": "yes"})
        assert await again.result(compatible, timeout=10) == ev.ResultOk("v2 yes")
        assert await again.result(incompatible, timeout=10) == ev.ResultOk("v1 yes")

        [ok] = upgrade_events(await again.storage.get_events(compatible))
        assert ok == ev.ComponentUpgradeFinished(
            new_digest, again.deployment_id, ev.UpgradeSuccess()
        )
        events = await again.storage.get_events(incompatible)
        [failed] = upgrade_events(events)
        assert failed.digest == new_digest and isinstance(failed.outcome, ev.UpgradeFailed)
        assert '["o-2!"]' in failed.outcome.reason, failed.outcome.reason
        locks = [e.event for e in events if isinstance(e.event, ev.Locked)]
        assert locks[-1].component_id.digest == old_digest
        assert not any(
            isinstance(e.event, ev.Finished) and isinstance(e.event.result, ev.ExecutionFailure)
            for e in events
        )
    finally:
        await again.stop()


async def test_executions_of_a_removed_function_are_reported_as_waiting(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(workflow_toml(), files={"order.js": ORDER_V1})
    eid = await engine.submit(ORDER, ["o-1"])
    child = await blocked_child(engine, eid)
    assert engine.reload_status().orphaned == []
    without_workflow = APPROVE_STUB
    status = await edit_and_wait(
        engine, tmp_path / "deployment.toml", without_workflow, changed("order")
    )
    assert status.ok, status.error
    assert status.orphaned == [OrphanedFunction(ORDER, 1)]
    with pytest.raises(UnknownFunction):
        await engine.submit(ORDER, ["o-2"])
    # A later reload that changes nothing (a comment), or fails, still reports them.
    status = await edit_and_wait(
        engine,
        tmp_path / "deployment.toml",
        without_workflow.render() + "\n# a comment\n",
        lambda s: True,
    )
    assert status.ok and status.changes == [] and status.orphaned == [OrphanedFunction(ORDER, 1)]
    status = await edit_and_wait(
        engine,
        tmp_path / "deployment.toml",
        without_workflow.render() + "\n[[broken",
        lambda s: True,
    )
    assert not status.ok and status.orphaned == [OrphanedFunction(ORDER, 1)]
    await engine.stop()
    write(tmp_path / "deployment.toml", without_workflow)

    # Also at start, for a deployment without it.
    again = await Engine.start(tmp_path / "deployment.toml", tmp_path / "data", watch=False)
    try:
        assert again.reload_status().orphaned == [OrphanedFunction(ORDER, 1)]
    finally:
        await again.stop()

    # Deployed again: nothing waits, the execution finishes.
    write(tmp_path / "deployment.toml", workflow_toml())
    again = await Engine.start(tmp_path / "deployment.toml", tmp_path / "data", watch=False)
    try:
        assert again.reload_status().orphaned == []
        await again.stub(child, {"ok": "yes"})
        assert await again.result(eid, timeout=10) == ev.ResultOk("v1 yes")
    finally:
        await again.stop()


# ---------------------------------------------------------------------------------------
# Storage: pins
# ---------------------------------------------------------------------------------------


async def test_storage_pins_executions_to_a_digest(tmp_path: Path) -> None:
    storage = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    try:
        now = datetime(2025, 1, 1, tzinfo=UTC)
        component = ev.ComponentId("workflow_js", "order", "sha256:" + "1" * 64)
        for eid in ("E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC", "E_01JKX3M7V9Q2R8T5W0Y4Z6A1BD"):
            created = ev.Created(ORDER, ["x"], now, component, "Dep_1")
            await storage.create(CreateRequest(eid, created), now)
        pinned_id = "E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC"
        failed = ev.ComponentUpgradeFinished("sha256:" + "2" * 64, "Dep_2", ev.UpgradeFailed("x"))
        with pytest.raises(VersionConflict):
            await storage.append_upgrade_finished(pinned_id, 5, failed, component.digest, now)
        await storage.append_upgrade_finished(pinned_id, 1, failed, component.digest, now)
        rows = await storage.unfinished_executions([ORDER])
        assert {(r.execution_id, r.pinned_digest) for r in rows} == {
            (pinned_id, component.digest),
            ("E_01JKX3M7V9Q2R8T5W0Y4Z6A1BD", None),
        }
        assert [r.execution_id for r in await storage.unfinished_executions(pinned_only=True)] == [
            pinned_id
        ]

        async def lock(pinned_digest: str | None) -> list[str]:
            locked = await storage.lock_pending(
                ffqns=[ORDER],
                batch_size=10,
                now=now,
                component_id=component,
                executor_id="Exr_1",
                run_id="Run_1",
                lock_expires_at=now + timedelta(seconds=1),
                retry_config=ev.RetryConfig(None, 100),
                pinned_digest=pinned_digest,
            )
            return [x.execution_id for x in locked]

        assert await lock(None) == ["E_01JKX3M7V9Q2R8T5W0Y4Z6A1BD"]
        assert await lock("sha256:" + "9" * 64) == []
        assert await lock(component.digest) == [pinned_id]
        # A success unpins (allowed while locked: it changes no state).
        ok = ev.ComponentUpgradeFinished("sha256:" + "2" * 64, "Dep_3", ev.UpgradeSuccess())
        await storage.append_upgrade_finished(pinned_id, 3, ok, None, now)
        assert await storage.unfinished_executions(pinned_only=True) == []
    finally:
        await storage.close()


# ---------------------------------------------------------------------------------------
# Which version wrote a history
# ---------------------------------------------------------------------------------------


def test_history_digest_is_the_version_in_force_at_the_last_history_event() -> None:
    from engine.executors.upgrade import history_digest, history_writers

    at = datetime(2026, 1, 1, tzinfo=UTC)
    retry = ev.RetryConfig(None, 0)

    def cid(d: str) -> ev.ComponentId:
        return ev.ComponentId("workflow_js", "order", d)

    def log(*events: ev.Event) -> list[ev.StoredEvent]:
        return [ev.StoredEvent(i, at, e) for i, e in enumerate(events)]

    created = ev.Created(ORDER, ["o-1"], at, cid("d1"), "Dep_1")

    def locked(d: str) -> ev.Locked:
        return ev.Locked(cid(d), "Exr_1", "Run_1", at, retry)

    history = ev.HistoryEvent(ev.JoinSetCreate("o:1"))
    upgraded = ev.ComponentUpgradeFinished("d2", "Dep_2", ev.UpgradeSuccess())
    refused = ev.ComponentUpgradeFinished("d2", "Dep_2", ev.UpgradeFailed("no"))
    assert history_digest(log(created)) is None
    assert history_digest(log(created, locked("d1"))) is None  # nothing written yet
    assert history_digest(log(created, locked("d1"), history)) == "d1"
    # Locked by another version that wrote nothing (a check that failed, a crash).
    assert history_digest(log(created, locked("d1"), history, locked("d2"))) == "d1"
    assert history_digest(log(created, locked("d1"), history, locked("d2"), refused)) == "d1"
    # Upgraded: its history is d2's from then on, also before d2 writes anything.
    assert history_digest(log(created, locked("d1"), history, upgraded)) == "d2"
    assert history_digest(log(created, locked("d1"), history, upgraded, locked("d2"))) == "d2"
    assert history_digest(log(created, locked("d2"), history, locked("d1"), history)) == "d1"
    assert history_writers(
        log(created, locked("d1"), history, upgraded, locked("d2"), history, locked("d1"), history)
    ) == ["d1", "d2", "d1"]
    assert history_writers(log(created, locked("d1"))) == []


async def test_runs_see_the_functions_of_the_registry_after_a_reload(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    """The interfaces a workflow run imports from are computed once per registry (every
    run asks for them): a reload's new registry has its own, with what it added."""
    from engine.executors.replay_host import registry_interfaces

    engine = await start_engine(GREET_TOML, files={"greet.js": greet_js("hello")})
    before = registry_interfaces(engine.registry)
    assert registry_interfaces(engine.registry) is before
    assert "myapp:demo/activity" in before and "other" not in before["myapp:demo/activity"]

    write(tmp_path / "other.js", 'export default function other() { return "other"; }\n')
    status = await edit_and_wait(
        engine, tmp_path / "deployment.toml", GREET_TOML + OTHER_TOML, changed("other")
    )
    assert status.ok, status.error
    after = registry_interfaces(engine.registry)
    assert set(after["myapp:demo/activity"]) == {"greet", "other"}
    assert set(before["myapp:demo/activity"]) == {"greet"}  # the old one unchanged
