"""Screenshots of the console: `.venv/bin/python screenshots/make.py [--only NAME,…] [--out DIR]`.

Starts the console headless (`App.run_test`, 160 × 45 cells) on a copy of the demo
deployment (`demo/`, copied into `--work`, by default /tmp/obelisk-screenshots, so that
the paths the pictures show do not depend on where the repository is) with a fresh
SQLite file. Everything shown is the app's own output on a real engine:

* a steady, scripted traffic (`Traffic`: one submission every half second from a fixed
  cycle of the demo's functions; orders approved, cancelled, paused or left waiting in
  turn; a flaky activity that always fails; a long step cancelled while it runs), which
  runs from the start, so that the list is live and the header's throughput sparkline
  (the engine's finished count over wall-clock time, one bar a second for 60 s) is full
  when the list is shot, `--traffic-seconds` (60) after the workload's burst, at the
  first moment (within 20 s) that its STATE column shows every state of `MIX`;
* a fixed workload (`WORKLOAD`) for the detail pictures, with the ids the engine gives;
* a hot reload (last): the copy's `order.js` is changed so that it no longer replays
  the orders that wait (their upgrade fails, they stay on the old version), `sleepy.js`
  in a way that does (the sleeping workflow continues on the new code); the file watcher
  reloads, and the components screen shows the outcomes.

Each picture is Textual's SVG export, converted to a PNG 1600 px wide with cairosvg in
the Fira Code font (`fonts-firacode`; the SVG names the family "Fira Code"). Re-running
gives other ids, times and numbers, and the same scenes.

Pictures (`--only` takes any of them, comma-separated): executions, help, detail-state,
detail-events, detail-result, detail-logs, detail-children, components, submit,
reload-failed. `--keep` keeps the SVGs beside the PNGs, `--svg-only` makes only SVGs,
`--quick` (the test's: tests/console/test_screenshots_script.py) runs a 2 s traffic and
shoots the list as it comes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZE = (160, 45)
WIDTH_PX = 1600

#: Every picture, in the order a full run makes them.
PICTURES = (
    "help",
    "detail-state",
    "detail-events",
    "detail-result",
    "detail-logs",
    "detail-children",
    "components",
    "submit",
    "executions",
    "reload-failed",
)

#: The workload of the detail pictures: (name, FFQN, params).
WORKLOAD: list[tuple[str, str, list[Any]]] = [
    ("greet", "myapp:demo/greeter.greet", ["world"]),
    ("step", "myapp:demo/activity.step", [3, 100]),
    ("add", "myapp:demo/wat.add", [2, 40]),
    ("flaky", "myapp:demo/greeter.flaky", [100]),  # always fails: retried, then err
    ("serial", "myapp:demo/workflow.serial", []),
    ("parallel", "myapp:demo/workflow.parallel", []),
    ("batch", "myapp:demo/workflow.batch", [2]),
    ("py-parallel", "myapp:demo-py/workflow.parallel", []),
    ("welcome", "myapp:demo/workflow.welcome", ["ann@example.com"]),
    ("sleepy", "myapp:demo/workflow.sleepy", [2, 600]),  # sleeps 10 minutes
    ("order-7", "myapp:demo/workflow.order-cancellable", ["order-7"]),  # approved
    ("order-8", "myapp:demo/workflow.order-cancellable", ["order-8"]),  # waits
    ("order-9", "myapp:demo/workflow.order-cancellable", ["order-9"]),  # paused
    ("order-10", "myapp:demo/workflow.order-cancellable", ["order-10"]),  # cancelled
]

#: The deployment and the data dir, relative to the work dir (the title bar shows them).
DEPLOYMENT = Path("demo") / "deployment.toml"
DATA_DIR = Path("data") / "screenshots"
DEFAULT_WORK = Path(tempfile.gettempdir()) / "obelisk-screenshots"

log = logging.getLogger("screenshots")


# ---------------------------------------------------------------------------------------
# The work dir: a copy of the demo, a fresh data dir
# ---------------------------------------------------------------------------------------


def prepare_work_dir(work: Path) -> None:
    """`work/demo`: a copy of the demo deployment (its built components included);
    `work/data/screenshots`: a new data dir whose compiled-component cache is the one
    tests share (compiling the Python demo component takes about a minute; loading it a
    fraction of a second)."""
    shutil.rmtree(work / "demo", ignore_errors=True)
    shutil.rmtree(work / DATA_DIR, ignore_errors=True)
    shutil.copytree(
        REPO / "demo", work / "demo", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    data = work / DATA_DIR
    data.mkdir(parents=True)
    shared = REPO / ".cache" / "engine-compiled"
    shared.mkdir(parents=True, exist_ok=True)
    (data / "cache").symlink_to(shared, target_is_directory=True)


# ---------------------------------------------------------------------------------------
# Waiting
# ---------------------------------------------------------------------------------------


async def within(
    pilot: Any, predicate: Callable[[], bool | Awaitable[bool]], timeout: float
) -> bool:
    """Whether the screen comes to show something within `timeout` seconds (Textual has
    no event for "this is on the screen": checked every 50 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return True
        if time.monotonic() > deadline:
            return False
        await pilot.pause(0.05)


async def until(
    pilot: Any, predicate: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = 60
) -> None:
    if not await within(pilot, predicate, timeout):
        raise SystemExit(f"timed out waiting for {what}; the screen:\n{screen_text(pilot.app)}")


async def until_engine(
    engine: Any, check: Callable[[], Awaitable[bool]], what: str, timeout: float = 60
) -> None:
    """Until `check()` holds, re-checked whenever the engine commits something."""
    deadline = time.monotonic() + timeout
    generation = await engine.wait_changed(-1, 0.0)
    while not await check():
        left = deadline - time.monotonic()
        if left <= 0:
            raise SystemExit(f"timed out waiting for {what}")
        generation = await engine.wait_changed(generation, min(left, 5.0))


async def state_of(engine: Any, execution_id: str) -> str:
    from engine.core.state import state_name

    return str(state_name((await engine.storage.get_row(execution_id)).state))


def screen_text(app: Any) -> str:
    """The text the terminal shows now (the screen and its overlays)."""
    update = app.screen._compositor.render_full_update()
    lines = []
    for strips in update.strips:
        for strip in [strips] if hasattr(strips, "text") else strips:
            lines.append(strip.text)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Traffic and workload
# ---------------------------------------------------------------------------------------


class Traffic:
    """A steady stream of the demo's executions, like `obelisk-tui --demo`'s traffic but
    scripted, so that every run shows the same mix: one submission every `PERIOD`
    seconds from `CYCLE`. The order of each cycle is, half a cycle later, approved,
    cancelled, paused or left waiting, in turn; every other cycle's long step is
    cancelled while it runs (`cancelling`, then `failed cancelled`)."""

    PERIOD = 0.5
    NAMES = ("Ann", "Bob", "Cleo", "Dan")
    #: (FFQN, params of the n-th cycle).
    CYCLE: list[tuple[str, Callable[[int, random.Random], list[Any]]]] = [
        ("myapp:demo/activity.step", lambda n, r: [r.randint(0, 99), 300]),
        ("myapp:demo/greeter.greet", lambda n, r: [Traffic.NAMES[n % 4]]),
        ("myapp:demo/workflow.order-cancellable", lambda n, r: [f"order-{101 + n}"]),
        ("myapp:demo/wat.add", lambda n, r: [r.randint(0, 999), r.randint(0, 999)]),
        ("myapp:demo/greeter.flaky", lambda n, r: [100]),  # retried 4 times, then err
        ("myapp:demo/workflow.fanout", lambda n, r: [3]),
        ("myapp:demo/activity.step", lambda n, r: [r.randint(0, 99), 2500]),  # the long step
        ("myapp:demo/workflow.welcome", lambda n, r: [Traffic.address(n)]),  # odd n: err
        ("myapp:demo/greeter.greet", lambda n, r: [Traffic.NAMES[(n + 2) % 4]]),
        ("myapp:demo/workflow.sleepy", lambda n, r: [1, 4]),
        ("myapp:demo/greeter.flaky", lambda n, r: [30]),  # now and then a retry
        ("myapp:demo/activity.step", lambda n, r: [r.randint(0, 99), 800]),
    ]
    ORDER_SLOT, LONG_STEP_SLOT, STEER_SLOT = 2, 6, 8

    @staticmethod
    def address(n: int) -> str:
        """The welcome's address: every other one is not one (its email fails)."""
        return "not-an-address" if n % 2 else f"{Traffic.NAMES[n % 4].lower()}@example.com"

    ORDER_FATES = ("approve", "pause", "cancel", "wait")

    def __init__(self, engine: Any, seed: int = 7) -> None:
        self.engine = engine
        self.random = random.Random(seed)
        self.orders: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="traffic")

    async def _run(self) -> None:
        n = 0
        long_step = order = None
        while True:
            for slot, (ffqn, params) in enumerate(self.CYCLE):
                eid = await self._try(self.engine.submit(ffqn, params(n, self.random)))
                if slot == self.ORDER_SLOT and eid is not None:
                    order = eid
                    self.orders.append(eid)
                elif slot == self.LONG_STEP_SLOT:
                    long_step = eid
                elif slot == self.LONG_STEP_SLOT + 1 and long_step is not None and n % 2:
                    await self._try(self.engine.cancel(long_step))
                elif slot == self.STEER_SLOT and order is not None:
                    await self._steer(order, self.ORDER_FATES[n % len(self.ORDER_FATES)])
                # The pace of the traffic; a stop comes between two submissions (one
                # cancelled midway could be made and never answered).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.PERIOD)
                if self._stopping.is_set():
                    return
            n += 1

    async def _steer(self, order: str, fate: str) -> None:
        if fate == "approve":
            await self._try(self.engine.stub(f"{order}.o:1-approve_1", {"ok": True}))
        elif fate == "cancel":
            await self._try(self.engine.cancel(order))
        elif fate == "pause":
            await self._try(self.engine.pause(order))

    async def stop(self) -> None:
        """Stop submitting, and answer the orders left waiting (they would be part of the
        reload's upgrades): unpaused, approved, and run to their end."""
        self._stopping.set()
        if self._task is not None:
            await self._task
        for order in self.orders:
            state = await state_of(self.engine, order)
            if state == "finished":
                continue
            if state == "paused":
                await self._try(self.engine.unpause(order))
            approval = f"{order}.o:1-approve_1"

            async def asked(approval: str = approval) -> bool:
                with contextlib.suppress(Exception):
                    await self.engine.storage.get_row(approval)
                    return True
                return False

            await until_engine(self.engine, asked, f"{order}'s approval request")
            await self._try(self.engine.stub(approval, {"ok": True}))
            await self.engine.result(order, 60)

    @staticmethod
    async def _try(call: Awaitable[Any]) -> Any:
        try:
            return await call
        except Exception as e:  # the traffic goes on; the console shows what happened
            log.info("traffic: %r", e)
            return None


