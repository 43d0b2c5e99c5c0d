"""Peer benchmark: Restate 1.7 doing our benchmark "(b)" (many workflows x sequential steps).

    /work/peers-venv/bin/python bench/peers/restate_steps.py --workflows 100 --per-workflow 10 \
        --rounds 3 [--variant call|run|both] [--warmup 20] [--data-dir DIR] [--no-netns] [--json]

Needs the peer's own environment (bench/peers/README.md): a virtualenv with `restate-sdk`,
`hypercorn` and `aiohttp` (not the project's .venv) and the `restate-server` binary from
npm (`--restate-server PATH`, or `$RESTATE_SERVER_BIN`, default under /work/peers-npm).

What it does: starts `restate-server` on a fresh data directory (a temp dir, under
`--data-dir` if given) listening on TCP loopback only, on free ports (ingress, admin,
fabric: set in a generated `restate.toml`, telemetry off); starts this file as the
Python SDK service under hypercorn (one worker process, HTTP/2 cleartext, which hypercorn
speaks by default: prior knowledge; the h2 stream and keep-alive limits raised as the
Restate docs recommend); registers the deployment (`POST /deployments` on the admin API);
warms up with `--warmup` small workflows; then each round submits `--workflows`
invocations at once through the ingress HTTP API (`POST /StepWorkflow/<handler>`, one
request per workflow waiting for its result), checks every result and reports wall time
(first submit to last result) and the user+sys CPU (`/proc/<pid>/stat`) of the
restate-server process and of the hypercorn process tree over the round. Everything
started is stopped on exit, on errors too.

Network: restate-server tries one look-up of its latest release on GitHub at start-up
(`check_if_latest_version` in its `main.rs`, no setting turns it off). So, when it can
(root and `unshare` on PATH; `--no-netns` to not), the script re-runs itself in a network
namespace of its own with only loopback up: the server, the SDK service and the load
client all talk over that namespace's 127.0.0.1 and nothing can leave the machine.

Workload — a workflow is one invocation of the `StepWorkflow` *Service* handler (a
Service, not a Virtual Object: every invocation has its own id and they all run
concurrently) that makes `--per-workflow` sequential steps, awaiting each before the
next; steps = workflows x per-workflow:

* `--variant call` (default): a step is `await ctx.service_call(step, x)` — a durable RPC
  to the `StepActivity.step` handler (returns x+1), an invocation of its own with its own
  journal: the equivalent of our child execution (the activity call).
* `--variant run`: a step is `await ctx.run_typed("step", inline_step, RunOptions(), x)` — a
  journaled side effect inside the workflow's own journal (the "inline step").
* `--variant both`: both, on the same server, reported separately.

Durability (Restate 1.7.12, single node, default configuration; read from the server's
`--dump-config` output and from the restate source at v1.7.x):

* The durable state is the Bifrost log. In 1.7 its default provider is
  `replicated` (`[bifrost] default-provider`, even on one node, `default-replication = 1`):
  records are stored by the node's `log-server` role in RocksDB, and the log-server
  writer commits each write batch with `WriteOptions::set_sync(true)` — fsync of the
  RocksDB WAL per batch (group commit) — unless `[log-server] rocksdb-disable-wal-fsync =
  true` (default `false`; `crates/log-server/src/rocksdb_logstore/writer.rs`,
  `crates/types/src/config/log_server.rs`). `rocksdb-disable-wal` (default false,
  "[DANGEROUS]") would skip the WAL altogether.
* The partition store (journals, state, the worker's RocksDB) writes with the WAL
  *disabled* ("We disable WAL since bifrost is our durable distributed log",
  `crates/partition-store/src/partition_store.rs`): it is rebuilt from the log (or a
  snapshot) after a crash, so it needs no fsync.
* `[bifrost.local]` (`rocksdb-disable-wal-fsync = false`, `writer-batch-commit-count =
  5000`, `writer-batch-commit-duration = "0s"`) applies only to the older `local`
  loglet provider, which is not the default any more.
* A record is acknowledged (and acted on by the partition processor, hence any result the
  client sees) only once the log-server has stored it, i.e. after its fsync.

So Restate's default on one node is already fsync-per-group-commit, like our SQLite WAL
with synchronous=FULL; this script keeps the defaults and only writes
`rocksdb-disable-wal-fsync = false` explicitly. Other defaults kept:
`default-num-partitions = 24` (24 partition processors, each with its own log),
the dev profile (no `--production`: auto-provisioning of the one-node cluster).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import restate
from restate import RunOptions

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # the repository: `bench.procs`
from bench.procs import cpu_seconds, process_tree  # noqa: E402

DEFAULT_SERVER_BIN = (
    "/work/peers-npm/node_modules/@restatedev/restate-server-linux-x64/bin/restate-server"
)

# --------------------------------------------------------------------------------------
# The Restate services (imported by hypercorn as `restate_steps:app`).

activity = restate.Service("StepActivity")


@activity.handler()  # type: ignore[untyped-decorator]
async def step(ctx: restate.Context, x: int) -> int:
    """The trivial activity: input + 1."""
    return x + 1


async def inline_step(x: int) -> int:
    """The inline step's action (async: the SDK would run a sync one in a thread)."""
    return x + 1


