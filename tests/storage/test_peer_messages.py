"""What another process may say on the peer bus of a SQLite file, and what it may not.

Peers are authenticated by uid (a datagram from another user is dropped: the engine
level test with a real second user is in tests/engine/test_peer_messages.py), and even a
peer only wakes: a cancellation it announces stops a run only when the re-read summary
says the run must stop. Two `SqliteStorage`s on one file stand for two processes; the
test process's own socket stands for a forger of the same uid.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from engine.core import events as ev
from engine.storage.common import RemoteChecks, apply_remote_notes, run_must_stop
from engine.storage.notify import Notifier
from engine.storage.sqlite import SqliteStorage
from engine.storage.sqlite import peers as sqlite_peers

from .conftest import ACTIVITY_FFQN, WORKFLOW, WORKFLOW_FFQN, Executor, at, create_request

pytestmark = pytest.mark.skipif(not sqlite_peers.supported(), reason="the peer bus is Linux-only")


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[SqliteStorage, SqliteStorage]]:
    a = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    b = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


@pytest.fixture
def forger() -> Iterator[socket.socket]:
    """A socket of this uid that is no peer (unbound: it sends, nobody knows it)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        yield sock
    finally:
        sock.close()


async def delivered(storage: SqliteStorage, sock: socket.socket, *payloads: bytes) -> None:
    """Send `payloads` to `storage`'s bus, then a marker; return once the marker was
    read (datagrams are read in order: everything before it was handled) and what the
    payloads made it read back is done."""
    received = storage.peers.stats["received"]

    def send() -> None:  # from a thread: a full socket blocks until the loop reads
        for payload in (*payloads, b"marker"):
            sock.sendto(payload, storage.peers.address)

    await asyncio.to_thread(send)
    feed = storage.notifier
    async with asyncio.timeout(30):
        while storage.peers.stats["received"] <= received:
            await feed.wait_changed(feed.generation, 1.0)
    await asyncio.gather(*list(storage._background))


async def locked_with_listener(
    a: SqliteStorage, b: SqliteStorage
) -> tuple[str, int, asyncio.Event]:
    """An activity created by `b` and locked by `a`, whose run there listens for its
    cancellation (as `ActivityExecutor` does); the event is set when told to stop."""
    request = create_request()
    await b.create(request, at(0))
    [locked] = await a.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    stopped = asyncio.Event()
    a.subscribe_cancellations().add(locked.execution_id, stopped.set)
    return locked.execution_id, locked.next_version, stopped


async def test_a_forged_cancellation_does_not_stop_a_run_a_real_one_does(
    pair: tuple[SqliteStorage, SqliteStorage], forger: socket.socket
) -> None:
    a, b = pair
    eid, _, stopped = await locked_with_listener(a, b)
    await delivered(a, forger, f"x\nc {eid}\nx {eid}".encode())
    assert not stopped.is_set()  # the log holds no cancellation
    assert a.peers.stats["rejected"] == 0  # same uid: read, re-checked, ignored
    await b.request_cancellation(eid, at(2))  # another process, for real
    await asyncio.wait_for(stopped.wait(), 30)


async def test_a_pause_by_another_process_stops_the_run_of_a_workflow(
    pair: tuple[SqliteStorage, SqliteStorage],
) -> None:
    """`pause_events` releases a locked workflow: the re-read finds it paused, unlocked."""
    a, b = pair
    await b.create(create_request(None, WORKFLOW_FFQN), at(0))
    [locked] = await a.lock_pending(**Executor([WORKFLOW_FFQN], WORKFLOW).lock_args(at(1)))
    stopped = asyncio.Event()
    a.subscribe_cancellations().add(locked.execution_id, stopped.set)
    await b.pause(locked.execution_id, at(2))
    await asyncio.wait_for(stopped.wait(), 30)
    assert run_must_stop(await a.get_summary(locked.execution_id))


async def test_malformed_payloads_are_harmless(
    pair: tuple[SqliteStorage, SqliteStorage], forger: socket.socket
) -> None:
    a, b = pair
    eid, version, stopped = await locked_with_listener(a, b)
    garbage = [
        b"\xff\xfe\x00\x80not utf-8\nc \xff" + eid.encode(),
        b"x\n" + b"p " + b"A" * 40_000,  # one long line
        b"x\n" + b"c nothing-here\n" * 4000,  # many ids nobody runs
        b"x\nl nan f\nl inf f\nl -1e999 f\nl 1e999 f\nl x f\nf\nc\n\n  \nq q\nr \x00",
        b"x\n" + b"c " + eid.encode() + b"\n" + b"z" * 70_000,  # cut by the kernel
    ]
    await delivered(a, forger, *garbage)
    assert not stopped.is_set()
    assert a.peers.stats["rejected"] == 1  # the datagram longer than a peer's
    # The storage still works, and still hears its peer.
    waiting = asyncio.ensure_future(a.wait_for_finished(eid, timeout=30))
    await asyncio.sleep(0)
    await b.append(eid, version, [ev.Finished(ev.ResultOk(1))], at(2))
    assert await asyncio.wait_for(waiting, 30) == ev.ResultOk(1)


def test_only_wake_ups_are_applied_at_once() -> None:
    """A `c` line is returned to be confirmed, only for runs held here; `l` needs a
    finite delay. (Pure: no loop needed for what it does not schedule.)"""
    notifier = Notifier()
    called: list[str] = []
    notifier.add("held", lambda: called.append("held"))
    checks = apply_remote_notes(notifier, "c held\nc held\nc elsewhere\nl nan f\nl inf f")
    assert checks == RemoteChecks(finished=[], stops=["held"])
    assert called == []


async def test_the_register_of_peers_is_private(tmp_path: Path) -> None:
    database = tmp_path / "obelisk.sqlite"
    older = Path(f"{database}-peers")
    older.mkdir(mode=0o755)  # as an older version made it
    os.chmod(older, 0o755)
    storage = await SqliteStorage.open(database)
    try:
        assert stat.S_IMODE(storage.peers.directory.stat().st_mode) == 0o700
    finally:
        await storage.close()


async def test_rejected_datagrams_are_counted_each_but_logged_once(
    pair: tuple[SqliteStorage, SqliteStorage],
    forger: socket.socket,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A flood of datagrams that are no peer's (here: longer than a peer sends) must not
    flood the log."""
    a, _ = pair
    with caplog.at_level(logging.WARNING, logger="obelisk.storage"):
        await delivered(a, forger, *[b"x\n" + b"z" * 70_000] * 5)
    assert a.peers.stats["rejected"] == 5
    warnings = [r.getMessage() for r in caplog.records if "peer bus" in r.getMessage()]
    assert len(warnings) == 1
    assert "too long" in warnings[0]