async def run_workload(engine: Any) -> dict[str, str]:
    """Submits `WORKLOAD`, steers the orders, waits until each is where the pictures want
    it; returns the ids by name."""
    ids = {name: await engine.submit(ffqn, params) for name, ffqn, params in WORKLOAD}
    for order in ("order-7", "order-8", "order-9", "order-10"):

        async def waiting(order: str = order) -> bool:
            return await state_of(engine, ids[order]) == "blocked_by_join_set"

        await until_engine(engine, waiting, f"{order} to wait")
    await engine.stub(f"{ids['order-7']}.o:1-approve_1", {"ok": True})
    await engine.pause(ids["order-9"])
    await engine.cancel(ids["order-10"])
    for name in (
        "greet",
        "step",
        "add",
        "flaky",
        "serial",
        "parallel",
        "batch",
        "py-parallel",
        "welcome",
        "order-7",
        "order-10",
    ):
        await engine.result(ids[name], 120)

    async def sleeping() -> bool:
        return await state_of(engine, ids["sleepy"]) == "blocked_by_join_set"

    await until_engine(engine, sleeping, "sleepy to sleep")
    return ids


# ---------------------------------------------------------------------------------------
# The pictures
# ---------------------------------------------------------------------------------------


class Shooter:
    def __init__(
        self, app: Any, pilot: Any, out: Path, wanted: set[str], mix_seconds: float
    ) -> None:
        self.app, self.pilot, self.out, self.wanted = app, pilot, out, wanted
        self.mix_seconds = mix_seconds
        self.svgs: list[Path] = []
        self.started = time.monotonic()

    def footer_ready(self) -> bool:
        """The footer is recomposed on every binding refresh (a live refresh, a cursor
        move): whether this frame has its keys."""
        footers = self.app.screen.query("Footer")
        return not footers or bool(footers.first().query("FooterKey"))

    async def shoot(self, name: str, *, toasts: bool = False) -> None:
        if not toasts:
            self.app.clear_notifications()
        await self.pilot.pause(0.4)
        await until(self.pilot, self.footer_ready, "the footer's keys")
        self.save(name)

    def save(self, name: str) -> None:
        svg = Path(self.app.save_screenshot(f"{name}.svg", str(self.out)))
        self.svgs.append(svg)
        print(f"  {name}  ({time.monotonic() - self.started:.0f} s)", flush=True)