workflow = restate.Service("StepWorkflow")


@workflow.handler()  # type: ignore[untyped-decorator]
async def calls(ctx: restate.Context, req: dict[str, int]) -> int:
    """`n` sequential service calls to `StepActivity.step`."""
    x = req["start"]
    for _ in range(req["n"]):
        x = await ctx.service_call(step, x)
    return x


@workflow.handler()  # type: ignore[untyped-decorator]
async def runs(ctx: restate.Context, req: dict[str, int]) -> int:
    """`n` sequential journaled side effects (`ctx.run_typed`)."""
    x = req["start"]
    for _ in range(req["n"]):
        x = await ctx.run_typed("step", inline_step, RunOptions(), x)
    return x


app = restate.app(services=[workflow, activity])

HANDLERS = {"call": "calls", "run": "runs"}

# --------------------------------------------------------------------------------------
# Processes.


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Peer:
    """restate-server + the hypercorn SDK service, on a fresh data dir."""

    def __init__(
        self,
        server_bin: str,
        data_parent: str | None,
        keep: bool,
        partitions: int | None = None,
        sdk_workers: int = 1,
    ) -> None:
        self.server_bin = server_bin
        self.sdk_workers = sdk_workers
        self.partitions = partitions
        self.keep = keep
        self.tmp = Path(tempfile.mkdtemp(prefix="restate-peer-", dir=data_parent))
        self.fabric, self.admin, self.ingress, self.sdk = free_ports(4)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Any] = []
        self.server: subprocess.Popen[bytes] | None = None
        self.service: subprocess.Popen[bytes] | None = None

    # -- start ---------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def start_server(self) -> None:
        cfg = self.tmp / "restate.toml"
        cfg.write_text(
            f"""\
cluster-name = "bench-peer"
node-name = "bench-node"
base-dir = "{self.tmp / "restate-data"}"
listen-mode = "tcp"
bind-ip = "127.0.0.1"
bind-port = {self.fabric}
advertised-address = "http://127.0.0.1:{self.fabric}/"
disable-telemetry = true
{f"default-num-partitions = {self.partitions}" if self.partitions else ""}

[admin]
bind-port = {self.admin}

[ingress]
bind-port = {self.ingress}

[log-server]
# The default, written out: fsync the log-server's RocksDB WAL on every write batch.
rocksdb-disable-wal-fsync = false
"""
        )
        self.server = self._spawn(
            "restate-server",
            [self.server_bin, "--config-file", str(cfg), "--no-logo"],
            self.tmp,
        )

    def start_service(self) -> None:
        cfg = self.tmp / "hypercorn.toml"
        cfg.write_text(
            f"""\
bind = ["127.0.0.1:{self.sdk}"]
workers = {self.sdk_workers}
h2_max_concurrent_streams = 2147483647
keep_alive_max_requests = 2147483647
keep_alive_timeout = 2147483647
"""
        )
        self.service = self._spawn(
            "hypercorn",
            [
                sys.executable,
                "-m",
                "hypercorn",
                "--config",
                str(cfg),
                f"{HERE / 'restate_steps'}:app",
            ],
            HERE,
        )

    def check_alive(self) -> None:
        for proc, name in ((self.server, "restate-server"), (self.service, "hypercorn")):
            if proc is not None and proc.poll() is not None:
                log = (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log}")

    # -- stop ----------------------------------------------------------------------
    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        for log in self.logs:
            log.close()
        if self.keep:
            print(f"kept {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------
# Driving it.


async def wait_http(session: Any, url: str, peer: Peer, timeout: float = 60) -> None:
    import aiohttp

    deadline = time.monotonic() + timeout
    while True:
        peer.check_alive()
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except (OSError, aiohttp.ClientError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {timeout}s")
        await asyncio.sleep(0.1)


async def wait_tcp(port: int, peer: Peer, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        peer.check_alive()
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"port {port} not listening after {timeout}s") from None
            await asyncio.sleep(0.1)


async def register(session: Any, peer: Peer) -> None:
    url = f"http://127.0.0.1:{peer.admin}/deployments"
    body = {"uri": f"http://127.0.0.1:{peer.sdk}"}
    async with session.post(url, json=body) as resp:
        text = await resp.text()
        if resp.status >= 300:
            raise RuntimeError(f"registration failed: {resp.status} {text}")


async def run_batch(
    session: Any, peer: Peer, variant: str, workflows: int, per: int, base: int
) -> float:
    """Submit `workflows` invocations at once; returns wall seconds; checks results."""
    url = f"http://127.0.0.1:{peer.ingress}/StepWorkflow/{HANDLERS[variant]}"

    async def one(i: int) -> None:
        start = base + i * 1000
        async with session.post(url, json={"start": start, "n": per}) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"workflow {i}: HTTP {resp.status} {text[:500]}")
            got = json.loads(text)
            if got != start + per:
                raise RuntimeError(f"workflow {i}: got {got}, expected {start + per}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(workflows)))
    return time.perf_counter() - t0


async def measure_round(
    session: Any, peer: Peer, variant: str, workflows: int, per: int, base: int
) -> dict[str, Any]:
    assert peer.server is not None and peer.service is not None
    sdk_pids = process_tree(peer.service.pid)
    s0, k0 = cpu_seconds([peer.server.pid]), cpu_seconds(sdk_pids)
    c0 = time.process_time()
    wall = await run_batch(session, peer, variant, workflows, per, base)
    c1 = time.process_time()
    s1, k1 = cpu_seconds([peer.server.pid]), cpu_seconds(sdk_pids)
    steps = workflows * per
    server_s, sdk_s = s1 - s0, k1 - k0
    return {
        "variant": variant,
        "workflows": workflows,
        "per_workflow": per,
        "steps": steps,
        "wall_s": round(wall, 4),
        "steps_per_s": round(steps / wall, 1),
        "cpu_server_s": round(server_s, 3),
        "cpu_sdk_s": round(sdk_s, 3),
        "cpu_ms_per_step": round((server_s + sdk_s) * 1000 / steps, 3),
        "cpu_ms_per_step_server": round(server_s * 1000 / steps, 3),
        "cpu_ms_per_step_sdk": round(sdk_s * 1000 / steps, 3),
        "client_cpu_ms_per_step": round((c1 - c0) * 1000 / steps, 3),
    }


def fmt(r: dict[str, Any], label: str) -> str:
    return (
        f"{label} [{r['variant']}] {r['workflows']}x{r['per_workflow']} = {r['steps']} steps: "
        f"{r['wall_s']:.3f} s, {r['steps_per_s']:.1f} steps/s; CPU/step "
        f"{r['cpu_ms_per_step']:.3f} ms (restate-server {r['cpu_ms_per_step_server']:.3f}"
        f" + SDK {r['cpu_ms_per_step_sdk']:.3f}; load client {r['client_cpu_ms_per_step']:.3f})"
    )


async def bench(args: argparse.Namespace, peer: Peer) -> dict[str, Any]:
    import aiohttp  # the peer venv's; only the driver needs it

    variants = ["call", "run"] if args.variant == "both" else [args.variant]
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        peer.start_server()
        await wait_http(session, f"http://127.0.0.1:{peer.admin}/health", peer)
        await wait_http(session, f"http://127.0.0.1:{peer.ingress}/restate/health", peer)
        peer.start_service()
        await wait_tcp(peer.sdk, peer)
        await register(session, peer)
        log = sys.stderr if args.json else sys.stdout
        print(
            f"restate-server pid {peer.server.pid if peer.server else '?'} (ingress "
            f"{peer.ingress}, admin {peer.admin}), hypercorn pid "
            f"{peer.service.pid if peer.service else '?'} (port {peer.sdk}), data {peer.tmp}",
            file=log,
            flush=True,
        )
        for variant in variants:  # warm-up: not measured
            if args.warmup:
                await run_batch(session, peer, variant, args.warmup, 2, base=0)
        await asyncio.sleep(1)
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for rnd in range(args.rounds):
            for variant in variants:
                r = await measure_round(
                    session,
                    peer,
                    variant,
                    args.workflows,
                    args.per_workflow,
                    base=(rnd + 1) * 10_000_000,
                )
                results[variant].append(r)
                if not args.json:
                    print(fmt(r, f"round {rnd + 1}"), flush=True)
                await asyncio.sleep(0.5)
        summary = {}
        for variant, rs in results.items():
            summary[variant] = {
                "median_steps_per_s": statistics.median(r["steps_per_s"] for r in rs),
                "median_cpu_ms_per_step": statistics.median(r["cpu_ms_per_step"] for r in rs),
                "median_cpu_ms_per_step_server": statistics.median(
                    r["cpu_ms_per_step_server"] for r in rs
                ),
                "median_cpu_ms_per_step_sdk": statistics.median(
                    r["cpu_ms_per_step_sdk"] for r in rs
                ),
            }
            if not args.json:
                s = summary[variant]
                print(
                    f"median [{variant}]: {s['median_steps_per_s']:.1f} steps/s, CPU/step "
                    f"{s['median_cpu_ms_per_step']:.3f} ms (server "
                    f"{s['median_cpu_ms_per_step_server']:.3f} + SDK "
                    f"{s['median_cpu_ms_per_step_sdk']:.3f})"
                )
        return {"rounds": results, "median": summary}


def versions(server_bin: str) -> dict[str, str]:
    from importlib.metadata import version

    out = subprocess.run([server_bin, "--version"], capture_output=True, text=True, check=False)
    return {
        "restate_server": out.stdout.strip(),
        "restate_sdk": version("restate-sdk"),
        "hypercorn": version("hypercorn"),
        "aiohttp": version("aiohttp"),
        "python": platform.python_version(),
        "nproc": str(os.cpu_count()),
    }


NETNS_ENV = "RESTATE_PEER_IN_NETNS"


def loopback_up() -> None:
    """`ip link set lo up`, by ioctl (a new network namespace has `lo` down)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, siocgifflags, struct.pack("16sH22x", b"lo", 0))
        flags = struct.unpack("16sH22x", ifr)[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


def reexec_in_netns() -> None:
    """Run this script again in a fresh network namespace (loopback only), if possible."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        print("not root or no unshare: running without a network namespace", file=sys.stderr)
        return
    env = {**os.environ, NETNS_ENV: "1"}
    cmd = [unshare, "--net", "--", sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(unshare, cmd, env)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workflows", type=int, default=100)
    p.add_argument("--per-workflow", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variant", choices=["call", "run", "both"], default="call")
    p.add_argument("--warmup", type=int, default=20, help="warm-up workflows (2 steps each)")
    p.add_argument("--timeout", type=float, default=600, help="seconds for one round")
    p.add_argument("--data-dir", help="parent of the temp data dir (default: $TMPDIR)")
    p.add_argument("--keep-data", action="store_true", help="keep the data dir and logs")
    p.add_argument(
        "--restate-server", default=os.environ.get("RESTATE_SERVER_BIN", DEFAULT_SERVER_BIN)
    )
    p.add_argument(
        "--no-netns", action="store_true", help="do not run in a loopback-only network namespace"
    )
    p.add_argument(
        "--partitions",
        type=int,
        help="default-num-partitions (Restate's default: 24, on any number of cores)",
    )
    p.add_argument(
        "--sdk-workers", type=int, default=1, help="hypercorn worker processes for the SDK"
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if not args.no_netns:
        if os.environ.get(NETNS_ENV) == "1":
            loopback_up()
        else:
            reexec_in_netns()
    if not Path(args.restate_server).is_file():
        raise SystemExit(f"no restate-server at {args.restate_server} (bench/peers/README.md)")

    def on_signal(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    peer = Peer(
        args.restate_server, args.data_dir, args.keep_data, args.partitions, args.sdk_workers
    )
    try:
        out = asyncio.run(bench(args, peer))
    finally:
        peer.stop()
    if args.json:
        out["versions"] = versions(args.restate_server)
        out["config"] = {
            "workflows": args.workflows,
            "per_workflow": args.per_workflow,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "partitions": args.partitions or "default (24)",
            "sdk_workers": args.sdk_workers,
        }
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
