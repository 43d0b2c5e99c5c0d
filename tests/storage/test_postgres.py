"""PostgreSQL-specific behaviour: schema versions, errors at open, several storages on
one database (as several processes would be), wake-ups across them, lost connections.

Every test runs against a real server (the session's throw-away cluster, or
`OBELISK_TEST_POSTGRES_DSN`), each in its own schema.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest

from engine.core import events as ev
from engine.storage.contract import AppendExtras, ListFilter, StorageError
from engine.storage.postgres import PostgresStorage, dsn_from_parts, parse_dsn
from engine.storage.postgres.schema import SCHEMA_VERSION
from tests.pg_cluster import PASSWORD, Cluster, drop_schema, free_port, schema_dsn, schema_name

from .conftest import ACTIVITY_FFQN, WORKFLOW, WORKFLOW_FFQN, Executor, at, child_id, create_request

OK = ev.ResultOk(7)


@pytest.fixture
def url(postgres_dsn: str, tmp_path: Path) -> AsyncIterator[str]:
    yield schema_dsn(postgres_dsn, tmp_path)
    drop_schema(postgres_dsn, tmp_path)


Opener = Callable[[], Awaitable[PostgresStorage]]


@pytest.fixture
async def opened(url: str) -> AsyncIterator[Opener]:
    """Opens storages on the test's schema (several: as several processes); closes all."""
    storages: list[PostgresStorage] = []

    async def open_() -> PostgresStorage:
        s = await PostgresStorage.open(url)
        storages.append(s)
        return s

    yield open_
    for s in storages:
        await s.close()


async def raw(url: str) -> asyncpg.Connection:
    target = parse_dsn(url)
    return await asyncpg.connect(target.dsn, server_settings={"search_path": target.schema})


# ---------------------------------------------------------------------------------------
# schema and errors at open
# ---------------------------------------------------------------------------------------


async def test_fresh_schema_is_created_at_the_current_version(opened: Opener, url: str) -> None:
    await opened()
    conn = await raw(url)
    try:
        assert await conn.fetchval("SELECT max(version) FROM obelisk_schema_version") == (
            SCHEMA_VERSION
        )
        tables = {
            r[0]
            for r in await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                parse_dsn(url).schema,
            )
        }
        assert {"executions", "events", "responses", "delays", "logs", "backtraces"} <= tables
    finally:
        await conn.close()


