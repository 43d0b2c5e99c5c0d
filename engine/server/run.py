"""`obelisk server run`: the engine and the REST API in one asyncio process.

The API token comes from `OBELISK_API_TOKEN`, or is generated and printed at start;
`--allow-unauthenticated-api` turns authentication off. SIGINT/SIGTERM stop the API,
then the engine (executors release their locks), then exit 0. Start-up errors print one
line to stderr and exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import os
import secrets
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from aiohttp import web

from engine import affinity
from engine.deployment import deployment_problem
from engine.engine import Engine
from engine.errors import DeploymentError, StorageError
from engine.gc_tuning import tune_gc
from engine.processes import HelperError
from engine.server.api import make_app
from engine.server.config import ConfigError, DatabaseChoice, choose_database

log = logging.getLogger("obelisk.server")

DEFAULT_LISTEN = "127.0.0.1:5005"
TOKEN_ENV = "OBELISK_API_TOKEN"


class ListenError(ValueError):
    """A `--api-listen` value that is not HOST:PORT."""


def parse_listen(text: str) -> tuple[str, int]:
    """`127.0.0.1:5005`, `[::1]:5005`, `localhost:0` → (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ListenError(f"expected HOST:PORT (e.g. {DEFAULT_LISTEN}), got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise ListenError(f"invalid port {port_text!r} in {text!r} (0-65535)")
    return host, port


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


SHUTDOWN_GRACE_SECONDS = 1.0
"""How long a stopping server lets requests in flight finish before cancelling them."""


@dataclass
class RunningServer:
    """An engine with its API listening; `await stop()` shuts both down."""

    engine: Engine
    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)

    async def stop(self) -> None:
        try:
            await self.runner.cleanup()
        finally:
            await self.engine.stop()


async def start_server(
    deployment: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    host: str,
    port: int,
    token: str | None,
    database_url: str | None = None,
    cpu_affinity: affinity.Mode = "off",
    processes: int = 1,
) -> RunningServer:
    """Start the engine, then the API on host:port (port 0: any free port).

    Raises DeploymentError / StorageError / OSError from the engine, CannotListen when
    the address cannot be bound (before the engine starts).
    """
    # Bound first: a busy address fails before the engine touches the data dir (and
    # before its executors run anything).
    try:
        socks = _listening_sockets(host, port)
    except OSError as e:
        raise CannotListen(host, port, e) from e
    try:
        engine = await Engine.start(
            deployment,
            data_dir,
            database_url=database_url,
            cpu_affinity=cpu_affinity,
            processes=processes,
        )
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    # Long polls (`?follow=true`, `/v1/changes`, the deployment) never finish on their
    # own: a stop gives requests in flight a moment, then cancels them.
    runner = web.AppRunner(
        make_app(engine, token),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=SHUTDOWN_GRACE_SECONDS,
    )
    try:
        await runner.setup()
        for sock in socks:
            await web.SockSite(runner, sock).start()
    except BaseException:
        for sock in socks:
            sock.close()
        await runner.cleanup()
        await engine.stop()
        raise
    bound_port = port
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            bound_port = int(address[1])
            break
    return RunningServer(engine, runner, host, bound_port)


class CannotListen(Exception):
    """The API address cannot be bound (busy, not an address of this host…)."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        busy = cause.errno == errno.EADDRINUSE
        reason = "address already in use" if busy else (cause.strerror or str(cause))
        super().__init__(f"cannot listen on {http_url(host, port)}: {reason}")


def _listening_sockets(host: str, port: int) -> list[socket.socket]:
    """TCP sockets listening on host:port: one per address the host resolves to (as
    aiohttp's own site binds), only the first for port 0 (any free port: one port)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    addresses = list(dict.fromkeys((family, address) for family, *_, address in infos))
    if port == 0:
        addresses = addresses[:1]
    socks: list[socket.socket] = []
    try:
        for family, address in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(128)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def _print_components(server: RunningServer, out: TextIO) -> None:
    components = server.engine.registry.components
    print(f"Loaded {len(components)} component(s):", file=out)
    rows = [
        (c.config.type, c.config.name, c.component_id.digest[:19], ", ".join(c.ffqns))
        for c in components
    ]
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)]
        print("  " + "  ".join([*cells, row[3]]), file=out)


async def _serve(
    deployment: Path,
    data_dir: Path,
    host: str,
    port: int,
    token: str | None,
    out: TextIO,
    database: DatabaseChoice,
    cpu_affinity: affinity.Mode,
    processes: int = 1,
) -> int:
    first = not any((data_dir / "cache").glob("*.cwasm"))  # nothing compiled yet
    note = " (the first start compiles components)" if first else ""
    print(f"Starting the engine: {deployment}{note}…", file=out, flush=True)
    try:
        server = await start_server(
            deployment, data_dir, host, port, token, database.url, cpu_affinity, processes
        )
    except (DeploymentError, StorageError, CannotListen, HelperError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # anything else the system refused at start: say what and where
        where = f"{e.filename}: " if e.filename else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        _print_components(server, out)
        print(f"Data directory: {data_dir}", file=out)
        print(f"Database: {database.describe(data_dir)}", file=out)
        print(f"API listening on {server.url}", file=out, flush=True)
        await stop.wait()
        print("Shutting down…", file=out, flush=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        await server.stop()
    print("Stopped.", file=out, flush=True)
    return 0


def run_server(
    deployment: str | os.PathLike[str],
    data_dir: str | os.PathLike[str] = "data",
    listen: str = DEFAULT_LISTEN,
    allow_unauthenticated: bool = False,
    *,
    database_url: str | None = None,
    config: str | os.PathLike[str] | None = None,
    environ: dict[str, str] | None = None,
    out: TextIO | None = None,
    cpu_affinity: affinity.Mode = "split",
    processes: int = 1,
) -> int:
    """Run until SIGINT/SIGTERM; returns the process exit code. The process is the
    server's: its threads are placed (`engine.affinity`) unless `cpu_affinity="off"`.
    `processes` > 1: that many engine processes (`engine.processes`; with SQLite, a
    shard of the data dir each: `engine.storage.sharded`)."""
    out = out or sys.stdout
    env = os.environ if environ is None else environ
    try:
        database = choose_database(database_url, env, config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        host, port = parse_listen(listen)
    except ListenError as e:
        print(f"error: --api-listen: {e}", file=sys.stderr)
        return 2
    # A broken deployment is told before any token is printed or port taken.
    if (problem := deployment_problem(deployment)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    token: str | None
    if allow_unauthenticated:
        token = None
        print("API authentication is OFF (--allow-unauthenticated-api)", file=out)
        if not is_loopback(host):
            print(
                f"warning: the API on {host} is reachable from other machines without a token",
                file=sys.stderr,
            )
    elif env.get(TOKEN_ENV):
        token = env[TOKEN_ENV]
        print(f"API token: taken from {TOKEN_ENV}", file=out)
    else:
        token = secrets.token_urlsafe(32)
        print(f"API token (generated): {token}", file=out)
        print(f"  clients: export {TOKEN_ENV}={token}", file=out)
    out.flush()
    try:
        tune_gc()  # this process is the server's: fewer collector passes
        return asyncio.run(
            _serve(
                Path(deployment),
                Path(data_dir),
                host,
                port,
                token,
                out,
                database,
                cpu_affinity,
                processes,
            )
        )
    except KeyboardInterrupt:  # a signal before the handlers were installed
        print("interrupted during start-up", file=sys.stderr)
        return 130


__all__ = ["RunningServer", "parse_listen", "run_server", "start_server"]
