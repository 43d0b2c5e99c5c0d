"""The console's facade: the embedded and the REST backend answer the same, on one engine.

The REST backend talks to the real API (`engine.server.api.make_app`) over HTTP on a
loopback port; both backends see the same engine, so every answer must be equal. The
engine is one process, and (slow) two processes with a SQLite shard each: the answers
are then merged from both files (`engine.storage.sharded`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from engine.client import ApiError, ServerUnreachable
from engine.core import events as ev
from engine.engine import Engine
from engine.server.api import make_app
from engine.server.run import SHUTDOWN_GRACE_SECONDS
from obelisk_tui.backend import EmbeddedBackend, RestBackend
from obelisk_tui.list_query import ExecutionQuery
from tests.console.conftest import APPROVE, FANOUT, STEP, write_deployment

TOKEN = "console-test-token"


@pytest.fixture(
    params=[1, pytest.param(2, marks=pytest.mark.slow)], ids=["one-process", "two-shards"]
)
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Engine]:
    engine = await Engine.start(
        write_deployment(tmp_path), tmp_path / "data", processes=request.param
    )
    try:
        yield engine
    finally:
        await engine.stop()


@pytest.fixture
async def backends(engine: Engine) -> AsyncIterator[tuple[EmbeddedBackend, RestBackend]]:
    server = TestServer(make_app(engine, TOKEN))
    await server.start_server()
    rest = await RestBackend.connect(str(server.make_url("")), TOKEN)
    embedded = EmbeddedBackend(engine, label="embedded", owns_engine=False)
    try:
        yield embedded, rest
    finally:
        await rest.close()
        await server.close()


async def both(backends: tuple[EmbeddedBackend, RestBackend], method: str, *args: Any) -> Any:
    embedded, rest = backends
    a = await getattr(embedded, method)(*args)
    b = await getattr(rest, method)(*args)
    assert a == b, f"{method}{args}: embedded {a!r} != rest {b!r}"
    return a


async def test_reads_are_the_same_through_both(
    engine: Engine, backends: tuple[EmbeddedBackend, RestBackend]
) -> None:
    fan = await engine.submit(FANOUT, [2])
    await engine.result(fan, timeout=30)
    await engine.submit(APPROVE, ["x"])
    for q in (
        ExecutionQuery(),
        ExecutionQuery(order="created_asc"),
        ExecutionQuery(order="updated_desc", states=("finished",)),
        ExecutionQuery(ffqn_prefix="test:console/activity."),
        ExecutionQuery(id_prefix=fan, top_level_only=True),
    ):
        rows = await both(backends, "list_executions", q, 0, 50)
        assert await both(backends, "count_executions", q) == len(rows)
        assert all("children" in r and "last_event" in r for r in rows)
    page = await both(backends, "list_executions", ExecutionQuery(), 1, 2)
    assert len(page) == 2
    counts = await both(backends, "counts_by_state")
    assert counts["finished"] == 3 and counts["pending_at"] == 1
    kids = await both(backends, "descendants", fan)
    assert [k["parent_id"] for k in kids] == [fan, fan]
    info = await both(backends, "status", fan)
    assert info["result"] == {"ok": "10"}
    events = await both(backends, "events", fan)
    assert len(events) == info["next_version"] and "backtrace_id" in events[0]
    assert await both(backends, "events", fan, 3) == events[3:]
    answers = await both(backends, "responses", fan)
    assert len(answers) == 2
    assert await both(backends, "responses", fan, answers[0]["cursor"]) == answers[1:]
    logs = await both(backends, "logs", fan)
    assert [x["message"] for x in logs] == ["fan-out of 2 adds up to 10"]
    assert await both(backends, "logs", fan, logs[0]["id"]) == []
    with_bt = next(e for e in events if e.get("backtrace_id") is not None)
    bt = await both(backends, "backtrace", fan, with_bt["version"])
    assert bt is not None and bt["frames"][0]["file"].endswith("fanout.js")
    assert await both(backends, "backtrace", fan, 0) is None  # `created` has none
    source = await both(backends, "component_source", bt["component_digest"])
    assert source is not None and "stepSubmit" in source["source"]
    assert await both(backends, "component_source", "sha256:" + "0" * 64) is None
    deployment = await both(backends, "deployment")
    assert {c["name"] for c in deployment["components"]} >= {"step", "fanout", "order"}


async def test_commands_and_refusals_are_the_same_through_both(
    engine: Engine, backends: tuple[EmbeddedBackend, RestBackend]
) -> None:
    embedded, rest = backends
    for backend in (embedded, rest):
        eid = await backend.submit(APPROVE, ["o"])
        await backend.pause(eid)
        assert (await backend.status(eid))["state"]["type"] == "paused"
        await backend.unpause(eid)
        await backend.stub(eid, {"ok": True})
        assert (await backend.status(eid))["result"] == {"ok": True}
    errors: list[tuple[int | None, str]] = []
    for backend in (embedded, rest):
        done = (await backend.list_executions(ExecutionQuery(states=("finished",)), 0, 1))[0]
        for call in (
            backend.pause(done["execution_id"]),
            backend.status("E_00000000000000000000000000"),
            backend.submit("test:console/nothing.here", []),
            backend.submit(STEP, ["not a number"]),
            backend.cancel_delay("Delay_not-a-delay"),
        ):
            with pytest.raises(ApiError) as raised:
                await call
            errors.append((raised.value.status, raised.value.message))
    half = len(errors) // 2
    assert errors[:half] == errors[half:]
    assert [status for status, _ in errors[:half]] == [409, 404, 404, 400, 400]
    assert "params[0] (idx): expected u32" in errors[3][1]


async def test_long_polls_answer_on_change(
    engine: Engine, backends: tuple[EmbeddedBackend, RestBackend]
) -> None:
    generation = await both(backends, "wait_changed", -1, 1.0)
    assert await both(backends, "wait_changed", generation, 0.05) == generation  # no change
    waiting = [asyncio.ensure_future(b.wait_changed(generation, 10.0)) for b in backends]
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiting)
    await engine.submit(APPROVE, ["w"])
    for w in waiting:
        assert await asyncio.wait_for(w, 10) > generation
    reload = (await both(backends, "deployment"))["reload"]["generation"]
    for backend in backends:
        assert (await backend.wait_reload(reload, 0.05))["reload"]["generation"] == reload


async def test_rest_backend_errors_name_the_server() -> None:
    with pytest.raises(ServerUnreachable) as raised:
        await RestBackend.connect("http://127.0.0.1:1", None)
    assert "cannot reach the obelisk server at http://127.0.0.1:1" in str(raised.value)


async def test_rest_backend_with_a_wrong_token(console_engine: Engine) -> None:
    server = TestServer(make_app(console_engine, TOKEN))
    await server.start_server()
    try:
        with pytest.raises(ApiError) as raised:
            await RestBackend.connect(str(server.make_url("")), "wrong")
        assert raised.value.status == 401
    finally:
        await server.close()


async def test_the_console_attached_to_a_server_on_postgresql(
    tmp_path: Any, postgres_dsn: str, request: pytest.FixtureRequest
) -> None:
    """Issue 5's "the console works against any of the servers": a server whose storage
    is PostgreSQL, the console attached to its API: list, counts, detail, an action."""
    from tests.console.conftest import open_console, screen_text, until, write_deployment
    from tests.pg_cluster import drop_schema, schema_dsn

    request.addfinalizer(lambda: drop_schema(postgres_dsn, tmp_path))
    engine = await Engine.start(
        write_deployment(tmp_path),
        tmp_path / "data",
        database_url=schema_dsn(postgres_dsn, tmp_path),
    )
    server = await api_server(engine)
    try:
        fan = await engine.submit(FANOUT, [2])
        assert await engine.result(fan, timeout=30) is not None
        waiting = await engine.submit(APPROVE, ["pg"])
        rest = await RestBackend.connect(str(server.make_url("")), TOKEN)
        embedded = EmbeddedBackend(engine, label="embedded", owns_engine=False)
        pair = (embedded, rest)
        rows = await both(pair, "list_executions", ExecutionQuery(), 0, 10)
        assert len(rows) == 4 and await both(pair, "count_executions", ExecutionQuery()) == 4
        assert (await both(pair, "counts_by_state"))["finished"] == 3
        await both(pair, "events", fan)
        async with open_console(backend=rest) as (app, pilot):
            from obelisk_tui.widgets.execution_list import ExecutionList

            lst = app.screen.query_one(ExecutionList)
            await until(pilot, lambda: len(lst.rows) == 4, what="the rows")
            assert "attached" in app.sub_title
            lst.move_cursor(lst.index_of(waiting) or 0)
            await pilot.press("p")
            await until(
                pilot,
                lambda: lst.selected is not None and lst.selected["state"]["type"] == "paused",
                what="paused",
            )
            await pilot.press("enter")
            await until(
                pilot,
                lambda: (
                    "test:console/approval.approve" in screen_text(app)
                    and "Paused" in screen_text(app)
                ),
                what="the detail",
            )
    finally:
        await server.close()
        await engine.stop()


async def api_server(engine: Engine, port: int | None = None, token: str = TOKEN) -> TestServer:
    """The REST API of `engine`, started (on `port`, or any free one). It stops as
    `obelisk server run` does: requests in flight get `SHUTDOWN_GRACE_SECONDS`, then are
    cancelled (aiohttp's test server waits a minute for them, and an attached console
    always has a long poll in flight)."""
    server = TestServer(make_app(engine, token), port=port)
    await server.start_server(shutdown_timeout=SHUTDOWN_GRACE_SECONDS)
    return server


async def test_the_attached_console_marks_a_lost_server_once_and_resumes(
    console_engine: Engine,
) -> None:
    """The server goes away while the console is attached: one notice and a lasting
    mark in the header (not a toast per retry), kept through a refresh asked meanwhile
    and the answer a closing server gives to a long poll asked before; back on the same
    address: unmarked."""
    from tests.console.conftest import open_console, until

    server = await api_server(console_engine)
    port = server.port
    rest = await RestBackend.connect(str(server.make_url("")), TOKEN)
    try:
        async with open_console(backend=rest) as (app, pilot):
            titles: list[str] = []  # every toast, also those that expired meanwhile
            notify = app.notify

            def recording_notify(message: str, *, title: str = "", **kw: Any) -> None:
                titles.append(title)
                notify(message, title=title, **kw)

            app.notify = recording_notify  # type: ignore[method-assign]

            def unreachable_toasts() -> int:
                return titles.count("server unreachable")

            closing = asyncio.ensure_future(server.close())  # refuses new requests first
            await until(pilot, lambda: "DISCONNECTED" in app.sub_title, what="the mark")
            # A commit while it closes: the long poll asked before it went is answered.
            await console_engine.submit(APPROVE, ["meanwhile"])
            await closing
            await pilot.press("space", "space")  # frozen and live again: a refresh asked
            await asyncio.sleep(2.5)  # follow_changes retries each second meanwhile
            assert unreachable_toasts() == 1
            assert "server" not in titles  # no "connected again" while it was away
            assert "DISCONNECTED" in app.sub_title
            server = await api_server(console_engine, port)  # back on the same address
            await until(pilot, lambda: "DISCONNECTED" not in app.sub_title, what="unmarked")
            assert titles[-1] == "server"  # "connected again"
    finally:
        await rest.close()
        await server.close()


@pytest.mark.parametrize(
    ("key", "screen_name", "notice"),
    [
        ("s", "SubmitScreen", "cannot list the functions"),
        ("C", "ComponentsScreen", "cannot read the deployment"),
    ],
)
async def test_a_screen_opened_while_the_server_is_away_says_why_and_fills_once_back(
    console_engine: Engine, key: str, screen_name: str, notice: str
) -> None:
    """The Submit dialog (its functions) and the Components screen (the deployment)."""
    from obelisk_tui.screens.components import ComponentsScreen
    from obelisk_tui.screens.submit import SubmitScreen
    from tests.console.conftest import open_console, screen_text, until

    def loaded(screen: object) -> bool:
        if isinstance(screen, SubmitScreen):
            return bool(screen.functions)
        assert isinstance(screen, ComponentsScreen)
        return screen.deployment is not None

    server = await api_server(console_engine)
    port = server.port
    rest = await RestBackend.connect(str(server.make_url("")), TOKEN)
    try:
        async with open_console(backend=rest) as (app, pilot):
            await server.close()
            await pilot.press(key)
            await until(
                pilot,
                lambda: type(app.screen).__name__ == screen_name and notice in screen_text(app),
                what="the screen's notice",
            )
            screen = app.screen
            assert not loaded(screen)
            if isinstance(screen, ComponentsScreen):
                assert "(retrying)" in screen_text(app)
            server = await api_server(console_engine, port)  # back on the same address
            # Within the follower's next retry (each second), though nothing commits: a
            # long poll that waits for a commit kept the screen empty for 10 s.
            await until(pilot, lambda: loaded(screen), what="its data", timeout=6)
            assert notice not in screen_text(app)
    finally:
        await rest.close()
        await server.close()


async def test_the_components_screen_says_a_rejected_token_is_not_retried(
    console_engine: Engine,
) -> None:
    """Unreachable: retried by itself once the server is back. Rejected (401): `r`."""
    from obelisk_tui.screens.components import ComponentsScreen
    from tests.console.conftest import open_console, screen_text, until

    server = await api_server(console_engine)
    rest = await RestBackend.connect(str(server.make_url("")), TOKEN)
    try:
        async with open_console(backend=rest) as (app, pilot):
            port = server.port
            await server.close()
            server = await api_server(console_engine, port, token="another")  # restarted
            await pilot.press("C")
            await until(
                pilot,
                lambda: (
                    isinstance(app.screen, ComponentsScreen)
                    and "cannot read the deployment" in screen_text(app)
                ),
                what="the notice",
            )
            assert "(r to retry)" in screen_text(app) and "(retrying)" not in screen_text(app)
    finally:
        await rest.close()
        await server.close()


async def test_both_console_backends_send_the_force(
    backends: tuple[EmbeddedBackend, RestBackend],
) -> None:
    embedded, rest = backends
    engine = embedded.engine
    later = engine.clock.now() + timedelta(days=1)
    for backend in (embedded, rest):
        eid = await engine.submit(FANOUT, [1], scheduled_at=later)
        with pytest.raises(ApiError, match="not cancellable") as refused:
            await backend.cancel(eid)
        assert refused.value.status == 422
        await backend.cancel(eid, force=True)
        events = [e.event for e in await engine.storage.get_events(eid)]
        assert ev.CancellationRequested(forced=True) in events, backend.label
