"""`obelisk-tui --serve`: textual-serve's web app, guarded.

Every browser session is a full console on the engine (submit, cancel, pause, stub…), so
the served app is not left open to any page the operator's browser happens to load:

* a token is required for every request: `?token=…` in the URL that `--serve` prints
  (the page load then sets an HttpOnly, SameSite=Strict cookie, so that the page's own
  WebSocket and static fetches carry it), or that cookie;
* a WebSocket upgrade (or any state-changing request) must come from the served origin:
  its `Origin` names the host:port the request was sent to, else 403 (a foreign page
  cannot drive the console even where the browser would send the cookie);
* at most `max_sessions` consoles run at once; one more is refused with 503 before its
  process is started;
* a non-loopback listen address needs `--serve-public`.

It subclasses textual-serve's `Server` (a middleware on its aiohttp app, two handlers
overridden) instead of forking it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp_jinja2
from aiohttp import web
from textual_serve.server import Server, to_int

from obelisk_tui.serve_rules import (
    DEFAULT_MAX_SESSIONS,
    FOREIGN_ORIGIN,
    TOO_MANY,
    UNAUTHORIZED,
    cookie_name,
    cookie_value,
    needs_same_origin,
    origin_matches,
    token_matches,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConsoleServer(Server):
    """textual-serve's server with a token, an origin check and a session cap."""

    def __init__(
        self,
        command: str,
        *,
        host: str,
        port: int,
        token: str,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
        title: str = "Obelisk console",
    ) -> None:
        super().__init__(command, host=host, port=port, title=title)
        self.token = token
        self.max_sessions = max_sessions
        self.sessions = 0
        self._cookie = cookie_value(token)
        self._cookie_name = cookie_name(port)

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._guard)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if needs_same_origin(
            request.method, request.headers.get("Upgrade", "")
        ) and not origin_matches(origin, request.host):
            raise web.HTTPForbidden(text=FOREIGN_ORIGIN.format(origin=origin or "none"))
        from_query = token_matches(request.query.get("token"), self.token)
        if not from_query and not token_matches(
            request.cookies.get(self._cookie_name), self._cookie
        ):
            raise web.HTTPUnauthorized(text=UNAUTHORIZED)
        response = await handler(request)
        if from_query and not response.prepared:  # (a WebSocket's headers are sent)
            response.set_cookie(
                self._cookie_name,
                self._cookie,
                path="/",
                httponly=True,
                samesite="Strict",
                secure=_scheme(request) == "https",
            )
        return response

    async def handle_index(self, request: web.Request) -> web.StreamResponse:
        """The page, its URLs on the origin the browser asked for (textual-serve uses the
        listen address: a page opened as `localhost` would open its WebSocket on
        `127.0.0.1`, another origin without the cookie)."""
        base = f"{_scheme(request)}://{request.host}"
        ws_base = ("wss" if base.startswith("https") else "ws") + base[base.index(":") :]
        context = {
            "font_size": to_int(request.query.get("fontsize", "16"), 16),
            "app_websocket_url": f"{ws_base}{request.app.router['websocket'].url_for()}",
            "config": {"static": {"url": f"{base}/static/"}},
            "application": {"name": self.title},
        }
        return aiohttp_jinja2.render_template("app_index.html", request, context)

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        # No await between the check and the count: two upgrades cannot both pass at cap.
        if self.sessions >= self.max_sessions:
            raise web.HTTPServiceUnavailable(text=TOO_MANY.format(count=self.sessions))
        self.sessions += 1
        try:
            return await super().handle_websocket(request)
        finally:
            self.sessions -= 1


def _scheme(request: web.Request) -> str:
    """https behind a TLS reverse proxy that says so; it only picks ws:// or wss:// for
    the page (and the cookie's Secure flag), it grants nothing."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return "https" if forwarded == "https" or request.secure else "http"
