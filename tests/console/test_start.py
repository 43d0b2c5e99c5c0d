"""A first start compiles components for a while: the console shows each one as it
loads instead of a silent splash."""

from __future__ import annotations

from pathlib import Path

from obelisk_tui.app import ConnectingScreen, ObeliskApp
from obelisk_tui.backend import ConsoleBackend, EmbeddedBackend
from tests.console.conftest import screen_text, until, write_deployment


async def test_the_start_screen_lists_each_component_as_it_loads(tmp_path: Path) -> None:
    deployment = write_deployment(tmp_path)
    seen: dict[str, float | None] = {}
    shown: list[str] = []

    async def connect() -> ConsoleBackend:
        starting = app.screen
        assert isinstance(starting, ConnectingScreen)
        backend = await EmbeddedBackend.start(
            deployment, tmp_path / "data", on_progress=app.load_progress
        )
        seen.update(starting.components)
        shown.append(starting.shown)
        return backend

    app = ObeliskApp(connect, what="test")
    async with app.run_test(size=(120, 40)) as pilot:
        from obelisk_tui.screens.executions import ExecutionsScreen

        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")
        # Its first load done (the header titled): the app is whole before it closes.
        await until(pilot, lambda: "0 executions" in screen_text(app), what="the first load")
        assert app.screen_errors == []
    names = {'activity_js "step"', 'activity_js "spin"', 'activity_stub "approval"'}
    names |= {'workflow_js "fanout"', 'workflow_js "order"'}
    assert names <= set(seen), seen
    assert all(took is not None and took >= 0 for took in seen.values()), seen
    text = shown[0]
    assert f"components: {len(seen)} of {len(seen)} loaded" in text
    assert 'activity_js "step": ready (' in text


async def test_the_engine_finishes_its_start_after_the_first_rows(tmp_path: Path) -> None:
    """The embedded engine's deferred start (its report of waiting executions, its file
    watcher) begins once the list's first rows are drawn, and it does begin."""
    from engine.reload import ReloadStatus
    from obelisk_tui.screens.executions import ExecutionsScreen

    deployment = write_deployment(tmp_path)
    reported: list[bool] = []  # at the start's report: were the first rows drawn?

    def on_status(status: ReloadStatus) -> None:
        if status.trigger == "start":
            screen = app.screen
            reported.append(isinstance(screen, ExecutionsScreen) and screen.first_rows.is_set())

    async def connect() -> ConsoleBackend:
        backend = await EmbeddedBackend.start(deployment, tmp_path / "data")
        # Only the console's `finish_start()` may let it begin, not the fallback delay.
        backend.engine.reloader.FINISH_START_AFTER = 120.0
        backend.engine.reloader.add_listener(on_status)
        return backend

    app = ObeliskApp(connect, what="test")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: reported != [], what="the start's report")
        assert reported == [True]
        assert app.screen_errors == []
