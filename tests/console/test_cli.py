"""`obelisk-tui` mistakes are one line on stderr and exit 1, before the screen is taken."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.console.conftest import write_deployment


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "obelisk_tui", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--attach", "http://127.0.0.1:9"],
            "cannot reach the obelisk server at http://127.0.0.1:9: connection refused",
        ),
        (["--attach", "127.0.0.1:5005"], "--attach '127.0.0.1:5005' is not an http(s) URL"),
        (["--attach", "http://localhost:99999"], "has an invalid port"),
        (["--deployment", "missing.toml"], "missing.toml: deployment file not found"),
        ([], "give --deployment FILE, --demo or --attach URL"),
        (["--serve", "--serve-listen", "nowhere"], "--serve-listen: expected HOST:PORT"),
        (["--demo", "--processes", "0"], "--processes: must be from 1 to 64, not 0"),
        (
            ["--attach", "http://127.0.0.1:9", "--processes", "2"],
            "--processes is for an embedded engine (--demo, --deployment)",
        ),
    ],
)
def test_mistakes_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    done = run(*args, cwd=tmp_path)
    assert done.returncode in (1, 2)
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_a_deployment_with_a_mistake_is_named(tmp_path: Path) -> None:
    path = write_deployment(tmp_path)
    path.write_text(path.read_text() + "\n[[activity_js]]\nname = 'x'\nlocation = 'nope.js'\n")
    done = run("--deployment", str(path), "--data-dir", str(tmp_path / "data"))
    assert done.returncode == 1
    assert f"{path}: [[activity_js]] #3" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_token_is_checked_before_the_screen(tmp_path: Path) -> None:
    """A server that wants a token, attached without one."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    deployment = write_deployment(tmp_path)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "engine.cli",
            "server",
            "run",
            "--deployment",
            str(deployment),
            "--data-dir",
            str(tmp_path / "data"),
            "--api-listen",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={"PATH": "/usr/bin:/bin", "OBELISK_API_TOKEN": "sekrit"},
    )
    try:
        assert server.stdout is not None
        for line in server.stdout:  # wait for the server to listen
            if "API listening on" in line:
                break
        done = subprocess.run(
            [sys.executable, "-m", "obelisk_tui", "--attach", f"http://127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "OBELISK_API_TOKEN": "wrong"},
        )
        assert done.returncode == 1
        assert "refused the API token" in done.stderr and "OBELISK_API_TOKEN" in done.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)
