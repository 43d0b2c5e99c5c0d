"""Forged messages on the peer bus of a SQLite file (`engine.storage.sqlite.peers`)
against a real engine running a real activity.

The activity (JS) fetches a URL of the test's HTTP server on loopback, which answers
only when the test lets it: "running" and "finished normally" are events, not guesses.
Locks are long (30 s), so a prompt end is a cancellation, never a lock expiry.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from engine.core import events as ev
from engine.engine import Engine
from engine.storage.sqlite import SqliteStorage
from engine.storage.sqlite import peers as sqlite_peers
from tests.engine.conftest import StartEngine
from tests.fixtures.deployments import Deployment, ms, seconds

pytestmark = pytest.mark.skipif(not sqlite_peers.supported(), reason="the peer bus is Linux-only")

HOLD = "test:peers/acts.hold"
HOLD_JS = """
export default async function hold(url) {
  const res = await fetch(url);
  return await res.text();
}
"""
DEPLOYMENT = Deployment().activity_js(
    "hold",
    None,  # hold.js: HOLD_JS
    ffqn=HOLD,
    params=[("url", "string")],
    return_type="result<string, string>",
    allowed_host=["127.0.0.1:*"],
    max_retries=0,
    exec={"lock_expiry": seconds(30), "tick_sleep": ms(20)},
)
CANCELLED = ev.ExecutionFailure("cancelled", "cancellation requested")
#: Another local user (`nobody`).
OTHER_UID = 65534
#: Sends argv[2] (hex) to the abstract address argv[1] (hex); prints its uid.
SENDER = (
    "import os, socket, sys\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
    "s.connect(bytes.fromhex(sys.argv[1]))\n"
    "s.send(bytes.fromhex(sys.argv[2]))\n"
    "print(os.getuid())\n"
)


class Gate:
    """The activity's URL: `arrived` when a run is in it, answers once `release`d."""

    def __init__(self) -> None:
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()
        self.url = ""

    def reset(self) -> None:
        self.arrived, self.release = asyncio.Event(), asyncio.Event()

    async def handle(self, _request: web.Request) -> web.Response:
        self.arrived.set()
        await self.release.wait()
        return web.Response(text="done")


@pytest.fixture
async def gate() -> AsyncIterator[Gate]:
    g = Gate()
    app = web.Application()
    app.router.add_get("/hold", g.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    g.url = f"http://127.0.0.1:{server.port}/hold"
    try:
        yield g
    finally:
        g.release.set()
        await server.close()


async def running(start_engine: StartEngine, gate: Gate) -> tuple[Engine, SqliteStorage, str]:
    engine = await start_engine(DEPLOYMENT, files={"hold.js": HOLD_JS})
    storage = engine.storage
    assert isinstance(storage, SqliteStorage)
    eid = await engine.submit(HOLD, [gate.url])
    await asyncio.wait_for(gate.arrived.wait(), 30)  # the run waits in `fetch`
    return engine, storage, eid


async def handled(storage: SqliteStorage) -> None:
    """Once every datagram sent to `storage` so far was read, and what they made it read
    back is done: a marker sent last is read last."""
    received = storage.peers.stats["received"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"marker", storage.peers.address)
    feed = storage.notifier
    async with asyncio.timeout(30):
        while storage.peers.stats["received"] <= received:
            await feed.wait_changed(feed.generation, 1.0)
    await asyncio.gather(*list(storage._background))


def told_to_stop(engine: Engine, eid: str) -> bool:
    """Whether the run of `eid` was interrupted (its cancellation listener called: the
    flag the runner checks every ~20 ms while it waits in `fetch`)."""
    for executor in engine.executors:
        entry = getattr(executor, "_inflight", {}).get(eid)
        if entry is not None:
            return bool(entry[1].is_set())
    raise AssertionError(f"no run of {eid} in flight")


async def finishes_normally(engine: Engine, gate: Gate, eid: str) -> None:
    assert not told_to_stop(engine, eid)
    gate.release.set()
    assert await engine.result(eid, timeout=30) == ev.ResultOk("done")
    kinds = [type(e.event).__name__ for e in await engine.storage.get_events(eid)]
    assert kinds == ["Created", "Locked", "Finished"]


def send_as(uid: int, address: bytes, payload: bytes) -> None:
    """Send one datagram from a process running as `uid` (an interpreter it may run:
    ours may be in a directory only root can enter)."""
    code = [SENDER, address.hex(), payload.hex()]
    for python in dict.fromkeys([sys.executable, shutil.which("python3", path="/usr/bin:/bin")]):
        if python is None:
            continue
        try:
            done = subprocess.run(
                [python, "-I", "-c", *code],
                user=uid,
                group=uid,
                extra_groups=[],
                cwd="/",
                env={},
                capture_output=True,
                text=True,
                timeout=30,
            )
        except PermissionError:
            continue
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(uid)
        return
    pytest.skip(f"no Python interpreter that uid {uid} may run")


@pytest.mark.skipif(
    not hasattr(os, "getuid") or os.getuid() != 0,
    reason="sending as another user needs root (to run a process as uid 65534)",
)
async def test_a_cancellation_forged_by_another_user_is_dropped(
    start_engine: StartEngine, gate: Gate
) -> None:
    engine, storage, eid = await running(start_engine, gate)
    await asyncio.to_thread(send_as, OTHER_UID, storage.peers.address, f"x\nc {eid}".encode())
    await handled(storage)
    await finishes_normally(engine, gate, eid)
    assert storage.peers.stats["rejected"] == 1


async def test_a_cancellation_forged_by_this_user_stops_nothing_a_real_one_does(
    start_engine: StartEngine, gate: Gate
) -> None:
    engine, storage, eid = await running(start_engine, gate)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.sendto(f"x\nc {eid}\nx {eid}".encode(), storage.peers.address)
    await handled(storage)
    await finishes_normally(engine, gate, eid)
    assert storage.peers.stats["rejected"] == 0  # a peer's uid: read, but only a wake-up

    # A real cancellation by another process (what `Engine.cancel` does, from a second
    # storage on the file) still stops the run at once, long before its lock expires.
    gate.reset()
    eid = await engine.submit(HOLD, [gate.url])
    await asyncio.wait_for(gate.arrived.wait(), 30)
    other = await SqliteStorage.open(storage.path)
    try:
        started = engine.clock.now()
        await other.request_cancellation(eid, engine.clock.now())
        assert await engine.result(eid, timeout=10) == CANCELLED
        assert engine.clock.now() - started < timedelta(seconds=10)
    finally:
        await other.close()
    kinds = [type(e.event).__name__ for e in await engine.storage.get_events(eid)]
    assert kinds == ["Created", "Locked", "CancellationRequested", "Finished"]
