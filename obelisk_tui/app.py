"""`ObeliskApp`: the console. Screens talk to the engine only through `self.backend`.

The app owns the connection (made in `on_mount`, so that an embedded engine runs in the
app's own event loop), the live refresh (one long-poll on the backend's commit
generation, throttled, forwarded to the current screen as `DataChanged`), a one-second
`Tick` for relative times, and reload notifications (toasts).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from textual import work
from textual._context import active_message_pump  # noqa: PLC2701 (textual internals, version pinned)
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.dom import DOMNode
from textual.screen import ModalScreen, Screen
from textual.widget import Widget
from textual.widgets import LoadingIndicator, Static
from textual.worker import WorkerFailed

from engine import gc_tuning
from engine.client import ApiError, ServerUnreachable
from engine.views import upgrades_unchecked
from obelisk_tui import cmdline, model, palette
from obelisk_tui.backend import ConsoleBackend
from obelisk_tui.commands import ExecutionCommands, ScreenCommands
from obelisk_tui.messages import DataChanged, DeploymentReloaded, Restyled, Tick
from obelisk_tui.opening_hold import OpeningHold
from obelisk_tui.screens.base import is_live
from obelisk_tui.screens.components import reload_summary

if TYPE_CHECKING:
    from obelisk_tui.screens.executions import ExecutionsScreen

#: At most this many refreshes per second, however fast executions flow.
MAX_REFRESH_HZ = 2.0
#: How long the change follower's question waits for a commit (a long poll).
CHANGE_POLL_SECONDS = 10.0
#: The start's deferred work waits at most this many seconds for the list's first rows.
FIRST_ROWS_WAIT = 2.0

log = logging.getLogger("obelisk.console")


class ConnectingScreen(Screen[None]):
    """Until the engine answers: what is starting and, for an embedded engine, each
    component as it loads (a first start compiles WASM for a while)."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what
        #: Component label → seconds it took (None: loading).
        self.components: dict[str, float | None] = {}
        #: The progress text shown.
        self.shown = ""

    def compose(self) -> ComposeResult:
        yield Static(f"Obelisk — starting: {self.what}", id="connecting")
        yield Static(id="connecting-progress")
        yield LoadingIndicator()

    def progress(self, label: str, ready: bool, seconds: float) -> None:
        self.components[label] = seconds if ready else None
        if not self.is_mounted:
            return
        done = sum(1 for s in self.components.values() if s is not None)
        lines = [f"components: {done} of {len(self.components)} loaded"]
        for name, took in self.components.items():
            lines.append(f"  {name}: " + ("loading…" if took is None else f"ready ({took:.1f} s)"))
        self.shown = "\n".join(lines)
        self.query_one("#connecting-progress", Static).update(self.shown)


class ObeliskApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "Obelisk"
    COMMANDS = App.COMMANDS | {ExecutionCommands, ScreenCommands}
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("s", "submit", "Submit"),
        Binding("C", "components", "Components"),
        Binding("h", "executions", "List"),  # from any depth (hidden on the list itself)
        Binding("y", "copy_id", "Copy id", show=False),
        Binding("space", "freeze", "Freeze"),
        Binding("r", "refresh", "Refresh", show=False),
    ]

    def __init__(
        self,
        connect: Callable[[], Awaitable[ConsoleBackend]],
        *,
        what: str = "",
        now: Callable[[], datetime] | None = None,
        live: bool = True,
        on_connected: Callable[[ObeliskApp], Awaitable[None]] | None = None,
        tune_gc: bool = False,
    ) -> None:
        super().__init__()
        self._connect = connect
        self._what = what
        self._on_connected = on_connected
        #: Process-wide GC settings: for the process that is the console (`obelisk-tui`).
        self._tune_gc = tune_gc
        #: While an execution's screen opens: the collector held off, the GIL shared
        #: more often (`obelisk_tui.opening_hold`).
        self.opening = OpeningHold(enabled=tune_gc)
        if tune_gc:
            # Already for the start: its allocations (the engine's imports and loading,
            # the screens' composition) mostly live on; with CPython's thresholds the
            # collector ran ~170 times before the first frame (75-120 ms of its CPU).
            gc_tuning.tune_gc(gc_tuning.CONSOLE_THRESHOLDS)
        self.now = now or (lambda: datetime.now(UTC))
        #: Whether to follow the engine's changes (tests of fixed data turn it off).
        self.live = live
        self.backend: ConsoleBackend = None  # type: ignore[assignment]  # set on mount
        self.frozen = False
        self.fatal_error: str | None = None
        #: The engine is unreachable (attached): shown in the header until it is back.
        self._disconnected = False
        #: How many times the server was seen gone: an answer to a question asked before
        #: the last time is no news that it is back.
        self._disconnections = 0
        self._last_error: str | None = None
        self._last_error_at = 0.0
        #: Run on exit, before the backend closes (e.g. the demo traffic's stop).
        self.closers: list[Callable[[], Awaitable[None]]] = []
        self._refresh_wanted = asyncio.Event()
        self._last_refresh = 0.0
        #: Exceptions of screens that the console survived (`_handle_exception`): each
        #: was logged and shown. Tests assert it stays empty.
        self.screen_errors: list[BaseException] = []
        #: Finished per second, sampled each second by the app (`sample_throughput`):
        #: true whatever screen is shown, frozen or not.
        self.throughput = model.Throughput()
        self._sampling = False
        #: The `:` command line's history, one for every screen's line.
        self.command_history = cmdline.History()

    # -- start and stop ------------------------------------------------------------------
    async def on_mount(self) -> None:
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self._theme_changed()
        self.push_screen(ConnectingScreen(self._what))
        self.start()

    @work(exclusive=True, group="connect")
    async def start(self) -> None:
        try:
            self.backend = await self._connect()
        except Exception as e:  # a user mistake (bad URL, token, deployment): say it, exit
            self.fatal_error = str(e) or type(e).__name__
            self.exit(return_code=1)
            return
        self.sub_title = self.backend.label
        from obelisk_tui.screens.executions import ExecutionsScreen

        # The generation before the list's first load reads anything: a commit between
        # that load's read and the follower's start would otherwise be followed from
        # (its change counted as seen) and missing from the list until the next commit.
        generation = await self._generation_now() if self.live else None
        executions = ExecutionsScreen()
        await self.switch_screen(executions)
        if self._tune_gc:
            # What was allocated so far lives for the whole session: out of the
            # collector's way, and its later passes rarer (much is allocated per refresh);
            # but full ones regular: Textual leaves many cycles (`engine.gc_tuning`).
            gc.freeze()
            gc_tuning.tune_gc(gc_tuning.CONSOLE_THRESHOLDS)
        if self.live:
            self.follow_changes(generation)
            self.set_interval(1.0, self._tick)
            self.set_interval(1.0, self.sample_throughput)
        self._after_first_rows(executions)
        if self._on_connected is not None:
            await self._on_connected(self)

    @work(group="start")
    async def _after_first_rows(self, executions: ExecutionsScreen) -> None:
        """Once the list's first rows are drawn (or `FIRST_ROWS_WAIT` s): the reload
        follower, the throughput's baseline and an embedded engine's deferred start
        (its report scan, its file watcher). Begun with the first load, their queries
        and CPU delayed its rows (they share the engine's one reader connection)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_ROWS_WAIT):
                await executions.first_rows.wait()
        self.backend.finish_start()
        if self.live:
            self.follow_reloads()
            self.sample_throughput()  # the baseline

    async def on_unmount(self) -> None:
        for close in self.closers:
            await close()
        if self.backend is not None:
            await self.backend.close()

    def _theme_changed(self, _: object = None) -> None:
        """State colours and the others (`palette`) come from the theme, readable on its
        background."""

        variables = self.current_theme.to_color_system().generate()
        model.STATE_COLOURS.update(model.state_colours(variables))
        palette.COLOURS.update(palette.theme_colours(variables))
        if self.backend is not None:
            for screen in self.screen_stack:
                screen.post_message(DataChanged())
                screen.post_message(Restyled())  # what is drawn once (dialogs)
                screen.refresh(repaint=True)

    # -- a bug in a screen is not the end of the engine ---------------------------------
    def _handle_exception(self, error: Exception) -> None:
        """Textual's handler of any unhandled exception, which exits the app: with an
        embedded engine, that would stop the engine over a screen's bug. Once connected,
        an exception of a screen (its worker, timer, handler or action) is logged with its
        traceback, shown, and the screen whose message loop it broke is closed; the app
        and its engine keep running. Before the connection, and for the app's own loop,
        Textual's handling stands (nothing else can carry on)."""
        if self.backend is None or self._exit:
            super()._handle_exception(error)
            return
        cause = error.error if isinstance(error, WorkerFailed) else error
        pump = active_message_pump.get(None)
        broken = pump if isinstance(pump, DOMNode) and pump is not self else None
        if isinstance(error, WorkerFailed) or broken is not None:
            self._survive(cause, broken)
            return
        super()._handle_exception(error)

    async def _dispatch_action(self, namespace: DOMNode, action_name: str, params: Any) -> bool:
        """Actions run in the app's own message loop, which an exception would end:
        a screen's or a widget's action that raises is survived as `_handle_exception`
        does, the app's own actions are not."""
        if namespace is self or self.backend is None:
            return await super()._dispatch_action(namespace, action_name, params)
        # A key for a screen that is being closed (`esc` and another key at once) finds
        # its widgets going: it acts on nothing.
        if not all(is_live(node) for node in namespace.ancestors_with_self if node is not self):
            return False
        # A key for a screen whose widgets do not exist yet (`enter` and another key at
        # once: the monkey test's finds, seeds 303 and 1555444897) acts once they do: a
        # screen's queue is processed after its compose and mount.
        if isinstance(namespace, Screen) and not namespace.is_mounted:
            namespace.call_later(self._dispatch_action, namespace, action_name, params)
            return True
        try:
            return await super()._dispatch_action(namespace, action_name, params)
        except Exception as e:
            self._survive(e, None)
            return True

    def _survive(self, error: BaseException, broken: DOMNode | None) -> None:
        self.screen_errors.append(error)
        where = type(broken).__name__ if broken is not None else type(self.screen).__name__
        log.error("the console survived an error in %s", where, exc_info=error)
        self.notify(
            f"{type(error).__name__}: {error}\n(in {where}; logged, the engine keeps running)",
            title="console error",
            severity="error",
            timeout=10,
        )
        # A widget whose message loop ended handles nothing more: its screen goes.
        screen = broken if isinstance(broken, Screen) else None
        if isinstance(broken, Widget) and not isinstance(broken, Screen):
            with contextlib.suppress(Exception):
                screen = broken.screen
        if screen is not None and screen is self.screen and len(self.screen_stack) > 1:
            with contextlib.suppress(Exception):
                self.pop_screen()

    def load_progress(self, label: str, ready: bool, seconds: float) -> None:
        """An embedded engine's components as they load (`Engine.start(on_progress=…)`)."""
        for screen in self.screen_stack:
            if isinstance(screen, ConnectingScreen):
                screen.progress(label, ready, seconds)

    # -- live refresh --------------------------------------------------------------------
    def request_refresh(self) -> None:
        """Refresh now (after an action), not waiting for the next change."""
        self._refresh_wanted.set()

    async def _generation_now(self) -> int | None:
        """The engine's commit generation, or None when it cannot be read (the follower
        reads it then, and reports the error)."""
        try:
            return await self.backend.wait_changed(-1, 0.0)
        except ApiError:
            return None

    @work(exclusive=True, group="changes")
    async def follow_changes(self, generation: int | None = None) -> None:
        """A `DataChanged` for the screen after each change committed after `generation`
        (read before the screen's first load), throttled; None: from the generation now."""
        while True:
            try:
                if generation is None:
                    generation = await self.backend.wait_changed(-1, 0.0)
                    continue
                asked_at = self._disconnections
                # While the server is away, a question it answers at once: one that
                # waits for a commit would leave the mark until it ends, after it is back.
                wait = 0.0 if self._disconnected else CHANGE_POLL_SECONDS
                new, forced, answered = await self._next_change(generation, wait)
            except ApiError as e:
                self.report_error(e)
                await asyncio.sleep(1.0)  # the server may be restarting: retry calmly
                continue
            if self._disconnected and answered:
                if asked_at != self._disconnections:
                    # Asked before the server was seen gone (one shutting down answers
                    # its long polls while refusing new requests): ask again.
                    continue
                self._connection_back()
                forced = True  # whatever happened meanwhile: show it
            changed, generation = new != generation, new
            if not forced and (not changed or self.frozen):
                if changed:  # frozen: nothing to show until unfrozen (`request_refresh`);
                    # following each commit meanwhile was a poll per commit, hundreds a
                    # second at 100 executions/s (`bench/console.py --only live-cpu`).
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._refresh_wanted.wait(), 1.0)
                continue
            # Throttle: at most MAX_REFRESH_HZ refreshes; what arrives meanwhile is
            # picked up by the next one (the generation only grows).
            pause = self._last_refresh + 1 / MAX_REFRESH_HZ - time.monotonic()
            if pause > 0 and not forced:
                await asyncio.sleep(pause)
                if self.frozen:  # frozen while we waited
                    continue
            self._last_refresh = time.monotonic()
            self.screen.post_message(DataChanged())

    async def _next_change(self, generation: int, wait: float) -> tuple[int, bool, bool]:
        """(the generation, whether a refresh was asked for, whether the server answered)
        once the engine committed something new (or `wait` s passed) or `request_refresh`
        was called (a refresh asked for while the server is away is no answer from it)."""
        change = asyncio.ensure_future(self.backend.wait_changed(generation, wait))
        asked = asyncio.ensure_future(self._refresh_wanted.wait())
        try:
            await asyncio.wait({change, asked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            asked.cancel()
            if not change.done():
                change.cancel()
        forced = self._refresh_wanted.is_set()
        self._refresh_wanted.clear()
        answered = change.done() and not change.cancelled()
        return (change.result() if answered else generation), forced, answered

    def sample_throughput(self) -> None:
        # One sample at a time: a query slower than the timer is not cancelled by the
        # next one (each would cancel the last, none would land); the next sample
        # covers the time it took.
        if not self._sampling:
            self._sampling = True
            self._sample_throughput()

    @work(group="throughput")
    async def _sample_throughput(self) -> None:
        """The engine's finished count against the clock (`now`: tests drive it)."""
        try:
            counts = await self.backend.counts_by_state()
        except ApiError:
            return  # `follow_changes` reports the connection; a missed sample is no harm
        finally:
            self._sampling = False
        self.throughput.sample(counts.get("finished", 0), self.now().timestamp())

    def _tick(self) -> None:
        # The interval may fire once more while the console exits, its screens gone.
        if not self.frozen and self.screen_stack:
            self.screen.post_message(Tick())

    @work(exclusive=True, group="reloads")
    async def follow_reloads(self) -> None:
        try:
            generation = (await self.backend.deployment())["reload"]["generation"]
        except ApiError as e:
            self.report_error(e)
            return
        resync = False
        while True:
            try:
                if resync:  # after an error: the server may be a new process
                    current = (await self.backend.deployment())["reload"]["generation"]
                    generation = min(generation, current)  # a restarted one counts from 0
                    resync = False
                deployment = await self.backend.wait_reload(generation, 25.0)
            except ApiError:
                resync = True
                await asyncio.sleep(2.0)
                continue
            reload = deployment["reload"]
            if reload["generation"] <= generation:
                continue
            generation = reload["generation"]
            ok = bool(reload.get("ok"))
            in_force = upgrades_unchecked(reload)
            self.notify(
                reload_summary(reload) if ok else str(reload.get("error")),
                title="hot reload"
                if ok
                else "hot reload: upgrades not checked"
                if in_force
                else "hot reload failed: the previous version stays",
                severity=("warning" if reload.get("orphaned") else "information")
                if ok
                else "error",
                timeout=6 if ok else 15,
            )
            for screen in self.screen_stack:
                screen.post_message(DeploymentReloaded(deployment))

    def report_error(self, error: ApiError) -> None:
        if isinstance(error, ServerUnreachable):
            if self._disconnected:
                return  # the header says so until it is back
            # One notice, and a lasting mark that `follow_changes` clears once the
            # server answers again (retries and several panes would stack toasts).
            self._disconnected = True
            self._disconnections += 1
            self.sub_title = f"{self.backend.label} · DISCONNECTED, retrying"
            self.notify(error.message, title="server unreachable", severity="error", timeout=8)
            return
        # The same error again within its toast's life would only stack identical toasts.
        now = time.monotonic()
        if self._last_error == error.message and now - self._last_error_at < 8.0:
            return
        self._last_error, self._last_error_at = error.message, now
        self.notify(error.message, title="error", severity="error", timeout=8)

    def _connection_back(self) -> None:
        self._disconnected = False
        self.sub_title = self.backend.label
        self._last_error = None
        self.notify("connected again", title="server", timeout=4)

    # -- navigation and global actions ---------------------------------------------------
    def open_execution(self, execution_id: str) -> None:
        from obelisk_tui.screens.detail import ExecutionDetailScreen

        self.opening.hold()  # released by the screen once it is drawn filled
        self.push_screen(ExecutionDetailScreen(execution_id))

    def action_executions(self) -> None:
        from obelisk_tui.screens.executions import ExecutionsScreen

        while len(self.screen_stack) > 1 and not isinstance(self.screen, ExecutionsScreen):
            self.pop_screen()

    def action_copy_id(self) -> None:
        """The execution's id (its screen's, or the list's selected row) to the clipboard:
        OSC 52, which the terminal (not this process) puts there, so it works over ssh
        and in tmux (with `set-clipboard on`)."""
        from obelisk_tui.widgets.execution_list import ExecutionList

        screen = self.screen
        eid = getattr(screen, "execution_id", None)
        if eid is None and (lists := screen.query(ExecutionList)):
            selected = lists.first().selected
            eid = None if selected is None else selected["execution_id"]
        if not isinstance(eid, str):
            self.notify("no execution selected to copy", severity="warning")
            return
        self.copy_to_clipboard(eid)
        self.notify(eid, title="copied to the clipboard", timeout=3)

    def action_components(self) -> None:
        from obelisk_tui.screens.components import ComponentsScreen

        if not isinstance(self.screen, ComponentsScreen):
            self.push_screen(ComponentsScreen())

    def action_submit(self, ffqn: str | None = None) -> None:
        """The submit dialog (`s`, `:submit [FFQN]`), with `ffqn` chosen if given."""
        from obelisk_tui.screens.submit import SubmitScreen

        self.push_screen(SubmitScreen(ffqn), self.submitted)

    def submitted(self, execution_id: str | None) -> None:
        """A new execution (the dialog's, `:submit`'s): say so and open it."""
        if execution_id:
            self.notify(f"submitted {execution_id}", title="submit")
            self.open_execution(execution_id)

    def action_freeze(self) -> None:
        self.frozen = not self.frozen
        self.notify(
            "live refresh frozen (space resumes)" if self.frozen else "live refresh resumed",
            timeout=2,
        )
        self.request_refresh()

    def action_refresh(self) -> None:
        self.screen.post_message(DataChanged())

    def action_help(self) -> None:
        from obelisk_tui.screens.help import HelpScreen, sections

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(sections(self.screen)))

    def action_show_help_panel(self) -> None:
        """The palette's "Keys" opens the console's one help: Textual's own panel lists
        bindings by their one-word descriptions only, and disagreed with it."""
        self.action_help()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        from obelisk_tui.screens.executions import ExecutionsScreen

        if action in ("executions", "copy_id") and (
            self.backend is None or isinstance(self.screen, ModalScreen)
        ):
            return False  # a dialog answers first (its own keys, `esc`)
        if action == "executions":
            # Hidden on the list itself.
            return not isinstance(self.screen, ExecutionsScreen)
        needs_backend = action in ("submit", "components", "freeze", "refresh")
        return not (needs_backend and self.backend is None)
