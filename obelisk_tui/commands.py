"""Command palette (ctrl+p): open an execution by id, and the console's screens."""

from __future__ import annotations

import contextlib
from functools import partial
from typing import TYPE_CHECKING, cast

from textual.command import DiscoveryHit, Hit, Hits, Provider

from engine.client import ApiError
from obelisk_tui import model
from obelisk_tui.list_query import ExecutionQuery

if TYPE_CHECKING:
    from obelisk_tui.app import ObeliskApp


class ExecutionCommands(Provider):
    """Typing an id (prefix) offers the matching executions."""

    @property
    def obelisk(self) -> ObeliskApp:
        return cast("ObeliskApp", self.app)

    async def search(self, query: str) -> Hits:
        text = query.strip()
        if not text.upper().startswith("E_") or len(text) < 3:
            return
        wanted = "E_" + text[2:]
        try:
            rows = await self.obelisk.backend.list_executions(
                ExecutionQuery(id_prefix=wanted), 0, 12
            )
            if all(r["execution_id"] != wanted for r in rows):
                # A workflow's many children (newer, same prefix) can fill the page.
                with contextlib.suppress(ApiError):
                    rows.insert(0, await self.obelisk.backend.status(wanted))
        except ApiError:
            return
        for info in rows:
            label, _ = model.state_label(info)
            eid = info["execution_id"]
            yield Hit(
                _id_score(eid, wanted),
                f"Open execution {eid}",
                partial(self.obelisk.open_execution, eid),
                help=f"{info['ffqn']} · {label}",
            )

    async def discover(self) -> Hits:
        yield DiscoveryHit(
            "Open execution by id…", self._hint, help="type E_ and the start of an id"
        )

    def _hint(self) -> None:
        self.app.notify("In the command palette, type an execution id (E_…) to open it.")


def _id_score(execution_id: str, typed: str) -> float:
    """The exact id first, then the closest (a parent before its children)."""
    if execution_id == typed:
        return 1.0
    return 0.9 - min(len(execution_id) - len(typed), 500) / 1000


class ScreenCommands(Provider):
    @property
    def obelisk(self) -> ObeliskApp:
        return cast("ObeliskApp", self.app)

    def _commands(self) -> list[tuple[str, str, object]]:
        app = self.obelisk
        return [
            ("Executions", "the live list of executions", app.action_executions),
            ("Components", "deployed components and hot-reload status", app.action_components),
            ("Submit an execution", "pick a function and its params", app.action_submit),
            ("Freeze / resume live refresh", "space", app.action_freeze),
        ]

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, help_text, callback in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)  # type: ignore[arg-type]

    async def discover(self) -> Hits:
        for name, help_text, callback in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)  # type: ignore[arg-type]