async def make(out: Path, wanted: set[str], traffic_seconds: int, mix_seconds: float) -> list[Path]:
    from obelisk_tui.app import ObeliskApp
    from obelisk_tui.backend import EmbeddedBackend
    from obelisk_tui.screens.executions import ExecutionsScreen

    async def connect() -> Any:
        return await EmbeddedBackend.start(DEPLOYMENT, DATA_DIR)

    app = ObeliskApp(connect, what="screenshots")
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), "the home screen", 300)
        engine = app.backend.engine  # type: ignore[attr-defined]
        traffic = Traffic(engine)
        traffic.start()
        print("running the workload …", flush=True)
        ids = await run_workload(engine)
        # The workload's burst of finished executions is out of the sparkline's minute
        # once this many samples more are taken.
        full_sparkline = app.throughput.samples + traffic_seconds + 1
        shots = Shooter(app, pilot, out, wanted, mix_seconds)
        if "help" in wanted:
            await help_picture(shots)
        await detail_pictures(shots, ids)
        if "components" in wanted:
            await components_picture(shots)
        if "submit" in wanted:
            await submit_picture(shots)
        if "executions" in wanted:
            print(f"the traffic fills the sparkline ({traffic_seconds} s) …", flush=True)
            await until(
                pilot,
                lambda: app.throughput.samples >= full_sparkline,
                "the throughput's samples",
                traffic_seconds + 60,
            )
            await executions_picture(shots)
        await traffic.stop()
        if "reload-failed" in wanted:
            await reload_picture(shots, ids)
    return shots.svgs


