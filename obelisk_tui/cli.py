"""`obelisk-tui`: the console, embedded or attached, in a terminal or a browser.

    obelisk-tui --demo                         # the demo deployment, embedded, with traffic
    obelisk-tui --deployment FILE [--data-dir DIR] [--processes N|auto]
    obelisk-tui --attach http://127.0.0.1:5005 # a running `obelisk server` (OBELISK_API_TOKEN)
    obelisk-tui --serve [--demo | --deployment FILE | --attach URL] [--serve-listen 127.0.0.1:8000]
                [--serve-max-sessions 8] [--serve-public]   # opened with the printed ?token= URL

A mistake (bad file, unreachable server, wrong token) is one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import shlex
import signal
import sys
from pathlib import Path

from engine.affinity import parse_processes
from engine.client import DEFAULT_API_URL
from obelisk_tui.serve_rules import DEFAULT_MAX_SESSIONS, max_sessions_arg

TOKEN_ENV = "OBELISK_API_TOKEN"


def repo_root() -> Path:
    from engine.build_components import REPO_ROOT

    return REPO_ROOT


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="obelisk-tui",
        description="The Obelisk operator console. Embeds the engine (--deployment, --demo) "
        "or attaches to a running server (--attach).",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--deployment", type=Path, help="deployment TOML to run embedded")
    where.add_argument("--demo", action="store_true", help="the demo deployment, with demo traffic")
    where.add_argument(
        "--attach",
        metavar="URL",
        nargs="?",
        const=DEFAULT_API_URL,
        help=f"a running obelisk server (default {DEFAULT_API_URL}); token from {TOKEN_ENV}",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        help="embedded: the database and caches (default: data/demo for --demo, ./data otherwise)",
    )
    p.add_argument("--no-traffic", action="store_true", help="--demo without generated traffic")
    p.add_argument(
        "--processes",
        type=parse_processes,
        default=1,
        metavar="N|auto",
        help="embedded: engine processes, each with a SQLite shard and a CPU of its own "
        "(default 1; auto: one per CPU), as `obelisk server run --processes`",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="serve the console to browsers (textual-serve), on one shared engine; "
        f"the printed URL carries a token (or {TOKEN_ENV} when set) that every request needs",
    )
    p.add_argument(
        "--serve-listen",
        default="127.0.0.1:8000",
        metavar="HOST:PORT",
        help="with --serve: where browsers connect (default 127.0.0.1:8000; "
        "a non-loopback address needs --serve-public)",
    )
    p.add_argument(
        "--serve-max-sessions",
        type=max_sessions_arg,
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help=f"with --serve: browser sessions (console processes) at once, more are refused "
        f"(default {DEFAULT_MAX_SESSIONS})",
    )
    p.add_argument(
        "--serve-public",
        action="store_true",
        help="with --serve: allow a non-loopback --serve-listen; anyone with the token who "
        "reaches it drives the engine (put TLS in front, e.g. a reverse proxy)",
    )
    # Internal: `--serve` starts each browser session's console with the served URL,
    # which its header shows instead of the loopback API URL it attaches to.
    p.add_argument("--served-at", default=None, help=argparse.SUPPRESS)
    return p


def _log_to_file(data_dir: Path) -> Path:
    """Engine logs go to a file: the terminal belongs to the console."""
    from engine.engine import Engine  # (the embedded console's engine is loaded anyway)

    path = Engine.private_data_file(data_dir, "console.log")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    return path


def _ensure_demo_built() -> None:
    """The demo's WASM components are built from source (cached) before the first start."""
    from engine.build_components import COMPONENTS, ensure_built

    for name in COMPONENTS:
        ensure_built(name)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.attach and args.processes != 1:
        print(
            "error: --processes is for an embedded engine (--demo, --deployment); "
            "an attached server has its own (obelisk server run --processes)",
            file=sys.stderr,
        )
        return 2
    if args.serve:
        return _serve(args)
    from engine.client import api_url_problem
    from engine.deployment import deployment_problem
    from obelisk_tui.app import ObeliskApp
    from obelisk_tui.backend import ConsoleBackend, EmbeddedBackend, RestBackend

    on_connected = None
    if args.attach:
        url = args.attach.rstrip("/")
        token = os.environ.get(TOKEN_ENV)

        async def connect() -> ConsoleBackend:
            backend = await RestBackend.connect(url, token)
            backend.served_at = args.served_at
            return backend

        problem = api_url_problem(url)
        error = f"--attach {problem}" if problem else _preflight_attach(url, token)
        if error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        what = f"attaching to {url}"
    else:
        if args.demo:
            deployment = repo_root() / "demo" / "deployment.toml"
            data_dir = args.data_dir or Path("data/demo")
            try:
                _ensure_demo_built()
            except Exception as e:
                print(f"error: building the demo components: {e}", file=sys.stderr)
                return 1
        else:
            deployment = args.deployment
            if deployment is None:
                print(
                    "error: give --deployment FILE, --demo or --attach URL (obelisk-tui --help)",
                    file=sys.stderr,
                )
                return 2
            data_dir = args.data_dir or Path("data")
        error = deployment_problem(deployment)  # one line, not a console that cannot start
        if error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        log_path = _log_to_file(data_dir)

        async def connect() -> ConsoleBackend:
            # Several processes: each on a CPU of its own (one: the OS places threads).
            return await EmbeddedBackend.start(
                deployment,
                data_dir,
                processes=args.processes,
                cpu_affinity="split" if args.processes > 1 else "off",
                on_progress=app.load_progress,  # the app exists by the time it connects
            )

        what = f"the engine on {deployment} (logs: {log_path})"
        if args.demo and not args.no_traffic:
            on_connected = _start_traffic

    app = ObeliskApp(connect, what=what, on_connected=on_connected, tune_gc=True)
    app.run()
    if app.fatal_error:
        print(f"error: {app.fatal_error}", file=sys.stderr)
        return 1
    return app.return_code or 0


