"""Screenshots of the console: `.venv/bin/python screenshots/make.py [--out DIR] [--keep]`.

Starts the console headless (`App.run_test`, 160 × 45 cells) on the demo deployment
(`demo/deployment.toml`) with a fresh SQLite file, runs a fixed workload with fixed
execution ids (no random traffic), waits until every execution is where the pictures
want it, then visits each screen and saves Textual's SVG export, converted to a PNG
1600 px wide with cairosvg in the Fira Code font (`fonts-firacode`; the SVG names the
family "Fira Code"). Re-running gives the same pictures except for times (clock times,
ages, the throughput sparkline) and the numbers a random activity rolled.

Files (in `screenshots/`): executions.png, detail-state.png, detail-events.png,
detail-children.png, detail-logs.png, detail-result.png, components.png, submit.png,
help.png. `--keep` also keeps the SVGs.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZE = (160, 45)
WIDTH_PX = 1600

#: The workload: (name, FFQN, params). Ids are fixed: E_ + a ULID of a fixed time and
#: the index, so every run lists the same executions in the same order.
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

#: The time part of every id (2026-12-01T12:00:00Z, in ms).
ID_TIME_MS = int(datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp() * 1000)


def execution_id(index: int) -> str:
    from ulid import ULID

    from engine.core.ids import ExecutionId

    raw = ID_TIME_MS.to_bytes(6, "big") + (index + 1).to_bytes(10, "big")
    return str(ExecutionId.from_ulid(ULID.from_bytes(raw)))


IDS = {name: execution_id(i) for i, (name, _, _) in enumerate(WORKLOAD)}


#: The data dir, relative to the repository (the title bar shows it): recreated each run.
DATA_DIR = Path("data") / "screenshots"


def fresh_data_dir() -> Path:
    """A new data dir whose compiled-component cache is the one tests share (compiling
    the Python demo component takes about a minute; loading it a fraction of a second)."""
    data = DATA_DIR
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    shared = REPO / ".cache" / "engine-compiled"
    shared.mkdir(parents=True, exist_ok=True)
    (data / "cache").symlink_to(shared, target_is_directory=True)
    return data


async def until(
    pilot: Any, predicate: Callable[[], bool | Awaitable[bool]], what: str, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await pilot.pause(0.05)


def screen_text(app: Any) -> str:
    """The text the terminal shows now (the screen and its overlays)."""
    update = app.screen._compositor.render_full_update()
    lines = []
    for strips in update.strips:
        for strip in [strips] if hasattr(strips, "text") else strips:
            lines.append(strip.text)
    return "\n".join(lines)


async def run_workload(engine: Any, pilot: Any) -> None:
    from engine.core.state import state_name

    async def state(name: str) -> str:
        return state_name((await engine.storage.get_row(IDS[name])).state)

    async def is_state(name: str, wanted: str) -> bool:
        return await state(name) == wanted

    for name, ffqn, params in WORKLOAD:
        await engine.submit(ffqn, params, execution_id=IDS[name])
    for order in ("order-7", "order-8", "order-9", "order-10"):

        def waiting(order: str = order) -> Awaitable[bool]:
            return is_state(order, "blocked_by_join_set")

        await until(pilot, waiting, f"{order} to wait")
    await engine.stub(f"{IDS['order-7']}.o:1-approve_1", {"ok": True})
    await engine.pause(IDS["order-9"])
    await engine.cancel(IDS["order-10"])
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
        await engine.result(IDS[name], 120)
    await until(pilot, lambda: is_state("sleepy", "blocked_by_join_set"), "sleepy to sleep")


async def shoot(app: Any, pilot: Any, name: str, out: Path, svgs: list[Path]) -> None:
    app.clear_notifications()
    await pilot.pause(0.4)
    # The footer is recomposed on every binding refresh (a live refresh, a cursor move):
    # wait for a frame that has its keys.
    footers = app.screen.query("Footer")
    if footers:
        await until(pilot, lambda: bool(footers.first().query("FooterKey")), "the footer's keys")
    svg = Path(app.save_screenshot(f"{name}.svg", str(out)))
    svgs.append(svg)
    print(f"  {name}", flush=True)


async def make(out: Path) -> list[Path]:
    from textual.widgets import TextArea

    from obelisk_tui.app import ObeliskApp
    from obelisk_tui.backend import EmbeddedBackend
    from obelisk_tui.screens.components import ComponentsScreen
    from obelisk_tui.screens.detail import ExecutionDetailScreen
    from obelisk_tui.screens.executions import ExecutionsScreen
    from obelisk_tui.screens.submit import SubmitScreen
    from obelisk_tui.widgets.event_log import EventLog
    from obelisk_tui.widgets.execution_list import ExecutionList

    deployment = Path("demo") / "deployment.toml"
    data = fresh_data_dir()

    async def connect() -> Any:
        return await EmbeddedBackend.start(deployment, data)

    svgs: list[Path] = []
    app = ObeliskApp(connect, what="screenshots")
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), "the home screen", 300)
        engine = app.backend.engine  # type: ignore[attr-defined]
        print("running the workload …", flush=True)
        await run_workload(engine, pilot)

        # A long activity, locked while the list is shot (its lock is 5 s; it sleeps 4 s).
        long_id = execution_id(len(WORKLOAD))
        await engine.submit("myapp:demo/activity.step", [5, 4000], execution_id=long_id)

        async def locked() -> bool:
            return bool(
                (await engine.storage.get_row(long_id)).state.__struct_config__.tag == "locked"
            )

        await until(pilot, locked, "the long step to run")
        lst = app.screen.query_one(ExecutionList)
        await until(
            pilot,
            lambda: lst.index_of(long_id) is not None and "locked" in screen_text(app),
            "the list",
        )
        await shoot(app, pilot, "executions", out, svgs)

        # Help panel, over the list.
        await pilot.press("question_mark")
        await until(pilot, lambda: bool(app.screen.query("HelpPanel")), "the help panel")
        await shoot(app, pilot, "help", out, svgs)
        await pilot.press("question_mark")
        await engine.result(long_id, 60)

        # Execution detail: the waiting order's state machine.
        app.open_execution(IDS["order-8"])
        await until(
            pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), "the detail screen"
        )
        detail: Any = app.screen
        await until(
            pilot,
            lambda: detail.info is not None and "BlockedByJoinSet" in screen_text(app),
            "the state tab",
        )
        await shoot(app, pilot, "detail-state", out, svgs)
        await pilot.press("escape")

        # The approved order: events with a backtrace, logs, result.
        app.open_execution(IDS["order-7"])
        await until(
            pilot,
            lambda: isinstance(app.screen, ExecutionDetailScreen) and app.screen is not detail,
            "the detail screen",
        )
        detail = app.screen
        await until(
            pilot,
            lambda: detail.info is not None and detail.info["state"]["type"] == "finished",
            "order-7",
        )
        await pilot.press("2")
        log = detail.query_one(EventLog)
        await until(pilot, lambda: bool(log.events), "the events")
        with_bt = [i for i, e in enumerate(log.events) if e.get("backtrace_id") is not None]
        log.move_cursor(with_bt[0])  # the call of the approval stub
        await until(
            pilot, lambda: "approve(orderId)" in screen_text(app), "the backtrace's source line"
        )
        await shoot(app, pilot, "detail-events", out, svgs)
        await pilot.press("5")
        await until(pilot, lambda: "shipped" in screen_text(app), "the result")
        await shoot(app, pilot, "detail-result", out, svgs)
        await pilot.press("escape")

        # A Python activity's logs: a log call and a line on stdout.
        app.open_execution(IDS["step"])
        await until(
            pilot,
            lambda: isinstance(app.screen, ExecutionDetailScreen) and app.screen is not detail,
            "the detail screen",
        )
        detail = app.screen
        await pilot.press("4")
        await until(pilot, lambda: "step 3 done" in screen_text(app), "the logs")
        await shoot(app, pilot, "detail-logs", out, svgs)
        await pilot.press("escape")

        # Child workflows and their children.
        app.open_execution(IDS["batch"])
        await until(
            pilot,
            lambda: isinstance(app.screen, ExecutionDetailScreen) and app.screen is not detail,
            "the detail screen",
        )
        detail = app.screen
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
        await shoot(app, pilot, "detail-children", out, svgs)
        await pilot.press("escape")
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), "the home screen")

        # Components.
        await pilot.press("C")
        await until(
            pilot,
            lambda: isinstance(app.screen, ComponentsScreen) and "started" in screen_text(app),
            "the components",
        )
        await shoot(app, pilot, "components", out, svgs)
        await pilot.press("escape")

        # Submit: a function picked by typing, its params checked against the WIT types.
        await pilot.press("s")
        await until(
            pilot,
            lambda: (
                isinstance(app.screen, SubmitScreen) and "myapp:demo/wat.add" in screen_text(app)
            ),
            "the submit form",
        )
        submit: Any = app.screen
        await pilot.press(*"activity.st")
        await pilot.press("enter")
        await until(
            pilot,
            lambda: (
                submit.chosen is not None and submit.chosen["ffqn"] == "myapp:demo/activity.step"
            ),
            "the function",
        )
        submit.query_one(TextArea).text = "[3, 250]"
        await until(pilot, lambda: "params match the types" in screen_text(app), "the params check")
        await shoot(app, pilot, "submit", out, svgs)
        await pilot.press("escape")
    return svgs


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO / "screenshots", help="where the PNGs go")
    p.add_argument("--keep", action="store_true", help="keep the SVGs too")
    args = p.parse_args(argv)
    check_font()
    from engine.build_components import COMPONENTS, ensure_built

    for name in COMPONENTS:  # the demo's WASM components (cached builds)
        ensure_built(name)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(REPO)  # relative deployment and data paths: the title bar shows them
    font = font_file()
    log = Path(tempfile.mkstemp(prefix="obelisk-screenshots-", suffix=".log")[1])
    logging.basicConfig(filename=str(log), level=logging.INFO)
    try:
        svgs = asyncio.run(make(out))
        for svg in svgs:
            png = to_png(svg, font)
            if not args.keep:
                svg.unlink()
            shown = png.relative_to(REPO) if png.is_relative_to(REPO) else png
            print(f"{shown}  {png.stat().st_size // 1024} KiB")
    finally:
        shutil.rmtree(DATA_DIR, ignore_errors=True)
        log.unlink(missing_ok=True)
    os._exit(0)  # engine threads of the stopped app must not hold the exit


if __name__ == "__main__":
    sys.exit(main())