async def overlay_picture(
    shots: Shooter, key: str, screen: type[Any], marker: str, name: str
) -> None:
    """`key` opens `screen` over the list; shot once it shows `marker`, then closed."""
    app, pilot = shots.app, shots.pilot
    await pilot.press(key)
    await until(
        pilot,
        lambda: isinstance(app.screen, screen) and marker in screen_text(app),
        f"the {name}",
    )
    await shots.shoot(name)
    await pilot.press("escape")


async def help_picture(shots: Shooter) -> None:
    """The help, over the list."""
    from obelisk_tui.screens.help import HelpScreen

    await overlay_picture(shots, "question_mark", HelpScreen, "Filter", "help")


#: The states the list's picture shows at once (the STATE column's beginnings), if the
#: traffic brings them within 20 s (none with `--quick`); else it is shot as it comes.
MIX = ("pending", "locked", "blocked", "paused", "finished ok", "finished err", "failed")


async def executions_picture(shots: Shooter) -> None:
    """The live list, the cursor on a workflow that waits (an order for its approval, if
    one is in sight), at a moment that shows every state of `MIX`."""
    from obelisk_tui import model
    from obelisk_tui.screens.executions import ExecutionsScreen
    from obelisk_tui.widgets.execution_list import ExecutionList

    app, pilot = shots.app, shots.pilot
    await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), "the home screen")
    lst = app.screen.query_one(ExecutionList)

    def waits(info: Any) -> bool:
        return model.state_label(info)[0] in ("blocked", "locked")

    def a_waiting_workflow() -> int | None:
        top = int(lst.scroll_y)
        waiting = [
            (":demo/workflow.order" not in info["ffqn"], i)
            for i in range(top + 2, top + lst.size.height - 4)  # not at an edge
            if (info := lst.row(i)) is not None
            and "/workflow." in info["ffqn"]
            and "." not in info["execution_id"]  # top-level
            and waits(info)
        ]
        return min(waiting)[1] if waiting else None

    def states_shown() -> set[str]:
        """The STATE column as the screen shows it now (what the SVG gets)."""
        lines = screen_text(app).splitlines()
        head = next(i for i, line in enumerate(lines) if " STATE " in line)
        start = lines[head].index(" STATE ")
        end = lines[head].index(" WHEN ") if " WHEN " in lines[head] else start + 20
        return {line[start:end].strip() for line in lines[head + 1 : -1]}

    def ready() -> bool:
        shown = states_shown()
        selected = lst.selected
        return (
            all(any(state.startswith(m) for state in shown) for m in MIX)
            and selected is not None
            and waits(selected)
            and shots.footer_ready()
        )

    # A moment when all is in sight, within the time given; else the list as it comes.
    t0 = time.monotonic()
    deadline = t0 + shots.mix_seconds
    while True:
        await until(pilot, lambda: a_waiting_workflow() is not None, "a workflow in the list")
        index = a_waiting_workflow()
        assert index is not None
        lst.move_cursor(index)  # as the keys do: the cursor stays on it
        await until(pilot, lambda: "follows" not in screen_text(app), "the cursor to stay")
        left = deadline - time.monotonic()
        if await within(pilot, ready, min(3.0, max(0.0, left))):
            print(f"  (every state in sight after {time.monotonic() - t0:.1f} s)", flush=True)
            break
        if left <= 0:
            print(f"  (not every state of {MIX} in sight: the list as it is)", flush=True)
            break
    shots.save("executions")