async def test_concurrent_opens_migrate_once(opened: Opener, url: str) -> None:
    storages = await asyncio.gather(*(opened() for _ in range(3)))
    assert len(storages) == 3
    conn = await raw(url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM obelisk_schema_version") == SCHEMA_VERSION
    finally:
        await conn.close()


async def test_newer_schema_is_refused_naming_both_versions(opened: Opener, url: str) -> None:
    s = await opened()
    await s.close()
    conn = await raw(url)
    try:
        await conn.execute("INSERT INTO obelisk_schema_version VALUES ($1)", SCHEMA_VERSION + 5)
    finally:
        await conn.close()
    with pytest.raises(StorageError) as e:
        await PostgresStorage.open(url)
    message = str(e.value)
    assert "newer version of obelisk" in message
    assert f"schema {SCHEMA_VERSION + 5}" in message
    assert f"knows up to {SCHEMA_VERSION}" in message


async def test_rows_written_at_schema_3_are_counted_by_result_after_migration_4(
    opened: Opener, url: str
) -> None:
    """Migration 4 stores each finished row's result class: rows that were there before
    it get theirs from their summaries (the table is rewritten)."""
    from tests.storage.test_contract import create, finish

    s = await opened()
    ok = await create(s, now=1)
    await finish(s, ok, 2, OK)
    err = await create(s, now=3)
    await finish(s, err, 4, ev.ResultErr({"result_kind": "ok"}))
    failed = await create(s, now=5)
    await finish(s, failed, 6, ev.ExecutionFailure("timed_out", "too slow"))
    await create(s, now=7)  # pending: no result class
    await s.close()
    conn = await raw(url)
    try:  # back to schema 3, as a database of the previous release would be
        await conn.execute(
            "DROP INDEX executions_state_result; ALTER TABLE executions DROP COLUMN "
            "result_class; CREATE INDEX executions_state ON executions (state); "
            "DELETE FROM obelisk_schema_version WHERE version = 4"
        )
    finally:
        await conn.close()
    s = await opened()
    counts = await s.count_by_state(results=True)
    assert {k: counts[k] for k in ("finished", "pending_at", "ok", "err", "failed")} == {
        "finished": 3,
        "pending_at": 1,
        "ok": 1,
        "err": 1,
        "failed": 1,
    }
    assert [r.execution_id for r in await s.list_executions(ListFilter(results=["err"]))] == [err]
    conn = await raw(url)
    try:
        assert await conn.fetchval("SELECT max(version) FROM obelisk_schema_version") == 4
        indexes = {
            r[0]
            for r in await conn.fetch(
                "SELECT indexname FROM pg_indexes WHERE schemaname = $1", parse_dsn(url).schema
            )
        }
        assert "executions_state_result" in indexes and "executions_state" not in indexes
    finally:
        await conn.close()


async def test_wrong_password_is_a_clear_error_without_the_password(url: str) -> None:
    bad = url.replace(f":{PASSWORD}@", ":not-the-password@")
    assert bad != url
    with pytest.raises(StorageError) as e:
        await PostgresStorage.open(bad)
    assert "password authentication failed" in str(e.value)
    assert "not-the-password" not in str(e.value)


async def test_unreachable_server_is_a_clear_error() -> None:
    url = dsn_from_parts("127.0.0.1", free_port(), "obelisk", "secret", "obelisk")
    with pytest.raises(StorageError) as e:
        await PostgresStorage.open(url, connect_timeout=5)
    assert "cannot connect to postgresql://obelisk@127.0.0.1:" in str(e.value)
    assert "connection refused" in str(e.value)
    assert "secret" not in str(e.value)


async def test_missing_database_is_a_clear_error(url: str) -> None:
    target = parse_dsn(url)
    missing = target.dsn.rsplit("/", 1)[0] + "/no_such_db"
    with pytest.raises(StorageError, match='database "no_such_db" does not exist'):
        await PostgresStorage.open(missing)


def test_parse_dsn_schema_and_description() -> None:
    t = parse_dsn("postgresql://u:p%40ss@db.example:6543/obelisk?schema=tenant_1&sslmode=disable")
    assert t.schema == "tenant_1"
    assert t.description == "postgresql://u@db.example:6543/obelisk (schema tenant_1)"
    assert "schema=" not in t.dsn and "sslmode=disable" in t.dsn
    with pytest.raises(StorageError, match="invalid schema name"):
        parse_dsn("postgresql://h/db?schema=a;drop")
    with pytest.raises(StorageError, match="expected postgresql://"):
        parse_dsn("sqlite:///x")
    assert parse_dsn(dsn_from_parts("h", 1, "u", "p@:/", "d", "s")).dsn == (
        "postgresql://u:p%40%3A%2F@h:1/d"
    )


# ---------------------------------------------------------------------------------------
# several storages on one database (as several processes)
# ---------------------------------------------------------------------------------------


async def test_processes_never_lock_the_same_execution(opened: Opener) -> None:
    a, b, c = await opened(), await opened(), await opened()
    requests = [create_request() for _ in range(300)]
    await asyncio.gather(*(a.create(r, at(0)) for r in requests))
    locked: Counter[str] = Counter()

    async def drain(s: PostgresStorage) -> None:
        executor = Executor([ACTIVITY_FFQN])
        while True:
            batch = await s.lock_pending(**executor.lock_args(at(1), batch_size=7))
            if not batch:
                return
            locked.update(le.execution_id for le in batch)

    # Several lockers per storage, so that their batches share physical transactions.
    await asyncio.gather(*(drain(s) for s in (a, b, c) for _ in range(3)))
    assert set(locked) == {r.execution_id for r in requests}
    assert max(locked.values()) == 1


async def test_appends_from_two_processes_at_one_version_only_one_wins(opened: Opener) -> None:
    a, b = await opened(), await opened()
    request = create_request()
    await a.create(request, at(0))
    eid = request.execution_id
    [le] = await a.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    outcomes = await asyncio.gather(
        a.append(eid, le.next_version, [ev.Finished(OK)], at(2)),
        b.append(eid, le.next_version, [ev.Finished(ev.ResultOk(8))], at(2)),
        return_exceptions=True,
    )
    errors = [o for o in outcomes if isinstance(o, Exception)]
    assert len(errors) == 1, outcomes
    events = await b.get_events(eid)
    assert [type(e.event) for e in events] == [ev.Created, ev.Locked, ev.Finished]


async def test_pending_work_wakes_another_process(opened: Opener) -> None:
    a, b = await opened(), await opened()
    waiter = asyncio.create_task(b.wait_for_pending([ACTIVITY_FFQN], 600))
    await asyncio.sleep(0)
    await a.create(create_request(), at(0))
    # Without the notification the waiter would sleep for its 600 s.
    await asyncio.wait_for(waiter, 30)


async def test_a_batch_that_changed_nothing_notifies_nobody(opened: Opener) -> None:
    a, b = await opened(), await opened()
    b.FINISHED_RECHECK_INTERVAL = 3600.0  # only the notification can wake it
    request = create_request()
    await a.create(request, at(0))  # one notification
    [le] = await a.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))  # one
    with pytest.raises(StorageError):  # a stale version: this batch writes nothing
        await a.append(le.execution_id, le.next_version - 1, [ev.Finished(OK)], at(2))
    waiter = asyncio.create_task(b.wait_for_finished(request.execution_id, 600))
    await a.append(le.execution_id, le.next_version, [ev.Finished(OK)], at(2))  # one
    assert await asyncio.wait_for(waiter, 30) == OK
    # Notifications arrive in commit order, so the failed append's would be counted.
    assert b.stats["notifications"] == 3


