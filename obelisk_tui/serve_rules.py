"""The rules of `obelisk-tui --serve`'s guard, as pure functions (cheap to import: the
CLI's argument parser uses them before anything is served). The guard itself is
`obelisk_tui.serve.ConsoleServer`."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

DEFAULT_MAX_SESSIONS = 8
PUBLIC_FLAG = "--serve-public"

#: Methods that change nothing: only these may come from another origin (a page load
#: from a link is a cross-site GET). A WebSocket upgrade is a GET that opens a console.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

UNAUTHORIZED = (
    "obelisk console: a token is required; open the URL with ?token=… that "
    "`obelisk-tui --serve` printed\n"
)
FOREIGN_ORIGIN = "obelisk console: refused, the request comes from another origin ({origin})\n"
TOO_MANY = (
    "obelisk console: {count} sessions are open, the most --serve-max-sessions allows; "
    "close one (q) and reload\n"
)


def listen_problem(host: str, public: bool) -> str | None:
    """Why `host` may not be listened on, or None: anything but loopback needs the flag."""
    from engine.server.run import is_loopback

    if public or is_loopback(host):
        return None
    return (
        f"--serve-listen {host} is not a loopback address: anyone who reaches it gets a "
        f"console that drives the engine; add {PUBLIC_FLAG} to allow it "
        "(and put TLS in front, e.g. a reverse proxy)"
    )


def max_sessions_arg(text: str) -> int:
    """argparse type of `--serve-max-sessions`: a count from 1."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1, not {text!r}")
    return value


def token_matches(given: str | None, expected: str) -> bool:
    """Constant time, so the comparison leaks nothing about how much of a guess was right."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def cookie_value(token: str) -> str:
    """What the cookie holds: derived from the token, not the token itself (which may be
    the API token), since cookies are not kept apart by port on the same host."""
    return hmac.new(token.encode(), b"obelisk-console-cookie", hashlib.sha256).hexdigest()


def cookie_name(port: int) -> str:
    """One cookie per port: two `--serve` on one host don't overwrite each other's."""
    return f"obelisk_console_{port}"


def needs_same_origin(method: str, upgrade: str) -> bool:
    """A WebSocket upgrade (it starts a console) or a state-changing method."""
    return upgrade.lower() == "websocket" or method.upper() not in SAFE_METHODS


def _host_port(netloc: str, default_port: int) -> tuple[str, int] | None:
    try:
        parts = urlsplit(f"//{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.hostname.lower(), port if port is not None else default_port


def origin_matches(origin: str | None, host: str | None) -> bool:
    """`Origin` names the same host:port as the `Host` the request was sent to.

    A missing or opaque (`null`) origin does not match: browsers always send it on a
    WebSocket upgrade. A port left out means the scheme's default, on both sides (a TLS
    proxy that forwards `Host: console.example.com` for `https://console.example.com`).
    """
    if not origin or not host:
        return False
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.path not in ("", "/"):
        return False
    default = 443 if parts.scheme == "https" else 80
    mine = _host_port(parts.netloc, default)
    return mine is not None and mine == _host_port(host, default)
