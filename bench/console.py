"""Console benchmark: `obelisk-tui` on 100,000 executions, under 100 executions/s, and
hot reload. Run by hand (not a test); results in docs/benchmarks.md ("Console").

    .venv/bin/python -m bench.console [--count 100000] [--only PHASES] [--db DIR]
        [--runs 3] [--rate 100] [--flow-seconds 30] [--samples 60] [--tmux]
        [--minutes 60] [--sample-seconds 60] [--data-dir DIR] [--json]

Phases (`--only build,first-frame,interact,reload,flow,embedded-flow,live-cpu,detail,tmux,
rss`; default: all but tmux, which needs /usr/bin/tmux and is added by `--tmux`, and rss,
which takes `--minutes`). live-cpu, detail and rss are in `bench/console_live.py` (its
docstring says what they measure):

* build — a deployment (the WAT activity of `tests.fixtures.components`, a JS activity,
  a stub, two JS workflows) and a database of `--count` executions in a mix of states,
  written through the storage layer: the engine itself runs ~1,000 JS order workflows
  (each blocked on a stub approval child; some then approved, rejected, paused or
  cancelled) and ~400 fan-out workflows of 5 children; the rest (~95 %) are activity
  executions written directly with `SqliteStorage.create` / `append` and realistic logs
  (created → locked → finished ok / err after retries / timed out, pending retries,
  long-running locked ones), created over the last 24 hours. `--db DIR` keeps the result
  in DIR and reuses it when DIR already holds one.
* first-frame — `--runs` fresh processes, each starts the console as `obelisk-tui
  --deployment` does (`EmbeddedBackend.start` in the app's loop) under
  `App.run_test(size=(160, 45))`, and reports the time from the process spawn to the
  first frame of the executions screen that shows rows, with the breakdown.
* interact — page-down × 30, end, home, 100 × down, order changes and six filters, each
  timed from the key press to the first frame that shows its result (the cursor at its
  new place with every visible row loaded, or the filtered total), plus every frame's
  time and the event loop's longest stall.
* reload — the console on the Components screen; a JS activity, a JS workflow with no
  running executions and a JS workflow with ~800 running (blocked) ones are edited on
  disk (a comment appended): time from the write to the frame whose table shows the new
  digest, and to the hot-reload toast.
* flow — `obelisk server run` on a copy of the database; a separate console process
  attached to it (`RestBackend`, like `obelisk-tui --attach`); the bench submits a
  trivial activity at `--rate`/s over HTTP. The console process alone is measured: its
  CPU (all its threads, per thread too), its list refreshes and the gaps between them.
* embedded-flow — the same rate submitted into the engine the console embeds (one
  process): refreshes and the process's CPU, split by thread.
* live-cpu — the console's own CPU (% of one core) at `--rate`/s, live / frozen / live:
  headless and the real `obelisk-tui --attach` in tmux, both attached to a server.
* detail — enter → the detail screen filled, `--samples` times, with 100k executions.
* tmux — the real `obelisk-tui --deployment` in a 160×45 tmux pane: spawn → the first
  screen showing rows (polling `capture-pane` every 10 ms).
* rss — the real console on the demo with demo traffic for `--minutes`: RSS every minute.

Headless frames: Textual's headless driver skips the ANSI encoding of each update, so the
probe does it (`CompositorUpdate.render_segments`, the string a terminal would be sent)
and discards it; "frame time" is one run of the screen's update (layout, widget
rendering, compositing, ANSI encoding).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.procs import cpu_seconds, task_cpu

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SIZE = (160, 45)

ACT = "testing:fixtures/activity"
ADD = f"{ACT}.add"
ECHO = f"{ACT}.echo"
FAIL = f"{ACT}.fail"
TRAP = f"{ACT}.trap"
SPIN = f"{ACT}.spin"
GREET = "bench:console/greeter.greet"
APPROVE = "bench:console/approval.approve"
ORDER = "bench:console/workflow.order-cancellable"
FANOUT = "bench:console/workflow.fanout"

GREET_JS = """\
// bench:console/greeter.greet: func(name: string) -> result<string, string>
export default function greet(name) {
  console.log(`greeting ${name}`);
  return `Hello, ${name}!`;
}
"""

ORDER_JS = """\
// bench:console/workflow.order-cancellable: func(order: string) -> result<string, string>
import { approve } from "bench:console/approval";
import { add } from "testing:fixtures/activity";

export default function order(id) {
  console.log(`order ${id}: waiting for approval`);
  if (!approve(id)) return `order ${id} rejected`;
  return `order ${id} shipped (${add(1, 2)})`;
}
"""

FANOUT_JS = """\
// bench:console/workflow.fanout: func(n: u32) -> result<string, string>
import { addSubmit, addAwaitNext } from "testing:fixtures-obelisk-ext/activity";
import * as obelisk from "obelisk:workflow@1.0.0";

export default function fanout(n) {
  const js = obelisk.createJoinSet();
  for (let i = 0; i < n; i++) {
    addSubmit(js, i, 1);
  }
  let acc = 0;
  for (let i = 0; i < n; i++) {
    acc += Number(addAwaitNext(js));
  }
  return String(acc);
}
"""

DEPLOYMENT = """\
[[activity_wasm]]
name = "fixtures"
location = "{wasm}"
max_retries = 3
retry_exp_backoff.milliseconds = 100
exec.lock_expiry.seconds = 30
exec.max_inflight = 64
exec.batch_size = 64

[[activity_js]]
name = "greet"
location = "greet.js"
ffqn = "{greet}"
params = [{{ name = "name", type = "string" }}]
return_type = "result<string, string>"

[[activity_stub]]
ffqn = "{approve}"
params = [{{ name = "order", type = "string" }}]
return_type = "result<bool, string>"

[[workflow_js]]
name = "order"
location = "order.js"
ffqn = "{order}"
params = [{{ name = "order", type = "string" }}]
return_type = "result<string, string>"
blocking_strategy = "interrupt"
exec.lock_expiry.seconds = 5
exec.max_inflight = 128
exec.batch_size = 64

