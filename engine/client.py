"""A small synchronous client of the REST API (SPEC §11), on the standard library (and
the shapes of `engine.views`).

Used by the CLI (and by the console): one method per endpoint, JSON in and out, every
failure raised as `ApiError` with the HTTP status and the server's message. The shapes of
the answers are the `TypedDict`s of `engine.views` (import them from there), which the
server (`engine.server.api`) builds.
"""

from __future__ import annotations

import enum
import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any, cast

from engine.views import (
    BacktraceInfo,
    ComponentInfo,
    ComponentSourceInfo,
    DeploymentInfo,
    EventEntry,
    ExecutionInfo,
    LogEntry,
    PersistBacktracesAnswer,
    ResponseEntry,
    SubmitAnswer,
)

DEFAULT_API_URL = "http://127.0.0.1:5005"

#: Seconds a request may take before the client gives up (`--follow` waits longer).
DEFAULT_TIMEOUT = 30.0

# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


class ApiError(Exception):
    """A request that failed: `status` is the HTTP status, or None when the server could
    not be reached or did not answer with HTTP."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __str__(self) -> str:
        return self.message


class ServerUnreachable(ApiError):
    """Connection refused, unknown host, timeout: no HTTP answer at all."""

    def __init__(self, base_url: str, reason: str) -> None:
        super().__init__(None, f"cannot reach the obelisk server at {base_url}: {reason}")
        self.base_url = base_url
        self.reason = reason


# ---------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------


class _Unset(enum.Enum):
    UNSET = enum.auto()


Query = Iterable[tuple[str, str | int | float | bool | None]]


class ApiClient:
    """`ApiClient("http://127.0.0.1:5005", token)`; `token=None` sends no Authorization."""

    def __init__(
        self,
        base_url: str = DEFAULT_API_URL,
        token: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token or None
        self.timeout = timeout

    # -- executions ----------------------------------------------------------------------
    def list_executions(
        self,
        *,
        ffqn_prefix: str | None = None,
        states: Iterable[str] = (),
        hide_finished: bool = False,
        top_level_only: bool = False,
        id_prefix: str | None = None,
        limit: int | None = None,
        before: str | None = None,
    ) -> list[ExecutionInfo]:
        """Newest first; page with `before=<last execution_id of the previous page>`."""
        query: list[tuple[str, str | int | float | bool | None]] = [
            ("ffqn", ffqn_prefix),
            ("hide_finished", hide_finished or None),
            ("top_level_only", top_level_only or None),
            ("id_prefix", id_prefix),
            ("limit", limit),
            ("before", before),
        ]
        query += [("state", s) for s in states]
        return cast(list[ExecutionInfo], self._request("GET", "/v1/executions", query))

    def submit(self, ffqn: str, params: list[Any], *, execution_id: str | None = None) -> str:
        """Create a top-level execution; returns its id."""
        body: dict[str, Any] = {"ffqn": ffqn, "params": params}
        if execution_id is not None:
            body["execution_id"] = execution_id
        answer = cast(SubmitAnswer, self._request("POST", "/v1/executions", body=body))
        return answer["execution_id"]

    def result(
        self, execution_id: str, *, follow: bool = False, timeout: float | None = None
    ) -> dict[str, Any]:
        """The result. Unfinished: ApiError(425), or with `follow` wait for it (up to
        `timeout` seconds when given, else as long as it takes)."""
        query: list[tuple[str, str | int | float | bool | None]] = []
        http_timeout: float | None = self.timeout
        if follow:
            query = [("follow", True), ("timeout", timeout)]
            http_timeout = None if timeout is None else timeout + self.timeout
        return cast(
            dict[str, Any],
            self._request("GET", self._path(execution_id), query, http_timeout=http_timeout),
        )

    def status(self, execution_id: str) -> ExecutionInfo:
        return cast(ExecutionInfo, self._request("GET", self._path(execution_id, "status")))

    def events(
        self,
        execution_id: str,
        *,
        version: int | None = None,
        length: int | None = None,
        include_backtrace_id: bool = False,
    ) -> list[EventEntry]:
        query = [
            ("version", version),
            ("length", length),
            ("include_backtrace_id", include_backtrace_id or None),
        ]
        return cast(
            list[EventEntry], self._request("GET", self._path(execution_id, "events"), query)
        )

    def responses(self, execution_id: str, *, after: int | None = None) -> list[ResponseEntry]:
        return cast(
            list[ResponseEntry],
            self._request("GET", self._path(execution_id, "responses"), [("after", after)]),
        )

    def logs(
        self, execution_id: str, *, after: int | None = None, limit: int | None = None
    ) -> list[LogEntry]:
        query = [("after", after), ("limit", limit)]
        return cast(list[LogEntry], self._request("GET", self._path(execution_id, "logs"), query))

    def backtrace(self, execution_id: str, version: int) -> BacktraceInfo:
        """The backtrace of the event at `version`; ApiError(404) when it has none."""
        return cast(
            BacktraceInfo,
            self._request("GET", self._path(execution_id, "backtrace"), [("version", version)]),
        )

    def persist_backtraces(self, execution_id: str) -> PersistBacktracesAnswer:
        """Replay a JS workflow execution against its deployed code (writing no history)
        and store the backtraces of its events, replacing the older ones."""
        return cast(
            PersistBacktracesAnswer,
            self._request("PUT", self._path(execution_id, "backtraces")),
        )

    def pause(self, execution_id: str) -> ExecutionInfo:
        return cast(ExecutionInfo, self._request("PUT", self._path(execution_id, "pause")))

    def unpause(self, execution_id: str) -> ExecutionInfo:
        return cast(ExecutionInfo, self._request("PUT", self._path(execution_id, "unpause")))

    def cancel(self, execution_id: str, force: bool = False) -> ExecutionInfo:
        """Cancel (SPEC §8); `force` ends a workflow that is not -cancellable anyway."""
        query = [("force", "true")] if force else []
        path = self._path(execution_id, "cancel")
        return cast(ExecutionInfo, self._request("PUT", path, query))

    def cancel_delay(self, delay_id: str) -> ExecutionInfo:
        """Cancel a delay; returns the workflow that owns it (it gets the response)."""
        path = "/v1/delays/" + urllib.parse.quote(delay_id, safe="") + "/cancel"
        return cast(ExecutionInfo, self._request("PUT", path))

    def stub(self, execution_id: str, result: Mapping[str, Any]) -> ExecutionInfo:
        """Finish an `activity_stub` execution with `{"ok": v}` or `{"err": v}`."""
        return cast(
            ExecutionInfo,
            self._request("PUT", self._path(execution_id, "stub"), body=dict(result)),
        )

    # -- components ------------------------------------------------------------------------
    def components(self) -> list[ComponentInfo]:
        return cast(list[ComponentInfo], self._request("GET", "/v1/components"))

    def deployment(self) -> DeploymentInfo:
        """The deployment in force and the last reload's outcome (pinned versions and
        orphaned functions counted now)."""
        return cast(DeploymentInfo, self._request("GET", "/v1/deployment"))

    def component_source(self, digest: str) -> ComponentSourceInfo:
        """The source text of a (JS) component version, e.g. to show a backtrace's line."""
        path = "/v1/components/" + urllib.parse.quote(digest, safe="") + "/source"
        return cast(ComponentSourceInfo, self._request("GET", path))

    def openapi(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._request("GET", "/openapi.json"))

    # -- plumbing ----------------------------------------------------------------------------
    @staticmethod
    def _path(execution_id: str, action: str | None = None) -> str:
        path = "/v1/executions/" + urllib.parse.quote(execution_id, safe="")
        return path if action is None else f"{path}/{action}"

    def _request(
        self,
        method: str,
        path: str,
        query: Query = (),
        *,
        body: Any = None,
        http_timeout: float | _Unset | None = _Unset.UNSET,
    ) -> Any:
        pairs = [(k, _query_value(v)) for k, v in query if v is not None]
        url = self.base_url + path
        if pairs:
            url += "?" + urllib.parse.urlencode(pairs)
        headers = {"Accept": "application/json"}
        data: bytes | None = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        timeout = self.timeout if isinstance(http_timeout, _Unset) else http_timeout
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                payload = response.read()
        except urllib.error.HTTPError as e:
            with e:
                raise ApiError(e.code, error_message(e.code, e.read())) from None
        except urllib.error.URLError as e:
            raise ServerUnreachable(self.base_url, connection_error_reason(e.reason)) from None
        except TimeoutError:
            raise ServerUnreachable(self.base_url, "timed out") from None
        except OSError as e:
            raise ServerUnreachable(self.base_url, connection_error_reason(e)) from None
        except http.client.HTTPException as e:
            raise ServerUnreachable(self.base_url, f"not an HTTP answer ({e!r})") from None
        if not payload:
            return None
        try:
            return json.loads(payload)
        except ValueError:
            raise ApiError(None, f"the server at {self.base_url} answered with non-JSON") from None
        except RecursionError:  # e.g. a result nested deeper than `json` reads
            raise ApiError(
                None, f"the server at {self.base_url} answered with JSON nested too deeply to read"
            ) from None


def _query_value(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def api_url_problem(url: str) -> str | None:
    """Why `url` cannot be an API address (None when it can): http(s), a host, a port."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL (e.g. {DEFAULT_API_URL})"
    try:
        parts.port  # noqa: B018 -- raises for a port out of range
    except ValueError:
        return f"{url!r} has an invalid port"
    return None


def connection_error_reason(reason: object) -> str:
    """A short reason for a failed connection (refused, unknown host, timed out…)."""
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, socket.gaierror):
        return f"unknown host ({reason.strerror})"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    if isinstance(reason, OSError) and "[Errno 111]" in str(reason):
        # Every address of the host failed (aiohappyeyeballs' "Multiple exceptions").
        return "connection refused"
    return str(reason)


def error_message(status: int, payload: bytes) -> str:
    try:
        body = json.loads(payload)
    except (ValueError, RecursionError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return str(body["error"])
    text = payload.decode("utf-8", errors="replace").strip()
    return f"HTTP {status}" + (f": {text[:200]}" if text else "")


__all__ = [
    "DEFAULT_API_URL",
    "ApiClient",
    "ApiError",
    "ServerUnreachable",
    "api_url_problem",
    "connection_error_reason",
    "error_message",
]
