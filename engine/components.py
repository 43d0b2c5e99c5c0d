"""Loading the components a deployment names: digests, exports, runners.

A `Registry` is immutable once built; a reload builds a new one and swaps it in whole,
so a failed reload leaves the previous registry in force.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core import events as ev
from engine.deployment import ComponentConfig, Deployment, Param, is_ffqn, load_deployment
from engine.errors import DeploymentError, InvalidParams, UnknownFunction
from engine.limits import params_size_problem
from engine.wit.codec import WitValueError, validate_json
from engine.wit.types import WitType, format_wit_type


@dataclass(frozen=True, slots=True)
class FunctionInfo:
    ffqn: str
    params: tuple[Param, ...]
    return_type: WitType | None
    component_name: str
    component_type: str

    @property
    def return_type_text(self) -> str | None:
        return None if self.return_type is None else format_wit_type(self.return_type)


@dataclass(slots=True)
class LoadedComponent:
    config: ComponentConfig
    component_id: ev.ComponentId
    functions: dict[str, FunctionInfo]
    #: WasmActivityRunner / JsActivityRunner / JsWorkflowRunner / WasmWorkflowRunner; None
    #: for stubs.
    runner: Any = None
    source: str | None = None

    @property
    def ffqns(self) -> list[str]:
        return sorted(self.functions)


@dataclass(slots=True)
class Registry:
    deployment: Deployment
    components: list[LoadedComponent] = field(default_factory=list)
    functions: dict[str, tuple[FunctionInfo, LoadedComponent]] = field(default_factory=dict)

    def function(self, ffqn: str) -> tuple[FunctionInfo, LoadedComponent]:
        try:
            return self.functions[ffqn]
        except KeyError:
            if not is_ffqn(ffqn):
                raise UnknownFunction(
                    f"{ffqn!r} is not an FFQN (namespace:package/interface.function, "
                    "e.g. myapp:demo/activity.step)"
                ) from None
            raise UnknownFunction(
                f"function {ffqn} is not exported by any deployed component"
            ) from None

    def validate_params(self, ffqn: str, params: Any) -> list[Any]:
        """Check params against the function's WIT types (SPEC §9.2); name the bad one.
        Every new execution comes through here, so params over `MAX_PARAMS_BYTES` are
        refused here too (`engine.limits`)."""
        info, _ = self.function(ffqn)
        too_large = params_size_problem(ffqn, params)
        if too_large is not None:
            raise InvalidParams(too_large)
        return validate_params(info, params)


def validate_params(info: FunctionInfo, params: Any) -> list[Any]:
    """`params` checked against the declared types of `info` and normalized;
    `InvalidParams` naming the function and the bad parameter."""
    ffqn = info.ffqn
    if not isinstance(params, list):
        raise InvalidParams(f"params of {ffqn} must be a JSON array")
    if len(params) != len(info.params):
        expected = ", ".join(f"{p.name}: {p.type_text}" for p in info.params) or "none"
        raise InvalidParams(
            f"{ffqn} takes {len(info.params)} parameter(s) ({expected}), got {len(params)}"
        )
    out: list[Any] = []
    for i, (param, value) in enumerate(zip(info.params, params, strict=True)):
        try:
            out.append(validate_json(value, param.type, f"params[{i}] ({param.name})"))
        except WitValueError as e:
            raise InvalidParams(f"{ffqn}: {e}") from None
    return out


def file_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _read(config: ComponentConfig) -> bytes:
    assert config.location is not None
    try:
        return config.location.read_bytes()
    except OSError as e:
        raise DeploymentError(
            f"{config.section}: cannot read {config.location}: {e.strerror}"
        ) from None


def _typed_digest(config: ComponentConfig, source: bytes) -> str:
    """JS and stubs: a digest of the source plus the declared FFQN and types (SPEC §2)."""
    h = hashlib.sha256(source)
    h.update(f"\0{config.ffqn}\0{config.return_type_text}".encode())
    for p in config.params:
        h.update(f"\0{p.name}:{p.type_text}".encode())
    return "sha256:" + h.hexdigest()


def _declared_function(config: ComponentConfig) -> FunctionInfo:
    assert config.ffqn is not None
    return FunctionInfo(config.ffqn, config.params, config.return_type, config.name, config.type)


def _load_one_sync(config: ComponentConfig, wasm_engine: Any, cache_dir: Path) -> LoadedComponent:
    from engine.runtimes.js import activity as js_activity
    from engine.runtimes.wasm import activity as wasm_activity

    if config.type == "activity_stub":
        digest = _typed_digest(config, b"")
        fn = _declared_function(config)
        return LoadedComponent(
            config, ev.ComponentId("activity_stub", config.name, digest), {fn.ffqn: fn}
        )
    data = _read(config)
    if config.type == "activity_js":
        digest = _typed_digest(config, data)
        source = data.decode("utf-8", errors="replace")
        try:
            js_activity.parse_allowed_hosts(list(config.allowed_hosts))
        except ValueError as e:
            raise DeploymentError(f"{config.section}, key `allowed_host`: {e}") from None
        try:
            runner = js_activity.JsActivityRunner(
                source, str(config.location), config.export, env_vars=dict(config.env_vars)
            )
        except js_activity.JsLoadError as e:
            raise DeploymentError(f"{config.section}: {e}") from None
        fn = _declared_function(config)
        return LoadedComponent(
            config,
            ev.ComponentId("activity_js", config.name, digest),
            {fn.ffqn: fn},
            runner,
            source,
        )
    if config.type == "activity_wasm":
        digest = file_digest(data)
        try:
            assert config.location is not None  # read above
            component = wasm_activity.load_activity(config.location, cache_dir, wasm_engine)
            signatures = wasm_activity.inspect_exports(component)
        except wasm_activity.ComponentLoadError as e:
            raise DeploymentError(f"{config.section}, key `location`: {e}") from None
        _check_not_a_workflow(config, component)
        functions = _functions_of(config, signatures)
        if not functions:
            raise DeploymentError(f"{config.section}: {config.location} exports no functions")
        return LoadedComponent(
            config,
            ev.ComponentId("activity_wasm", config.name, digest),
            functions,
            wasm_activity.WasmActivityRunner(component, signatures),
        )
    if config.type == "workflow_js":
        source = data.decode("utf-8", errors="replace")
        return js_workflow_component(
            config, source, _typed_digest(config, data), str(config.location)
        )
    if config.type == "workflow_wasm":
        try:
            component = wasm_engine.load_component(config.location, cache_dir)
        except wasm_activity.ComponentLoadError as e:
            raise DeploymentError(f"{config.section}, key `location`: {e}") from None
        return wasm_workflow_component(config, component, file_digest(data), wasm_engine)
    raise DeploymentError(
        f"{config.section}: {config.type} components are not supported by this version yet"
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


def js_workflow_component(
    config: ComponentConfig, source: str, digest: str, filename: str
) -> LoadedComponent:
    """A `workflow_js` component from its source (the deployed file, or an old version's
    stored text: `engine.old_versions`)."""
    from engine.runtimes.js.workflow import JsWorkflowRunner

    fn = _declared_function(config)
    return LoadedComponent(
        config,
        ev.ComponentId("workflow_js", config.name, digest),
        {fn.ffqn: fn},
        JsWorkflowRunner(source, filename, config.export),
        source,
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
        _functions_of(config, wf_runner.exports),
        wf_runner,
    )


def _functions_of(
    config: ComponentConfig, signatures: Mapping[str, Any]
) -> dict[str, FunctionInfo]:
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


async def load_registry(
    deployment: Deployment, wasm_engine: Any, cache_dir: Path, *, skip_types: Sequence[str] = ()
) -> Registry:
    """Load every component (in threads: compiling WASM takes a while) and index exports."""
    configs = [c for c in deployment.components if c.type not in skip_types]
    if any(c.type in ("activity_js", "workflow_js") for c in configs):
        from engine.runtimes.js.activity import warm_up

        # Compile QuickJS once before the JS modules are checked under a load timeout.
        await asyncio.to_thread(warm_up, cache_dir)
    try:
        loaded = await asyncio.gather(
            *(asyncio.to_thread(_load_one_sync, c, wasm_engine, cache_dir) for c in configs)
        )
    except DeploymentError as e:  # name the deployment file, like every other load error
        raise DeploymentError(f"{deployment.path}: {e}") from None
    registry = Registry(deployment)
    for component in loaded:
        for ffqn, info in component.functions.items():
            if ffqn in registry.functions:
                other = registry.functions[ffqn][1].config.section
                raise DeploymentError(
                    f"{deployment.path}: {component.config.section} exports {ffqn}, "
                    f"which {other} already exports"
                )
            if info.return_type is None or not format_wit_type(info.return_type).startswith(
                "result"
            ):
                raise DeploymentError(
                    f"{deployment.path}: {component.config.section}: {ffqn} must return a result<…>"
                )
            registry.functions[ffqn] = (info, component)
        registry.components.append(component)
    await asyncio.gather(
        *(asyncio.to_thread(check_workflow, c, registry) for c in registry.components)
    )
    return registry


async def verify_deployment(path: str | os.PathLike[str], cache_dir: Path) -> Registry:
    """Everything `Engine.start` checks before it starts anything — the TOML, every
    component compiled or loaded, its exports, workflows' imports against them — with no
    storage and no executors (`obelisk server verify`). Raises DeploymentError."""
    from engine.runtimes.wasm.activity import WasmEngine

    deployment = load_deployment(path)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DeploymentError(
            f"cannot use the cache directory {cache_dir}: {e.strerror or e}"
        ) from None
    return await load_registry(deployment, WasmEngine(), cache_dir)


def check_workflow(component: LoadedComponent, registry: Registry) -> None:
    """Workflows import other components' interfaces: check them against the registry."""
    if component.config.type == "workflow_wasm":
        _check_wasm_workflow(component, registry)
        return
    if component.config.type != "workflow_js":
        return
    from engine.executors.replay_host import registry_interfaces
    from engine.runtimes.js.workflow import JsWorkflowLoadError

    try:
        component.runner.check(registry_interfaces(registry))
    except JsWorkflowLoadError as e:
        raise DeploymentError(
            f"{registry.deployment.path}: {component.config.section}: {e}"
        ) from None


def _check_wasm_workflow(component: LoadedComponent, registry: Registry) -> None:
    """A WASM workflow's imports must reach deployed functions with the same WIT types."""
    from engine.executors.replay_host import registry_interfaces
    from engine.runtimes.wasm.workflow import WasmWorkflowLoadError, signatures_of

    try:
        component.runner.check(registry_interfaces(registry), signatures_of(registry.functions))
    except WasmWorkflowLoadError as e:
        raise DeploymentError(
            f"{registry.deployment.path}: {component.config.section}: {e}"
        ) from None
