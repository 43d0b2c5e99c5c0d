"""The home screen: every execution, live, with filters, order, marks and actions."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Input, Static

from engine.api_types import ListOrder
from engine.client import ApiError
from engine.views import ExecutionInfo
from obelisk_tui import list_query
from obelisk_tui.list_query import ExecutionQuery
from obelisk_tui.messages import DataChanged, Tick
from obelisk_tui.screens import actions
from obelisk_tui.screens.base import HEADER_ICON
from obelisk_tui.screens.run_command import CommandLineHost
from obelisk_tui.widgets.execution_list import ExecutionList
from obelisk_tui.widgets.header import ObeliskHeader
from obelisk_tui.widgets.key_footer import KeyFooter
from obelisk_tui.widgets.state_counts import StateCounts, counts_total


class ExecutionsScreen(CommandLineHost):
    #: Its crumb in the breadcrumb of the screens above it.
    crumb = "executions"

    BINDINGS = [
        # A priority binding runs as the key arrives, before the keys typed after it are
        # forwarded: those go to the filter box it focuses, not to bindings (`q` quits).
        Binding("slash", "filter", "Filter", priority=True),
        Binding("o", "order", "Order"),
        Binding("t", "top_level", "Top-level", show=False),
        Binding("f", "follow", "Follow"),
        Binding("F", "failures", "Failures"),
        Binding("p", "act('pause')", "Pause"),
        Binding("p", "explain('pause')", show=False),
        Binding("u", "act('unpause')", "Unpause"),
        Binding("u", "explain('unpause')", show=False),
        Binding("c", "act('cancel')", "Cancel"),
        Binding("c", "explain('cancel')", show=False),
        Binding("S", "stub", "Stub"),
        Binding("S", "explain('stub')", show=False),
        Binding("m", "mark", "Mark"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.query_state = ExecutionQuery()
        self._footer_state: tuple[bool, ...] = ()
        self._title_total: int | None = None
        #: Set once the first load's rows (or its error) are drawn: the app starts what
        #: the first frame need not wait for (`ObeliskApp._after_first_rows`).
        self.first_rows = asyncio.Event()

    def compose(self) -> ComposeResult:
        yield ObeliskHeader(show_clock=False, icon=HEADER_ICON)
        yield StateCounts(self.obelisk.throughput, id="counts")
        yield Static(id="list-title")
        yield Input(
            placeholder="filter: state:locked,paused  result:err,failed  ffqn:myapp:demo/  id:E_01…  top   (enter: apply, esc: clear)",
            id="filter",
        )
        yield ExecutionList(now=self.obelisk.now, id="executions")
        yield self.make_command_line()
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one(ExecutionList).focus()
        self._update_title()
        # The first load comes with the ScreenResume that follows the mount.

    # -- data ----------------------------------------------------------------------------
    def on_data_changed(self, _: DataChanged) -> None:
        self.load_for_change(self.load, "list")

    def on_tick(self, _: Tick) -> None:
        self.query_one(ExecutionList).tick()  # relative times

    def on_screen_resume(self) -> None:
        self.load()

    @work(exclusive=True, group="list")
    async def load(self, offset: int | None = None, limit: int | None = None) -> None:
        """Counts, the list's total and the window around what is visible."""
        lst = self.query_one(ExecutionList)
        if offset is None or limit is None:
            offset, limit = lst.window()
        backend = self.obelisk.backend
        filtered = self.query_state.is_filtered
        try:
            counts, rows, *filtered_total = await asyncio.gather(
                backend.counts_by_state(results=True),
                backend.list_executions(self.query_state, offset, limit),
                *([backend.count_executions(self.query_state)] if filtered else []),
            )
        except ApiError as e:
            self.obelisk.report_error(e)
            self.first_rows.set()
            return
        bar = self.query(StateCounts)
        if not (self.is_live and lst.is_attached and bar):  # the app quit (or the
            return  # screen went, its widgets first) while we waited
        bar.first().show(counts, frozen=self.obelisk.frozen)
        # Unfiltered, the list's total is the counts' (one read: the title and the counts
        # agree even when an execution was created between two reads; a frozen list
        # would show the two numbers apart until it is live again).
        total = filtered_total[0] if filtered else counts_total(counts)
        lst.show_window(total, offset, rows)
        self._update_title(total)
        self._refresh_footer()
        if not self.first_rows.is_set():
            self.call_after_refresh(self.first_rows.set)

    def _update_title(self, total: int | None = None) -> None:
        if total is not None:
            self._title_total = total
        title = self.query_one("#list-title", Static)
        lst = self.query_one(ExecutionList)
        # Fitted to the line (a long filter wrapped out of sight): re-fitted on resize.
        width = title.size.width or self.app.size.width
        title.update(
            list_query.list_title(
                self._title_total, self.query_state, len(lst.marked), width, lst.follow
            ),
            layout=False,
        )

    def on_resize(self) -> None:
        self._update_title()

    @on(ExecutionList.WindowWanted)
    def _window_wanted(self, event: ExecutionList.WindowWanted) -> None:
        self.load(event.first, event.limit)

    @on(ExecutionList.Activated)
    def _open(self, event: ExecutionList.Activated) -> None:
        info = self.query_one(ExecutionList).row(event.index)
        if info is not None:
            self.obelisk.open_execution(info["execution_id"])

    @on(ExecutionList.CursorMoved)
    def _moved(self, _: ExecutionList.CursorMoved) -> None:
        self._refresh_footer()

    @on(ExecutionList.FollowChanged)
    def _follow_changed(self, _: ExecutionList.FollowChanged) -> None:
        self._update_title(self.query_one(ExecutionList).total)

    def action_follow(self) -> None:
        lst = self.query_one(ExecutionList)
        lst.set_follow(not lst.follow)
        self.notify(
            "the cursor follows the top row" if lst.follow else "the cursor stays where it is",
            timeout=2,
        )

    @on(ExecutionList.MarksChanged)
    def _marks(self, _: ExecutionList.MarksChanged) -> None:
        self._update_title(self.query_one(ExecutionList).total)
        self._refresh_footer()

    def _refresh_footer(self) -> None:
        """Re-check the actions of the footer only when what applies changed: Textual
        rebuilds the whole footer on `refresh_bindings` (costly twice a second)."""
        targets = self.query_one(ExecutionList).targets()
        applies = tuple(actions.applicable(a, targets) for a in actions.ACTIONS)
        if applies != self._footer_state:
            self._footer_state = applies
            self.refresh_bindings()

    # -- filter and order ----------------------------------------------------------------
    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.value = list_query.format_filter(self.query_state)
        self.set_focus(box)  # at once (`Widget.focus` is deferred)

    @on(Input.Submitted, "#filter")
    def _apply_filter(self, event: Input.Submitted) -> None:
        try:
            self.apply_filter(event.value)
        except ValueError as e:
            self.notify(str(e), title="filter", severity="error")
            return
        event.input.display = False
        self.set_focus(self.query_one(ExecutionList))

    def apply_filter(self, text: str) -> None:
        """The filter `text` (the `/` box's, `:filter`'s; empty: none); ValueError names
        what is wrong with it."""
        self._set_query(list_query.parse_filter(text, self.query_state.order))

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        if box.display:
            box.display = False
            self.set_focus(self.query_one(ExecutionList))
            return
        if self.query_state.is_filtered:
            self._set_query(ExecutionQuery(order=self.query_state.order))

    def action_order(self) -> None:
        self.set_order(None)

    def set_order(self, order: ListOrder | None) -> None:
        """The list in `order`, or (None) the next one (`o`, `:order`)."""
        q = self.query_state
        self._set_query(list_query.next_order(q) if order is None else replace(q, order=order))
        self.notify(f"order: {list_query.ORDER_TITLES[self.query_state.order]}", timeout=2)

    def action_failures(self) -> None:
        """The failures view (`result:err,failed`), on or off: the other filters stay."""
        self._set_query(list_query.toggle_failures(self.query_state))
        on = self.query_state.results == list_query.FAILURES
        self.notify("failures: finished err or failed" if on else "failures view off", timeout=2)

    def action_top_level(self) -> None:
        q = self.query_state
        self._set_query(replace(q, top_level_only=not q.top_level_only))

    def _set_query(self, query: ExecutionQuery) -> None:
        self.query_state = query
        lst = self.query_one(ExecutionList)
        lst.scroll_to(y=0, animate=False)
        lst.set_reactive(ExecutionList.cursor, 0)
        self._update_title()
        self.load(0, lst.window()[1])

    # -- actions -------------------------------------------------------------------------
    def action_mark(self) -> None:
        self.query_one(ExecutionList).action_toggle_mark()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "filter":
            # Typing in the filter box or the command line: `/` is text (`ffqn:myapp:
            # demo/`). (`focused`, not `has_focus`: that one changes only when the box
            # handles its Focus event, after the keys typed with the `/` that opened it.)
            return not isinstance(self.focused, Input)
        if action in ("act", "stub"):
            if not self.is_mounted:
                return True
            targets = self.query_one(ExecutionList).targets()
            return actions.key_state(str(parameters[0]) if action == "act" else "stub", targets)
        return super().check_action(action, parameters)

    # -- the command line (`:`) ----------------------------------------------------------
    def command_targets(self) -> list[ExecutionInfo]:
        return self.query_one(ExecutionList).targets()

    def command_ids(self) -> list[str]:
        return [r["execution_id"] for r in self.query_one(ExecutionList).rows]

    def action_explain(self, action: str) -> None:
        actions.explain(self.obelisk, action, self.query_one(ExecutionList).targets())

    @work(group="actions")
    async def action_stub(self) -> None:
        await self.act_on("stub")

    @work(group="actions")
    async def action_act(self, action: str) -> None:
        await self.act_on(action)

    async def act_on(self, action: str, targets: list[ExecutionInfo] | None = None) -> None:
        """`action` on `targets` (a command's), else on what the keys act on: the marked
        executions (unmarked once done) or the selected one (`actions.act`)."""
        lst = self.query_one(ExecutionList)
        if targets is not None:
            await actions.act(self.obelisk, action, targets)
        elif await actions.act(self.obelisk, action, lst.targets()) and lst.marked:
            lst.action_clear_marks()
