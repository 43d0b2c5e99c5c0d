"""Running a `:` command: each goes through the code its key runs (`actions.act` for
pause / unpause / cancel / force cancel / stub, the screens' and the app's actions for
the rest), so a command decides nothing a key does not (legality is the engine's,
through `model.refusal`).

`CommandLineHost` gives a screen its command line: `:` opens it, a line it runs is
parsed (`cmdline.parse`), its ids resolved (`resolve`), and the line closes; a line that
is wrong leaves it open, as typed, with a toast that names what is wrong.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from textual import on, work
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Input

from engine.api_types import ListOrder
from engine.client import ApiError
from engine.views import ExecutionInfo
from obelisk_tui import cmdline, submitting
from obelisk_tui.cmdline import CommandError, Parsed
from obelisk_tui.list_query import ExecutionQuery
from obelisk_tui.screens.base import ObeliskScreenMixin
from obelisk_tui.widgets.command_line import CommandLine

if TYPE_CHECKING:
    from obelisk_tui.app import ObeliskApp
    from obelisk_tui.backend import ConsoleBackend

#: The action (`actions.ACTIONS`) of each command that acts on executions.
ACTIONS = {
    "pause": "pause",
    "unpause": "unpause",
    "cancel": "cancel",
    "cancel!": "force_cancel",
    "stub": "stub",
}


@runtime_checkable
class ListHost(Protocol):
    """The executions list, as commands that change it see it."""

    def apply_filter(self, text: str) -> None: ...  # ValueError names what is wrong
    def set_order(self, order: ListOrder | None) -> None: ...
    def action_failures(self) -> None: ...


class CommandLineHost(ObeliskScreenMixin, Screen[None]):
    """A screen with a command line: it composes a `CommandLine`; `:` opens it (a
    priority binding, refused while text is typed in an input: `state:locked`)."""

    BINDINGS = [Binding("colon", "command_line", "Command line", show=False, priority=True)]

    def command_targets(self) -> list[ExecutionInfo]:
        """What the keys act on here (a command without an id acts on it)."""
        raise NotImplementedError

    def command_ids(self) -> list[str]:
        """The ids of the executions shown here: short forms and suffixes are looked up
        among them, and tab completes them."""
        raise NotImplementedError

    async def act_on(self, action: str, targets: list[ExecutionInfo] | None = None) -> None:
        """`action` on `targets`, or (None) on what the keys act on here."""
        raise NotImplementedError

    def make_command_line(self) -> CommandLine:
        return CommandLine(self.obelisk.command_history, self.command_ids, id="command-line")

    def action_command_line(self) -> None:
        self.query_one(CommandLine).open()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "command_line":
            # Typing in the filter box or the line itself: `:` is text (`state:locked`).
            return not isinstance(self.focused, Input)
        return True

    @on(CommandLine.Run)
    def _command_run(self, message: CommandLine.Run) -> None:
        message.stop()
        self.run_command_line(message.text)

    @work(group="command")
    async def run_command_line(self, text: str) -> None:
        line = self.query_one(CommandLine)
        try:
            parsed = cmdline.parse(text)
            if parsed is not None:
                await run(self, parsed, line.action_close)
        except CommandError as e:
            self.notify(str(e), title="command", severity="error", timeout=8)
            return  # the line stays open, as typed, to be fixed
        except ApiError as e:  # the engine's answer (unreachable, say): try again later
            self.notify(e.message, title=f"command: {text}", severity="error", timeout=8)
            return
        if self.is_live and line.is_open:
            line.action_close()


Handler = Callable[[CommandLineHost, Parsed], Awaitable[None]]


async def run(host: CommandLineHost, parsed: Parsed, accepted: Callable[[], None]) -> None:
    """Run `parsed` on `host`. `accepted` is called once the line is known to be right
    (its ids found), before what may follow (a confirmation, another screen)."""
    name = parsed.command.name
    if name in ACTIONS:
        await _act(host, parsed, accepted)
        return
    await HANDLERS[name](host, parsed)


async def _act(host: CommandLineHost, parsed: Parsed, accepted: Callable[[], None]) -> None:
    name = parsed.command.name
    if parsed.args:
        listed = host.command_ids()
        targets = [await resolve(host.obelisk.backend, w, listed) for w in parsed.args]
        targets = list({t["execution_id"]: t for t in targets}.values())
    elif not host.command_targets():
        raise CommandError(f":{name} needs an execution id here (nothing is selected)")
    else:
        targets = None  # what the key acts on (the marks are cleared after, as the key does)
    accepted()
    await host.act_on(ACTIONS[name], targets)


async def resolve(backend: ConsoleBackend, word: str, listed: list[str]) -> ExecutionInfo:
    """The execution `word` names, as it is now: a whole id; an id's start (`E_01…`:
    looked up in the engine; a start that stops within a workflow's id names the workflow,
    not its children); or, among the executions shown (`listed`), an id's end
    (`approve_1`) or the short form the list shows (`E_01M9…XYNVK.o:1-approve_1`).
    CommandError names the id that is unknown or ambiguous."""
    text = cmdline.normalise_id(word)
    found = cmdline.match_listed(text, listed)
    if len(found) > 1:
        raise CommandError(cmdline.ambiguity(word, found))
    if found:
        return await _status(backend, found[0], word)
    if "…" in text or not text.startswith("E_"):
        raise CommandError(
            f"no execution shown here ends with {word} (an id's end or a shortened id is "
            "looked up among the executions shown; give the id or its start, E_…)"
        )
    try:
        return await backend.status(text)
    except ApiError as e:
        if e.status not in (400, 404):  # not "no such id": the engine did not answer
            raise
    rows = await backend.list_executions(ExecutionQuery(id_prefix=text, order="created_asc"), 0, 3)
    if not rows:
        raise CommandError(f"no execution {word}")
    total = await backend.count_executions(ExecutionQuery(id_prefix=text))
    first = rows[0]["execution_id"]  # the oldest: a workflow before its children
    if total > 1:
        children = await backend.count_executions(ExecutionQuery(id_prefix=first + "."))
        if total != children + 1:
            raise CommandError(cmdline.ambiguity(word, [r["execution_id"] for r in rows], total))
    return rows[0]


async def _status(backend: ConsoleBackend, execution_id: str, word: str) -> ExecutionInfo:
    """Its state now (what was listed may be half a second old)."""
    try:
        return await backend.status(execution_id)
    except ApiError as e:
        if e.status == 404:
            raise CommandError(f"no execution {word} (it is gone: {execution_id})") from None
        raise


# ---------------------------------------------------------------------------------------
# The other commands: the screens' and the app's actions
# ---------------------------------------------------------------------------------------


def _app(host: CommandLineHost) -> ObeliskApp:
    return host.obelisk


async def _open(host: CommandLineHost, parsed: Parsed) -> None:
    if parsed.args:
        info = await resolve(host.obelisk.backend, parsed.args[0], host.command_ids())
    else:
        targets = host.command_targets()
        if len(targets) != 1 or targets[0]["execution_id"] == getattr(host, "execution_id", None):
            raise CommandError(":open needs an execution id here (:open E_…)")
        info = targets[0]
    _app(host).open_execution(info["execution_id"])


def _list(host: CommandLineHost) -> ListHost:
    """The executions list, brought to the top (as `h` does) for a command that changes it."""
    app = _app(host)
    lists = [s for s in app.screen_stack if isinstance(s, ListHost)]
    if not lists:
        raise CommandError("the executions list is not open")
    app.action_executions()
    return lists[0]


async def _filter(host: CommandLineHost, parsed: Parsed) -> None:
    target = _list(host)
    try:
        target.apply_filter(parsed.rest)
    except ValueError as e:
        raise CommandError(f":filter {parsed.rest}: {e}") from None


async def _order(host: CommandLineHost, parsed: Parsed) -> None:
    _list(host).set_order(parsed.order)


async def _failures(host: CommandLineHost, _: Parsed) -> None:
    _list(host).action_failures()


async def _submit(host: CommandLineHost, parsed: Parsed) -> None:
    """The submit dialog (with the function chosen), or, with params, the submit itself
    after the dialog's checks, then the new execution's screen, as the dialog does."""
    app = _app(host)
    words = parsed.rest.split(maxsplit=1)
    if not words:
        app.action_submit()
        return
    ffqn = words[0]
    functions = submitting.exported_functions(await app.backend.deployment())
    fn = next((f for f in functions if f["ffqn"] == ffqn), None)
    if fn is None:
        near = [f["ffqn"] for f in functions if f["ffqn"].startswith(ffqn)][:3]
        hint = f" (did you mean {', '.join(near)}?)" if near else " (:submit alone lists them)"
        raise CommandError(f"no exported function {ffqn}{hint}")
    if len(words) == 1:
        app.action_submit(ffqn)
        return
    params, error = submitting.check_params(ffqn, fn["params"], words[1])
    if params is None:
        raise CommandError(f":submit {ffqn}: {error}")
    try:
        execution_id = await app.backend.submit(ffqn, params)
    except ApiError as e:
        raise CommandError(f":submit {ffqn}: {e.message}") from None
    app.submitted(execution_id)


async def _components(host: CommandLineHost, _: Parsed) -> None:
    _app(host).action_components()


async def _executions(host: CommandLineHost, _: Parsed) -> None:
    _app(host).action_executions()


async def _help(host: CommandLineHost, _: Parsed) -> None:
    _app(host).action_help()


async def _quit(host: CommandLineHost, _: Parsed) -> None:
    await _app(host).run_action("quit")  # the `q` key's action


HANDLERS: dict[str, Handler] = {
    "open": _open,
    "filter": _filter,
    "order": _order,
    "failures": _failures,
    "submit": _submit,
    "components": _components,
    "list": _executions,
    "help": _help,
    "quit": _quit,
}