async def detail_pictures(shots: Shooter, ids: dict[str, str]) -> None:
    from obelisk_tui.screens.detail import ExecutionDetailScreen
    from obelisk_tui.screens.executions import ExecutionsScreen
    from obelisk_tui.widgets.event_log import EventLog

    app, pilot, wanted = shots.app, shots.pilot, shots.wanted

    async def open_detail(name: str) -> Any:
        app.open_execution(ids[name])
        await until(
            pilot,
            lambda: (
                isinstance(app.screen, ExecutionDetailScreen)
                and app.screen.execution_id == ids[name]
                and app.screen.info is not None
            ),
            f"the detail screen of {name}",
        )
        return app.screen

    async def back() -> None:
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), "the home screen")

    if "detail-state" in wanted:  # the waiting order's state machine
        await open_detail("order-8")
        await until(pilot, lambda: "BlockedByJoinSet" in screen_text(app), "the state tab")
        await shots.shoot("detail-state")
        await back()

    if wanted & {"detail-events", "detail-result"}:  # the approved order
        detail = await open_detail("order-7")
        if "detail-events" in wanted:  # its events, and where the approval was asked for
            await pilot.press("2")
            log = detail.query_one(EventLog)
            await until(pilot, lambda: bool(log.events), "the events")
            with_bt = [i for i, e in enumerate(log.events) if e.get("backtrace_id") is not None]
            log.move_cursor(with_bt[0])  # the call of the approval stub
            await until(
                pilot, lambda: "approve(orderId)" in screen_text(app), "the backtrace's source"
            )
            await shots.shoot("detail-events")
        if "detail-result" in wanted:
            await pilot.press("5")
            await until(pilot, lambda: "shipped" in screen_text(app), "the result")
            await shots.shoot("detail-result")
        await back()

    if "detail-logs" in wanted:  # a Python activity's logs: a log call, a line on stdout
        await open_detail("step")
        await pilot.press("4")
        await until(pilot, lambda: "step 3 done" in screen_text(app), "the logs")
        await shots.shoot("detail-logs")
        await back()

    if "detail-children" in wanted:  # child workflows and their children
        detail = await open_detail("batch")
        await pilot.press("3")
        await until(
            pilot,
            lambda: screen_text(app).count("myapp:demo/workflow.parallel") >= 2,
            "the children",
        )
        tree: Any = detail.query_one("ChildrenTree")
        tree.root.expand_all()
        await until(
            pilot,
            lambda: screen_text(app).count("myapp:demo/activity.step") >= 10,
            "the grandchildren",
        )
        await shots.shoot("detail-children")
        await back()