[[workflow_js]]
name = "fanout"
location = "fanout.js"
ffqn = "{fanout}"
params = [{{ name = "n", type = "u32" }}]
return_type = "result<string, string>"
exec.lock_expiry.seconds = 10
exec.max_inflight = 128
exec.batch_size = 64
"""


def write_deployment(directory: Path) -> Path:
    """The bench deployment in `directory` (JS files beside the TOML)."""
    from tests.fixtures.components import activity_component

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "greet.js").write_text(GREET_JS)
    (directory / "order.js").write_text(ORDER_JS)
    (directory / "fanout.js").write_text(FANOUT_JS)
    path = directory / "deployment.toml"
    path.write_text(
        DEPLOYMENT.format(
            wasm=activity_component(), greet=GREET, approve=APPROVE, order=ORDER, fanout=FANOUT
        )
    )
    return path


# ---------------------------------------------------------------------------------------
# Building the database
# ---------------------------------------------------------------------------------------

#: Real workflows run by the engine while building.
ORDERS = 1000
FANOUTS = 400
FANOUT_CHILDREN = 5


async def _wait_states(
    engine: Any, predicate: Callable[[dict[str, int]], bool], timeout: float, what: str
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        counts = await engine.storage.count_by_state()
        if predicate(counts):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"build: timed out waiting for {what}: {counts}")
        await asyncio.sleep(0.2)


async def _run_real_workflows(engine: Any, rng: random.Random) -> dict[str, int]:
    """Orders blocked on approvals (then some approved, rejected, paused, cancelled) and
    finished fan-outs, run by the engine itself: real logs, children and backtraces."""
    orders = []
    for start in range(0, ORDERS, 200):
        orders += await asyncio.gather(
            *(engine.submit(ORDER, [f"order-{i}"]) for i in range(start, min(ORDERS, start + 200)))
        )
    fanouts = []
    for start in range(0, FANOUTS, 100):
        fanouts += await asyncio.gather(
            *(
                engine.submit(FANOUT, [FANOUT_CHILDREN])
                for _ in range(start, min(FANOUTS, start + 100))
            )
        )
    for eid in fanouts:
        await engine.result(eid, 300)
    await _wait_states(
        engine,
        lambda c: c.get("blocked_by_join_set", 0) >= ORDERS,
        300,
        f"{ORDERS} orders to block on their approvals",
    )
    rng.shuffle(orders)
    approved, rejected, paused, cancelled = (
        orders[:120],
        orders[120:180],
        orders[180:260],
        orders[260:300],
    )
    for eid in approved:
        await engine.stub(f"{eid}.o:1-approve_1", {"ok": True})
    for eid in rejected:
        await engine.stub(f"{eid}.o:1-approve_1", {"ok": False})
    for eid in paused:
        await engine.pause(eid)
    for eid in cancelled:
        await engine.cancel(eid)
    for eid in approved + rejected + cancelled:
        await engine.result(eid, 300)
    return {
        "orders": ORDERS,
        "approved": len(approved),
        "rejected": len(rejected),
        "paused": len(paused),
        "cancelled": len(cancelled),
        "fanouts": FANOUTS,
    }


@dataclass
class _Fab:
    """Writes fabricated activity executions through the storage layer."""

    storage: Any
    components: dict[str, Any]
    rng: random.Random
    now: datetime
    retry: Any = None
    executor_id: str = ""
    stats: dict[str, int] = field(default_factory=dict)

    def new_id(self, at: datetime) -> str:
        from ulid import ULID

        from engine.core.ids import ExecutionId

        ms = int(at.timestamp() * 1000)
        return str(
            ExecutionId.from_ulid(ULID.from_bytes(ms.to_bytes(6, "big") + self.rng.randbytes(10)))
        )

    async def one(self, eid: str, t: datetime, kind: str, i: int) -> None:
        from engine.core import events as ev
        from engine.core.ids import new_run_id
        from engine.storage.contract import CreateRequest

        ms = timedelta(milliseconds=1)
        table: dict[str, tuple[str, list[Any]]] = {
            "ok": (ADD, [i, 1]),
            "ok_echo": (ECHO, [f"message {i}"]),
            "ok_greet": (GREET, [f"user-{i % 977}"]),
            "retried_ok": (ECHO, [f"flaky {i}"]),
            "err": (FAIL, [f"error {i % 13}"]),
            "trap": (TRAP, []),
            "pending_retry": (FAIL, [f"later {i}"]),
            "pending_scheduled": (ADD, [i, 2]),
            "locked": (SPIN, []),
        }
        ffqn, params = table[kind]
        comp = self.components[ffqn]
        scheduled = self.now + WAITS_FOR if kind == "pending_scheduled" else t
        created = ev.Created(ffqn, params, scheduled, comp, "Dep_01JKX3M7V9Q2R8T5W0Y4Z6A1BC")
        await self.storage.create(CreateRequest(eid, created), t)
        self.stats[kind] = self.stats.get(kind, 0) + 1
        if kind == "pending_scheduled":
            return
        run = t + 2 * ms
        version = 1

        def lock(at: datetime, expiry: timedelta = timedelta(seconds=30)) -> Any:
            return ev.Locked(comp, self.executor_id, new_run_id(), at + expiry, self.retry)

        if kind in ("ok", "ok_echo", "ok_greet"):
            value = (
                i + 1
                if kind == "ok"
                else params[0]
                if kind == "ok_echo"
                else f"Hello, {params[0]}!"
            )
            await self.storage.append(
                eid, 1, [lock(run), ev.Finished(ev.ResultOk(value))], run + 3 * ms
            )
            return
        if kind == "locked":
            await self.storage.append(eid, 1, [lock(run, self.now - run + WAITS_FOR)], run)
            return
        # Retried: temporary failures with backoff (100 ms × 2^n), then the outcome.
        attempts = {"retried_ok": 2, "err": 4, "trap": 4, "pending_retry": 2}[kind]
        for n in range(attempts):
            await self.storage.append(eid, version, [lock(run)], run)
            version += 1
            end = run + 4 * ms
            last = n == attempts - 1
            if last and kind == "retried_ok":
                await self.storage.append(eid, version, [ev.Finished(ev.ResultOk(params[0]))], end)
                return
            if last and kind == "err":
                await self.storage.append(eid, version, [ev.Finished(ev.ResultErr(params[0]))], end)
                return
            if last and kind == "trap":
                failure = ev.ExecutionFailure(
                    "uncategorized", "trap", "wasm trap: wasm `unreachable` instruction executed"
                )
                await self.storage.append(eid, version, [ev.Finished(failure)], end)
                return
            backoff = end + timedelta(milliseconds=100 * 2**n)
            if last and kind == "pending_retry":
                backoff = self.now + WAITS_FOR
            if kind == "trap":
                event: Any = ev.TemporarilyFailed(
                    backoff, "trap", "wasm trap: wasm `unreachable` instruction executed"
                )
            else:
                event = ev.TemporarilyFailed(backoff, "returned err", json.dumps(params[0]))
            await self.storage.append(eid, version, [event], end)
            version += 1
            run = backoff + 2 * ms


#: How far ahead the fabricated scheduled executions, retries and lock expiries lie. A
#: database kept with `--db` is reused for days: once these passed, every phase's engine
#: ran ~2,000 spinning activities and ~4,000 retries beside the console (load ~40 on two
#: cores), which is not what the phases measure.
WAITS_FOR = timedelta(days=60)

#: Fabricated kinds and their weights (‰).
KINDS: list[tuple[str, int]] = [
    ("ok", 640),
    ("ok_echo", 120),
    ("ok_greet", 60),
    ("retried_ok", 50),
    ("err", 60),
    ("trap", 10),
    ("pending_retry", 20),
    ("pending_scheduled", 20),
    ("locked", 20),
]


async def build_database(
    deployment: Path, data_dir: Path, count: int, seed: int = 7
) -> dict[str, Any]:
    from engine.core import events as ev
    from engine.core.ids import new_executor_id
    from engine.engine import Engine
    from engine.storage.sqlite import SqliteStorage
    from tests.fixtures.components import share_compiled_cache

    share_compiled_cache(data_dir)
    rng = random.Random(seed)
    t0 = time.perf_counter()
    engine = await Engine.start(deployment, data_dir)
    components = {
        ffqn: engine.registry.function(ffqn)[1].component_id
        for ffqn in (ADD, ECHO, FAIL, TRAP, SPIN, GREET)
    }
    try:
        real = await _run_real_workflows(engine, rng)
        real_count = sum((await engine.storage.count_by_state()).values())
    finally:
        await engine.stop()
    t_real = time.perf_counter() - t0

    storage = await SqliteStorage.open(data_dir / "obelisk.sqlite")
    now = datetime.now(UTC)
    fab = _Fab(storage, components, rng, now, ev.RetryConfig(3, 100), new_executor_id())
    n = count - real_count
    names = [k for k, _ in KINDS]
    weights = [w for _, w in KINDS]
    start = now - timedelta(hours=24)
    spacing = (timedelta(hours=24) - timedelta(minutes=10)) / max(1, n)
    t1 = time.perf_counter()
    try:
        batch = 1000
        for first in range(0, n, batch):
            jobs = []
            for i in range(first, min(n, first + batch)):
                t = start + spacing * i + timedelta(microseconds=rng.randint(0, 500_000))
                jobs.append(fab.one(fab.new_id(t), t, rng.choices(names, weights)[0], i))
            await asyncio.gather(*jobs)
        by_state = await storage.count_by_state()
    finally:
        await storage.close()
    t_fab = time.perf_counter() - t1
    size = sum(p.stat().st_size for p in data_dir.glob("obelisk.sqlite*"))
    return {
        "count": sum(by_state.values()),
        "by_state": by_state,
        "real_workflows": real,
        "real_executions": real_count,
        "fabricated": fab.stats,
        "engine_part_s": round(t_real, 1),
        "storage_part_s": round(t_fab, 1),
        "fabricated_per_s": round(n / t_fab),
        "db_bytes": size,
    }


def copy_data(src: Path, dst: Path) -> Path:
    """A copy of a data dir (the database; the compiled-components cache stays shared)."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.glob("obelisk.sqlite*"):
        if p.is_file():  # not the engine's directories beside it (`-peers`, `-executors`)
            shutil.copy2(p, dst / p.name)
    cache = src / "cache"
    if cache.is_symlink():
        (dst / "cache").symlink_to(os.readlink(cache), target_is_directory=True)
    return dst


