"""`ChildrenTree`: child executions (nested) and delays of an execution, with states
and durations. `c` / `p` / `u` on a delay's row go to the screen as `DelayKey`."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from engine.views import EventEntry, ExecutionInfo, ResponseEntry
from obelisk_tui import model, palette
from obelisk_tui.messages import DelayKey

#: Columns of a child's duration ("5m 03s so far").
DURATION_WIDTH = 14


def child_label(info: ExecutionInfo, now: datetime) -> Text:
    label, colour = model.state_label(info)
    text = Text(no_wrap=True)
    text.append(f"{label:<16} ", colour)
    text.append(f"{model.duration(info, now):>{DURATION_WIDTH}}  ", palette.COLOURS["muted"])
    eid = info["execution_id"]
    parent = info["parent_id"] or ""
    text.append(eid[len(parent) :] if parent and eid.startswith(parent) else eid, "bold")
    text.append(f"  {info['ffqn']}", "")
    if info.get("children"):
        text.append(f"  ({info['children']} children)", palette.COLOURS["muted"])
    return text


def delays_of(
    events: list[EventEntry], responses: list[ResponseEntry]
) -> list[tuple[str, str, str]]:
    """(delay id, expires at, outcome) of every delay the log requested."""
    outcomes = model.delay_outcomes(responses)
    out = []
    for _, req in model.child_requests(events):
        if req.get("type") == "delay_request":
            delay = str(req.get("delay_id"))
            out.append((delay, str(req.get("expires_at")), outcomes.get(delay, "waiting")))
    return out


def _order(info: ExecutionInfo) -> tuple[str, str, int]:
    """Children by creation, then join set, then their number (`…g:1_2` before `…g:1_10`)."""
    head, _, n = info["execution_id"].rpartition("_")
    return info["created_at"], head, int(n) if n.isdigit() else 0


class ChildrenTree(Tree[str]):
    """Node data: an execution id (or a delay id, which opens nothing)."""

    BINDINGS = [
        Binding("j", "cursor_down", "Down", show=False),
        Binding("k", "cursor_up", "Up", show=False),
        Binding("g,home", "first", "First", show=False),
        Binding("G,end", "last", "Last", show=False),
        # Only on a delay's row (`check_action`); elsewhere the screen's keys act on the
        # execution.
        Binding("c", "delay('cancel')", "Cancel delay"),
        Binding("p", "delay('pause')", show=False),
        Binding("u", "delay('unpause')", show=False),
    ]

    def action_first(self) -> None:
        # No lines yet (before the tab's first load, or just cleared): nothing to move to.
        if self.last_line >= 0:
            self.move_cursor_to_line(0)

    def action_last(self) -> None:
        if self.last_line >= 0:
            self.move_cursor_to_line(self.last_line)

    DEFAULT_CSS = """
    ChildrenTree { height: 1fr; }
    """

    def __init__(self, id: str | None = None) -> None:
        # Before the tree's own: its cursor's watcher (`watch_cursor_line`) reads them.
        self._delays: set[str] = set()
        self._on_delay = False
        #: The unfinished children's nodes: their durations grow (`tick`).
        self._unfinished: dict[str, tuple[TreeNode[str], ExecutionInfo]] = {}
        super().__init__("children", id=id)
        self.show_root = False
        self.guide_depth = 3
        self._shown: object = None

    @property
    def selected_delay(self) -> str | None:
        """The delay under the cursor, if the cursor is on one."""
        data = self.cursor_node.data if self.cursor_node is not None else None
        return data if data in self._delays else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "delay":
            return self.selected_delay is not None
        return True

    def action_delay(self, action: str) -> None:
        if (delay := self.selected_delay) is not None:
            self.post_message(DelayKey(delay, action))

    def watch_cursor_line(self, previous_line: int, line: int) -> None:
        super().watch_cursor_line(previous_line, line)
        self._check_delay_keys()

    def _check_delay_keys(self) -> None:
        # `c` cancels a delay on its row, the execution elsewhere: the footer says which
        # (rebuilt only when that changes: Textual rebuilds the whole footer).
        on_delay = self.selected_delay is not None
        if on_delay != self._on_delay:
            self._on_delay = on_delay
            self.refresh_bindings()

    def tick(self, now: datetime) -> None:
        """Repaint the durations of the children still running."""
        for node, info in self._unfinished.values():
            node.set_label(child_label(info, now))

    def show(
        self,
        root_id: str,
        descendants: list[ExecutionInfo],
        events: list[EventEntry],
        responses: list[ResponseEntry],
        now: datetime,
    ) -> None:
        delays = delays_of(events, responses)
        key = ([(d["execution_id"], d["state"], d.get("children")) for d in descendants], delays)
        if key == self._shown:  # unchanged: keep the cursor and what is expanded
            return
        self._shown = key
        self._delays = {delay for delay, _, _ in delays}
        self._unfinished = {}
        cursor = self.cursor_node.data if self.cursor_node is not None else None
        self.clear()
        kids: dict[str, list[ExecutionInfo]] = {}
        for info in descendants:
            kids.setdefault(info["parent_id"] or root_id, []).append(info)
        nodes: dict[str, TreeNode[str]] = {}

        def add(parent: TreeNode[str], parent_id: str) -> None:
            for info in sorted(kids.get(parent_id, []), key=_order):
                eid = info["execution_id"]
                if eid in kids:
                    node = parent.add(child_label(info, now), data=eid, expand=True)
                    add(node, eid)
                else:
                    node = parent.add_leaf(child_label(info, now), data=eid)
                nodes[eid] = node
                if model.state_name(info["state"]) != "finished":
                    self._unfinished[eid] = (node, info)

        add(self.root, root_id)
        for delay, expires, outcome in delays:
            colour = {
                "waiting": model.STATE_COLOURS["pending_at"],
                "cancelled": palette.COLOURS["error"],
            }.get(outcome, palette.COLOURS["muted"])
            label = Text(no_wrap=True)
            label.append(f"{'delay ' + outcome:<16} ", colour)
            label.append(" " * (DURATION_WIDTH + 2))
            label.append(delay, "bold")
            label.append(f"  until {expires}", palette.COLOURS["muted"])
            nodes[delay] = self.root.add_leaf(label, data=delay)
        if not descendants and not delays:
            self.root.add_leaf(Text("no children or delays", palette.COLOURS["muted"]))
        self.root.expand()
        if cursor is not None and cursor in nodes:
            self.move_cursor(nodes[cursor])
        elif self.root.children:  # the root is hidden: without this `enter` has no row
            self.move_cursor(self.root.children[0])
        self._check_delay_keys()