async def components_picture(shots: Shooter) -> None:
    from obelisk_tui.screens.components import ComponentsScreen

    await overlay_picture(shots, "C", ComponentsScreen, "started", "components")


async def submit_picture(shots: Shooter) -> None:
    """A function picked by typing, its params checked against the WIT types."""
    from textual.widgets import TextArea

    from obelisk_tui.screens.executions import ExecutionsScreen
    from obelisk_tui.screens.submit import SubmitScreen

    app, pilot = shots.app, shots.pilot
    await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), "the home screen")
    await pilot.press("s")
    await until(
        pilot,
        lambda: isinstance(app.screen, SubmitScreen) and bool(app.screen.functions),
        "the submit form",
    )
    submit: Any = app.screen
    await pilot.press(*"activity.st")
    await pilot.press("enter")
    await until(
        pilot,
        lambda: submit.chosen is not None and submit.chosen["ffqn"] == "myapp:demo/activity.step",
        "the function",
    )
    submit.query_one(TextArea).text = "[3, 250]"
    await until(pilot, lambda: "params match the types" in screen_text(app), "the params check")
    await shots.shoot("submit")
    await pilot.press("escape")


#: The reload: (file in the copy of demo/, text replaced, its replacement).
#: `order.js` now checks the stock before asking for approval: the orders that wait for
#: theirs recorded the approval request first, so their replay fails (they stay on the
#: old version). `sleepy.js` only words its log line otherwise: its execution that
#: sleeps replays as it was recorded and continues on the new code.
RELOAD_EDITS = [
    (
        "workflow/order.js",
        "  let approved;\n",
        "  step(0, 100); // check the stock first\n  let approved;\n",
    ),
    ("workflow/sleepy.js", "console.log(`round ${i}: woke", "console.log(`round ${i + 1}: woke"),
]


async def reload_picture(shots: Shooter, ids: dict[str, str]) -> None:
    """A hot reload that the waiting orders cannot follow, on the components screen."""
    from textual.widgets import DataTable

    from obelisk_tui.screens.components import ComponentsScreen

    app, pilot = shots.app, shots.pilot
    engine = app.backend.engine
    await pilot.press("C")
    await until(
        pilot,
        lambda: isinstance(app.screen, ComponentsScreen) and "started" in screen_text(app),
        "the components",
    )
    generation = engine.reload_status().generation
    edited = []
    for name, old, new in RELOAD_EDITS:  # one write after the other: one reload
        path = Path("demo") / name
        text = path.read_text()
        if old not in text:
            raise SystemExit(f"demo/{name} changed: make.py's RELOAD_EDITS must follow it")
        edited.append((path, text.replace(old, new, 1)))
    for path, text in edited:
        path.write_text(text)
    status = await engine.wait_reload(generation, 30)
    outcomes = {u.execution_id: u.outcome for u in status.upgrades}
    if len(status.changes) != len(RELOAD_EDITS) or outcomes.get(ids["order-8"]) != "failed":
        raise SystemExit(f"the reload is not the one wanted: {status.to_json()}")
    await until(pilot, lambda: "workflow upgrades" in screen_text(app), "the reload's outcomes")
    table: Any = app.screen.query_one("#components", DataTable)
    table.move_cursor(row=table.get_row_index("order"))  # the component that changed
    await until(pilot, lambda: "myapp:demo/workflow.order-cancellable" in screen_text(app), "it")
    await shots.shoot("reload-failed", toasts=True)


# ---------------------------------------------------------------------------------------
# SVG → PNG
# ---------------------------------------------------------------------------------------


def font_file(family: str = "Fira Code") -> str:
    return subprocess.run(
        ["fc-match", family, "--format=%{file}"], capture_output=True, text=True, check=True
    ).stdout