def db_counts(data_dir: Path) -> dict[str, Any]:
    """Expected answers of the filters, straight from SQLite (not through the console)."""
    import sqlite3

    conn = sqlite3.connect(f"file:{data_dir / 'obelisk.sqlite'}?mode=ro", uri=True)
    try:

        def q(sql: str, *a: Any) -> Any:
            return conn.execute(sql, a).fetchone()[0]

        some_id = conn.execute(
            "SELECT execution_id FROM executions WHERE parent_id IS NULL ORDER BY created_at "
            "LIMIT 1 OFFSET ?",
            (q("SELECT count(*) FROM executions WHERE parent_id IS NULL") // 4,),
        ).fetchone()[0]
        prefix = some_id[:9]  # E_ and 7 ULID characters: ~33 s of creation time
        return {
            "total": q("SELECT count(*) FROM executions"),
            "blocked": q("SELECT count(*) FROM executions WHERE state = 'blocked_by_join_set'"),
            "pending_locked": q(
                "SELECT count(*) FROM executions WHERE state IN ('pending_at', 'locked')"
            ),
            "fail": q("SELECT count(*) FROM executions WHERE ffqn = ?", FAIL),
            "top": q("SELECT count(*) FROM executions WHERE parent_id IS NULL"),
            "id_prefix": prefix,
            "id_prefix_count": q(
                "SELECT count(*) FROM executions WHERE execution_id >= ? AND execution_id < ?",
                prefix,
                prefix + "\U0010ffff",
            ),
            "orders": q("SELECT count(*) FROM executions WHERE ffqn = ?", ORDER),
            "running_orders": q(
                "SELECT count(*) FROM executions WHERE ffqn = ? AND state != 'finished'", ORDER
            ),
        }
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------
# The probe (child processes): frames, displays, loop stalls, CPU by thread
# ---------------------------------------------------------------------------------------


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process, by Python thread name (numbers
    dropped: `obelisk-run_3` counts as `obelisk-run`), summed per name; threads that
    Python does not know (native ones) by their kernel name."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    main = threading.main_thread().native_id
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        cpu = task_cpu(str(task))
        if cpu is None:
            continue
        tid = int(task.name)
        if tid == main:
            name = "main (event loop: Textual + asyncio)"
        elif tid in names:
            name = re.sub(r"[_-]?\d+( \(.*\))?$", "", names[tid]) or names[tid]
        else:
            try:
                name = f"native:{(task / 'comm').read_text().strip()}"
            except OSError:
                continue
        out[name] = out.get(name, 0.0) + cpu
    return out


def summary(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """median / p90 / p99 / max (in ms by default) of a list of seconds."""
    if not values:
        return {"n": 0}
    v = sorted(x * scale for x in values)

    def pct(p: float) -> float:
        return v[max(0, min(len(v) - 1, round(p / 100 * len(v) + 0.5) - 1))]

    return {
        "n": len(v),
        "median": round(statistics.median(v), 2),
        "p90": round(pct(90), 2),
        "p99": round(pct(99), 2),
        "max": round(v[-1], 2),
    }


class Probe:
    """Hooks Textual (this process only) to time frames and see what each one shows."""

    def __init__(self) -> None:
        self.frames: list[tuple[float, float]] = []  # (end, duration) of each screen update
        self.displays: list[float] = []
        self.windows: list[tuple[float, int, int]] = []  # (time, total, offset) of each list window
        self.lags: list[float] = []
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[float]]] = []
        self._lag_task: asyncio.Task[None] | None = None
        #: What the bench is doing now; slow frames and stalls are noted with it.
        self.label = ""
        self.slow: list[tuple[str, str, float]] = []  # (kind, label, ms)
        #: (end, seconds) of every full (generation 2) garbage collection.
        self.full_gcs: list[tuple[float, float]] = []
        self._gc_start = 0.0

    def install(self) -> None:
        from textual._compositor import CompositorUpdate
        from textual.app import App
        from textual.screen import Screen

        from obelisk_tui.widgets.execution_list import ExecutionList

        probe = self
        original_update = Screen._on_timer_update
        original_display = App._display
        original_show = ExecutionList.show_window

        def on_timer_update(screen: Screen[Any]) -> None:
            t0 = time.perf_counter()
            original_update(screen)
            t1 = time.perf_counter()
            probe.frames.append((t1, t1 - t0))
            if t1 - t0 > 0.1:
                probe.slow.append(("frame", probe.label, round(1000 * (t1 - t0))))

        def display(app: App[Any], screen: Screen[Any], renderable: Any) -> None:
            if (
                renderable is not None
                and app.is_headless
                and isinstance(renderable, CompositorUpdate)
            ):
                renderable.render_segments(app.console)  # what a terminal would be sent
            original_display(app, screen, renderable)
            if renderable is None:
                return
            now = time.perf_counter()
            probe.displays.append(now)
            for waiter in list(probe._waiters):
                cond, fut = waiter
                if fut.done():
                    probe._waiters.remove(waiter)
                    continue
                try:
                    hit = cond()
                except Exception:
                    hit = False
                if hit:
                    fut.set_result(now)
                    probe._waiters.remove(waiter)

        def show_window(lst: ExecutionList, total: int, offset: int, rows: list[Any]) -> None:
            original_show(lst, total, offset, rows)
            probe.windows.append((time.perf_counter(), total, offset))

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if info.get("generation") != 2:
                return
            now = time.perf_counter()
            if phase == "start":
                probe._gc_start = now
            else:
                probe.full_gcs.append((now, now - probe._gc_start))

        import gc

        gc.callbacks.append(on_gc)
        Screen._on_timer_update = on_timer_update  # type: ignore[method-assign,assignment]
        App._display = display  # type: ignore[method-assign,assignment]
        ExecutionList.show_window = show_window  # type: ignore[method-assign,assignment]

    def expect(self, cond: Callable[[], bool]) -> asyncio.Future[float]:
        """The time of the first frame displayed from now on for which `cond()` holds."""
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._waiters.append((cond, fut))
        return fut

    def start_lag_monitor(self, period: float = 0.005) -> None:
        async def monitor() -> None:
            while True:
                t = time.perf_counter()
                await asyncio.sleep(period)
                lag = time.perf_counter() - t - period
                self.lags.append(lag)
                if lag > 0.1:
                    self.slow.append(("stall", self.label, round(1000 * lag)))

        self._lag_task = asyncio.get_running_loop().create_task(monitor())

    def frames_since(self, t: float) -> list[float]:
        return [d for end, d in self.frames if end >= t]

    def lags_since_reset(self) -> list[float]:
        return list(self.lags)


