"""`screenshots/make.py` makes every picture of the README from the app as it is.

The script runs as a subprocess (it starts the console headless on a copy of the demo),
into a temporary directory, so the committed PNGs are never rewritten; `--quick`: a
short traffic (the sparkline is not full), the list shot as it comes; the same scenes.
Each picture must come as a PNG of the right size and as an SVG whose screen text shows
what that picture is for.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from tests.console.e2e_helpers import in_ci

pytestmark = pytest.mark.slow  # starts a process: the console and its engine (~40 s)

REPO = Path(__file__).resolve().parents[2]
MAKE = REPO / "screenshots" / "make.py"

#: An execution id as the engine makes them (a ULID), not a made-up one.
EXECUTION_ID = r"E_[0-9A-HJKMNP-TV-Z]{26}"

#: What each picture's screen shows (regular expressions, each on one line).
EXPECTED: dict[str, list[str]] = {
    "executions": [
        r"\d+ executions · newest first\s*$",  # the cursor stays (not "follows the top row")
        r"fin/s",
        r" err [1-9]",  # the workload's flaky activity
        r" failed [1-9]",  # its cancelled order
        rf"^\s+{EXECUTION_ID} +myapp:demo/",
    ],
    "help": [r"█ +Keys +█", r"█ Executions +█", r"█ Filter +█", r"state:locked,paused"],
    "detail-state": [rf"{EXECUTION_ID} +myapp:demo/workflow.order-cancellable", "BlockedByJoinSet"],
    "detail-events": [r"join_set_create", r"demo/workflow/order\.js:\d+", r"approve\(orderId\)"],
    "detail-result": [r"order order-7 shipped"],
    "detail-logs": [r"step 3 done"],
    "detail-children": [r"myapp:demo/workflow\.parallel", r"myapp:demo/activity\.step"],
    "components": [r"^\s+started \d\d:\d\d:\d\d", r"myapp:demo/approval\.approve"],
    "submit": [r"Submit an execution", r"params match the types"],
    "reload-failed": [
        r"reloaded .* \(watch\): 2 component change\(s\), \d workflow upgrade\(s\): "
        r"\d continue on the new code, 2 kept on the old version",
        r"workflow upgrades",
        rf"{EXECUTION_ID} +success",
        rf"{EXECUTION_ID} +failed +at version \d+ the log has join_set_create\(o:1-approve\)",
        r"hot reload",  # the toast
    ],
}

TEXT_RUN = re.compile(
    r'<text[^>]* x="([\d.]+)"[^>]* textLength="([\d.]+)"[^>]*'
    r'clip-path="url\(#[\w-]+-line-(\d+)\)">([^<]*)</text>'
)


def screen_lines(svg: str) -> list[str]:
    """The terminal's lines in Textual's SVG export: each run of text is put back at
    its column (runs of one style are separate elements, blank cells are left out)."""
    runs = [
        (float(x), float(n), int(line), html.unescape(t)) for x, n, line, t in TEXT_RUN.findall(svg)
    ]
    cell = max(runs, key=lambda r: len(r[3]))
    width = cell[1] / len(cell[3])
    lines: dict[int, list[str]] = {}
    for x, _, line, text in runs:
        row = lines.setdefault(line, [])
        col = round(x / width)
        row.extend(" " * (col + len(text) - len(row)))
        row[col : col + len(text)] = text
    return [
        "".join(lines.get(i, [])).replace("\xa0", " ").rstrip("\n") for i in range(max(lines) + 1)
    ]


def test_screen_lines_puts_runs_at_their_columns() -> None:
    svg = (
        '<text class="r1" x="24.4" y="1" textLength="24.4" clip-path="url(#t-line-0)">ab</text>'
        '<text class="r2" x="73.2" y="1" textLength="12.2" clip-path="url(#t-line-0)">c</text>'
        '<text class="r1" x="0" y="2" textLength="36.6" clip-path="url(#t-line-1)">&#160;d&amp;</text>'
    )
    assert screen_lines(svg) == ["  ab  c", " d&"]


def test_make_makes_every_picture(tmp_path: Path) -> None:
    fonts = subprocess.run(["fc-list", ":family"], capture_output=True, text=True).stdout
    if "Fira Code" not in fonts and not in_ci():
        pytest.skip("the Fira Code font is missing: apt-get install -y fonts-firacode")
    if not shutil.which("fc-match"):
        pytest.fail("fontconfig's fc-match is missing")
    out, work = tmp_path / "out", tmp_path / "work"
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(MAKE), "--quick", "--keep", "--out", str(out), "--work", str(work)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )
    took = time.monotonic() - started
    assert run.returncode == 0, f"make.py failed after {took:.0f} s:\n{run.stdout}\n{run.stderr}"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{name}.{ext}" for name in EXPECTED for ext in ("png", "svg")
    )
    for name, patterns in EXPECTED.items():
        with Image.open(out / f"{name}.png") as image:
            assert image.format == "PNG"
            assert image.width == 1600 and 800 < image.height < 1100, (name, image.size)
            assert len(image.getcolors(256) or []) > 8, f"{name}.png is nearly blank"
        assert (out / f"{name}.png").stat().st_size > 10_000, name
        lines = screen_lines((out / f"{name}.svg").read_text())
        assert len(lines) == 45, (name, len(lines))
        for pattern in patterns:
            assert any(re.search(pattern, line) for line in lines), (
                f"{name}: nothing matches {pattern!r} on the screen:\n" + "\n".join(lines)
            )
    # The script never touches the repository's pictures, nor leaves the data dir.
    assert not (work / "data" / "screenshots").exists()
