"""Parsing and bounds of the API's request parts: query parameters, path ids, JSON bodies.

Each numeric query parameter is declared once, as an `IntParam` or a `SecondsParam`: the
handler parses the request with it and the OpenAPI document states its schema from it,
so that the document and the validation cannot drift apart. A value out of bounds is a
400 naming the parameter, never a 500 from a database binding, `int()` or a timer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from engine.core.ids import EXECUTION_ID_PATTERN, ExecutionId, IdError

#: Columns such as event versions and response cursors are 32-bit in PostgreSQL.
MAX_INT32 = 2**31 - 1
#: Offsets, log ids and generations are 64-bit everywhere (SQLite binds no larger int).
MAX_INT64 = 2**63 - 1

MAX_LIST_LIMIT = 1000
MAX_LOG_LIMIT = 10_000
#: Long polls (`/v1/changes`, `/v1/deployment`) wait at most this long.
MAX_WAIT_SECONDS = 60.0
DEFAULT_WAIT_SECONDS = 25.0
#: `follow` on a result waits at most a day: an HTTP request open longer is a mistake.
MAX_FOLLOW_SECONDS = 86_400.0


class ApiProblem(Exception):
    """A request the API refuses, with the status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class IntParam:
    """An integer query parameter within [lo, hi]; absent or empty: `default`."""

    name: str
    lo: int
    hi: int
    default: int | None = None

    def parse(self, request: web.Request) -> int | None:
        raw = request.query.get(self.name)
        if raw is None or raw == "":
            return self.default
        return self.check(raw)

    def parse_required(self, request: web.Request) -> int:
        value = self.parse(request) if request.query.get(self.name) else None
        if value is None:
            raise ApiProblem(400, f"query parameter `{self.name}` is required")
        return value

    def check(self, raw: str) -> int:
        try:
            value = int(raw) if len(raw) <= 40 else None  # int() refuses 4,301+ digits itself
        except ValueError:
            value = None
        if value is None or not self.lo <= value <= self.hi:
            raise ApiProblem(
                400,
                f"query parameter `{self.name}` must be an integer between {self.lo} and "
                f"{self.hi}, got {_shown(raw)}",
            )
        return value

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "integer", "minimum": self.lo, "maximum": self.hi}
        if self.default is not None:
            out["default"] = self.default
        return out


@dataclass(frozen=True, slots=True)
class SecondsParam:
    """A number of seconds within [0, hi]; absent or empty: `default`."""

    name: str
    hi: float
    default: float | None = None

    def parse(self, request: web.Request) -> float | None:
        raw = request.query.get(self.name)
        if raw is None or raw == "":
            return self.default
        try:
            value = float(raw) if len(raw) <= 40 else math.nan
        except ValueError:
            value = math.nan
        if not 0 <= value <= self.hi:  # NaN fails every comparison
            raise ApiProblem(
                400,
                f"query parameter `{self.name}` must be a number of seconds between 0 and "
                f"{self.hi:g}, got {_shown(raw)}",
            )
        return value

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "number", "minimum": 0, "maximum": self.hi}
        if self.default is not None:
            out["default"] = self.default
        return out


# The parameters of the API, each with its bounds (the OpenAPI document uses them too).
LIST_LIMIT = IntParam("limit", 1, MAX_LIST_LIMIT, 100)
LIST_OFFSET = IntParam("offset", 0, MAX_INT64, 0)
FOLLOW_TIMEOUT = SecondsParam("timeout", MAX_FOLLOW_SECONDS)
EVENTS_VERSION = IntParam("version", 0, MAX_INT32, 0)
EVENTS_LENGTH = IntParam("length", 1, MAX_INT32)
RESPONSES_AFTER = IntParam("after", 0, MAX_INT32, 0)
LOGS_AFTER = IntParam("after", 0, MAX_INT64, 0)
LOGS_LIMIT = IntParam("limit", 1, MAX_LOG_LIMIT, 1000)
BACKTRACE_VERSION = IntParam("version", 0, MAX_INT32)
DEPLOYMENT_AFTER = IntParam("after", -1, MAX_INT64)
CHANGES_SINCE = IntParam("since", -1, MAX_INT64, -1)
WAIT_TIMEOUT = SecondsParam("timeout", MAX_WAIT_SECONDS, DEFAULT_WAIT_SECONDS)

#: The schema of an execution id, as a path or query parameter or a body field.
EXECUTION_ID_SCHEMA: dict[str, Any] = {"type": "string", "pattern": EXECUTION_ID_PATTERN}


def bool_query(request: web.Request, name: str) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in ("", "true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ApiProblem(400, f"query parameter `{name}` must be true or false, got {_shown(raw)}")


def execution_id(text: str, where: str | None = None) -> str:
    """The canonical text of an execution id; 400 naming `where` when malformed."""
    try:
        return str(ExecutionId.parse(text))
    except IdError as e:
        raise ApiProblem(400, str(e) if where is None else f"{where}: {e}") from None


async def json_body(request: web.Request) -> Any:
    data = await request.read()
    if not data.strip():
        raise ApiProblem(400, "missing JSON request body")
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as e:
        raise ApiProblem(400, f"malformed JSON in request body: {e}") from None
    except RecursionError:  # msgspec stops at the interpreter's recursion limit (~1,000)
        raise ApiProblem(
            400, "JSON in request body is nested too deeply (arrays/objects in one another)"
        ) from None


def _shown(raw: str, limit: int = 40) -> str:
    """The value a client sent, quoted and cut short: an error message stays readable."""
    return repr(raw if len(raw) <= limit else raw[:limit] + "…")


__all__ = [
    "BACKTRACE_VERSION",
    "CHANGES_SINCE",
    "DEPLOYMENT_AFTER",
    "EVENTS_LENGTH",
    "EVENTS_VERSION",
    "EXECUTION_ID_SCHEMA",
    "FOLLOW_TIMEOUT",
    "LIST_LIMIT",
    "LIST_OFFSET",
    "LOGS_AFTER",
    "LOGS_LIMIT",
    "MAX_LIST_LIMIT",
    "MAX_LOG_LIMIT",
    "RESPONSES_AFTER",
    "WAIT_TIMEOUT",
    "ApiProblem",
    "IntParam",
    "SecondsParam",
    "bool_query",
    "execution_id",
    "json_body",
]
