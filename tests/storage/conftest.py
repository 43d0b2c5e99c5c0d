"""Fixtures for the storage contract suite.

`storage` yields an opened backend on a fresh location, parametrised over every backend
in `BACKENDS`. A new backend (PostgreSQL) is one more entry: an async function that opens
it on a fresh database for the test's temp dir (and skips when its server is missing).
The contract tests in `test_contract.py` must pass unchanged for every entry.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engine.core import events as ev
from engine.core.ids import ExecutionId, JoinSetId, new_executor_id, new_run_id
from engine.storage.contract import CreateRequest, Storage
from engine.storage.postgres import PostgresStorage
from engine.storage.sqlite import SqliteStorage
from tests.pg_cluster import drop_schema, schema_dsn

#: Opens a backend on the location belonging to `tmp_path`. Opening twice with the same
#: `tmp_path` must give the same database (close/reopen tests rely on it).
Opener = Callable[[Path], Awaitable[Storage]]
#: What the `open_storage` fixture returns: open (again) the database of this test.
Reopen = Callable[[], Awaitable[Storage]]


async def _open_sqlite(tmp_path: Path) -> Storage:
    return await SqliteStorage.open(tmp_path / "obelisk.sqlite")


#: The server's DSN, set by `open_storage` (the `postgres_dsn` session fixture) before
#: `_open_postgres` runs.
_postgres: dict[str, str] = {}


async def _open_postgres(tmp_path: Path) -> Storage:
    # A fresh schema per test (named after its temp dir: reopening finds the same one);
    # much faster than a database per test, and notifications are per schema too.
    return await PostgresStorage.open(schema_dsn(_postgres["dsn"], tmp_path))


async def _open_sqlite_shared(tmp_path: Path) -> Storage:
    """SQLite while another process (here: a second storage) has the file open: writes
    go through optimistic batches (`engine.storage.sqlite.optimistic`), wake-ups over
    the peer bus (`engine.storage.sqlite.peers`)."""
    peer = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    storage = await SqliteStorage.open(tmp_path / "obelisk.sqlite")
    assert storage.peers.has_peers()
    close = storage.close

    async def close_both() -> None:
        await close()
        await peer.close()

    storage.close = close_both  # type: ignore[method-assign]
    return storage


BACKENDS: dict[str, Opener] = {
    "sqlite": _open_sqlite,
    "sqlite-shared": _open_sqlite_shared,
    "postgres": _open_postgres,
}


@pytest.fixture(params=sorted(BACKENDS))
def open_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Reopen:
    """The opener of the backend under test, bound to this test's location."""
    opener = BACKENDS[request.param]
    if request.param == "postgres":
        _postgres["dsn"] = request.getfixturevalue("postgres_dsn")
        request.addfinalizer(lambda: drop_schema(_postgres["dsn"], tmp_path))

    async def open_() -> Storage:
        return await opener(tmp_path)

    return open_


@pytest.fixture
async def storage(open_storage: Reopen) -> AsyncIterator[Storage]:
    s = await open_storage()
    try:
        yield s
    finally:
        await s.close()


# -- builders shared by the storage tests ----------------------------------------------

T0 = datetime(2026, 1, 15, 10, 0, 0, 123456, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """T0 + `seconds`: every test drives time explicitly."""
    return T0 + timedelta(seconds=seconds)


ACTIVITY = ev.ComponentId("activity_wasm", "act", "sha256:" + "ab" * 32)
WORKFLOW = ev.ComponentId("workflow_js", "wf", "sha256:" + "cd" * 32)
ACTIVITY_FFQN = "testing:act/ifc.step"
OTHER_FFQN = "testing:act/ifc.other"
WORKFLOW_FFQN = "testing:wf/ifc.serial"
CANCELLABLE_WORKFLOW_FFQN = "testing:wf/ifc.serial-cancellable"
RETRY = ev.RetryConfig(max_retries=3, retry_exp_backoff_ms=100)
DEPLOYMENT = "Dep_01JKX3M7V9Q2R8T5W0Y4Z6A1BC"


def new_id() -> str:
    return str(ExecutionId.generate())


def child_id(parent: str, join_set: str, n: int = 1) -> str:
    return str(ExecutionId.parse(parent).child(JoinSetId.parse(join_set), n))


def delay_id(owner: str, join_set: str, n: int = 1) -> str:
    return str(ExecutionId.parse(owner).delay(JoinSetId.parse(join_set), n))


def created(
    ffqn: str = ACTIVITY_FFQN,
    params: list[Any] | None = None,
    *,
    scheduled_at: datetime = T0,
    component: ev.ComponentId | None = None,
    parent: tuple[str, str] | None = None,
) -> ev.Created:
    if component is None:
        component = WORKFLOW if ffqn.startswith("testing:wf/") else ACTIVITY
    return ev.Created(
        ffqn=ffqn,
        params=[] if params is None else params,
        scheduled_at=scheduled_at,
        component_id=component,
        deployment_id=DEPLOYMENT,
        parent=parent,
    )


def create_request(
    execution_id: str | None = None, ffqn: str = ACTIVITY_FFQN, **kwargs: Any
) -> CreateRequest:
    return CreateRequest(execution_id or new_id(), created(ffqn, **kwargs))


class Executor:
    """Arguments for `lock_pending`, as one executor tick would pass them."""

    def __init__(self, ffqns: list[str], component: ev.ComponentId = ACTIVITY) -> None:
        self.ffqns = ffqns
        self.component = component
        self.executor_id = new_executor_id()

    def lock_args(
        self, now: datetime, *, batch_size: int = 10, expiry: float = 10.0, **kw: Any
    ) -> dict[str, Any]:
        return {
            "ffqns": self.ffqns,
            "batch_size": batch_size,
            "now": now,
            "component_id": self.component,
            "executor_id": self.executor_id,
            "run_id": new_run_id(),
            "lock_expires_at": now + timedelta(seconds=expiry),
            "retry_config": RETRY,
            **kw,
        }