def visible_loaded(lst: Any) -> bool:
    rng = lst.visible_range()
    return all(lst.row(i) is not None for i in rng)


async def wait_for(fut: asyncio.Future[float], timeout: float, what: str) -> float:
    try:
        return await asyncio.wait_for(fut, timeout)
    except TimeoutError:
        raise SystemExit(f"timed out ({timeout} s) waiting for {what}") from None


@contextlib.asynccontextmanager
async def console(
    connect: Callable[[], Awaitable[Any]], probe: Probe, milestones: dict[str, float]
) -> Any:
    """The console headless at SIZE; yields (app, pilot) once the first frame of the
    executions screen with rows is displayed (its time in `milestones["first_frame"]`)."""
    from obelisk_tui.app import ObeliskApp
    from obelisk_tui.screens.executions import ExecutionsScreen
    from obelisk_tui.widgets.execution_list import ExecutionList

    async def timed_connect() -> Any:
        milestones["connect_start"] = time.time()
        backend = await connect()
        milestones["connected"] = time.time()
        return backend

    def shows_rows() -> bool:
        screen = app.screen
        if not isinstance(screen, ExecutionsScreen):
            return False
        lst = screen.query_one(ExecutionList)
        return bool(lst.rows) and visible_loaded(lst)

    # As `obelisk-tui` runs it: the start-up objects frozen, the server's GC thresholds.
    app = ObeliskApp(timed_connect, what="bench", tune_gc=True)
    first = probe.expect(shows_rows)
    milestones["app_created"] = time.time()
    async with app.run_test(size=SIZE) as pilot:
        t_first = await wait_for(first, 120, "the first frame with rows")
        milestones["first_frame"] = time.time() - (time.perf_counter() - t_first)
        yield app, pilot


# ---------------------------------------------------------------------------------------
# Child: first frame, interaction
# ---------------------------------------------------------------------------------------


async def child_first_frame(args: argparse.Namespace) -> dict[str, Any]:
    milestones: dict[str, float] = {"imports_start": time.time()}
    from obelisk_tui.backend import EmbeddedBackend

    milestones["imports_done"] = time.time()
    probe = Probe()
    probe.install()

    async def connect() -> Any:
        return await EmbeddedBackend.start(args.deployment, args.data)

    async with console(connect, probe, milestones) as (app, _pilot):
        from obelisk_tui.widgets.execution_list import ExecutionList

        lst = app.screen.query_one(ExecutionList)
        shown = {"total": lst.total, "rows_loaded": len(lst.rows), "offset": lst.start}
        first_frames = [d for _, d in probe.frames]
    spawn = args.spawned_at
    return {
        "spawn_to_first_frame_s": round(milestones["first_frame"] - spawn, 3),
        "spawn_to_imports_s": round(milestones["imports_start"] - spawn, 3),
        "imports_s": round(milestones["imports_done"] - milestones["imports_start"], 3),
        "engine_start_s": round(milestones["connected"] - milestones["connect_start"], 3),
        "connected_to_first_frame_s": round(milestones["first_frame"] - milestones["connected"], 3),
        "app_to_connect_s": round(milestones["connect_start"] - milestones["app_created"], 3),
        "frames_until_first": summary(first_frames),
        "shown": shown,
    }


