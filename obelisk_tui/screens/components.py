"""Every deployed component, and the outcome of the last hot reload."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Static

from engine.client import ApiError
from engine.views import ComponentInfo, DeploymentInfo, upgrades_unchecked
from obelisk_tui import model
from obelisk_tui.messages import DataChanged, DeploymentReloaded
from obelisk_tui.palette import COLOURS
from obelisk_tui.screens.base import HEADER_ICON, ObeliskScreenMixin
from obelisk_tui.widgets.breadcrumb import Breadcrumb
from obelisk_tui.widgets.header import ObeliskHeader
from obelisk_tui.widgets.key_footer import KeyFooter


def reload_summary(reload: dict[str, Any]) -> str:
    """One line: "reloaded 14:02:03.120 (watch): 1 component change(s), 2 workflow
    upgrade(s): 1 continue on the new code, 1 kept on the old version"."""
    at = model.clock_time(model.parse_ts(reload.get("at")))
    trigger = reload.get("trigger")
    if trigger == "start":
        return f"started {at}"
    if not reload.get("ok"):  # the error follows, in full
        if upgrades_unchecked(reload):
            return f"reloaded {at} ({trigger}), but its workflow upgrades were not checked"
        return f"reload FAILED {at} ({trigger}) — the previous version stays"
    changes = reload.get("changes") or []
    upgrades = reload.get("upgrades") or []
    failed = sum(1 for u in upgrades if u.get("outcome") == "failed")
    text = f"reloaded {at} ({trigger}): {len(changes)} component change(s)"
    if upgrades:
        kept = len(upgrades) - failed
        text += f", {len(upgrades)} workflow upgrade(s): {kept} continue on the new code"
        if failed:
            text += f", {failed} kept on the old version"
    waiting = sum(int(o.get("executions") or 0) for o in reload.get("orphaned") or [])
    if waiting:
        text += f"; {waiting} execution(s) of removed functions wait"
    return text


def reload_role(reload: dict[str, Any]) -> str:
    """The summary's colour role: a reload that left executions on the old version
    (failed upgrades) is a warning, not a plain success."""
    if not reload.get("ok"):
        return "error"
    upgrades = reload.get("upgrades") or []
    return "warning" if any(u.get("outcome") == "failed" for u in upgrades) else "ok"


def render_reload(reload: dict[str, Any]) -> RenderableType:
    ok = bool(reload.get("ok"))
    parts: list[RenderableType] = [
        Text(reload_summary(reload), style="bold " + COLOURS[reload_role(reload)])
    ]
    if not ok and reload.get("error"):
        parts.append(Text(str(reload["error"]), style=COLOURS["error"]))
    if reload.get("changes"):
        table = Table("change", "component", "digest", box=None, padding=(0, 1))
        for c in reload["changes"]:
            table.add_row(
                str(c.get("change", "")),
                str(c.get("name", "")),
                str(c.get("new_digest") or c.get("old_digest") or "")[:23],
            )
        parts.append(table)
    if reload.get("upgrades"):
        table = Table("execution", "outcome", "reason", box=None, padding=(0, 1))
        for u in reload["upgrades"]:
            colour = COLOURS["ok" if u.get("outcome") == "success" else "error"]
            table.add_row(
                str(u.get("execution_id")),
                Text(str(u.get("outcome")), colour),
                str(u.get("reason") or ""),
            )
        parts.append(Text("workflow upgrades", style="bold"))
        parts.append(table)
    if reload.get("pinned"):
        parts.append(
            Text(
                f"{len(reload['pinned'])} old version(s) kept for executions pinned to them",
                style=COLOURS["muted"],
            )
        )
    if reload.get("orphaned"):
        parts.append(
            Text(
                "waiting: no deployed component exports their function",
                style="bold " + COLOURS["warning"],
            )
        )
        table = Table("function", "unfinished executions", box=None, padding=(0, 1))
        for o in reload["orphaned"]:
            table.add_row(str(o.get("ffqn")), str(o.get("executions")))
        parts.append(table)
    return Group(*parts)


_COLUMNS = ("name", "type", "exports", "digest", "file")


def elide_left(text: str, width: int) -> str:
    """`text` in at most `width` columns: its end, after an ellipsis, if it is longer."""
    if len(text) <= width:
        return text
    return "…" + text[len(text) - width + 1 :] if width > 1 else "…"[:width]


