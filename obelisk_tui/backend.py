"""The console's one facade onto the engine: `ConsoleBackend`, with two implementations.

- `EmbeddedBackend` drives an `Engine` running in the console's own event loop (the
  console and the engine are one process);
- `RestBackend` talks to a running `obelisk server` over its REST API (`--attach`).

Both answer with the JSON shapes of the REST API (`engine.views`' TypedDicts), built by
the same builders (`engine.views`), and both raise `ApiError` (HTTP status and the
server's message) for what the engine refuses: the screens cannot tell them apart.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from engine.answers import (
    backtrace_info,
    component_source_info,
    deployment_info,
    event_entries,
    execution_info,
    log_entries,
    response_entries,
)
from engine.api_types import EngineError, StorageError, error_status
from engine.client import (
    DEFAULT_API_URL,
    ApiError,
    ServerUnreachable,
    connection_error_reason,
    error_message,
)
from engine.views import (
    BacktraceInfo,
    ComponentSourceInfo,
    DeploymentInfo,
    EventEntry,
    ExecutionInfo,
    LogEntry,
    ResponseEntry,
)
from obelisk_tui.list_query import ExecutionQuery

if TYPE_CHECKING:
    import aiohttp

    from engine.engine import Engine

T = TypeVar("T")

__all__ = [
    "ApiError",
    "ConsoleBackend",
    "EmbeddedBackend",
    "ExecutionQuery",
    "RestBackend",
    "ServerUnreachable",
]


class ConsoleBackend(Protocol):
    """Everything the console asks of the engine. Errors: `ApiError`."""

    @property
    def label(self) -> str:
        """Where the console is connected, for the title bar."""
        ...

    async def close(self) -> None: ...

    def finish_start(self) -> None:
        """The console has drawn its first rows: an embedded engine begins what its start
        left for later (`Engine.start(finish_later=True)`)."""
        ...

    # -- lists --------------------------------------------------------------------------
    async def list_executions(
        self, query: ExecutionQuery, offset: int, limit: int
    ) -> list[ExecutionInfo]:
        """A page of the list, with `children` and `last_event` filled in."""
        ...

    async def count_executions(self, query: ExecutionQuery) -> int: ...

    async def counts_by_state(self, *, results: bool = False) -> dict[str, int]:
        """Executions per state; with `results`, also the finished per result class
        (`ok`, `err`, `failed` keys: `Engine.counts_by_state`)."""
        ...

    async def descendants(self, execution_id: str, limit: int = 1000) -> list[ExecutionInfo]:
        """Children, grandchildren, … of an execution, oldest first."""
        ...

    async def wait_changed(self, since: int, timeout: float) -> int:
        """The commit generation once it differs from `since` (or after `timeout` s)."""
        ...

    # -- one execution ------------------------------------------------------------------
    async def status(self, execution_id: str) -> ExecutionInfo: ...

    async def events(self, execution_id: str, from_version: int = 0) -> list[EventEntry]:
        """The log from `from_version`, with `backtrace_id`s."""
        ...

    async def responses(self, execution_id: str, after: int = 0) -> list[ResponseEntry]:
        """Responses with a cursor above `after`."""
        ...

    async def logs(self, execution_id: str, after: int = 0) -> list[LogEntry]: ...

    async def backtrace(self, execution_id: str, version: int) -> BacktraceInfo | None: ...

    async def component_source(self, digest: str) -> ComponentSourceInfo | None: ...

    # -- deployment ---------------------------------------------------------------------
    async def deployment(self) -> DeploymentInfo: ...

    async def wait_reload(self, after_generation: int, timeout: float) -> DeploymentInfo:
        """The deployment once a reload newer than `after_generation` happened (or after
        `timeout` s)."""
        ...

    # -- commands -----------------------------------------------------------------------
    async def submit(self, ffqn: str, params: list[Any]) -> str: ...

    async def pause(self, execution_id: str) -> None: ...

    async def unpause(self, execution_id: str) -> None: ...

    async def cancel(self, execution_id: str, force: bool = False) -> None: ...

    async def stub(self, execution_id: str, result: Mapping[str, Any]) -> None: ...

    async def cancel_delay(self, delay_id: str) -> None: ...


# ---------------------------------------------------------------------------------------
# Embedded
# ---------------------------------------------------------------------------------------


class EmbeddedBackend:
    """The engine in this process, through its facade (`Engine`'s methods) and the API's
    views (`engine.views`). `owns_engine`: `close()` stops it."""

    def __init__(self, engine: Engine, *, label: str, owns_engine: bool = True) -> None:
        self.engine = engine
        self._label = label
        self._owns_engine = owns_engine

    @property
    def label(self) -> str:
        return self._label

    @classmethod
    async def start(
        cls, deployment: str | os.PathLike[str], data_dir: str | os.PathLike[str], **kwargs: Any
    ) -> EmbeddedBackend:
        # Imported here: an attached console (`RestBackend`) never loads the engine's
        # runtimes (about 130 ms of its start).
        from engine.engine import Engine

        # The start's report scan and file watcher wait for the first rows (`finish_start`):
        # they would share the CPU and the database's reader with the first list queries.
        kwargs.setdefault("finish_later", True)
        engine = await Engine.start(deployment, data_dir, **kwargs)
        return cls(engine, label=f"embedded · {Path(deployment)} · {Path(data_dir)}")

    async def close(self) -> None:
        if self._owns_engine:
            await self.engine.stop()

    def finish_start(self) -> None:
        self.engine.finish_start()

    async def _call(self, coro: Awaitable[T]) -> T:
        """Await an engine call, turning its refusals into `ApiError` like the API does."""
        try:
            return await coro
        except (StorageError, EngineError) as e:
            raise ApiError(error_status(e), str(e)) from None

    async def list_executions(
        self, query: ExecutionQuery, offset: int, limit: int
    ) -> list[ExecutionInfo]:
        rows = await self.engine.list_executions(query.to_filter(offset, limit, extras=True))
        return [execution_info(r) for r in rows]

    async def count_executions(self, query: ExecutionQuery) -> int:
        return await self.engine.count_executions(query.to_filter())

    async def counts_by_state(self, *, results: bool = False) -> dict[str, int]:
        return await self.engine.counts_by_state(results=results)

    async def descendants(self, execution_id: str, limit: int = 1000) -> list[ExecutionInfo]:
        return [execution_info(r) for r in await self.engine.descendants(execution_id, limit)]

    async def wait_changed(self, since: int, timeout: float) -> int:
        return await self.engine.wait_changed(since, timeout)

    async def status(self, execution_id: str) -> ExecutionInfo:
        return execution_info(await self._call(self.engine.status(execution_id)))

    async def events(self, execution_id: str, from_version: int = 0) -> list[EventEntry]:
        stored = await self._call(self.engine.events(execution_id, from_version))
        return event_entries(stored, True)

    async def responses(self, execution_id: str, after: int = 0) -> list[ResponseEntry]:
        return response_entries(await self._call(self.engine.responses(execution_id, after)))

    async def logs(self, execution_id: str, after: int = 0) -> list[LogEntry]:
        return log_entries(await self._call(self.engine.logs(execution_id, after)))

    async def backtrace(self, execution_id: str, version: int) -> BacktraceInfo | None:
        bt = await self._call(self.engine.backtrace(execution_id, version))
        return None if bt is None else backtrace_info(execution_id, version, bt)

    async def component_source(self, digest: str) -> ComponentSourceInfo | None:
        source = await self.engine.component_source(digest)
        return None if source is None else component_source_info(source)

    async def deployment(self) -> DeploymentInfo:
        return await deployment_info(self.engine)

    async def wait_reload(self, after_generation: int, timeout: float) -> DeploymentInfo:
        await self.engine.wait_reload(after_generation, timeout)
        return await self.deployment()

    async def submit(self, ffqn: str, params: list[Any]) -> str:
        return await self._call(self.engine.submit(ffqn, params))

    async def pause(self, execution_id: str) -> None:
        await self._call(self.engine.pause(execution_id))

    async def unpause(self, execution_id: str) -> None:
        await self._call(self.engine.unpause(execution_id))

    async def cancel(self, execution_id: str, force: bool = False) -> None:
        await self._call(self.engine.cancel(execution_id, force))

    async def stub(self, execution_id: str, result: Mapping[str, Any]) -> None:
        await self._call(self.engine.stub(execution_id, dict(result)))

    async def cancel_delay(self, delay_id: str) -> None:
        await self._call(self.engine.cancel_delay(delay_id))


# ---------------------------------------------------------------------------------------
# REST
# ---------------------------------------------------------------------------------------


@dataclass
class RestBackend:
    """A running `obelisk server`, through its REST API (token: `OBELISK_API_TOKEN`)."""

    base_url: str = DEFAULT_API_URL
    token: str | None = None
    #: Seconds an ordinary request may take; long polls add their own wait.
    timeout: float = 10.0
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)
    #: Where the operator is, when that is not the API (`--serve`: the served URL; the
    #: API is then an internal loopback address).
    served_at: str | None = None

    @property
    def label(self) -> str:
        if self.served_at:
            return f"served · {self.served_at}"
        return f"attached · {self.base_url}"

    @classmethod
    async def connect(cls, base_url: str, token: str | None = None) -> RestBackend:
        """A backend whose server answered once (so a wrong URL or token fails here)."""
        backend = cls(base_url.rstrip("/"), token)
        try:
            await backend.deployment()
        except BaseException:
            await backend.close()
            raise
        return backend

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def finish_start(self) -> None:
        pass  # the server started on its own

    def _client(self) -> aiohttp.ClientSession:
        import aiohttp  # here: an embedded console never needs it (0.1-0.2 s of its start)

        if self._session is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._session = aiohttp.ClientSession(headers=headers)
        return self._session

    async def _request(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Any = None,
        wait: float = 0.0,
    ) -> Any:
        import aiohttp

        url = self.base_url + path
        timeout = aiohttp.ClientTimeout(total=self.timeout + wait)
        try:
            async with self._client().request(
                method, url, params=list(query), json=body, timeout=timeout
            ) as r:
                data = await r.read()
                if r.status >= 400:
                    raise ApiError(r.status, error_message(r.status, data))
                return _decode(data)
        except aiohttp.ClientConnectorError as e:  # refused, unknown host…
            raise ServerUnreachable(self.base_url, connection_error_reason(e.os_error)) from None
        except aiohttp.ClientConnectionError as e:
            raise ServerUnreachable(self.base_url, str(e) or type(e).__name__) from None
        except aiohttp.InvalidURL:
            raise ApiError(None, f"{self.base_url} is not a valid URL") from None
        except TimeoutError:
            raise ServerUnreachable(self.base_url, "timed out") from None

    @staticmethod
    def _path(execution_id: str, action: str | None = None) -> str:
        from urllib.parse import quote

        path = "/v1/executions/" + quote(execution_id, safe="")
        return path if action is None else f"{path}/{action}"

    async def list_executions(
        self, query: ExecutionQuery, offset: int, limit: int
    ) -> list[ExecutionInfo]:
        q = [*query.to_query(), ("offset", str(offset)), ("limit", str(limit)), ("extras", "true")]
        return cast(list[ExecutionInfo], await self._request("GET", "/v1/executions", query=q))

    async def count_executions(self, query: ExecutionQuery) -> int:
        answer = await self._request("GET", "/v1/executions/count", query=query.to_query())
        return int(answer["count"])

    async def counts_by_state(self, *, results: bool = False) -> dict[str, int]:
        if not results:
            return cast(dict[str, int], (await self._request("GET", "/v1/stats"))["by_state"])
        answer = await self._request("GET", "/v1/stats", query=[("results", "true")])
        return {**answer["by_state"], **answer["by_result"]}

    async def descendants(self, execution_id: str, limit: int = 1000) -> list[ExecutionInfo]:
        q = [
            ("id_prefix", execution_id + "."),
            ("order", "created_asc"),
            ("limit", str(limit)),
            ("extras", "true"),
        ]
        return cast(list[ExecutionInfo], await self._request("GET", "/v1/executions", query=q))

    async def wait_changed(self, since: int, timeout: float) -> int:
        q = [("since", str(since)), ("timeout", f"{timeout:g}")]
        answer = await self._request("GET", "/v1/changes", query=q, wait=timeout)
        return int(answer["generation"])

    async def status(self, execution_id: str) -> ExecutionInfo:
        return cast(ExecutionInfo, await self._request("GET", self._path(execution_id, "status")))

    async def events(self, execution_id: str, from_version: int = 0) -> list[EventEntry]:
        q = [("version", str(from_version)), ("include_backtrace_id", "true")]
        path = self._path(execution_id, "events")
        return cast(list[EventEntry], await self._request("GET", path, query=q))

    async def responses(self, execution_id: str, after: int = 0) -> list[ResponseEntry]:
        path = self._path(execution_id, "responses")
        q = [("after", str(after))]
        return cast(list[ResponseEntry], await self._request("GET", path, query=q))

    async def logs(self, execution_id: str, after: int = 0) -> list[LogEntry]:
        path = self._path(execution_id, "logs")
        return cast(list[LogEntry], await self._request("GET", path, query=[("after", str(after))]))

    async def backtrace(self, execution_id: str, version: int) -> BacktraceInfo | None:
        path = self._path(execution_id, "backtrace")
        try:
            answer = await self._request("GET", path, query=[("version", str(version))])
        except ApiError as e:
            if e.status == 404 and "has no backtrace" in e.message:
                return None
            raise
        return cast(BacktraceInfo, answer)

    async def component_source(self, digest: str) -> ComponentSourceInfo | None:
        from urllib.parse import quote

        try:
            answer = await self._request("GET", f"/v1/components/{quote(digest, safe='')}/source")
        except ApiError as e:
            if e.status == 404:
                return None
            raise
        return cast(ComponentSourceInfo, answer)

    async def deployment(self) -> DeploymentInfo:
        return cast(DeploymentInfo, await self._request("GET", "/v1/deployment"))

    async def wait_reload(self, after_generation: int, timeout: float) -> DeploymentInfo:
        q = [("after", str(after_generation)), ("timeout", f"{timeout:g}")]
        return cast(
            DeploymentInfo, await self._request("GET", "/v1/deployment", query=q, wait=timeout)
        )

    async def submit(self, ffqn: str, params: list[Any]) -> str:
        answer = await self._request(
            "POST", "/v1/executions", body={"ffqn": ffqn, "params": params}
        )
        return str(answer["execution_id"])

    async def pause(self, execution_id: str) -> None:
        await self._request("PUT", self._path(execution_id, "pause"))

    async def unpause(self, execution_id: str) -> None:
        await self._request("PUT", self._path(execution_id, "unpause"))

    async def cancel(self, execution_id: str, force: bool = False) -> None:
        query = [("force", "true")] if force else []
        await self._request("PUT", self._path(execution_id, "cancel"), query=query)

    async def stub(self, execution_id: str, result: Mapping[str, Any]) -> None:
        await self._request("PUT", self._path(execution_id, "stub"), body=dict(result))

    async def cancel_delay(self, delay_id: str) -> None:
        from urllib.parse import quote

        await self._request("PUT", f"/v1/delays/{quote(delay_id, safe='')}/cancel")


def _decode(data: bytes) -> Any:
    return json.loads(data) if data else None
