"""The footer is rebuilt only when the keys it shows change (`widgets/key_footer.py`):
Textual rebuilt it on every `refresh_bindings` (7–9 times while a detail screen opened)
and each rebuild left its key widgets alive (Textual #6666): the console's memory grew
by ~16 MB a minute under the demo's traffic."""

from __future__ import annotations

import gc

import pytest
from textual.widgets._footer import FooterKey

from engine.engine import Engine
from obelisk_tui.screens import detail
from obelisk_tui.screens.detail import ExecutionDetailScreen
from obelisk_tui.widgets.key_footer import KeyFooter
from tests.console.conftest import APPROVE, open_console, screen_text, until


async def test_the_footer_is_rebuilt_only_when_its_keys_change(console_engine: Engine) -> None:
    eid = await console_engine.submit(APPROVE, ["footer"])
    async with open_console(console_engine) as (app, pilot):
        app.open_execution(eid)
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        await until(pilot, lambda: "c Cancel" in screen_text(app), what="its footer")
        footer = app.screen.query_one(KeyFooter)
        recomposes = 0
        original = KeyFooter.recompose

        async def counted(self: KeyFooter) -> None:
            nonlocal recomposes
            recomposes += 1
            await original(self)

        KeyFooter.recompose = counted  # type: ignore[method-assign]
        try:
            keys = set(footer.query(FooterKey))
            for _ in range(20):  # nothing changed: nothing rebuilt
                app.screen.refresh_bindings()
                await pilot.pause()
            assert recomposes == 0 and set(footer.query(FooterKey)) == keys

            # Only whether a key applies changed (`P Parent` greyed: a top-level
            # execution; then it has a parent): the same key widgets, no longer greyed.
            (parent,) = [k for k in keys if k.action == "parent"]
            assert parent.has_class("-disabled")
            screen = app.screen
            assert isinstance(screen, ExecutionDetailScreen) and screen.info is not None
            screen.info = {**screen.info, "parent_id": "E_01PARENT"}
            screen.refresh_bindings()
            await until(pilot, lambda p=parent: not p.has_class("-disabled"), what="P on")
            assert set(footer.query(FooterKey)) == keys
        finally:
            KeyFooter.recompose = original  # type: ignore[method-assign]

        # A change of width rebuilds it; the keys it replaced are not kept alive (a
        # generation may linger in Textual's layout caches, not one per rebuild).
        replaced: set[int] = set()
        for width in (100, 120, 90, 140, 110, 130):
            old = set(footer.query(FooterKey))
            replaced |= {id(k) for k in old}
            await pilot.resize_terminal(width, 30)
            await until(
                pilot,
                lambda old=old: bool(new := set(footer.query(FooterKey))) and not old & new,
                what="the new keys",
            )
        generation = len(old)
        del old, keys, parent
        gc.collect()
        alive = [o for o in gc.get_objects() if isinstance(o, FooterKey) and id(o) in replaced]
        # Six generations replaced: fewer than two alive (a leak keeps one per rebuild).
        assert len(alive) < 2 * generation < len(replaced), (len(alive), generation)


async def test_the_detail_footer_is_composed_once_with_the_loaded_keys(
    console_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not once without the execution's keys (not loaded yet: which actions apply is not
    known) and again with them: 30–80 ms each on `enter` (`bench/console.py --only
    detail`). The keys are not bound to the footer's `compact` (each bound key left a
    watcher of the footer behind)."""
    # The fallback for a slow first load must not fire in a slow test run.
    monkeypatch.setattr(detail, "FOOTER_WAIT", 60.0)
    eid = await console_engine.submit(APPROVE, ["footer once"])
    composed: list[list[str]] = []
    original = KeyFooter.recompose

    async def counted(self: KeyFooter) -> None:
        await original(self)
        if isinstance(self.screen, ExecutionDetailScreen):
            composed.append([k.action for k in self.query(FooterKey)])

    monkeypatch.setattr(KeyFooter, "recompose", counted)
    async with open_console(console_engine) as (app, pilot):
        app.open_execution(eid)
        await until(pilot, lambda: "c Cancel" in screen_text(app), what="the loaded keys")
        screen = app.screen
        assert isinstance(screen, ExecutionDetailScreen) and screen.info is not None
        for _ in range(5):
            await pilot.pause()
        assert len(composed) == 1, composed
        assert "act('cancel')" in composed[0] and "back" in composed[0]
        footer = screen.query_one(KeyFooter)
        assert not getattr(footer, "__watchers", {}).get("compact")