def render_component(c: ComponentInfo) -> RenderableType:
    head = Text()
    head.append(c["name"], "bold")
    head.append(f"  {c['type']}  {c['digest']}\n", COLOURS["muted"])
    head.append(f"file: {c['location'] or '—'}\n", COLOURS["muted"])
    table = Table("exported function", "params", "returns", box=None, padding=(0, 1))
    for f in c["exports"]:
        params = ", ".join(f"{p['name']}: {p['type']}" for p in f["params"])
        table.add_row(f["ffqn"], params, f["return_type"] or "")
    return Group(head, table)


class ComponentsScreen(ObeliskScreenMixin, Screen[None]):
    BINDINGS = [
        Binding("escape", "back", "Back"),
        # The keys of the execution list, for the table (it binds only arrows/home/end).
        Binding("j", "table('cursor_down')", show=False),
        Binding("k", "table('cursor_up')", show=False),
        Binding("g", "table('scroll_top')", show=False),
        Binding("G", "table('scroll_bottom')", show=False),
    ]

    async def action_table(self, action: str) -> None:
        await self.query_one("#components", DataTable).run_action(action)

    #: Its name in the breadcrumb.
    crumb = "components"

    def __init__(self) -> None:
        super().__init__()
        self.deployment: DeploymentInfo | None = None

    def compose(self) -> ComposeResult:
        yield ObeliskHeader(show_clock=False, icon=HEADER_ICON)
        yield Breadcrumb(id="breadcrumb")
        yield Static(id="reload-status")
        table: DataTable[str] = DataTable(id="components", cursor_type="row", zebra_stripes=True)
        yield table
        with VerticalScroll(id="component-detail-box"):
            yield Static(id="component-detail")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(*_COLUMNS)
        # The first load comes with the ScreenResume that follows the mount.

    def on_screen_resume(self) -> None:
        self.query_one(Breadcrumb).trail = self.trail()
        self.load()  # what changed while a screen was on top of this one

    def on_resize(self, _: events.Resize) -> None:
        if self.deployment is not None:
            self.show(self.deployment)  # the file column fits the new width

    def on_deployment_reloaded(self, message: DeploymentReloaded) -> None:
        self.show(message.deployment)

    def on_data_changed(self, _: DataChanged) -> None:
        # A reload that upgrades many running workflows publishes its status only at the
        # end; the new version is in force (and shown) as soon as they start committing.
        self.load_for_change(self.load)

    @work(exclusive=True)
    async def load(self) -> None:
        try:
            deployment = await self.obelisk.backend.deployment()
        except ApiError as e:
            self.obelisk.report_error(e)
            if self.deployment is None and self.is_live:  # nothing shown yet: say why
                # Only an unreachable server is retried (when it answers again); other
                # errors (a rejected token, say) reload with the next change or `r`.
                retry = "retrying" if e.status is None else "r to retry"
                self.query_one("#reload-status", Static).update(
                    Text(f"cannot read the deployment: {e.message} ({retry})", COLOURS["error"])
                )
            return
        if self.is_live:
            self.show(deployment)

    def show(self, deployment: DeploymentInfo) -> None:
        self.deployment = deployment
        self.query_one("#reload-status", Static).update(render_reload(deployment["reload"]))
        table = self.query_one(DataTable)
        row = table.cursor_row
        rows = [
            (c["name"], c["type"], str(len(c["exports"])), c["digest"][:19] + "…")
            for c in deployment["components"]
        ]
        widths = [
            max([cell_len(title), *(cell_len(r[i]) for r in rows)])
            for i, title in enumerate(_COLUMNS[:-1])
        ]
        # The file column gets what is left of the width; a path that does not fit keeps
        # its end, the file's name (the detail below has it whole).
        room = max(len("file"), self.size.width - sum(w + 2 for w in widths) - 4)
        files = [elide_left(c["location"] or "", room) for c in deployment["components"]]
        widths.append(max([len("file"), *(cell_len(f) for f in files)]))
        # Columns of fixed widths, computed here: an auto-width column is measured only
        # when the table next goes idle, and until then it is as wide as its title.
        table.clear(columns=True)
        for title, width in zip(_COLUMNS, widths, strict=True):
            table.add_column(title, width=width)
        for r, c, file in zip(rows, deployment["components"], files, strict=True):
            table.add_row(*r, file, key=c["name"])
        if deployment["components"]:
            table.move_cursor(row=min(row, len(deployment["components"]) - 1))
            self._detail(table.cursor_row)

    @on(DataTable.RowHighlighted)
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._detail(event.cursor_row)

    def _detail(self, index: int) -> None:
        if self.deployment is None or not 0 <= index < len(self.deployment["components"]):
            return
        self.query_one("#component-detail", Static).update(
            render_component(self.deployment["components"][index])
        )

    def action_back(self) -> None:
        self.app.pop_screen()
