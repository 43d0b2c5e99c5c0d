"""The stub kind: `[[activity_stub]]`, an activity whose executions are answered by hand
(`obelisk execution stub`, or a workflow's `stub` call) and never run."""

from __future__ import annotations

from typing import ClassVar

from engine.core import events as ev
from engine.runtimes.api import (
    ComponentConfig,
    ComponentKind,
    LoadContext,
    LoadedComponent,
    declared_function,
)
from engine.runtimes.digests import typed_digest


class ActivityStub(ComponentKind):
    section = ev.STUB_TYPE
    keys: ClassVar[frozenset[str]] = frozenset({"name", "ffqn", "params", "return_type"})
    declares_function = True
    has_location = False
    executed = False

    def digest(self, config: ComponentConfig, data: bytes) -> str:
        return typed_digest(config, b"")

    def load(self, config: ComponentConfig, data: bytes, ctx: LoadContext) -> LoadedComponent:
        fn = declared_function(config)
        return LoadedComponent(
            config,
            ev.ComponentId(self.section, config.name, self.digest(config, data)),
            {fn.ffqn: fn},
        )
