"""Suite-wide fixtures: the PostgreSQL server that the PostgreSQL tests use.

`OBELISK_TEST_POSTGRES_DSN` names a server to use (its role must be allowed to create
schemas); without it a throw-away cluster is started once per session (`tests/pg_cluster`)
and removed at the end. When no server can be started the PostgreSQL tests are skipped
with a loud message — except in CI (`CI` set, as `.ci/run` has it, or
`OBELISK_REQUIRE_POSTGRES=1`), where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.pg_cluster import Cluster, ClusterUnavailable, create_cluster, postgres_required

DSN_ENV = "OBELISK_TEST_POSTGRES_DSN"

_state: dict[str, object] = {}


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster | None]:
    """The session's own cluster (None when `OBELISK_TEST_POSTGRES_DSN` is given)."""
    if os.environ.get(DSN_ENV):
        yield None
        return
    try:
        cluster = create_cluster()
    except (ClusterUnavailable, OSError) as e:
        message = f"PostgreSQL tests cannot run: {e}"
        _state["unavailable"] = message
        if postgres_required():
            pytest.fail(message + f" (CI requires them; or set {DSN_ENV})", pytrace=False)
        pytest.skip(message)
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture(scope="session")
def postgres_dsn(postgres_cluster: Cluster | None) -> str:
    """A DSN of a PostgreSQL database the tests may create schemas in."""
    given = os.environ.get(DSN_ENV)
    if given:
        return given
    assert postgres_cluster is not None
    return postgres_cluster.dsn()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker hands the message to the controller, which prints it."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and "unavailable" in _state:
        workeroutput["postgres_unavailable"] = _state["unavailable"]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """(pytest-xdist, on the controller) a worker finished: keep what it reported."""
    message = getattr(node, "workeroutput", {}).get("postgres_unavailable")
    if message:
        _state["unavailable"] = message


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    message = _state.get("unavailable")
    if message:
        terminalreporter.write_sep("!", "PostgreSQL tests were NOT run", red=True, bold=True)
        terminalreporter.write_line(str(message), red=True)
