#!/usr/bin/env python3
"""Set up and run the project with nothing but Python 3.11+.

    python3 dev.py demo     # set up, build the demo components, run the console on the demo
    python3 dev.py test     # set up, build, then ruff (lint and format) + mypy + the import
                            # contracts + the whole test suite
    python3 dev.py server   # the demo deployment as a server (REST API, `obelisk` CLI)

Set-up is idempotent: a `.venv` is created and the project installed into it (again
only when pyproject.toml changed); Python-authored components are built once and cached.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"


def sh(*args: str | os.PathLike[str], check: bool = True) -> int:
    print("+", " ".join(str(a) for a in args), flush=True)
    return subprocess.run([str(a) for a in args], cwd=ROOT, check=check).returncode


def setup() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 (dev.py runs on whatever python3 is)
        sys.exit(f"Python 3.11+ is needed, this is {sys.version.split()[0]}")
    if not PY.exists():
        sh(sys.executable, "-m", "venv", VENV)
    stamp = VENV / ".installed"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if not stamp.exists() or stamp.read_text() != want:
        sh(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
        sh(PY, "-m", "pip", "install", "-q", "-e", ".[dev]")
        stamp.write_text(want)
    sh(PY, "-m", "engine.build_components")


def demo(extra: list[str]) -> int:
    """The console on the embedded demo deployment, with demo traffic. Extra arguments go
    to `obelisk-tui` (e.g. `python3 dev.py demo --no-traffic`); `python3 dev.py server`
    runs the demo as a server (REST API + CLI) instead."""
    args = [
        str(VENV / "bin" / "obelisk-tui"),
        "--demo",
        "--data-dir",
        str(ROOT / "data" / "demo"),
        *extra,
    ]
    print("+", " ".join(args), flush=True)
    os.execv(args[0], args)


def server(extra: list[str]) -> int:
    env_token = os.environ.get("OBELISK_API_TOKEN")
    args = [
        str(VENV / "bin" / "obelisk"),
        "server",
        "run",
        "--deployment",
        str(ROOT / "demo" / "deployment.toml"),
        "--data-dir",
        str(ROOT / "data" / "demo-server"),
        *extra,
    ]
    print("+", " ".join(args), flush=True)
    if env_token is None:
        print("(the server prints a token; `export OBELISK_API_TOKEN=…` for the CLI)", flush=True)
    os.execv(args[0], args)


def test(extra: list[str]) -> int:
    sources = ("engine", "obelisk_tui", "tests", "bench", "dev.py")
    sh(PY, "-m", "ruff", "check", *sources)
    sh(PY, "-m", "ruff", "format", "--check", *sources)
    sh(PY, "-m", "mypy")
    sh(VENV / "bin" / "lint-imports")  # the layers: [tool.importlinter] in pyproject.toml
    # Two workers (pytest-xdist): the suite alone uses ~0.8 of a core (it waits on
    # processes, timers and fsyncs), and on 2 cores it ran 12 min serially, 8 min so.
    # `-n 0` (or any -n) given by the caller wins.
    workers = [] if any(a.startswith(("-n", "--numprocesses")) for a in extra) else ["-n", "2"]
    return sh(PY, "-m", "pytest", "-q", *workers, *extra, check=False)


def main() -> int:
    command, *extra = sys.argv[1:] or ["help"]
    if command not in ("demo", "server", "test", "setup"):
        print(__doc__)
        return 2
    setup()
    if command == "demo":
        return demo(extra)
    if command == "server":
        return server(extra)
    if command == "test":
        return test(extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