async def test_finished_result_reaches_a_waiter_in_another_process(opened: Opener) -> None:
    a, b = await opened(), await opened()
    b.FINISHED_RECHECK_INTERVAL = 3600.0  # only the notification can wake it
    request = create_request()
    await a.create(request, at(0))
    waiter = asyncio.create_task(b.wait_for_finished(request.execution_id, 600))
    [le] = await a.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    await a.append(le.execution_id, le.next_version, [ev.Finished(OK)], at(2))
    assert await asyncio.wait_for(waiter, 30) == OK


async def test_child_response_wakes_the_parent_in_another_process(opened: Opener) -> None:
    a, b = await opened(), await opened()
    b.RESPONSE_RECHECK_INTERVAL = 3600.0
    parent = create_request(ffqn=WORKFLOW_FFQN)
    await a.create(parent, at(0))
    pid = parent.execution_id
    [wf] = await a.lock_pending(**Executor([WORKFLOW_FFQN], WORKFLOW).lock_args(at(1)))
    child = child_id(pid, "g:1")
    await a.append(
        pid,
        wf.next_version,
        [
            ev.HistoryEvent(ev.JoinSetCreate("g:1")),
            ev.HistoryEvent(
                ev.JoinSetRequest("g:1", ev.ChildExecutionRequest(child, ACTIVITY_FFQN, []))
            ),
        ],
        at(2),
        extras=AppendExtras(creates=[create_request(child, parent=(pid, "g:1"))]),
    )
    waiter = asyncio.create_task(b.wait_for_response(pid, 0, 600))
    await asyncio.sleep(0)
    [le] = await a.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3)))
    await a.append(child, le.next_version, [ev.Finished(OK)], at(4))
    [response] = await asyncio.wait_for(waiter, 30)
    assert isinstance(response.response, ev.ChildExecutionFinished)
    assert response.response.child_execution_id == child


async def test_cancellation_reaches_the_executor_in_another_process(opened: Opener) -> None:
    a, b = await opened(), await opened()
    request = create_request()
    await a.create(request, at(0))
    [le] = await a.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    called = asyncio.Event()
    a.subscribe_cancellations().add(le.execution_id, called.set)
    changes_before = a.changes().generation
    await b.request_cancellation(le.execution_id, at(2))
    await asyncio.wait_for(called.wait(), 30)
    assert a.changes().generation > changes_before


async def test_a_forged_notify_does_not_stop_a_run(opened: Opener, url: str) -> None:
    """Any database user can NOTIFY: a cancellation it claims is checked against the log."""
    a = await opened()
    request = create_request()
    await a.create(request, at(0))
    [le] = await a.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(1)))
    called = asyncio.Event()
    a.subscribe_cancellations().add(le.execution_id, called.set)
    heard = a.stats["notifications"]
    conn = await raw(url)
    try:
        payload = f"forger\nc {le.execution_id}\nx {le.execution_id}"
        await conn.execute("SELECT pg_notify($1, $2)", a._channel, payload)
    finally:
        await conn.close()
    feed = a.changes()
    async with asyncio.timeout(30):
        while a.stats["notifications"] == heard:
            await feed.wait_changed(feed.generation, 1.0)
    await asyncio.gather(*list(a._background))  # the summary read back
    assert not called.is_set()
    b = await opened()
    await b.request_cancellation(le.execution_id, at(2))  # for real: the log says so
    await asyncio.wait_for(called.wait(), 30)


# ---------------------------------------------------------------------------------------
# lost connections
# ---------------------------------------------------------------------------------------


async def terminate_backends(url: str) -> int:
    """pg_terminate_backend every obelisk connection of the test's schema's database
    (the test's own admin connection excepted)."""
    conn = await raw(url)
    try:
        rows = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'obelisk' AND pid <> pg_backend_pid()"
        )
        return len(rows)
    finally:
        await conn.close()


