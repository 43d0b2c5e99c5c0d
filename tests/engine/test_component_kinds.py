"""A new kind of component is one module and one registration: `activity_echo`, defined
and registered only here, is parsed from `deployment.toml`, loaded, executed, called by
a JS workflow, and listed — without any other module knowing its name."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from engine.core import events as ev
from engine.core.records import LogLine
from engine.errors import DeploymentError
from engine.runtimes.api import (
    ComponentConfig,
    ComponentKind,
    LoadContext,
    LoadedComponent,
    RunContext,
    RunOk,
    RunOutcome,
    declared_function,
)
from engine.runtimes.digests import typed_digest
from engine.runtimes.kinds import register_kind, sections, unregister_kind
from tests.engine.conftest import StartEngine
from tests.fixtures.deployments import Deployment, TomlValue, ms


class EchoRunner:
    """Answers every call with its first parameter, and logs what it echoed."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.calls = 0
        self._lock = threading.Lock()

    def run(self, ffqn: str, params: list[Any], ctx: RunContext) -> RunOutcome:
        with self._lock:
            self.calls += 1
        ctx.log(LogLine("info", f"echo {params[0]!r}"))
        return RunOk(self.prefix + str(params[0]))


class ActivityEcho(ComponentKind):
    section = "activity_echo"
    keys: ClassVar[frozenset[str]] = frozenset(
        {"name", "exec", "ffqn", "params", "return_type", "env_vars"}
    )
    declares_function = True
    has_location = False

    def digest(self, config: ComponentConfig, data: bytes) -> str:
        return typed_digest(config, b"echo")

    def load(self, config: ComponentConfig, data: bytes, ctx: LoadContext) -> LoadedComponent:
        fn = declared_function(config)
        prefix = config.env_vars.get("PREFIX", "")
        return LoadedComponent(
            config,
            ev.ComponentId(self.section, config.name, self.digest(config, data)),
            {fn.ffqn: fn},
            EchoRunner(prefix),
        )


@pytest.fixture
def echo_kind() -> Iterator[ActivityEcho]:
    kind = ActivityEcho()
    register_kind(kind)
    try:
        yield kind
    finally:
        unregister_kind(kind.section)


TWICE_JS = """
import { say } from "test:kinds/echo";

export default function twice(what) {
  return say(what) + " / " + say(what + "!");
}
"""


def deployment(**echo_keys: TomlValue) -> Deployment:
    return (
        Deployment()
        .section(
            "activity_echo",
            name="echo",
            ffqn="test:kinds/echo.say",
            params=[{"name": "what", "type": "string"}],
            return_type="result<string, string>",
            env_vars=[{"key": "PREFIX", "value": "echo: "}],
            exec={"tick_sleep": ms(20)},
            **echo_keys,
        )
        .workflow_js(
            "twice",
            TWICE_JS,
            ffqn="test:kinds/workflow.twice",
            params=[("what", "string")],
            return_type="result<string, string>",
        )
    )


async def test_a_kind_registered_by_a_test_runs_end_to_end(
    start_engine: StartEngine, echo_kind: ActivityEcho
) -> None:
    assert "activity_echo" in sections()
    engine = await start_engine(deployment())
    eid = await engine.submit("test:kinds/echo.say", ["hi"])
    assert await engine.result(eid, timeout=10) == ev.ResultOk("echo: hi")
    summary = await engine.storage.get_summary(eid)
    assert summary.component_type == "activity_echo"
    logs = await engine.storage.get_logs(eid)
    assert [line.message for line in logs] == ["echo 'hi'"]

    wf = await engine.submit("test:kinds/workflow.twice", ["yo"])
    assert await engine.result(wf, timeout=10) == ev.ResultOk("echo: yo / echo: yo!")
    component = next(c for c in engine.registry.components if c.config.type == "activity_echo")
    assert isinstance(component.runner, EchoRunner) and component.runner.calls == 3


async def test_an_unregistered_kind_is_an_unknown_section(start_engine: StartEngine) -> None:
    with pytest.raises(DeploymentError, match="unknown section `activity_echo`"):
        await start_engine(deployment())


async def test_a_kind_checks_its_keys(start_engine: StartEngine, echo_kind: ActivityEcho) -> None:
    with pytest.raises(DeploymentError, match=r"\[\[activity_echo\]\] #1 \"echo\", key `location`"):
        await start_engine(deployment(location="x"))
