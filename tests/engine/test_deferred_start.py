"""`Engine.start(finish_later=True)` (what the console's embedded engine does): the
start's report of waiting executions and its file watcher begin on `finish_start()`,
and nothing of what they did is lost by the wait."""

from __future__ import annotations

from pathlib import Path

from engine.engine import Engine
from engine.reload import OrphanedFunction
from tests.engine.conftest import StartEngine
from tests.engine.test_hot_reload import (
    APPROVE_STUB,
    GREET_TOML,
    ORDER,
    ORDER_V1,
    blocked_child,
    changed,
    greet_js,
    workflow_toml,
    write,
)


async def test_the_start_report_waits_for_finish_start(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(workflow_toml(), files={"order.js": ORDER_V1})
    await blocked_child(engine, await engine.submit(ORDER, ["o-1"]))
    await engine.stop()
    write(tmp_path / "deployment.toml", APPROVE_STUB)  # the workflow's function is gone
    deployment, data = tmp_path / "deployment.toml", tmp_path / "data"

    again = await Engine.start(deployment, data, watch=False, finish_later=True)
    try:
        # Not counted yet: the report waits for the caller.
        assert again.reload_status().orphaned == []
        with again.reload_events() as events:
            again.finish_start()
            status = await events.wait_for(lambda s: s.trigger == "start", 10)
        assert status.ok and status.orphaned == [OrphanedFunction(ORDER, 1)]
        assert again.reload_status() == status
    finally:
        await again.stop()

    # Asked for before `finish_start()`: the answer waits for the report.
    again = await Engine.start(deployment, data, watch=False, finish_later=True)
    try:
        status = await again.reload_status_now()
        assert status.trigger == "start" and status.orphaned == [OrphanedFunction(ORDER, 1)]
    finally:
        await again.stop()


async def test_a_reload_before_the_start_report_comes_after_it(
    start_engine: StartEngine,
) -> None:
    engine = await start_engine(
        GREET_TOML, files={"greet.js": greet_js("hello")}, watch=False, finish_later=True
    )
    with engine.reload_events() as events:
        reloading = engine.reload()  # waits for the start's report (the reload lock)
        engine.finish_start()
        manual = await reloading
        first = await events.wait_for(lambda s: True, 10)
        second = await events.wait_for(lambda s: True, 10)
    assert (first.trigger, second.trigger) == ("start", "manual")
    assert second == manual and manual.generation == 1
    assert engine.reload_status() == manual  # not replaced by the start's report


async def test_a_file_edited_before_the_deferred_watcher_starts_is_reloaded(
    start_engine: StartEngine, tmp_path: Path
) -> None:
    engine = await start_engine(
        GREET_TOML, files={"greet.js": greet_js("hello")}, finish_later=True
    )
    with engine.reload_events() as events:
        write(tmp_path / "greet.js", greet_js("hi"))  # no watcher yet
        engine.finish_start()
        status = await events.wait_for(changed("greet"), 30)
    assert status.ok and status.trigger == "watch"
    assert status.changed_paths == [str((tmp_path / "greet.js").resolve())]