def fit_cells(svg_text: str, font: str) -> str:
    """Make the font's advance exactly one cell of the SVG. Textual places each run of
    text at its cell and gives it a `textLength` (cells × cell width), but cairosvg
    lays the glyphs out at the font's own advance: Fira Code's (0.615 em) is a little
    wider than the cell Textual assumes (0.61 em), so long runs would drift right of
    their columns. A letter-spacing of the difference puts every glyph on its cell."""
    import html
    import re

    from PIL import ImageFont

    size = float(re.search(r"font-size: ([\d.]+)px;\s*line-height", svg_text).group(1))  # type: ignore[union-attr]
    runs = re.findall(r'textLength="([\d.]+)"[^>]*>([^<]+)</text>', svg_text)
    length, chars = max(((float(n), len(html.unescape(t))) for n, t in runs), key=lambda r: r[1])
    cell = length / chars
    advance = ImageFont.truetype(font, 1000).getlength("0") / 1000 * size
    spacing = cell - advance
    return svg_text.replace(
        "font-variant-east-asian: full-width;",
        f"font-variant-east-asian: full-width;\n        letter-spacing: {spacing:.4f}px;",
        1,
    )


def to_png(svg: Path, font: str) -> Path:
    import cairosvg

    png = svg.with_suffix(".png")
    text = fit_cells(svg.read_text(), font)
    cairosvg.svg2png(bytestring=text.encode(), write_to=str(png), output_width=WIDTH_PX)
    # 256 colours (a terminal's few colours and their anti-aliasing): ~4× smaller files.
    from PIL import Image  # cairosvg's dependency

    with Image.open(png) as image:
        small = image.quantize(
            colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE
        )
    small.save(png, optimize=True)
    return png


def check_font() -> None:
    fonts = subprocess.run(["fc-list", ":family"], capture_output=True, text=True).stdout
    if "Fira Code" not in fonts:
        raise SystemExit(
            "the Fira Code font is missing (the SVGs name it; another font breaks the "
            "columns): apt-get install -y fonts-firacode"
        )


def parse_only(value: str) -> set[str]:
    names = {n.strip().removesuffix(".png") for n in value.split(",") if n.strip()}
    unknown = names - set(PICTURES)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"no picture {', '.join(sorted(unknown))} (pictures: {', '.join(PICTURES)})"
        )
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "screenshots", help="where they go")
    p.add_argument(
        "--only", type=parse_only, default=set(PICTURES), help="NAME[,NAME…]: only these"
    )
    p.add_argument("--keep", action="store_true", help="keep the SVGs beside the PNGs")
    p.add_argument("--svg-only", action="store_true", help="only the SVGs (no PNGs)")
    p.add_argument(
        "--traffic-seconds",
        type=int,
        default=60,
        help="how long the traffic runs before the list is shot (60: a full sparkline)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a check that every scene comes: a short traffic (the sparkline is not full), "
        "no wait for a moment when the list shows every state",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=DEFAULT_WORK,
        help=f"the copy of the demo and the data dir, made anew (default {DEFAULT_WORK})",
    )
    args = p.parse_args(argv)
    if not args.svg_only:
        check_font()
    from engine.build_components import COMPONENTS, ensure_built

    for name in COMPONENTS:  # the demo's WASM components (cached builds)
        ensure_built(name)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    lock = (work / ".lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another make.py uses {work}: give another --work") from None
    prepare_work_dir(work)
    os.chdir(work)  # relative deployment and data paths: the title bar shows them
    logfile = work / "screenshots.log"
    logging.basicConfig(filename=str(logfile), filemode="w", level=logging.INFO)
    code = 0
    try:
        quick = args.quick
        svgs = asyncio.run(
            make(out, args.only, 2 if quick else args.traffic_seconds, 0 if quick else 20)
        )
        if not args.svg_only:
            font = font_file()
            for svg in svgs:
                png = to_png(svg, font)
                if not args.keep:
                    svg.unlink()
                shown = png.relative_to(REPO) if png.is_relative_to(REPO) else png
                print(f"{shown}  {png.stat().st_size // 1024} KiB", flush=True)
    except SystemExit as e:  # a scene that did not come (said why)
        print(f"error: {e}  (the engine's log: {logfile})", file=sys.stderr, flush=True)
        code = 1
    finally:
        shutil.rmtree(work / DATA_DIR, ignore_errors=True)
    sys.stdout.flush()
    os._exit(code)  # engine threads of the stopped app must not hold the exit


if __name__ == "__main__":
    sys.exit(main())
