"""One execution: state machine (with time travel), events with backtraces, children,
logs and result, live."""

from __future__ import annotations

import asyncio

from rich.console import Group, RenderableType
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.widget import Widget
from textual.widgets import Static, TabbedContent, TabPane, Tree

from engine.client import ApiError
from engine.views import (
    BacktraceInfo,
    ComponentSourceInfo,
    EventEntry,
    ExecutionInfo,
    ResponseEntry,
)
from obelisk_tui import model, palette, timeline
from obelisk_tui.messages import DataChanged, DelayKey, Restyled, Tick
from obelisk_tui.screens import actions
from obelisk_tui.screens.base import HEADER_ICON
from obelisk_tui.screens.confirm import ConfirmScreen
from obelisk_tui.screens.event_json import EventJsonScreen
from obelisk_tui.screens.run_command import CommandLineHost
from obelisk_tui.widgets.breadcrumb import Breadcrumb
from obelisk_tui.widgets.children_tree import ChildrenTree
from obelisk_tui.widgets.event_log import EventLog
from obelisk_tui.widgets.header import ObeliskHeader
from obelisk_tui.widgets.key_footer import KeyFooter
from obelisk_tui.widgets.key_scroll import KeyScroll
from obelisk_tui.widgets.log_view import LogView
from obelisk_tui.widgets.source_view import SourceView
from obelisk_tui.widgets.state_view import StateView

TABS = ("state", "events", "children", "logs", "result")
#: What a read found new: the status, the new responses and the new events.
Changes = tuple[ExecutionInfo, list[ResponseEntry], list[EventEntry]]
#: Seconds the footer waits for the first load before it shows the keys known without it.
FOOTER_WAIT = 0.5


def render_result(info: ExecutionInfo) -> RenderableType:
    result = info.get("result")
    if result is None:
        label, colour = model.state_label(info)
        return Text.assemble(("not finished yet: ", palette.COLOURS["muted"]), (label, colour))
    kind = model.result_kind(result)
    if kind in ("ok", "err"):
        colour = model.STATE_COLOURS["finished" if kind == "ok" else "err"]
        return Group(Text(kind, style="bold " + colour), palette.json_text(result[kind]))
    failure = result.get("execution_failure") or {}
    parts: list[RenderableType] = [
        Text(
            f"execution failure: {failure.get('kind')}",
            style="bold " + model.STATE_COLOURS["failed"],
        ),
    ]
    if failure.get("reason"):
        parts.append(Text(f"reason: {failure['reason']}"))
    if failure.get("detail"):
        parts.append(Text("detail:", style="bold"))
        parts.append(Text(str(failure["detail"])))
    return Group(*parts)