async def child_interact(args: argparse.Namespace) -> dict[str, Any]:
    from obelisk_tui.backend import EmbeddedBackend

    expected = json.loads(args.expected)
    probe = Probe()
    probe.install()
    milestones: dict[str, float] = {}

    async def connect() -> Any:
        return await EmbeddedBackend.start(args.deployment, args.data)

    results: dict[str, Any] = {}
    async with console(connect, probe, milestones) as (app, pilot):
        from textual.widgets import Input

        from obelisk_tui.screens.executions import ExecutionsScreen
        from obelisk_tui.widgets.execution_list import ExecutionList

        screen = app.screen
        assert isinstance(screen, ExecutionsScreen)
        lst = screen.query_one(ExecutionList)
        await pilot.pause(1.0)
        probe.start_lag_monitor()
        t_start = time.perf_counter()
        windows_before = len(probe.windows)

        async def key(k: str, cond: Callable[[], bool], what: str) -> float:
            probe.label = what
            t0 = time.perf_counter()
            fut = probe.expect(cond)
            await pilot.press(k)
            return await wait_for(fut, 30, what) - t0

        def at_cursor(target: int) -> Callable[[], bool]:
            return lambda: lst.cursor == target and visible_loaded(lst)

        page_downs = []
        for _ in range(30):
            target = min(lst.total - 1, lst.cursor + lst.page_rows)
            page_downs.append(await key("pagedown", at_cursor(target), "page down"))
        results["page_down"] = summary(page_downs)
        results["page_down_fetches"] = len(probe.windows) - windows_before
        ups = []
        for _ in range(20):  # from ~1,200 rows down: every press moves a page
            target = max(0, lst.cursor - lst.page_rows)
            ups.append(await key("pageup", at_cursor(target), "page up"))
        results["page_up"] = summary(ups)
        results["end"] = round(1000 * await key("G", at_cursor(lst.total - 1), "end"), 1)
        results["home"] = round(1000 * await key("g", at_cursor(0), "home"), 1)
        downs = []
        for _ in range(100):
            target = lst.cursor + 1
            downs.append(await key("down", at_cursor(target), "down"))
        results["down"] = summary(downs)
        await key("g", at_cursor(0), "home")

        # Orders (`o` cycles): oldest first, last change first, newest first.
        orders = {}
        for name in ("created_asc", "updated_desc", "created_desc"):
            n = len(probe.windows)

            def ordered(name: str = name, n: int = n) -> bool:
                return (
                    screen.query_state.order == name
                    and len(probe.windows) > n
                    and visible_loaded(lst)
                )

            orders[name] = round(1000 * await key("o", ordered, f"order {name}"), 1)
        results["order"] = orders

        # Filters: "/" opens the box (timed), the text is set, enter applies it (timed).
        box = screen.query_one("#filter", Input)
        filters = {}
        cases = [
            ("state:blocked", expected["blocked"]),
            ("state:pending,locked", expected["pending_locked"]),
            (f"ffqn:{FAIL}", expected["fail"]),
            ("top", expected["top"]),
            (expected["id_prefix"], expected["id_prefix_count"]),
            (f"ffqn:{ORDER} state:finished", None),
        ]
        for text, count in cases:
            open_ms = await key("slash", lambda: box.display and box.has_focus, "filter box")
            box.value = text
            await pilot.pause()
            n = len(probe.windows)

            def filtered(n: int = n, count: int | None = count) -> bool:
                return (
                    len(probe.windows) > n
                    and not box.display
                    and (count is None or lst.total == count)
                    and visible_loaded(lst)
                )

            applied = await key("enter", filtered, f"filter {text}")
            total = lst.total
            n = len(probe.windows)

            def unfiltered(n: int = n) -> bool:
                return (
                    len(probe.windows) > n
                    and lst.total == expected["total"]
                    and visible_loaded(lst)
                )

            cleared = await key("escape", unfiltered, "clear filter")
            filters[text] = {
                "open_ms": round(1000 * open_ms, 1),
                "apply_ms": round(1000 * applied, 1),
                "clear_ms": round(1000 * cleared, 1),
                "total": total,
            }
        results["filters"] = filters
        # Typing into the filter box: each key until its frame.
        await key("slash", lambda: box.display and box.has_focus, "filter box")
        typing = []
        for ch in "state:blocked":

            def echoed(length: int = len(box.value)) -> bool:
                return len(box.value) == length + 1

            typing.append(
                await key(
                    ch if ch.isalnum() else {":": "colon"}.get(ch, ch), echoed, f"typing {ch}"
                )
            )
        results["typing"] = summary(typing)
        await key("escape", lambda: not box.display, "close the box")
        results["frames"] = summary(probe.frames_since(t_start))
        results["loop_stalls"] = summary(probe.lags)
        results["lags_over_50ms"] = sum(1 for x in probe.lags if x > 0.05)
        results["lags_over_100ms"] = sum(1 for x in probe.lags if x > 0.1)
        results["full_gc"] = summary([d for end, d in probe.full_gcs if end >= t_start])
        results["slow"] = probe.slow
        results["wall_s"] = round(time.perf_counter() - t_start, 1)
        results["total"] = lst.total
    return results


# ---------------------------------------------------------------------------------------
# Child: hot reload
# ---------------------------------------------------------------------------------------


