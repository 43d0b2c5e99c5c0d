"""The WASM kinds of components: `[[activity_wasm]]` and `[[workflow_wasm]]`.

Their functions are the component's exports (types from its WIT); the digest is the
file's; compiled code is cached by digest (so an old workflow version is rebuilt from
the cache)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, ClassVar

from engine.core import events as ev
from engine.errors import DeploymentError
from engine.runtimes.api import (
    ComponentConfig,
    ComponentKind,
    FunctionInfo,
    LoadContext,
    LoadedComponent,
    Param,
    interfaces_of,
)
from engine.wit.types import format_wit_type


class ActivityWasm(ComponentKind):
    section = "activity_wasm"
    keys: ClassVar[frozenset[str]] = frozenset(
        {"name", "exec", "location", "max_retries", "retry_exp_backoff", "env_vars", "allowed_host"}
    )

    def load(self, config: ComponentConfig, data: bytes, ctx: LoadContext) -> LoadedComponent:
        # The runtime is imported when a component of the kind is loaded, not with the
        # registry: parsing a deployment file stays cheap.
        from engine.runtimes.wasm import activity as wasm_activity

        assert config.location is not None
        if config.allowed_hosts:
            # Refused rather than ignored: a host list that is not applied is worse than
            # none. The linker's built-in `wasi:http` (`add_wasi_http`) sends a guest's
            # requests itself and takes no hook; applying the patterns means defining
            # `wasi:http/outgoing-handler` in the host (the linker allows shadowing).
            raise DeploymentError(
                f"{config.section}, key `allowed_host`: not supported for WASM activities "
                "yet (their outgoing HTTP cannot be checked against host patterns here); "
                "remove the key, or write the activity in JS, where `allowed_host` applies"
            )
        try:
            component = wasm_activity.load_activity(config.location, ctx.cache_dir, ctx.wasm_engine)
            signatures = wasm_activity.inspect_exports(component)
        except wasm_activity.ComponentLoadError as e:
            raise DeploymentError(f"{config.section}, key `location`: {e}") from None
        _check_not_a_workflow(config, component)
        functions = functions_of(config, signatures)
        if not functions:
            raise DeploymentError(f"{config.section}: {config.location} exports no functions")
        return LoadedComponent(
            config,
            ev.ComponentId(self.section, config.name, self.digest(config, data)),
            functions,
            wasm_activity.WasmActivityRunner(component, signatures),
        )


class WorkflowWasm(ComponentKind):
    section = "workflow_wasm"
    keys: ClassVar[frozenset[str]] = frozenset({"name", "exec", "location", "blocking_strategy"})
    old_version_from = "compiled code"

    def load(self, config: ComponentConfig, data: bytes, ctx: LoadContext) -> LoadedComponent:
        from engine.runtimes.wasm.activity import ComponentLoadError

        assert config.location is not None  # a kind with a location
        try:
            component = ctx.wasm_engine.load_component(config.location, ctx.cache_dir)
        except ComponentLoadError as e:
            raise DeploymentError(f"{config.section}, key `location`: {e}") from None
        return wasm_workflow_component(
            config, component, self.digest(config, data), ctx.wasm_engine
        )

    def check(self, component: LoadedComponent, functions: Mapping[str, FunctionInfo]) -> None:
        from engine.runtimes.wasm.workflow import (
            WasmWorkflowLoadError,
            WasmWorkflowRunner,
            signatures_of,
        )

        runner = component.runner
        assert isinstance(runner, WasmWorkflowRunner)
        try:
            runner.check(interfaces_of(functions), signatures_of(functions))
        except WasmWorkflowLoadError as e:
            raise DeploymentError(f"{component.config.section}: {e}") from None

    async def rebuild(
        self, config: ComponentConfig, digest: str, ctx: LoadContext
    ) -> LoadedComponent | None:
        compiled = await asyncio.to_thread(ctx.wasm_engine.load_cached, digest, ctx.cache_dir)
        if compiled is None:
            return None
        return await asyncio.to_thread(
            wasm_workflow_component, config, compiled, digest, ctx.wasm_engine
        )


def _check_not_a_workflow(config: ComponentConfig, component: Any) -> None:
    """A workflow component declared as an activity would load and then fail every run."""
    from engine.runtimes.wasm.activity import engine_of
    from engine.runtimes.wasm.workflow import workflow_only_imports

    names = workflow_only_imports(component, engine_of(component).engine)
    if names:
        more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
        raise DeploymentError(
            f"{config.section}, key `location`: {config.location} imports {names[0]}{more}, "
            "which only workflows are given; a workflow component belongs in a "
            "[[workflow_wasm]] section"
        )


def wasm_workflow_component(
    config: ComponentConfig, component: Any, digest: str, wasm_engine: Any
) -> LoadedComponent:
    """A `workflow_wasm` component from compiled code (the deployed file's, or an old
    version's from the compiled cache); its exports are its functions."""
    from engine.runtimes.wasm.workflow import WasmWorkflowLoadError, WasmWorkflowRunner

    try:
        wf_runner = WasmWorkflowRunner(component, wasm_engine, label=str(config.location))
    except WasmWorkflowLoadError as e:
        raise DeploymentError(f"{config.section}: {e}") from None
    return LoadedComponent(
        config,
        ev.ComponentId("workflow_wasm", config.name, digest),
        functions_of(config, wf_runner.exports),
        wf_runner,
    )


def functions_of(config: ComponentConfig, signatures: Mapping[str, Any]) -> dict[str, FunctionInfo]:
    """The exported functions of a WASM component, from its signatures by FFQN."""
    return {
        ffqn: FunctionInfo(
            ffqn,
            tuple(Param(name, t, format_wit_type(t)) for name, t in sig.params),
            sig.result,
            config.name,
            config.type,
        )
        for ffqn, sig in signatures.items()
    }
