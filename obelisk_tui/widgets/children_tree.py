"""`ChildrenTree`: child executions (nested) and delays of an execution, with states."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from engine.views import EventEntry, ExecutionInfo, ResponseEntry
from obelisk_tui import model


def child_label(info: ExecutionInfo) -> Text:
    label, colour = model.state_label(info)
    text = Text(no_wrap=True)
    text.append(f"{label:<16} ", colour)
    eid = info["execution_id"]
    parent = info["parent_id"] or ""
    text.append(eid[len(parent) :] if parent and eid.startswith(parent) else eid, "bold")
    text.append(f"  {info['ffqn']}", "")
    if info.get("children"):
        text.append(f"  ({info['children']} children)", "dim")
    return text


def delays_of(
    events: list[EventEntry], responses: list[ResponseEntry]
) -> list[tuple[str, str, str]]:
    """(delay id, expires at, outcome) of every delay the log requested."""
    outcomes: dict[str, str] = {}
    for r in responses:
        resp = r["response"]
        if resp.get("type") == "delay_finished":
            outcomes[str(resp.get("delay_id"))] = (
                "cancelled" if resp.get("outcome") == "cancelled" else "expired"
            )
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
        super().__init__("children", id=id)
        self.show_root = False
        self.guide_depth = 3
        self._shown: object = None

    def show(
        self,
        root_id: str,
        descendants: list[ExecutionInfo],
        events: list[EventEntry],
        responses: list[ResponseEntry],
    ) -> None:
        delays = delays_of(events, responses)
        key = ([(d["execution_id"], d["state"], d.get("children")) for d in descendants], delays)
        if key == self._shown:  # unchanged: keep the cursor and what is expanded
            return
        self._shown = key
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
                    node = parent.add(child_label(info), data=eid, expand=True)
                    add(node, eid)
                else:
                    node = parent.add_leaf(child_label(info), data=eid)
                nodes[eid] = node

        add(self.root, root_id)
        for delay, expires, outcome in delays:
            colour = {"waiting": model.STATE_COLOURS["pending_at"], "cancelled": "#e0606a"}.get(
                outcome, "dim"
            )
            label = Text(no_wrap=True)
            label.append(f"{'delay ' + outcome:<16} ", colour)
            label.append(delay, "bold")
            label.append(f"  until {expires}", "dim")
            self.root.add_leaf(label, data=delay)
        if not descendants and not delays:
            self.root.add_leaf(Text("no children or delays", "dim"))
        self.root.expand()
        if cursor is not None and cursor in nodes:
            self.move_cursor(nodes[cursor])
        elif self.root.children:  # the root is hidden: without this `enter` has no row
            self.move_cursor(self.root.children[0])