class ExecutionDetailScreen(CommandLineHost):
    BINDINGS = [
        Binding("escape,backspace", "back", "Back"),
        Binding("left_square_bracket", "travel(-1)", "◀ version"),
        Binding("right_square_bracket", "travel(1)", "version ▶"),
        Binding("P", "parent", "Parent"),
        Binding("P", "explain_parent", show=False),  # greyed "Parent": say why
        Binding("p", "act('pause')", "Pause"),
        Binding("p", "explain('pause')", show=False),
        Binding("u", "act('unpause')", "Unpause"),
        Binding("u", "explain('unpause')", show=False),
        Binding("c", "act('cancel')", "Cancel"),
        Binding("c", "explain('cancel')", show=False),
        # Not in the footer: a last resort, listed by `?` help (and the README).
        Binding("X", "act('force_cancel')", "Force cancel", show=False),
        Binding("X", "explain('force_cancel')", show=False),
        Binding("S", "stub", "Stub"),
        Binding("S", "explain('stub')", show=False),
        # The engine has no retry of a finished execution: a re-submit is the retry.
        Binding("R", "resubmit", "Re-submit"),
        *[Binding(str(i + 1), f"tab('{t}')", t.title(), show=False) for i, t in enumerate(TABS)],
    ]

    def __init__(self, execution_id: str) -> None:
        super().__init__()
        self.execution_id = execution_id
        self.info: ExecutionInfo | None = None
        self.events: list[EventEntry] = []
        self.responses: list[ResponseEntry] = []
        self.steps: list[timeline.Step] = []
        self._timeline = timeline.Timeline()
        self._footer_state: tuple[bool, ...] = ()
        #: The version the diagram shows; None: the latest (live).
        self.travel: int | None = None
        self._sources: dict[str, ComponentSourceInfo | None] = {}
        self._backtraces: dict[int, BacktraceInfo | None] = {}
        #: What was read is not shown yet (`_show`).
        self._unshown = False
        # The first read begins now, while the screen is composed and mounted (~40 ms
        # with 100k executions): its data is then shown on mount, before the first
        # layout, not after a layout and a frame without it. It writes nothing to the
        # screen: what it read is taken on mount or by the first load (`_take_first`).
        self._first_read: asyncio.Task[Changes | None] | None = (
            asyncio.get_running_loop().create_task(self._read_first())
        )

    async def _read_first(self) -> Changes | None:
        try:
            return await self._read_changes()
        except ApiError:
            return None  # the load worker reads again and says why

    async def _read_changes(self) -> Changes | None:
        """What changed since what the attributes hold: the status, and if it changed, the
        new responses and events; None when the status is the same. Writes nothing."""
        backend = self.obelisk.backend
        eid = self.execution_id
        known = len(self.events)
        if self.info is None:  # nothing read yet: the status and the responses at once
            info, responses = await asyncio.gather(backend.status(eid), backend.responses(eid, 0))
        else:
            info = await backend.status(eid)
            if info == self.info:
                return None
            # Responses before events: each response read then has its request among
            # the events read (they commit before or with it), so the fold is whole.
            after = self.responses[-1]["cursor"] if self.responses else 0
            responses = await backend.responses(eid, after)
        events = await backend.events(eid, known) if info["next_version"] > known else []
        if known + len(events) > info["next_version"]:  # written meanwhile
            info = await backend.status(eid)
        return info, responses, events

    def _take(self, changes: Changes) -> None:
        """What a read found, into the attributes, to be shown (`_unshown`)."""
        self.info, responses, events = changes
        self.responses += responses
        self.events += events
        self.steps = self._timeline.update(self.events, self.responses)
        self._unshown = True

    def _take_first(self) -> bool:
        """What the first read read, into the attributes, if it is done and read it."""
        first = self._first_read
        if first is None or not first.done():
            return False
        self._first_read = None
        read = None if first.cancelled() else first.result()
        if read is None or self.info is not None:
            return False
        self._take(read)
        return True

    @property
    def crumb(self) -> str:
        """Its crumb in the breadcrumb."""
        return self.execution_id

    def compose(self) -> ComposeResult:
        yield ObeliskHeader(show_clock=False, icon=HEADER_ICON)
        yield Breadcrumb(id="breadcrumb")
        yield Static(id="detail-title")
        with TabbedContent(id="tabs", initial="state"):
            with TabPane("1 State", id="state"), KeyScroll(id="state-scroll"):
                yield StateView(id="state-view")
            # The other tabs' contents are mounted when first shown (`_tab`): fewer
            # widgets to mount, style and lay out on `enter`.
            yield TabPane("2 Events", id="events")
            yield TabPane("3 Children", id="children")
            yield TabPane("4 Logs", id="logs")
            yield TabPane("5 Result", id="result")
        yield self.make_command_line()
        # Composed once, with the keys of the loaded execution (which actions apply).
        yield KeyFooter(wait=True)

    def on_mount(self) -> None:
        self.query_one("#detail-title", Static).update(Text(f" {self.execution_id}", "bold"))
        if self._take_first():
            self._show()
            self._filled()
        # The first load comes with the ScreenResume that follows the mount. Should it be
        # slow (a busy server), the footer shows the keys known without it meanwhile.
        self.set_timer(FOOTER_WAIT, self.query_one(KeyFooter).release)

    def on_unmount(self) -> None:
        self.obelisk.opening.release()  # (closed before it was filled)
        # Closed before its first read was taken: the read is not wanted any more.
        if self._first_read is not None:
            self._first_read.cancel()

    def on_data_changed(self, _: DataChanged) -> None:
        self.load_for_change(self.load, "detail")

    def on_restyled(self, _: Restyled) -> None:
        # Another theme: what is drawn in the old one's colours is drawn again (a load
        # that read nothing new redraws nothing).
        self._show()

    def on_screen_resume(self) -> None:
        # Changes are announced to the top screen only: what happened while a dialog or
        # a child's screen was on top is shown now.
        self.query_one(Breadcrumb).trail = self.trail()
        self.load()

    def on_tick(self, _: Tick) -> None:
        # Durations of what still runs grow ("12s so far"); no I/O.
        if self.info is None:
            return
        if model.state_name(self.info["state"]) != "finished":
            self._show_title()
            self._show_state()
        if self.active_tab == "children":
            for tree in self.query(ChildrenTree):  # (none until the tab is first shown)
                tree.tick(self.obelisk.now())

    @property
    def _tabs(self) -> TabbedContent | None:
        """The tabs; None before the screen is composed (a key right after `enter`)."""
        tabs = self.query(TabbedContent)
        return tabs.first() if tabs else None

    @property
    def active_tab(self) -> str:
        tabs = self._tabs
        return "state" if tabs is None else tabs.active or "state"

    @staticmethod
    def _tab_contents(tab: str) -> list[Widget]:
        """The widgets of tab `tab` but the State tab's (composed with the screen)."""
        if tab == "events":
            return [EventLog(id="event-log"), SourceView(id="source")]
        if tab == "children":
            return [ChildrenTree(id="children-tree")]
        if tab == "logs":
            return [LogView(id="log-view")]
        if tab == "result":
            return [KeyScroll(Static(id="result-view"), id="result-scroll")]
        return []

    @on(TabbedContent.TabActivated)
    async def _tab(self, event: TabbedContent.TabActivated) -> None:
        pane = event.pane
        tab = pane.id or ""
        if not pane.children and (contents := self._tab_contents(tab)):
            await pane.mount_all(contents)
            if not self.is_live:  # closed meanwhile
                return
            self._fill(pane)
        self.load()
        if self.active_tab != tab:  # another tab chosen meanwhile: its turn comes
            return
        focus = {
            "state": "#state-scroll",
            "result": "#result-scroll",
            "events": "EventLog",
            "children": "ChildrenTree",
            "logs": "LogView",
        }.get(tab)
        for widget in pane.query(focus) if focus else ():
            widget.focus()

    def _fill(self, pane: TabPane) -> None:
        """A tab's newly mounted contents, with what `_show` shows (the Children and
        Logs tabs: what `load` reads for them)."""
        for log in pane.query(EventLog):
            log.set_events(self.events)
            if self.travel is not None:  # travelled from the State tab: that version
                log.move_cursor(self.travel)
        if self.info is not None:
            for result in pane.query("#result-view").results(Static):
                result.update(render_result(self.info))

    def action_tab(self, tab: str) -> None:
        tabs = self._tabs
        if tabs is not None:  # (a key before they exist waits for them: `_dispatch_action`)
            tabs.active = tab

    # -- data ----------------------------------------------------------------------------
    async def _read(self) -> None:
        """The execution's status, and its new responses and events if it changed, into
        the attributes (`_unshown` if anything changed)."""
        changes = await self._read_changes()
        if changes is not None:
            self._take(changes)

    @work(exclusive=True, group="detail")
    async def load(self) -> None:
        backend = self.obelisk.backend
        eid = self.execution_id
        try:
            if self._first_read is not None:  # (shielded: a cancelled load leaves it be)
                await asyncio.shield(self._first_read)
            if not self._take_first():  # (taken: just read, not read again)
                await self._read()
            if not self.is_live:
                return
            tab = self.active_tab
            # (The tab's widget is mounted before its first load: `_tab`.)
            if tab == "children" and self.query(ChildrenTree):
                descendants = await backend.descendants(eid)
                if self.is_live:
                    self.query_one(ChildrenTree).show(
                        eid, descendants, self.events, self.responses, self.obelisk.now()
                    )
            elif tab == "logs" and self.query(LogView):
                view = self.query_one(LogView)
                lines = await backend.logs(eid, view.last_id)
                if self.is_live:
                    view.extend(lines)
        except ApiError as e:
            if not self.is_live:
                return
            self.query_one(KeyFooter).release()
            if e.status == 404:
                self.query_one("#detail-title", Static).update(
                    Text(f" {e.message}", "bold " + palette.COLOURS["error"])
                )
                return
            self.obelisk.report_error(e)
            return
        if self.is_live:  # not when the screen was closed (or is closing) while we waited
            if self._unshown:  # (nothing changed: nothing redrawn)
                self._show()
            self._filled()

    def _filled(self) -> None:
        """The execution is shown: its keys in the footer, and once this frame is drawn,
        the end of the opening's hold (`ObeliskApp.open_execution`, `OpeningHold`)."""
        self.query_one(KeyFooter).release()
        if self.obelisk.opening.held:  # (the first fill; later refreshes have none)
            self.call_after_refresh(self.obelisk.opening.release)

    def _show(self) -> None:
        info = self.info
        if info is None:
            return
        self._unshown = False
        self._show_title()
        for log in self.query(EventLog):  # (the tabs not shown yet have no widgets)
            log.set_events(self.events)
        self._show_state()
        for result in self.query("#result-view").results(Static):
            result.update(render_result(info))
        applies = tuple(actions.applicable(a, [info]) for a in actions.ACTIONS)
        if applies != self._footer_state:  # Textual rebuilds the whole footer on each call
            self._footer_state = applies
            self.refresh_bindings()

    def _show_title(self) -> None:
        """The state, duration, id, FFQN and parent, fitted to the line
        (`model.detail_title`)."""
        info = self.info
        if info is None:
            return
        label, colour = model.state_label(info)
        took = model.duration(info, self.obelisk.now(), model.finished_at(self.events))
        widget = self.query_one("#detail-title", Static)
        width = widget.size.width or self.app.size.width
        # The state and duration first; the id keeps its end, the FFQN stays.
        eid, ffqn, parent = model.detail_title(
            f"{label}  {took}", info["execution_id"], info["ffqn"], info["parent_id"], width
        )
        title = Text(no_wrap=True, overflow="ellipsis")
        title.append(f" {label} ", f"bold {model.text_on(colour)} on {colour}")
        title.append(f" {took} ", "bold")
        title.append(f" {eid}", "bold")
        title.append(f"  {ffqn}")
        title.append(parent, palette.COLOURS["muted"])
        widget.update(title, layout=False)

    def on_resize(self) -> None:
        self._show_title()

    def _step(self) -> timeline.Step | None:
        if not self.steps:
            return None
        if self.travel is None:
            return self.steps[-1]
        return self.steps[min(self.travel, len(self.steps) - 1)]

    def _show_state(self) -> None:
        if self.info is not None:
            self.query_one(StateView).show(
                self.info, self.events, self._step(), self.travel is None, self.obelisk.now()
            )

    # -- time travel and backtraces ------------------------------------------------------
    def action_travel(self, delta: int) -> None:
        if not self.steps:
            return
        last = len(self.steps) - 1
        current = last if self.travel is None else self.travel
        target = max(0, min(last, current + delta))
        self.travel = None if target == last else target
        for log in self.query(EventLog):
            log.move_cursor(target)
        self._show_state()

    # `EventLog.Activated` and `.CursorMoved` are every `RowList`'s messages: the Logs
    # tab's `LogView` sends them too (its rows are not events).
    @on(EventLog.Activated, "EventLog")
    def _event_activated(self, event: EventLog.Activated) -> None:
        log = event.row_list
        if not isinstance(log, EventLog):  # (the selector says it is)
            return
        entry = log.events[event.index] if event.index < len(log.events) else None
        if entry is None:
            return
        child = model.requested_child(entry["event"])
        if child is None:  # any other event: what it holds, whole
            self.app.push_screen(EventJsonScreen(self.execution_id, entry))
            return
        self.obelisk.open_execution(child)

    @on(EventLog.RawWanted)
    def _event_raw(self, event: EventLog.RawWanted) -> None:
        for log in self.query(EventLog):  # (gone if the screen is being closed)
            if event.index < len(log.events):
                self.app.push_screen(EventJsonScreen(self.execution_id, log.events[event.index]))

    @on(EventLog.CursorMoved, "EventLog")
    def _event_selected(self, event: EventLog.CursorMoved) -> None:
        log = event.row_list
        if not isinstance(log, EventLog):  # (the selector says it is)
            return
        if not log.events:
            return
        index = event.index
        travel = None if index >= len(self.steps) - 1 else index
        if travel != self.travel:  # (the first load's cursor on the last event: shown)
            self.travel = travel
            self._show_state()
        entry = log.events[index] if index < len(log.events) else None
        if entry is None or entry.get("backtrace_id") is None:
            for view in self.query(SourceView):  # (gone if the screen is being closed)
                view.show_backtrace(None, None)
        else:
            self.show_backtrace(entry["version"])

    @work(exclusive=True, group="backtrace")
    async def show_backtrace(self, version: int) -> None:
        backend = self.obelisk.backend
        try:
            if version not in self._backtraces:
                self._backtraces[version] = await backend.backtrace(self.execution_id, version)
            bt = self._backtraces[version]
            source = None
            if bt is not None:
                digest = bt["component_digest"]
                if digest not in self._sources:
                    self._sources[digest] = await backend.component_source(digest)
                source = self._sources[digest]
        except ApiError as e:
            self.obelisk.report_error(e)
            return
        if self.is_live:
            self.query_one(SourceView).show_backtrace(bt, source)

    # -- navigation ----------------------------------------------------------------------
    def action_back(self) -> None:
        self.app.pop_screen()

    def action_explain_parent(self) -> None:
        self.notify(f"{self.execution_id} is a top-level execution", severity="warning")

    def action_parent(self) -> None:
        if self.info is None or not self.info["parent_id"]:
            self.notify(f"{self.execution_id} is a top-level execution", severity="warning")
            return
        self.obelisk.open_execution(self.info["parent_id"])

    @on(Tree.NodeSelected)
    def _child_selected(self, event: Tree.NodeSelected[str]) -> None:
        data = event.node.data
        if isinstance(data, str) and data.startswith("E_"):
            self.obelisk.open_execution(data)

    # -- actions -------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("act", "stub"):
            if self.info is None:
                return None
            return actions.key_state(str(parameters[0]) if action == "act" else "stub", [self.info])
        if action == "parent":
            return True if self.info is not None and self.info["parent_id"] else None
        return super().check_action(action, parameters)

    # -- the command line (`:`) ----------------------------------------------------------
    def command_targets(self) -> list[ExecutionInfo]:
        return [self.info] if self.info is not None else []

    def command_ids(self) -> list[str]:
        """This execution, its parent and the children its events requested."""
        ids = [self.execution_id]
        if self.info is not None and self.info["parent_id"]:
            ids.append(self.info["parent_id"])
        ids += [c for e in self.events if (c := model.requested_child(e["event"]))]
        return ids

    def action_explain(self, action: str) -> None:
        actions.explain(self.obelisk, action, [self.info] if self.info else [])

    @work(group="actions")
    async def action_stub(self) -> None:
        await self.act_on("stub")

    @work(group="actions")
    async def action_act(self, action: str) -> None:
        await self.act_on(action)

    async def act_on(self, action: str, targets: list[ExecutionInfo] | None = None) -> None:
        """`action` on `targets` (a command's), else on this execution (`actions.act`)."""
        if targets is None:
            targets = [self.info] if self.info is not None else []
        await actions.act(self.obelisk, action, targets)

    @work(group="actions")
    async def action_resubmit(self) -> None:
        """The same function and params (the `created` event's) as a new execution, after
        a confirmation; then its screen."""
        info = self.info
        created = self.events[0]["event"] if self.events else None
        if info is None or created is None or created.get("type") != "created":
            self.notify("the execution is not loaded yet", severity="warning")
            return
        params = list(created.get("params") or [])
        if not await self.app.push_screen_wait(
            ConfirmScreen(model.resubmit_question(info, params))
        ):
            return
        try:
            new = await self.obelisk.backend.submit(info["ffqn"], params)
        except ApiError as e:
            self.notify(e.message, title="re-submit failed", severity="error", timeout=8)
            return
        retried = model.result_kind(info.get("result")) not in (None, "ok")
        self.notify(
            f"{'retried' if retried else 're-submitted'} {self.execution_id} as {new}"
            + (" (a re-submit is the retry of a finished execution)" if retried else ""),
            title="re-submit",
        )
        if self.is_live:
            self.obelisk.open_execution(new)

    # -- delays (the Events and Children tabs) -------------------------------------------
    @on(DelayKey)
    def _delay_key(self, message: DelayKey) -> None:
        message.stop()
        outcome = model.delay_outcomes(self.responses).get(message.delay_id, "waiting")
        why = model.delay_refusal(message.action, message.delay_id, outcome)
        if why is not None:
            self.notify(why, title=f"cannot {message.action}", severity="warning", timeout=6)
            return
        self.cancel_delay(message.delay_id)

    @work(group="actions")
    async def cancel_delay(self, delay_id: str) -> None:
        question = (
            f"Cancel delay {delay_id}? {model.short_id(self.execution_id)} gets it as "
            "finished (cancelled) at once, not at its expiry."
        )
        if not await self.app.push_screen_wait(ConfirmScreen(question)):
            return
        try:
            await self.obelisk.backend.cancel_delay(delay_id)
        except ApiError as e:
            self.notify(e.message, title="cancel delay failed", severity="error", timeout=8)
            return
        self.notify(f"cancelled delay {delay_id}", title="cancel delay")
        self.obelisk.request_refresh()
