"""Console benchmark, the live phases (run through `python -m bench.console --only …`;
shares its helpers with `bench/console.py`; results in docs/benchmarks.md, "Console").

* live-cpu — the console's own CPU while 100 executions/s flow, live and frozen:
  `obelisk server run` on a copy of the 100k database, the console in a separate process
  attached to it (so that process is the console alone), headless at the bench's size;
  the bench submits at `--rate`/s. Windows: live on the list, frozen (space) on the list,
  live again; % of one core of the console process (all its threads, and per thread).
* detail — enter → detail filled, `--samples` times on the 100k database (embedded, as
  `obelisk-tui --deployment`): the cursor is put on a row of the list (spread over the
  first pages and deep ones), `enter` pressed, and the time taken to the first frame of
  the detail screen that shows the execution's state, its title and its events; then
  `esc` and the next.
* rss — the real `obelisk-tui` in tmux panes (160 × 45) for `--minutes`: the demo
  deployment embedded with its traffic (`obelisk-tui --demo`, the README's command, so
  the process is the console and the engine), and a console attached to
  `obelisk server run` on the demo deployment with the same demo traffic driven from the
  bench process (so that process is the console alone). RSS (VmRSS, RssAnon) and CPU of
  each console process every `--sample-seconds` (60); the RSS after 5 minutes against the
  RSS at the end. `--rss-console` picks the consoles (several attached ones share the
  server and the traffic; each embedded one has its own engine) with env vars each, e.g.
  `attached-main:PYTHONPATH=/work/main` against this checkout; `--rss-dump-dir` and
  `--rss-dump-at` take allocator statistics, the collector's passes and smaps from each
  (`bench/rss_hook`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.console import REPO, SIZE, VENV_BIN, Server
from bench.procs import cpu_seconds

# ---------------------------------------------------------------------------------------
# rss: an hour of demo traffic
# ---------------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile (kB) and Threads of a process."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM", "Threads"):
            out[key] = int(value.split()[0])
    return out


class TmuxConsole:
    """`obelisk-tui ARGS` in a detached tmux pane of SIZE, on a tmux server of our own
    (`-L`), so that other tmux sessions on the machine are not touched."""

    def __init__(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.tmux = shutil.which("tmux") or "/usr/bin/tmux"
        self.socket = f"bench-console-{os.getpid()}"
        self.session = name
        # `env` execs the console: the pane's pid stays the console's.
        extra = ["env", *(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())]
        cmd = " ".join(["exec", *(extra if env else []), str(VENV_BIN / "obelisk-tui"), *args])
        self._tmux("new-session", "-d", "-s", name, "-x", str(SIZE[0]), "-y", str(SIZE[1]), cmd)
        self.pid = int(self._tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())

    def _tmux(self, *args: str) -> str:
        return subprocess.run(
            [self.tmux, "-L", self.socket, *args],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
            env={**os.environ, "TERM": "xterm-256color"},
        ).stdout

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.session, *keys)

    def capture(self) -> str:
        try:
            return self._tmux("capture-pane", "-p", "-t", self.session)
        except subprocess.CalledProcessError:
            return ""

    def alive(self) -> bool:
        return Path(f"/proc/{self.pid}").exists()

    def wait_rows(self, timeout: float) -> float | None:
        """Seconds until the pane shows the list title and an execution id."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout:
            pane = self.capture()
            if re.search(r"[\d,]+ executions", pane) and re.search(r"E_[0-9A-Z]{10}", pane):
                return time.perf_counter() - t0
            time.sleep(0.1)
        return None

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._tmux("send-keys", "-t", self.session, "q")
        deadline = time.monotonic() + 20
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        with contextlib.suppress(subprocess.CalledProcessError):
            self._tmux("kill-session", "-t", self.session)
        if self.alive():
            os.kill(self.pid, 9)


def listed_total(pane: str) -> int | None:
    m = re.search(r"([\d,]+) executions", pane)
    return int(m.group(1).replace(",", "")) if m else None


