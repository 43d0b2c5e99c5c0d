"""`?`: what the keys do on the screen underneath, and the filter syntax.

Textual's own key panel lists bindings by their one-word descriptions only (and those
without one not at all): an operator needs `[`/`]`, `space`, `r` and the filter's
syntax explained, so the guide is written out here, per screen; the palette's "Keys"
opens this help too (one help).
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Label, Static

from obelisk_tui import cmdline, palette
from obelisk_tui.messages import Restyled
from obelisk_tui.widgets.key_footer import KeyFooter
from obelisk_tui.widgets.key_scroll import KeyScroll

Rows = list[tuple[str, str]]

MOVING: Rows = [
    ("j k  ↑ ↓", "move (in the list and in every tab; the State and Result tabs scroll)"),
    ("g G  home end", "first / last"),
    ("pgup pgdn  ctrl+b ctrl+f", "a page up / down"),
    ("enter", "open the selected execution"),
]

EXECUTIONS: Rows = [
    ("/", "filter (see below)"),
    ("esc", "clear the filter"),
    ("o", "order: newest first, oldest first, last change first"),
    ("t", "top-level executions only (on / off)"),
    ("f", "the cursor follows the top row (on at start, off once you move it)"),
    ("F", "failures: finished err or failed (result:err,failed; on / off)"),
    ("m  M", "mark the selected execution and move down / unmark all"),
    ("p u c", "pause / unpause / cancel (asks first): the marked executions, or the selected one"),
    ("S", "stub the selected activity_stub execution (write its return value)"),
    (":", "the command line (below)"),
]

DETAIL: Rows = [
    ("1 … 5", "tabs: State, Events, Children, Logs, Result"),
    ("[ ]", "time travel: the state machine at the previous / next version"),
    ("enter", "Events tab: open the child a child request names; Children tab: open it"),
    ("J", "Events tab: the event's raw JSON (enter on any other row too; esc closes)"),
    ("space", "Children tab: fold / unfold a child's own children (elsewhere: freeze)"),
    ("P", "open the parent execution"),
    ("p u c", "pause / unpause / cancel (asks first) this execution"),
    ("c", "on a delay (Events, Children tab): cancel the delay (asks first); delays do not pause"),
    ("R", "re-submit: same function and params, a new id (asks first); a failed one's retry"),
    ("S", "stub this execution, if it is an unfinished activity_stub"),
    ("X", "force-cancel this workflow that is not -cancellable (asks first, says so)"),
    (":", "the command line (below)"),
    ("esc backspace", "back"),
]

COMPONENTS: Rows = [
    ("j k  ↑ ↓", "select a component: its exports and WIT types below"),
    ("g G  home end", "first / last"),
    ("esc", "back"),
]

EVERYWHERE: Rows = [
    ("s", "submit an execution"),
    ("C", "components and the last hot reload"),
    ("h", "back to the executions list, from any depth"),
    ("y", "copy the execution's id (the open one, or the list's selected one): OSC 52"),
    ("space", "freeze / resume the live refresh"),
    ("r", "refresh now"),
    ("ctrl+p", "command palette: type an execution id (E_…) to open it; themes"),
    ("?", "this help (esc closes it)"),
    ("q", "quit"),
]

#: Written as sentences, wrapped by the terminal (never by the source).
FILTER = "\n".join(
    [
        "state:locked,paused   result:err,failed   ffqn:myapp:demo/   id:E_01J…   top",
        "A bare E_… word is an id prefix, any other bare word an FFQN prefix. "
        "States: pending, locked, blocked, paused, cancelling, finished. "
        "Results: ok, err, failed.",
        "A greyed key does not apply to the selection; pressed, it says why.",
    ]
)


#: The command line's commands, from its one table (`cmdline.COMMANDS`).
COMMAND_LINE: Rows = [
    (f":{c.name} {c.usage}".rstrip(), f"{c.help} ({c.key})" if c.key else c.help)
    for c in cmdline.COMMANDS
] + [("tab  ↑ ↓  esc", "complete (commands, ids shown); history; close")]

COMMAND_IDS = (
    "An ID is the whole id, its start (E_01…; a start within a workflow's id names the "
    "workflow), or, among the executions shown, its end (approve_1) or its short form as "
    "the list shows it (E_01M9…XYNVK.o:1-approve_1). No ID: what the key acts on (the "
    "marked or selected executions; on an execution's screen, that one). A wrong line "
    "says what is wrong and stays open."
)


def sections(screen: Screen[object]) -> list[tuple[str, Rows | str]]:
    """The guide for `screen` (by its kind), then what works everywhere, then its command
    line's commands (a reference: the keys come first)."""
    from obelisk_tui.screens.components import ComponentsScreen
    from obelisk_tui.screens.detail import ExecutionDetailScreen
    from obelisk_tui.screens.executions import ExecutionsScreen

    out: list[tuple[str, Rows | str]] = []
    if isinstance(screen, ExecutionsScreen):
        out += [("Executions", MOVING + EXECUTIONS), ("Filter", FILTER)]
    elif isinstance(screen, ExecutionDetailScreen):
        out += [("Execution", MOVING + DETAIL)]
    elif isinstance(screen, ComponentsScreen):
        out += [("Components", COMPONENTS)]
    out.append(("Everywhere", EVERYWHERE))
    if isinstance(screen, ExecutionsScreen | ExecutionDetailScreen):
        out += [("Command line (:)", COMMAND_LINE), ("", COMMAND_IDS)]
    return out


def render_sections(parts: list[tuple[str, Rows | str]]) -> RenderableType:
    blocks: list[RenderableType] = []
    for title, body in parts:
        if title:  # an untitled part goes on from the one before
            blocks.append(Text(title, style="bold"))
        elif blocks:
            blocks.pop()  # the blank line after the part before
        if isinstance(body, str):
            blocks.append(Text(body))
        else:
            table = Table.grid(padding=(0, 2))
            table.add_column(style="bold " + palette.COLOURS["mark"], no_wrap=True)
            table.add_column()
            for keys, what in body:
                table.add_row(Text(keys), Text(what))  # not markup: `[newest|oldest]`
            blocks.append(table)
        blocks.append(Text(""))
    return Group(*blocks)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]

    def __init__(self, parts: list[tuple[str, Rows | str]]) -> None:
        super().__init__()
        self.parts = parts

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Label("Keys", id="help-title")
            with KeyScroll(id="help-scroll"):
                yield Static(render_sections(self.parts), id="help-text")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.query_one(KeyScroll).focus()

    def on_restyled(self, _: Restyled) -> None:
        self.query_one("#help-text", Static).update(render_sections(self.parts))