async def test_writes_survive_terminated_connections(opened: Opener, url: str) -> None:
    s = await opened()
    acknowledged: list[str] = []

    async def writer(n: int) -> None:
        for _ in range(n):
            r = create_request()
            await s.create(r, at(0))
            acknowledged.append(r.execution_id)

    tasks = [asyncio.create_task(writer(40)) for _ in range(5)]
    while len(acknowledged) < 50:
        await asyncio.sleep(0.01)
    assert await terminate_backends(url) >= 2  # the writer, the listener (and readers)
    await asyncio.gather(*tasks)  # every write went through, after reconnecting
    # One more, after the termination for sure: the writers may all have been done
    # before it took effect (it failed so once under load, 2026-12-07).
    last = create_request()
    await s.create(last, at(0))
    acknowledged.append(last.execution_id)
    assert s.stats["reconnects"] >= 1
    other = await opened()
    found = await other.list_executions(ListFilter(limit=1000))
    assert {row.execution_id for row in found} == set(acknowledged)
    # And the listener is back: a create in one storage still wakes the other.
    waiter = asyncio.create_task(s.wait_for_pending([ACTIVITY_FFQN], 600))
    await asyncio.sleep(0.5)  # the listener reconnects with backoff: let it
    await other.create(create_request(), at(1))
    await asyncio.wait_for(waiter, 30)


async def test_server_restart_is_survived(
    opened: Opener, url: str, postgres_cluster: Cluster | None
) -> None:
    if postgres_cluster is None:
        pytest.skip("restarts only the session's own cluster, not OBELISK_TEST_POSTGRES_DSN")
    s = await opened()
    first = create_request()
    await s.create(first, at(0))
    postgres_cluster.restart()
    second = create_request()
    await s.create(second, at(1))  # reconnects
    assert await s.get_created(first.execution_id) == first.created
    assert await s.get_created(second.execution_id) == second.created


def test_schema_names_are_valid() -> None:
    name = schema_name("/tmp/pytest-of-root/x")
    assert parse_dsn(f"postgresql://h/db?schema={name}").schema == name


async def test_processes_finishing_children_of_shared_parents_do_not_deadlock(
    opened: Opener, url: str
) -> None:
    """Batches of two processes each finish children of the same parents (child row,
    then parent row): without one lock order across processes they deadlock."""
    a, b = await opened(), await opened()
    js = "g:1"
    parents: list[str] = []
    children: list[str] = []
    for _ in range(20):
        parent = create_request(ffqn=WORKFLOW_FFQN)
        await a.create(parent, at(0))
        pid = parent.execution_id
        parents.append(pid)
        [wf] = await a.lock_pending(**Executor([WORKFLOW_FFQN], WORKFLOW).lock_args(at(1)))
        kids = [child_id(pid, js, n) for n in range(1, 5)]
        children += kids
        await a.append(
            pid,
            wf.next_version,
            [ev.HistoryEvent(ev.JoinSetCreate(js))]
            + [
                ev.HistoryEvent(
                    ev.JoinSetRequest(js, ev.ChildExecutionRequest(k, ACTIVITY_FFQN, []))
                )
                for k in kids
            ],
            at(2),
            extras=AppendExtras(creates=[create_request(k, parent=(pid, js)) for k in kids]),
        )
    locked = await a.lock_pending(**Executor([ACTIVITY_FFQN]).lock_args(at(3), batch_size=100))
    assert len(locked) == len(children)
    conn = await raw(url)
    try:
        before = await conn.fetchval(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
        # Each process's batch holds children of every parent, one in the parents'
        # order, the other in reverse: opposite lock orders of the parents' rows.
        forward = [le for i, le in enumerate(locked) if i % 2]
        backward = [le for i, le in enumerate(locked) if not i % 2][::-1]
        await asyncio.gather(
            *(
                s.append(le.execution_id, le.next_version, [ev.Finished(OK)], at(4))
                for s, batch in ((a, forward), (b, backward))
                for le in batch
            )
        )
        after = await conn.fetchval(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
    finally:
        await conn.close()
    assert after == before
    for pid in parents:
        assert len(await a.get_responses(pid)) == 4


async def test_the_outcome_of_a_commit_without_an_answer_is_asked(opened: Opener, url: str) -> None:
    """After a COMMIT that got no answer the writer asks PostgreSQL how its transaction
    ended (`_xact_status`): committed (acknowledge, don't run it again) or aborted."""
    import time

    s = await opened()
    conn = await raw(url)
    try:
        async with conn.transaction():
            committed = await conn.fetchval("SELECT pg_current_xact_id()::text")
        try:
            async with conn.transaction():
                aborted = await conn.fetchval("SELECT pg_current_xact_id()::text")
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
    finally:
        await conn.close()
    deadline = time.monotonic() + 10
    assert await s._xact_status(str(committed), deadline) == "committed"
    assert await s._xact_status(str(aborted), deadline) == "aborted"