def db_total(data: Path) -> int | None:
    try:
        conn = sqlite3.connect(f"file:{data / 'obelisk.sqlite'}?mode=ro", uri=True, timeout=5)
        try:
            return int(conn.execute("SELECT count(*) FROM executions").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return None


async def _traffic(url: str, stop: asyncio.Event) -> dict[str, int]:
    """The demo's traffic generator (`obelisk_tui.demo_traffic`) against a server."""
    from obelisk_tui.backend import RestBackend
    from obelisk_tui.demo_traffic import DemoTraffic

    backend = await RestBackend.connect(url, None)
    traffic = DemoTraffic(backend)
    traffic.start()
    try:
        await stop.wait()
    finally:
        await traffic.stop()
        await backend.close()
    return {"submitted_top_level": len(traffic.submitted)}


def phase_rss(tmp: Path, args: argparse.Namespace, say: Any) -> dict[str, Any]:
    demo = REPO / "demo" / "deployment.toml"
    from engine.build_components import COMPONENTS, ensure_built

    for name in COMPONENTS:
        ensure_built(name)
    emb_data = tmp / "rss-embedded"
    att_data = tmp / "rss-server"
    for d in (emb_data, att_data):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    server = Server(demo, att_data)
    consoles: dict[str, TmuxConsole] = {}
    # SIGTERM (a `timeout`, a kill): still stop the consoles and the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    dumps: Path | None = args.rss_dump_dir
    # The consoles run this checkout's code (the venv's editable install may be another's),
    # with the hook (`bench/rss_hook`) for the dumps and OBELISK_RSS_GC_THRESHOLDS.
    hook_env = {"PYTHONPATH": str(REPO)}
    if dumps is not None:
        dumps.mkdir(parents=True, exist_ok=True)
        hook_env["OBELISK_RSS_DUMP_DIR"] = str(dumps.resolve())
    dump_at = sorted(float(m) for m in args.rss_dump_at.split(",") if m)
    try:
        data_of: dict[str, Path] = {}
        for spec in args.rss_console or ["embedded", "attached"]:
            name, _, env_spec = spec.partition(":")
            pairs = re.split(r",(?=[A-Za-z_]\w*=)", env_spec)  # a value may hold commas
            env = {**hook_env, **dict(kv.split("=", 1) for kv in pairs if kv)}
            env["PYTHONPATH"] += f":{REPO / 'bench' / 'rss_hook'}"  # also with another's code
            if name.startswith("embedded"):  # each its own engine and data
                data_of[name] = emb_data if name == "embedded" else tmp / f"rss-{name}"
                data_of[name].mkdir(parents=True, exist_ok=True)
                cargs = ["--demo", "--data-dir", str(data_of[name])]
            elif name.startswith("attached"):
                cargs = ["--attach", server.url]
                data_of[name] = att_data
            else:
                raise SystemExit(f"--rss-console {spec}: embedded[NAME] or attached[NAME][:K=V,…]")
            consoles[name] = TmuxConsole(f"rss-{name}-{os.getpid()}", cargs, env)
        started: dict[str, float | None] = {}

        async def run() -> dict[str, Any]:
            stop = asyncio.Event()
            # The attached console shows rows once there are executions.
            traffic = asyncio.ensure_future(_traffic(server.url, stop))
            loop = asyncio.get_running_loop()
            for k, c in consoles.items():
                started[k] = await loop.run_in_executor(None, c.wait_rows, 300.0)
            say(f"rss: consoles up (s): {started}; pids {[c.pid for c in consoles.values()]}")
            samples: dict[str, list[dict[str, Any]]] = {k: [] for k in consoles}
            t0 = time.monotonic()
            cpu0 = {k: cpu_seconds([c.pid]) for k, c in consoles.items()}
            server_cpu0 = cpu_seconds([server.proc.pid])
            last = dict(cpu0)
            t_last = t0
            n = round(args.minutes * 60 / args.sample_seconds)
            for i in range(n + 1):
                if i:
                    await asyncio.sleep(t0 + i * args.sample_seconds - time.monotonic())
                now = time.monotonic()
                for k, c in consoles.items():
                    if not c.alive():
                        samples[k].append({"t_min": round((now - t0) / 60, 2), "dead": True})
                        continue
                    cpu = cpu_seconds([c.pid])
                    pane = c.capture()
                    samples[k].append(
                        {
                            "t_min": round((now - t0) / 60, 2),
                            **proc_status(c.pid),
                            "cpu_percent": round(100 * (cpu - last[k]) / (now - t_last), 1)
                            if i
                            else None,
                            "listed": listed_total(pane),
                            "in_db": db_total(data_of[k]),
                        }
                    )
                    last[k] = cpu
                t_last = now
                if dumps is not None and dump_at and (now - t0) / 60 >= dump_at[0] - 0.01:
                    dump_at.pop(0)
                    for k, c in consoles.items():
                        if c.alive():
                            dump_memory(c.pid, k, dumps)
                load = os.getloadavg()
                say(
                    "rss sample "
                    + json.dumps(
                        {
                            "t_min": round((now - t0) / 60, 2),
                            "load": [round(x, 2) for x in load],
                            **{k: v[-1] for k, v in samples.items()},
                        }
                    )
                )
                for v in samples.values():
                    v[-1]["load1"] = round(load[0], 2)
            wall = time.monotonic() - t0
            stop.set()
            driven = await traffic
            return {
                "samples": samples,
                "traffic": driven,
                "cpu_percent_whole_run": {
                    k: round(100 * (cpu_seconds([c.pid]) - cpu0[k]) / wall, 1)
                    for k, c in consoles.items()
                    if c.alive()
                },
                "server_cpu_percent": round(
                    100 * (cpu_seconds([server.proc.pid]) - server_cpu0) / wall, 1
                ),
            }

        out = asyncio.run(run())
        out["start_to_rows_s"] = started
        out["summary"] = {k: rss_summary(v) for k, v in out["samples"].items()}
        out["final_panes"] = {k: c.capture() for k, c in consoles.items()}
        return out
    finally:
        for c in consoles.values():
            c.stop()
        with contextlib.suppress(Exception):
            subprocess.run(
                [
                    shutil.which("tmux") or "/usr/bin/tmux",
                    "-L",
                    f"bench-console-{os.getpid()}",
                    "kill-server",
                ],
                capture_output=True,
                check=False,
            )
        server.stop()


def dump_memory(pid: int, name: str, dumps: Path) -> None:
    """SIGUSR1 to the console (`bench/rss_hook`: Python's and glibc's allocator
    statistics into DIR/PID-N.txt) and a copy of its /proc/PID/smaps (DIR/PID-N.smaps)."""
    n = len(list(dumps.glob(f"{pid}-*.smaps")))
    shutil.copyfile(f"/proc/{pid}/smaps", dumps / f"{pid}-{n}.smaps")
    (dumps / f"{pid}.name").write_text(name)
    os.kill(pid, signal.SIGUSR1)


def rss_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """RSS (MiB) at 5 minutes and at the end, their ratio, the largest."""
    live = [s for s in samples if "VmRSS" in s]
    if not live:
        return {"dead": True}
    at5 = min(live, key=lambda s: abs(s["t_min"] - 5.0))
    end = live[-1]

    def mib(kb: int) -> float:
        return round(kb / 1024, 1)

    return {
        "rss_5min_mib": mib(at5["VmRSS"]),
        "rss_end_mib": mib(end["VmRSS"]),
        "end_t_min": end["t_min"],
        "ratio_end_to_5min": round(end["VmRSS"] / at5["VmRSS"], 3),
        "rss_max_mib": mib(max(s["VmRSS"] for s in live)),
        "anon_5min_mib": mib(at5["RssAnon"]),
        "anon_end_mib": mib(end["RssAnon"]),
        "died": len(live) < len(samples),
    }


# ---------------------------------------------------------------------------------------
# live-cpu: the console's own CPU at 100 executions/s, live and frozen
# ---------------------------------------------------------------------------------------


async def child_live_cpu(args: argparse.Namespace) -> dict[str, Any]:
    """The console attached to a server through which executions flow (the parent
    submits): a live window, a frozen one (space), a live one again."""
    from bench.console import Probe, _measure_window, console
    from obelisk_tui.backend import RestBackend

    probe = Probe()
    probe.install()
    milestones: dict[str, float] = {}

    async def connect() -> Any:
        return await RestBackend.connect(args.url, None)

    out: dict[str, Any] = {}
    async with console(connect, probe, milestones) as (app, pilot):
        probe.start_lag_monitor()
        await pilot.pause(3.0)
        out["live"] = await _measure_window(probe, args.flow_seconds)
        await pilot.press("space")
        assert app.frozen
        await pilot.pause(2.0)
        out["frozen"] = await _measure_window(probe, args.flow_seconds)
        await pilot.press("space")
        assert not app.frozen
        await pilot.pause(2.0)
        out["live_again"] = await _measure_window(probe, args.flow_seconds)
    return out


def _tmux_windows(c: TmuxConsole, seconds: float) -> dict[str, Any]:
    """The real console's CPU (% of one core) over live, frozen (space), live windows."""

    def window(name: str) -> dict[str, Any]:
        cpu0, t0 = cpu_seconds([c.pid]), time.perf_counter()
        first = listed_total(c.capture())
        time.sleep(seconds)
        cpu1, t1 = cpu_seconds([c.pid]), time.perf_counter()
        return {
            "window": name,
            "seconds": round(t1 - t0, 1),
            "cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / (t1 - t0), 1),
            "listed_first_last": [first, listed_total(c.capture())],
            "load1": round(os.getloadavg()[0], 2),
        }

    out = {"live": window("live")}
    c.send("space")
    time.sleep(2.0)
    out["frozen"] = window("frozen")
    c.send("space")
    time.sleep(2.0)
    out["live_again"] = window("live")
    return out


def phase_live_cpu(
    deployment: Path, data: Path, args: argparse.Namespace, say: Any
) -> dict[str, Any]:
    from bench.console import _child_cmd, submit_flow

    server = Server(deployment, data)
    consoles: list[TmuxConsole] = []
    try:

        async def drive() -> dict[str, Any]:
            stop = asyncio.Event()
            counts: dict[str, int] = {}
            flow = asyncio.ensure_future(submit_flow(server.url, args.rate, stop, counts))
            loop = asyncio.get_running_loop()
            await asyncio.sleep(3.0)  # the flow reaches its rate
            out: dict[str, Any] = {}

            def measured(what: str, run: Any) -> dict[str, Any]:
                s0, n0, w0 = (
                    cpu_seconds([server.proc.pid]),
                    counts.get("ok", 0),
                    time.perf_counter(),
                )
                result: dict[str, Any] = run()
                s1, n1, w1 = (
                    cpu_seconds([server.proc.pid]),
                    counts.get("ok", 0),
                    time.perf_counter(),
                )
                result["driver"] = {
                    "submitted_per_s": round((n1 - n0) / (w1 - w0), 1),
                    "failed_submissions": counts.get("failed", 0),
                    "server_cpu_percent": round(100 * (s1 - s0) / (w1 - w0), 1),
                    "load": [round(x, 2) for x in os.getloadavg()],
                }
                say(f"live-cpu ({what}): {json.dumps(result)}")
                return result

            def headless() -> dict[str, Any]:
                cmd = _child_cmd(
                    "live-cpu", deployment, data, url=server.url, flow_seconds=args.flow_seconds
                )
                proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
                for line in proc.stdout.splitlines():
                    if line.startswith("RESULT "):
                        return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]
                raise SystemExit(f"live-cpu child failed:\n{proc.stdout[-3000:]}\n{proc.stderr}")

            def tmux() -> dict[str, Any]:
                c = TmuxConsole(f"live-cpu-{os.getpid()}", ["--attach", server.url])
                consoles.append(c)
                up = c.wait_rows(120)
                time.sleep(3.0)
                result = _tmux_windows(c, args.flow_seconds)
                result["start_to_rows_s"] = up
                c.stop()
                return result

            out["headless"] = await loop.run_in_executor(None, measured, "headless", headless)
            out["tmux"] = await loop.run_in_executor(None, measured, "tmux", tmux)
            stop.set()
            await flow
            return out

        return asyncio.run(drive())
    finally:
        for c in consoles:
            c.stop()
        server.stop()


