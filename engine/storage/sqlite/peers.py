"""Wake-ups between the processes of one host that share a SQLite file.

PostgreSQL has LISTEN/NOTIFY; SQLite has nothing of the kind, so each `SqliteStorage`
binds a datagram socket of its own and, after every commit that changed something, sends
the other processes of the file one `RemoteNotes` payload: new pending work per FFQN,
responses, finished results, cancellations. A child finished by one process wakes its
parent's run waiting in another at once, instead of at its next poll.

- Sockets are Linux abstract UNIX sockets (no file, no path-length limit, gone when the
  process is), named after the database's real path and the peer. The peers of a file
  register in `<database>-peers/`, one empty file each; a peer whose socket is gone (it
  died) is forgotten and its file removed by whoever notices.
- Sending never blocks the writer: a datagram a peer has no room for is dropped, and
  the peer's periodic re-checks (`exec.tick_sleep`, the 1 s re-reads of awaited results
  and responses) catch up, as they did before there was a bus.
- Peers are authenticated: the socket asks for the sender's credentials
  (`SO_PASSCRED`), the kernel attaches them to every datagram, and one that is not from
  this process's uid (or carries none) is dropped. The register is 0700, so that other
  users do not even learn the names. (Abstract sockets have no file permissions: anyone
  on the host who knows a name can send to it.)
- A message only wakes this process to re-read the database (`apply_remote_notes`):
  whatever a peer says, outcomes are decided by what the log holds.
- Elsewhere than on Linux there is no bus, only the re-checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from engine.storage.data_files import private_dir

log = logging.getLogger("obelisk.storage")

#: How long the list of peers is trusted before the directory is read again.
PEERS_TTL = 0.5
#: Datagrams stay below this (the kernel's default socket buffer is ~200 KiB).
MAX_DATAGRAM = 32_000
#: The end of an observer's name.
OBSERVER_SUFFIX = "-observer"
#: Receive buffer asked for: bursts of commits while the loop is busy.
RECEIVE_BUFFER = 4 * 1024 * 1024
#: Largest datagram read; a longer one is not from a peer (they send < `MAX_DATAGRAM`).
RECEIVE_SIZE = 65536
#: Seconds between two warnings about rejected datagrams (a flood must not flood the log).
REJECT_LOG_INTERVAL = 60.0
#: `struct ucred` of `SCM_CREDENTIALS`: pid_t pid, uid_t uid, gid_t gid.
_UCRED = struct.Struct("iII")


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")


class PeerBus:
    """This process's end: `send` from any thread (the writer's), `on_message` called
    on the event loop with each payload another peer sent."""

    def __init__(
        self, database: Path, on_message: Callable[[str], None], *, observer: bool = False
    ) -> None:
        real = os.path.realpath(database)  # one name however the file was opened
        self.directory = Path(f"{real}-peers")
        self._prefix = b"\0obelisk-" + hashlib.sha256(real.encode()).hexdigest()[:20].encode()
        #: An observer (`observer=True`) reads the file and writes to it only now and
        #: then (the API of a sharded engine: `engine.storage.sharded`); the others do
        #: not change how they write for it (`has_engine_peers`).
        self.name = f"{os.getpid()}-{os.urandom(6).hex()}" + (OBSERVER_SUFFIX if observer else "")
        self._on_message = on_message
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._peers: list[str] = []
        self._peers_at = 0.0
        self._lock = threading.Lock()  # `send` may come from several threads
        #: Counters: datagrams sent, received, dropped (no room at the peer), rejected
        #: (not from this uid, without credentials, or too long: not read).
        self.stats = {"sent": 0, "received": 0, "dropped": 0, "rejected": 0}
        self._uid = os.getuid() if hasattr(os, "getuid") else -1
        #: When a rejected datagram may be logged again, and how many were not logged.
        self._reject_log_after = 0.0
        self._rejected_unlogged = 0

    @property
    def address(self) -> bytes:
        """The abstract socket address this bus binds (the other peers send to it)."""
        return self._address(self.name)

    def _address(self, name: str) -> bytes:
        return self._prefix + b"-" + name.encode()

    # -- lifecycle -----------------------------------------------------------------------
    def open(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Bind and register; False (and no bus) when that is not possible here."""
        if not supported():
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
            # Without the senders' credentials a peer cannot be told from another user.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(self._address(self.name))
            sock.setblocking(False)
            private_dir(self.directory)
            with contextlib.suppress(OSError):  # made by an older version (or not ours)
                self.directory.chmod(0o700)
            (self.directory / self.name).touch(mode=0o600)
        except OSError as e:
            sock.close()
            log.warning(
                "no wake-ups between processes sharing %s (%s): they poll",
                self.directory,
                e.strerror or e,
            )
            return False
        self._sock = sock
        self._loop = loop
        loop.add_reader(sock.fileno(), self._readable)
        return True

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(Exception):
                self._loop.remove_reader(sock.fileno())
        with contextlib.suppress(OSError):
            (self.directory / self.name).unlink()
        sock.close()

    # -- sending (any thread) ------------------------------------------------------------
    def send(self, payloads: list[str]) -> None:
        sock = self._sock
        if sock is None or not payloads:
            return
        with self._lock:
            peers = self._current_peers()
            if not peers:
                return
            gone: list[str] = []
            for peer in peers:
                address = self._address(peer)
                for payload in payloads:
                    try:
                        sock.sendto(payload.encode(), address)
                        self.stats["sent"] += 1
                    except BlockingIOError:
                        self.stats["dropped"] += 1  # the peer re-checks by itself
                    except OSError as e:
                        if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
                            gone.append(peer)
                            break
                        self.stats["dropped"] += 1
            for peer in gone:
                self._forget(peer)

    def has_peers(self) -> bool:
        """Whether other processes have the file open (as of at most `PEERS_TTL` ago)."""
        with self._lock:
            return bool(self._current_peers())

    def has_engine_peers(self) -> bool:
        """Whether other processes that are not observers have the file open: processes
        that write it all the time (as of at most `PEERS_TTL` ago)."""
        with self._lock:
            return any(not p.endswith(OBSERVER_SUFFIX) for p in self._current_peers())

    def _current_peers(self) -> list[str]:
        now = time.monotonic()
        if now - self._peers_at >= PEERS_TTL:
            self._peers_at = now
            try:
                names = os.listdir(self.directory)
            except OSError:
                names = []
            self._peers = [n for n in names if n != self.name and not n.startswith(".")]
        return self._peers

    def _forget(self, peer: str) -> None:
        """A peer whose socket is gone (its process ended without closing the bus)."""
        with contextlib.suppress(ValueError):
            self._peers.remove(peer)
        with contextlib.suppress(OSError):
            (self.directory / peer).unlink()

    # -- receiving (the loop) ------------------------------------------------------------
    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while True:
            try:
                data, ancillary, flags, _ = sock.recvmsg(
                    RECEIVE_SIZE, socket.CMSG_SPACE(_UCRED.size)
                )
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            refusal = refused(ancillary, flags, self._uid)
            if refusal is not None:
                self._rejected(refusal)
                continue
            self.stats["received"] += 1
            try:
                self._on_message(data.decode("utf-8", "replace"))
            except Exception:  # a waiter's bug must not stop the bus
                log.exception("a wake-up from another process failed")

    def _rejected(self, reason: str) -> None:
        """Count a datagram that is not from a peer; warn at most once per interval."""
        self.stats["rejected"] += 1
        self._rejected_unlogged += 1
        now = time.monotonic()
        if now < self._reject_log_after:
            return
        log.warning(
            "ignored %d datagram(s) sent to the peer bus of %s that are not from a peer (last: %s)",
            self._rejected_unlogged,
            self.directory,
            reason,
        )
        self._rejected_unlogged = 0
        self._reject_log_after = now + REJECT_LOG_INTERVAL


def refused(ancillary: list[tuple[int, int, bytes]], flags: int, uid: int) -> str | None:
    """Why a received datagram is not from a peer (None: it is): peers run as `uid`,
    which the kernel vouches for in `SCM_CREDENTIALS` (a sender may only claim its own
    ids unless it has CAP_SETUID, i.e. is root), and send less than `RECEIVE_SIZE`."""
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        return "too long"
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
            if len(data) < _UCRED.size:
                break
            pid, sender, _gid = _UCRED.unpack_from(data)
            return None if sender == uid else f"uid {sender}, pid {pid}"
    return "no credentials"