async def child_reload(args: argparse.Namespace) -> dict[str, Any]:
    from obelisk_tui.backend import EmbeddedBackend

    probe = Probe()
    probe.install()
    milestones: dict[str, float] = {}
    deployment_dir = Path(args.deployment).parent

    async def connect() -> Any:
        return await EmbeddedBackend.start(args.deployment, args.data)

    out: dict[str, Any] = {}
    async with console(connect, probe, milestones) as (app, pilot):
        from textual.widgets import DataTable

        from obelisk_tui.screens.components import ComponentsScreen

        fut = probe.expect(
            lambda: (
                isinstance(app.screen, ComponentsScreen)
                and app.screen.query_one(DataTable).row_count > 0
            )
        )
        await pilot.press("C")
        await wait_for(fut, 10, "the components screen")
        await pilot.pause(1.0)
        screen = app.screen
        table: Any = screen.query_one(DataTable)

        def digest_cell(name: str) -> str:
            return str(table.get_row(name)[3])

        cases = [("greet", "greet.js"), ("fanout", "fanout.js"), ("order", "order.js")]
        for name, file in cases * args.runs:
            before = digest_cell(name)
            seen = {n.identity for n in app._notifications}
            path = deployment_dir / file
            text = path.read_text() + f"// edited by bench/console.py at {time.time()}\n"

            def new_digest(name: str = name, before: str = before) -> bool:
                return digest_cell(name) != before

            def new_toast(seen: set[str] = seen) -> bool:
                return any(n.identity not in seen for n in app._notifications)

            t_table = probe.expect(new_digest)
            t_toast = probe.expect(new_toast)
            t0 = time.perf_counter()
            path.write_text(text)
            table_s = await wait_for(t_table, 120, f"{name}'s new digest") - t0
            toast_s = await wait_for(t_toast, 120, f"{name}'s reload toast") - t0
            toast = [str(n.message) for n in app._notifications if n.identity not in seen]
            out.setdefault(name, []).append(
                {
                    "table_ms": round(1000 * table_s, 1),
                    "toast_ms": round(1000 * toast_s, 1),
                    "toast": toast,
                }
            )
            await pilot.pause(1.5)
    return out


# ---------------------------------------------------------------------------------------
# Child: the console while executions flow (attached or embedded)
# ---------------------------------------------------------------------------------------


def _refresh_stats(windows: list[tuple[float, int, int]], t0: float, t1: float) -> dict[str, Any]:
    times = [t for t, _, _ in windows if t0 <= t <= t1]
    gaps = [b - a for a, b in zip([t0, *times], [*times, t1], strict=True)]
    totals = [total for t, total, _ in windows if t0 <= t <= t1]
    return {
        "refreshes": len(times),
        "per_s": round(len(times) / (t1 - t0), 2),
        "max_gap_s": round(max(gaps), 3) if gaps else None,
        "gaps_over_1s": sum(1 for g in gaps if g > 1.0),
        "total_first": totals[0] if totals else None,
        "total_last": totals[-1] if totals else None,
    }


def heap() -> dict[str, Any]:
    """Objects the garbage collector tracks, the footer's key widgets alive among them,
    and how long a full collection takes now."""
    import gc

    from textual.widgets._footer import FooterKey

    objects = gc.get_objects()
    keys = sum(1 for o in objects if isinstance(o, FooterKey))
    t0 = time.perf_counter()
    gc.collect()
    return {
        "tracked_objects": len(objects),
        "footer_keys_alive": keys,
        "full_collection_ms": round(1000 * (time.perf_counter() - t0), 1),
    }


async def _measure_window(
    probe: Probe, seconds: float, pid_extra: int | None = None
) -> dict[str, Any]:
    heap0 = heap()
    probe.lags.clear()
    cpu0, th0, w0 = time.process_time(), thread_cpu(), time.perf_counter()
    extra0 = cpu_seconds([pid_extra]) if pid_extra else 0.0
    await asyncio.sleep(seconds)
    cpu1, th1, w1 = time.process_time(), thread_cpu(), time.perf_counter()
    wall = w1 - w0
    threads = {k: round(100 * (th1.get(k, 0.0) - th0.get(k, 0.0)) / wall, 1) for k in th1}
    out = {
        "seconds": round(wall, 2),
        "cpu_percent_of_one_core": round(100 * (cpu1 - cpu0) / wall, 1),
        "threads_percent": {
            k: v for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0
        },
        "refresh": _refresh_stats(probe.windows, w0, w1),
        "frames": summary(probe.frames_since(w0)),
        "loop_stalls": summary(probe.lags),
        "full_gc": summary([d for end, d in probe.full_gcs if w0 <= end <= w1]),
    }
    out["heap_before"], out["heap_after"] = heap0, heap()
    if pid_extra:
        out["other_process_cpu_percent"] = round(
            100 * (cpu_seconds([pid_extra]) - extra0) / wall, 1
        )
    return out


async def child_attached(args: argparse.Namespace) -> dict[str, Any]:
    """The console attached to a server; measures an idle window, then (after the parent
    writes GO on stdin) a window while executions flow."""
    from obelisk_tui.backend import RestBackend

    probe = Probe()
    probe.install()
    milestones: dict[str, float] = {}

    async def connect() -> Any:
        return await RestBackend.connect(args.url, None)

    out: dict[str, Any] = {}
    async with console(connect, probe, milestones) as (_app, pilot):
        probe.start_lag_monitor()
        await pilot.pause(2.0)
        out["idle"] = await _measure_window(probe, args.idle_seconds)
        print("READY", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.readline)
        await asyncio.sleep(2.0)  # the flow reaches its rate
        out["flow"] = await _measure_window(probe, args.flow_seconds)
    return out


async def child_embedded_flow(args: argparse.Namespace) -> dict[str, Any]:
    """The console embedding the engine; this process submits at `rate`/s into it."""
    from obelisk_tui.backend import EmbeddedBackend

    probe = Probe()
    probe.install()
    milestones: dict[str, float] = {}
    backend_box: list[Any] = []

    async def connect() -> Any:
        backend = await EmbeddedBackend.start(args.deployment, args.data)
        backend_box.append(backend)
        return backend

    out: dict[str, Any] = {}
    async with console(connect, probe, milestones) as (_app, pilot):
        probe.start_lag_monitor()
        await pilot.pause(2.0)
        out["idle"] = await _measure_window(probe, args.idle_seconds)
        engine = backend_box[0].engine
        submitted = [0]

        pending: set[asyncio.Future[Any]] = set()

        async def flow() -> None:
            period = 1.0 / args.rate
            t_next = time.perf_counter()
            i = 0
            while True:
                t_next += period
                i += 1
                fut = asyncio.ensure_future(engine.submit(ADD, [i, 1]))
                pending.add(fut)
                fut.add_done_callback(pending.discard)
                submitted[0] += 1
                await asyncio.sleep(max(0.0, t_next - time.perf_counter()))

        task = asyncio.ensure_future(flow())
        await asyncio.sleep(2.0)
        n0, f0 = submitted[0], (await engine.storage.count_by_state()).get("finished", 0)
        out["flow"] = await _measure_window(probe, args.flow_seconds)
        n1, f1 = submitted[0], (await engine.storage.count_by_state()).get("finished", 0)
        out["flow"]["submitted_per_s"] = round((n1 - n0) / out["flow"]["seconds"], 1)
        out["flow"]["finished_per_s"] = round((f1 - f0) / out["flow"]["seconds"], 1)
        task.cancel()
    return out


