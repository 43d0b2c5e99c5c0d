"""Snapshots (pytest-textual-snapshot) of the main screens on fixed data (`fixed_data`).

Update them after an intended change of the look with
`.venv/bin/python -m pytest tests/console/test_snapshots.py --snapshot-update`, and look
at the SVGs in `__snapshots__/` before committing them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from obelisk_tui.app import ObeliskApp
from obelisk_tui.screens.executions import ExecutionsScreen
from obelisk_tui.widgets.execution_list import ExecutionList
from tests.console import fixed_data

SIZE = (150, 40)


@pytest.fixture
def fixed_app(tmp_path: Path) -> ObeliskApp:
    deployment, data = asyncio.run(fixed_data.build(tmp_path))
    return ObeliskApp(
        fixed_data.connector(deployment, data), now=lambda: fixed_data.NOW, live=False
    )


async def _loaded(pilot: Any) -> None:
    app = pilot.app
    for _ in range(500):
        screen = app.screen
        lists = screen.query(ExecutionList) if isinstance(screen, ExecutionsScreen) else []
        if lists and lists.first().rows:
            break
        await pilot.pause(0.02)
    await pilot.pause()


async def _open(pilot: Any, key: str, tab: str, wait_for: str) -> None:
    await _loaded(pilot)
    lst = pilot.app.screen.query_one(ExecutionList)
    lst.move_cursor(lst.index_of(fixed_data.IDS[key]))
    await pilot.press("enter")
    if tab != "1":
        await pilot.press(tab)
    from tests.console.conftest import screen_text

    for _ in range(500):
        if wait_for in screen_text(pilot.app):
            break
        await pilot.pause(0.02)
    await pilot.pause()


def test_executions_list(snap_compare: Any, fixed_app: ObeliskApp) -> None:
    assert snap_compare(fixed_app, terminal_size=SIZE, run_before=_loaded)


def test_detail_state(snap_compare: Any, fixed_app: ObeliskApp) -> None:
    async def run_before(pilot: Any) -> None:
        await _open(pilot, "fanout", "1", "BlockedByJoinSet")

    assert snap_compare(fixed_app, terminal_size=SIZE, run_before=run_before)


def test_detail_events(snap_compare: Any, fixed_app: ObeliskApp) -> None:
    async def run_before(pilot: Any) -> None:
        await _open(pilot, "err", "2", "unlucky 13")

    assert snap_compare(fixed_app, terminal_size=SIZE, run_before=run_before)


def test_detail_children(snap_compare: Any, fixed_app: ObeliskApp) -> None:
    async def run_before(pilot: Any) -> None:
        await _open(pilot, "fanout", "3", "g:1_2")

    assert snap_compare(fixed_app, terminal_size=SIZE, run_before=run_before)