def _preflight_attach(url: str, token: str | None) -> str | None:
    """Check the server answers (and takes the token) before the screen is taken over."""
    from engine.client import ApiError, ServerUnreachable
    from obelisk_tui.backend import RestBackend

    async def probe() -> None:
        backend = await RestBackend.connect(url, token)
        await backend.close()

    try:
        asyncio.run(probe())
    except ApiError as e:
        if e.status == 401:
            return f"{url} refused the API token: {e.message} (set {TOKEN_ENV})"
        if isinstance(e, ServerUnreachable):
            return f"{e.message}: is `obelisk server run` running?"
        return e.message
    return None


async def _start_traffic(app: object) -> None:
    from obelisk_tui.app import ObeliskApp
    from obelisk_tui.demo_traffic import DemoTraffic

    assert isinstance(app, ObeliskApp)
    traffic = DemoTraffic(app.backend)
    traffic.start()
    app.closers.append(traffic.stop)


# ---------------------------------------------------------------------------------------
# --serve: one engine (with its API on a loopback port) for every browser; each browser
# session runs `obelisk-tui --attach` against it.
# ---------------------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from engine.server.run import ListenError, parse_listen
    from obelisk_tui.serve_rules import listen_problem

    try:
        host, port = parse_listen(args.serve_listen)
    except ListenError as e:
        print(f"error: --serve-listen: {e}", file=sys.stderr)
        return 2
    if (problem := listen_problem(host, args.serve_public)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    if args.attach:
        api_url = args.attach.rstrip("/")
        return asyncio.run(_serve_web(host, port, api_url, None, None, args))
    if args.demo:
        deployment = repo_root() / "demo" / "deployment.toml"
        data_dir = args.data_dir or Path("data/demo")
        _ensure_demo_built()
    elif args.deployment:
        deployment, data_dir = args.deployment, args.data_dir or Path("data")
    else:
        print("error: --serve needs --demo, --deployment FILE or --attach URL", file=sys.stderr)
        return 2
    return asyncio.run(_serve_web(host, port, None, deployment, data_dir, args))


async def _serve_web(
    host: str,
    port: int,
    api_url: str | None,
    deployment: Path | None,
    data_dir: Path | None,
    args: argparse.Namespace,
) -> int:
    from aiohttp import web

    from engine.errors import DeploymentError, StorageError
    from engine.processes import HelperError
    from engine.server.run import http_url, start_server
    from obelisk_tui.serve import ConsoleServer

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    engine_server = None
    traffic = None
    # The browsers' token: the API token when set (the operator has it already), else a
    # new one, which an embedded engine's API takes too.
    token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)
    if api_url is None:
        assert deployment is not None and data_dir is not None
        os.environ[TOKEN_ENV] = token  # the browser sessions' consoles inherit it
        print(f"Starting the engine: {deployment}…", flush=True)
        try:
            engine_server = await start_server(
                deployment, data_dir, "127.0.0.1", 0, token, processes=args.processes
            )
        except (DeploymentError, StorageError, HelperError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        api_url = engine_server.url
        if args.demo and not args.no_traffic:
            from obelisk_tui.backend import EmbeddedBackend
            from obelisk_tui.demo_traffic import DemoTraffic

            traffic = DemoTraffic(
                EmbeddedBackend(engine_server.engine, label="demo", owns_engine=False)
            )
            traffic.start()
    served = http_url(host, port)
    # Each session's header names the served URL (where the operator is), not the API's.
    command = shlex.join(
        [sys.executable, "-m", "obelisk_tui", "--attach", api_url, "--served-at", served]
    )
    server = ConsoleServer(
        command, host=host, port=port, token=token, max_sessions=args.serve_max_sessions
    )
    runner = web.AppRunner(await server._make_app(), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        print(f"error: cannot listen on {host}:{port}: {e.strerror or e}", file=sys.stderr)
        await runner.cleanup()
        if engine_server is not None:
            await engine_server.stop()
        return 1
    print(f"API of the shared engine: {api_url}", flush=True)
    print(
        f"Console in the browser: {http_url(host, port)}/?token={token}  (ctrl+c stops)", flush=True
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        if traffic is not None:
            await traffic.stop()
        await runner.cleanup()
        if engine_server is not None:
            await engine_server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