CHILDREN: dict[str, Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]] = {
    "first-frame": child_first_frame,
    "interact": child_interact,
    "reload": child_reload,
    "attached": child_attached,
    "embedded-flow": child_embedded_flow,
}


def child_main(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.WARNING, filename=str(Path(args.data) / "bench-console.log"))
    children = dict(CHILDREN)
    if args.child not in children:
        from bench.console_live import CHILDREN as LIVE_CHILDREN

        children.update(LIVE_CHILDREN)
    result = asyncio.run(children[args.child](args))
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # engine threads of a stopped app must not hold the exit


# ---------------------------------------------------------------------------------------
# Parent: orchestration
# ---------------------------------------------------------------------------------------


def _child_cmd(child: str, deployment: Path, data: Path, **extra: Any) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "bench.console",
        "--child",
        child,
        "--deployment",
        str(deployment),
        "--data",
        str(data),
        "--spawned-at",
        repr(time.time()),
    ]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def run_child(
    child: str, deployment: Path, data: Path, timeout: float = 900, **extra: Any
) -> dict[str, Any]:
    cmd = _child_cmd(child, deployment, data, **extra)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])  # type: ignore[no-any-return]
    raise SystemExit(
        f"child {child} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    )


class Server:
    """`obelisk server run` on a data dir, in its own process."""

    def __init__(self, deployment: Path, data: Path) -> None:
        exe = VENV_BIN / "obelisk"
        cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "engine.cli"]
        self.proc = subprocess.Popen(
            [
                *cmd,
                "server",
                "run",
                "--deployment",
                str(deployment),
                "--data-dir",
                str(data),
                "--api-listen",
                "127.0.0.1:0",
                "--allow-unauthenticated-api",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
        )
        self.output: list[str] = []
        deadline = time.monotonic() + 180
        assert self.proc.stdout is not None
        self.url = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line)
            m = re.search(r"API listening on (http://\S+)", line)
            if m:
                self.url = m.group(1)
                break
        if not self.url:
            self.stop()
            raise SystemExit("server did not start:\n" + "".join(self.output))
        self._drain = asyncio.Event()
        import threading

        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def submit_flow(url: str, rate: float, stop: asyncio.Event, counts: dict[str, int]) -> None:
    """POST /v1/executions at `rate`/s (scheduled, not back to back) until `stop`."""
    import aiohttp

    period = 1.0 / rate
    async with aiohttp.ClientSession() as session:

        async def one(i: int) -> None:
            async with session.post(
                f"{url}/v1/executions", json={"ffqn": ADD, "params": [i, 1]}
            ) as r:
                await r.read()
                counts["ok" if r.status < 300 else "failed"] = (
                    counts.get("ok" if r.status < 300 else "failed", 0) + 1
                )

        tasks: set[asyncio.Task[None]] = set()
        t_next = time.perf_counter()
        i = 0
        while not stop.is_set():
            i += 1
            task = asyncio.ensure_future(one(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            t_next += period
            await asyncio.sleep(max(0.0, t_next - time.perf_counter()))
        await asyncio.gather(*tasks, return_exceptions=True)


def phase_flow(deployment: Path, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    server = Server(deployment, data)
    try:
        cmd = _child_cmd(
            "attached",
            deployment,
            data,
            url=server.url,
            idle_seconds=args.idle_seconds,
            flow_seconds=args.flow_seconds,
        )
        child = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdin is not None
        for line in child.stdout:
            if line.startswith("READY"):
                break
        else:
            raise SystemExit(
                "attached console did not start:\n" + (child.stderr.read() if child.stderr else "")
            )

        async def drive() -> dict[str, Any]:
            stop = asyncio.Event()
            counts: dict[str, int] = {}
            task = asyncio.ensure_future(submit_flow(server.url, args.rate, stop, counts))
            assert child.stdin is not None
            s0, w0 = cpu_seconds([server.proc.pid]), time.perf_counter()
            child.stdin.write("GO\n")
            child.stdin.flush()
            loop = asyncio.get_running_loop()
            lines: list[str] = await loop.run_in_executor(None, lambda: list(child.stdout or []))
            s1, w1 = cpu_seconds([server.proc.pid]), time.perf_counter()
            stop.set()
            await task
            return {
                "lines": lines,
                "submitted": counts,
                "submitted_per_s": round(counts.get("ok", 0) / (w1 - w0), 1),
                "server_cpu_percent": round(100 * (s1 - s0) / (w1 - w0), 1),
            }

        driven = asyncio.run(drive())
        child.wait(60)
        for line in driven.pop("lines"):
            if line.startswith("RESULT "):
                result: dict[str, Any] = json.loads(line[len("RESULT ") :])
                result["driver"] = driven
                return result
        raise SystemExit(
            "attached console gave no result:\n" + (child.stderr.read() if child.stderr else "")
        )
    finally:
        server.stop()


def phase_tmux(deployment: Path, data: Path, runs: int) -> dict[str, Any]:
    """The real `obelisk-tui` in a tmux pane: spawn → first screen with rows; then page
    down × 10 (send-keys → the pane's first listed id changes), polling every 10 ms."""
    tmux = shutil.which("tmux") or "/usr/bin/tmux"
    exe = VENV_BIN / "obelisk-tui"
    times = []
    pages: list[float] = []

    def capture(session: str) -> str:
        return subprocess.run(
            [tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
        ).stdout

    def first_id(text: str) -> str | None:
        m = re.search(r"E_[0-9A-Z]{10}\S*", text)
        return m.group(0) if m else None

    for run in range(runs):
        session = f"bench-console-{os.getpid()}-{run}"
        cmd = f"{exe} --deployment {deployment} --data-dir {data}"
        t0 = time.perf_counter()
        subprocess.run(
            [tmux, "new-session", "-d", "-s", session, "-x", str(SIZE[0]), "-y", str(SIZE[1]), cmd],
            check=True,
        )
        try:
            seen = None
            while time.perf_counter() - t0 < 120:
                pane = subprocess.run(
                    [tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True
                ).stdout
                if re.search(r"[\d,]+ executions · newest first", pane) and re.search(
                    r"E_[0-9A-Z]{10}", pane
                ):
                    seen = time.perf_counter() - t0
                    break
                time.sleep(0.01)
            times.append(seen)
            time.sleep(1.0)
            for _ in range(10 if seen is not None else 0):
                before = first_id(capture(session))
                t1 = time.perf_counter()
                subprocess.run([tmux, "send-keys", "-t", session, "PageDown"], check=True)
                while time.perf_counter() - t1 < 10:
                    now = first_id(capture(session))
                    if now is not None and now != before:
                        pages.append(time.perf_counter() - t1)
                        break
                    time.sleep(0.01)
                time.sleep(0.3)
        finally:
            subprocess.run([tmux, "send-keys", "-t", session, "q"], check=False)
            time.sleep(2.0)
            subprocess.run([tmux, "kill-session", "-t", session], check=False, capture_output=True)
    return {
        "spawn_to_rows_s": [None if t is None else round(t, 3) for t in times],
        "page_down": summary(pages),
    }


def machine() -> dict[str, Any]:
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--", "obelisk_tui", "engine"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    return {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "commit": head + (" (obelisk_tui/ or engine/ modified)" if dirty else ""),
        "load_avg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }


PHASES = (
    "build",
    "first-frame",
    "interact",
    "reload",
    "flow",
    "embedded-flow",
    "live-cpu",
    "detail",
    "tmux",
    "rss",
)
#: Not run unless asked for (`--only`; tmux also by `--tmux`).
OPT_IN = {"tmux", "rss"}


@contextlib.contextmanager
def workdir(parent: Path | None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="obelisk-bench-console-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=100_000, help="executions in the database (100000)")
    p.add_argument("--only", help=f"comma-separated phases of {','.join(PHASES)}")
    p.add_argument("--tmux", action="store_true", help="also the tmux phase")
    p.add_argument("--db", type=Path, help="keep/reuse the built deployment and database here")
    p.add_argument(
        "--runs", type=int, default=3, help="first-frame processes, reload edits per file (3)"
    )
    p.add_argument(
        "--rate", type=float, default=100.0, help="executions/s in the flow phases (100)"
    )
    p.add_argument(
        "--flow-seconds", type=float, default=30.0, help="measured window while flowing (30)"
    )
    p.add_argument("--idle-seconds", type=float, default=10.0, help="measured idle window (10)")
    p.add_argument(
        "--samples", type=int, default=60, help="enter → detail samples (detail phase, 60)"
    )
    p.add_argument("--minutes", type=float, default=60.0, help="length of the rss phase (60)")
    p.add_argument("--sample-seconds", type=float, default=60.0, help="rss sampling period (60)")
    p.add_argument(
        "--rss-console",
        action="append",
        help="rss: a console, embedded[NAME] or attached[NAME], [:K=V,…] env vars; repeatable "
        "(default: embedded and attached); e.g. attached-malloc:PYTHONMALLOC=malloc",
    )
    p.add_argument(
        "--rss-dump-dir",
        type=Path,
        help="rss: at --rss-dump-at, allocator statistics and smaps of each console here",
    )
    p.add_argument("--rss-dump-at", default="5,25", help="rss: minutes of the dumps (5,25)")
    p.add_argument("--data-dir", type=Path, help="parent of the temporary directories")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    # child processes
    p.add_argument("--child", help=argparse.SUPPRESS)  # CHILDREN, console_live.CHILDREN
    p.add_argument("--deployment", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--spawned-at", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--expected", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args)

    phases = set(args.only.split(",")) if args.only else set(PHASES) - OPT_IN
    if args.tmux:
        phases.add("tmux")
    unknown = phases - set(PHASES)
    if unknown:
        p.error(f"unknown phases {sorted(unknown)}")
    results: dict[str, Any] = {"machine": machine()}

    def say(text: str) -> None:
        if not args.json:
            print(text, flush=True)

    with workdir(args.data_dir) as tmp:
        if "rss" in phases:  # the demo deployment: no database to build
            from bench.console_live import phase_rss

            results["rss"] = phase_rss(tmp, args, say)
            say(f"rss: {json.dumps({k: v for k, v in results['rss'].items() if k != 'samples'})}")
            phases.discard("rss")
            if not phases:
                results["machine"]["load_avg_end"] = os.getloadavg()
                if args.json:
                    print(json.dumps(results))
                return 0
        base = args.db or tmp / "base"
        deployment = base / "deployment" / "deployment.toml"
        data = base / "data"
        if not (data / "obelisk.sqlite").exists():
            say(f"building {args.count:,} executions in {base} …")
            write_deployment(deployment.parent)
            results["build"] = asyncio.run(build_database(deployment, data, args.count))
            say(f"  {json.dumps(results['build'])}")
        expected = db_counts(data)
        results["expected"] = expected
        say(f"database: {json.dumps(expected)}")

        def fresh(name: str) -> tuple[Path, Path]:
            """A copy of the deployment and database (the phase may change them)."""
            d = tmp / name
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(deployment.parent, d / "deployment")
            return d / "deployment" / "deployment.toml", copy_data(data, d / "data")

        if "first-frame" in phases:
            runs = []
            for _ in range(args.runs):
                dep, dat = fresh("first-frame")
                runs.append(run_child("first-frame", dep, dat))
                say(f"first frame: {json.dumps(runs[-1])}")
            results["first_frame"] = runs
        if "interact" in phases:
            dep, dat = fresh("interact")
            results["interact"] = run_child("interact", dep, dat, expected=json.dumps(expected))
            say(f"interact: {json.dumps(results['interact'])}")
        if "reload" in phases:
            dep, dat = fresh("reload")
            results["reload"] = run_child("reload", dep, dat, runs=args.runs)
            say(f"reload: {json.dumps(results['reload'])}")
        if "flow" in phases:
            dep, dat = fresh("flow")
            results["flow"] = phase_flow(dep, dat, args)
            say(f"flow (attached): {json.dumps(results['flow'])}")
        if "embedded-flow" in phases:
            dep, dat = fresh("embedded-flow")
            results["embedded_flow"] = run_child(
                "embedded-flow",
                dep,
                dat,
                rate=args.rate,
                idle_seconds=args.idle_seconds,
                flow_seconds=args.flow_seconds,
            )
            say(f"flow (embedded): {json.dumps(results['embedded_flow'])}")
        if "live-cpu" in phases:
            from bench.console_live import phase_live_cpu

            dep, dat = fresh("live-cpu")
            results["live_cpu"] = phase_live_cpu(dep, dat, args, say)
        if "detail" in phases:
            dep, dat = fresh("detail")
            results["detail"] = run_child("detail", dep, dat, samples=args.samples)
            d = results["detail"]
            say(f"detail: {json.dumps({k: v for k, v in d.items() if k != 'samples'})}")
        if "tmux" in phases:
            dep, dat = fresh("tmux")
            results["tmux"] = phase_tmux(dep, dat, args.runs)
            say(f"tmux: {json.dumps(results['tmux'])}")
        results["machine"]["load_avg_end"] = os.getloadavg()
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