# ---------------------------------------------------------------------------------------
# detail: enter → detail filled
# ---------------------------------------------------------------------------------------


def detail_targets(total: int, samples: int, seed: int = 24) -> list[int]:
    """Row indexes: a third among the first rows (what an operator opens most), a third
    within the first ~1,000, a third anywhere in the list."""
    rng = random.Random(seed)
    out = []
    for i in range(samples):
        if i % 3 == 0:
            out.append(rng.randrange(0, min(total, 40)))
        elif i % 3 == 1:
            out.append(rng.randrange(0, min(total, 1000)))
        else:
            out.append(rng.randrange(0, total))
    return out


async def child_detail(args: argparse.Namespace) -> dict[str, Any]:
    from bench.console import Probe, console, summary, visible_loaded, wait_for
    from obelisk_tui.backend import EmbeddedBackend

    probe = Probe()
    probe.install()
    milestones: dict[str, float] = {}

    async def connect() -> Any:
        return await EmbeddedBackend.start(args.deployment, args.data)

    out: dict[str, Any] = {}
    async with console(connect, probe, milestones) as (app, pilot):
        from textual.widgets import Static

        from obelisk_tui import model
        from obelisk_tui.screens.detail import ExecutionDetailScreen
        from obelisk_tui.screens.executions import ExecutionsScreen
        from obelisk_tui.widgets.event_log import EventLog
        from obelisk_tui.widgets.execution_list import ExecutionList

        home = app.screen
        assert isinstance(home, ExecutionsScreen)
        lst = home.query_one(ExecutionList)
        await pilot.pause(1.0)
        probe.start_lag_monitor()
        samples: list[dict[str, Any]] = []
        for index in detail_targets(lst.total, args.samples):
            probe.label = "cursor"

            def at_row(index: int = index) -> bool:
                return lst.cursor == index and lst.row(index) is not None and visible_loaded(lst)

            ready = probe.expect(at_row)
            lst.move_cursor(index)
            await wait_for(ready, 30, f"row {index}")
            await pilot.pause(0.2)
            info = lst.row(index)
            assert info is not None
            eid = info["execution_id"]

            cpu_at: list[float] = []

            def filled(eid: str = eid, cpu_at: list[float] = cpu_at) -> bool:
                screen = app.screen
                if not (isinstance(screen, ExecutionDetailScreen) and screen.execution_id == eid):
                    return False
                shown = screen.info
                title = str(screen.query_one("#detail-title", Static).visual)
                # The Events tab's log is mounted when that tab is first shown: on
                # `enter`, the screen's events and its title with the state (`_show`).
                logs = screen.query(EventLog)
                done = (
                    shown is not None
                    and len(screen.events) == shown["next_version"]
                    and all(len(log.events) == shown["next_version"] for log in logs)
                    and eid in title
                    and model.state_label(shown)[0] in title
                )
                if done:
                    cpu_at.append(time.thread_time())
                return done

            probe.label = "enter"
            cpu0 = time.thread_time()
            t0 = time.perf_counter()
            fut = probe.expect(filled)
            await pilot.press("enter")
            took = await wait_for(fut, 30, f"detail of {eid}") - t0
            screen = app.screen
            assert isinstance(screen, ExecutionDetailScreen)
            samples.append(
                {
                    "index": index,
                    "ffqn": info["ffqn"],
                    "events": len(screen.events),
                    "children": info.get("children") or 0,
                    "ms": round(1000 * took, 1),
                    # The main thread's CPU meanwhile (the engine's SQLite reads are
                    # in other threads): what the wall time is on a quiet machine.
                    "main_cpu_ms": round(1000 * (cpu_at[0] - cpu0), 1),
                }
            )
            probe.label = "esc"
            back = probe.expect(lambda: app.screen is home and visible_loaded(lst))
            await pilot.press("escape")
            await wait_for(back, 30, "the list again")
            await pilot.pause(0.3)
        times = [s["ms"] / 1000 for s in samples]
        out["enter_to_detail"] = {**summary(times), "p95": percentile(times, 95)}
        cpu = [s["main_cpu_ms"] / 1000 for s in samples]
        out["main_thread_cpu"] = {**summary(cpu), "p95": percentile(cpu, 95)}
        out["load_avg"] = os.getloadavg()
        out["slowest"] = sorted(samples, key=lambda s: -s["ms"])[:5]
        out["by_ffqn"] = {
            ffqn: summary([s["ms"] / 1000 for s in samples if s["ffqn"] == ffqn])
            for ffqn in sorted({s["ffqn"] for s in samples})
        }
        out["loop_stalls"] = summary(probe.lags)
        out["slow"] = probe.slow[:20]
        out["samples"] = samples
    return out


def percentile(values: list[float], p: float) -> float | None:
    """The nearest-rank p-th percentile, in ms."""
    if not values:
        return None
    v = sorted(values)
    return round(1000 * v[max(0, min(len(v) - 1, math.ceil(p / 100 * len(v)) - 1))], 1)


CHILDREN = {"live-cpu": child_live_cpu, "detail": child_detail}
