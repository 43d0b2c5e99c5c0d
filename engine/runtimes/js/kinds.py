"""The JS kinds of components: `[[activity_js]]` and `[[workflow_js]]`.

Both declare their function in `deployment.toml` (the module has no types), digest the
source with the declared types, and share the QuickJS sandbox compiled once per process
(`prepare`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from engine.core import events as ev
from engine.errors import DeploymentError
from engine.runtimes.api import (
    ComponentConfig,
    ComponentKind,
    FunctionInfo,
    LoadContext,
    LoadedComponent,
    declared_function,
    interfaces_of,
)
from engine.runtimes.digests import typed_digest


class _JsKind(ComponentKind):
    declares_function = True

    def prepare(self, cache_dir: Path) -> None:
        from engine.runtimes.js.common import warm_up

        # Compile QuickJS once before the JS modules are checked under a load timeout.
        warm_up(cache_dir)

    def digest(self, config: ComponentConfig, data: bytes) -> str:
        return typed_digest(config, data)


class ActivityJs(_JsKind):
    section = "activity_js"
    keys: ClassVar[frozenset[str]] = frozenset(
        {
            "name",
            "exec",
            "location",
            "ffqn",
            "params",
            "return_type",
            "max_retries",
            "retry_exp_backoff",
            "env_vars",
            "allowed_host",
            "export",
        }
    )

    def load(self, config: ComponentConfig, data: bytes, ctx: LoadContext) -> LoadedComponent:
        # The runtime is imported when a component of the kind is loaded, not with the
        # registry: parsing a deployment file stays cheap.
        from engine.runtimes.js import activity as js_activity
        from engine.runtimes.js.network import parse_allowed_hosts

        source = data.decode("utf-8", errors="replace")
        try:
            parse_allowed_hosts(list(config.allowed_hosts))
        except ValueError as e:
            raise DeploymentError(f"{config.section}, key `allowed_host`: {e}") from None
        try:
            runner = js_activity.JsActivityRunner(
                source, str(config.location), config.export, env_vars=dict(config.env_vars)
            )
        except js_activity.JsLoadError as e:
            raise DeploymentError(f"{config.section}: {e}") from None
        fn = declared_function(config)
        return LoadedComponent(
            config,
            ev.ComponentId(self.section, config.name, self.digest(config, data)),
            {fn.ffqn: fn},
            runner,
            source,
        )


class WorkflowJs(_JsKind):
    section = "workflow_js"
    keys: ClassVar[frozenset[str]] = frozenset(
        {
            "name",
            "exec",
            "location",
            "ffqn",
            "params",
            "return_type",
            "blocking_strategy",
            "export",
        }
    )
    backtraces = True
    old_version_from = "source"

    def load(self, config: ComponentConfig, data: bytes, ctx: LoadContext) -> LoadedComponent:
        source = data.decode("utf-8", errors="replace")
        return js_workflow_component(
            config, source, self.digest(config, data), str(config.location)
        )

    def check(self, component: LoadedComponent, functions: Mapping[str, FunctionInfo]) -> None:
        from engine.runtimes.js.workflow import JsWorkflowLoadError, JsWorkflowRunner

        runner = component.runner
        assert isinstance(runner, JsWorkflowRunner)
        try:
            runner.check(interfaces_of(functions))
        except JsWorkflowLoadError as e:
            raise DeploymentError(f"{component.config.section}: {e}") from None

    async def rebuild(
        self, config: ComponentConfig, digest: str, ctx: LoadContext
    ) -> LoadedComponent | None:
        if ctx.stored_source is None:
            return None
        stored = await ctx.stored_source(digest)
        if stored is None:
            return None
        return await asyncio.to_thread(
            js_workflow_component, config, stored.source, digest, stored.file
        )


def js_workflow_component(
    config: ComponentConfig, source: str, digest: str, filename: str
) -> LoadedComponent:
    """A `workflow_js` component from its source (the deployed file's, or an old
    version's stored text)."""
    from engine.runtimes.js.workflow import JsWorkflowRunner

    fn = declared_function(config)
    return LoadedComponent(
        config,
        ev.ComponentId("workflow_js", config.name, digest),
        {fn.ffqn: fn},
        JsWorkflowRunner(source, filename, config.export),
        source,
    )
