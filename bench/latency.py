"""Latency: submit → result of one trivial WASM activity through the REST API.

    .venv/bin/python -m bench.latency [--samples 500] [--warmup 50] [--cli-runs 20] [--json]

Starts `obelisk server run --allow-unauthenticated-api` as a subprocess on a free port
(`--api-listen 127.0.0.1:0`, the bound port is read from its output) with a fresh
temporary data directory and the `testing:fixtures/activity` component. Then, over one
kept-alive HTTP connection (what an in-process client does), each sample is

    POST /v1/executions {"ffqn": "testing:fixtures/activity.add", "params": [i, 1]}
    GET  /v1/executions/{id}?follow=true

timed from before the POST to the parsed result, sequentially (one execution in flight).
The server wakes the follow request from the commit notification: no polling. Reported:
median / p90 / p99 / max of the round trip, and of its two halves.

For context it also times whole `obelisk execution submit FFQN PARAMS --follow` processes
(a new Python interpreter each time, so mostly interpreter and import start-up), and
`python -c pass` for the interpreter alone.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

FFQN = "testing:fixtures/activity.add"
REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def _obelisk() -> list[str]:
    exe = VENV_BIN / "obelisk"
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "engine.cli"]


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    k = max(0, min(len(sorted_values) - 1, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


def summarize(values_s: list[float]) -> dict[str, float]:
    v = sorted(x * 1000 for x in values_s)
    return {
        "median_ms": round(statistics.median(v), 3),
        "p90_ms": round(percentile(v, 90), 3),
        "p99_ms": round(percentile(v, 99), 3),
        "min_ms": round(v[0], 3),
        "max_ms": round(v[-1], 3),
    }


class Server:
    """`obelisk server run` in a subprocess; `url` once it listens."""

    def __init__(self, workdir: Path) -> None:
        sys.path.insert(0, str(REPO))
        from tests.fixtures.components import activity_component

        deployment = workdir / "deployment.toml"
        deployment.write_text(
            "[[activity_wasm]]\n"
            'name = "fixtures"\n'
            f'location = "{activity_component()}"\n'
            "max_retries = 0\n"
        )
        self.output: list[str] = []
        self.proc = subprocess.Popen(
            [
                *_obelisk(),
                "server",
                "run",
                "--deployment",
                str(deployment),
                "--data-dir",
                str(workdir / "data"),
                "--api-listen",
                "127.0.0.1:0",
                "--allow-unauthenticated-api",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=workdir,
        )
        self.url = self._wait_listening(timeout=120)
        m = re.match(r"http://([^:/]+):(\d+)", self.url)
        assert m, self.url
        self.host, self.port = m.group(1), int(m.group(2))

    def _wait_listening(self, timeout: float) -> str:
        found: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.output.append(line)
                m = re.search(r"API listening on (http://\S+)", line)
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(timeout)
        if not found:
            self.stop()
            raise SystemExit("server did not start:\n" + "".join(self.output))
        return found[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _request(conn: http.client.HTTPConnection, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Accept": "application/json"}
    if data is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=data, headers=headers)
    response = conn.getresponse()
    payload = response.read()
    if response.status >= 300:
        raise SystemExit(f"{method} {path}: HTTP {response.status}: {payload[:300]!r}")
    return json.loads(payload)


def measure_http(server: Server, samples: int, warmup: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    total: list[float] = []
    submit: list[float] = []
    follow: list[float] = []
    for i in range(warmup + samples):
        t0 = time.perf_counter()
        eid = _request(conn, "POST", "/v1/executions", {"ffqn": FFQN, "params": [i, 1]})[
            "execution_id"
        ]
        t1 = time.perf_counter()
        result = _request(conn, "GET", f"/v1/executions/{eid}?follow=true")
        t2 = time.perf_counter()
        if result != {"ok": i + 1}:
            raise SystemExit(f"unexpected result of {eid}: {result!r}")
        if i >= warmup:
            total.append(t2 - t0)
            submit.append(t1 - t0)
            follow.append(t2 - t1)
    conn.close()
    return {
        "samples": samples,
        "warmup": warmup,
        "round_trip": summarize(total),
        "submit": summarize(submit),
        "follow": summarize(follow),
    }


def measure_cli(server: Server, runs: int) -> dict[str, Any]:
    env = dict(os.environ, OBELISK_API_URL=server.url)
    env.pop("OBELISK_API_TOKEN", None)
    cli: list[float] = []
    bare: list[float] = []
    for i in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            [*_obelisk(), "execution", "submit", FFQN, f"[{i}, 1]", "--follow", "--json"],
            capture_output=True,
            text=True,
            env=env,
        )
        cli.append(time.perf_counter() - t0)
        if proc.returncode != 0 or json.loads(proc.stdout)["result"] != {"ok": i + 1}:
            raise SystemExit(f"CLI run failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        bare.append(time.perf_counter() - t0)
    return {"runs": runs, "cli_submit_follow": summarize(cli), "python_c_pass": summarize(bare)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=500, help="measured samples (500)")
    p.add_argument("--warmup", type=int, default=50, help="unmeasured samples first (50)")
    p.add_argument("--cli-runs", type=int, default=20, help="`obelisk … --follow` runs (20)")
    p.add_argument("--data-dir", type=Path, help="parent of the data dir (default: a temp dir)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    args = p.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="obelisk-latency-", dir=args.data_dir))
    server = None
    try:
        server = Server(workdir)
        result = {"http": measure_http(server, args.samples, args.warmup)}
        if args.cli_runs > 0:
            result["cli"] = measure_cli(server, args.cli_runs)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return 0
    h = result["http"]

    def line(label: str, s: dict[str, float]) -> str:
        return (
            f"  {label:<22} median {s['median_ms']:7.2f} ms   p90 {s['p90_ms']:7.2f} ms   "
            f"p99 {s['p99_ms']:7.2f} ms   max {s['max_ms']:7.2f} ms"
        )

    print(
        f"{h['samples']} sequential executions of {FFQN} over one HTTP connection "
        f"(after {h['warmup']} warm-up):"
    )
    print(line("submit → result", h["round_trip"]))
    print(line("  POST /v1/executions", h["submit"]))
    print(line("  GET …?follow=true", h["follow"]))
    if "cli" in result:
        c = result["cli"]
        print(f"`obelisk execution submit … --follow`, {c['runs']} runs (new process each):")
        print(line("whole process", c["cli_submit_follow"]))
        print(line("python -c pass", c["python_c_pass"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
