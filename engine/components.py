"""Loading the components a deployment names into a `Registry`: digests, exports, runners.

What a component *is* (its section's keys, how its file becomes functions and a runner,
its digest, its checks) is its kind's (`engine.runtimes.kinds`); this module only drives
the kinds and indexes what they load. A `Registry` is immutable once built; a reload
builds a new one and swaps it in whole, so a failed reload leaves the previous registry
in force.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from engine.deployment import ComponentConfig, Deployment, is_ffqn, load_deployment
from engine.errors import DeploymentError, InvalidParams, UnknownFunction
from engine.limits import params_size_problem
from engine.runtimes.api import FunctionInfo, LoadContext, LoadedComponent
from engine.runtimes.digests import file_digest
from engine.runtimes.kinds import kind_of
from engine.wit.codec import WitValueError, validate_json
from engine.wit.types import format_wit_type

__all__ = [
    "FunctionInfo",
    "LoadProgress",
    "LoadedComponent",
    "Registry",
    "check_component",
    "component_digest",
    "component_label",
    "file_digest",
    "index_registry",
    "load_components",
    "load_registry",
    "validate_params",
    "verify_deployment",
]


@dataclass(slots=True)
class Registry:
    deployment: Deployment
    components: list[LoadedComponent] = field(default_factory=list)
    functions: dict[str, tuple[FunctionInfo, LoadedComponent]] = field(default_factory=dict)
    #: Values derived from the built registry, computed once by whoever needs them (a
    #: registry is not changed once built: a reload builds a new one), keyed by name
    #: and by the number of functions they were computed from.
    derived: dict[tuple[str, int], Any] = field(default_factory=dict, repr=False, compare=False)

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


def _read(config: ComponentConfig) -> bytes:
    """The component's file (b"" for kinds without one)."""
    if config.location is None:
        return b""
    try:
        return config.location.read_bytes()
    except OSError as e:
        raise DeploymentError(
            f"{config.section}: cannot read {config.location}: {e.strerror}"
        ) from None


def component_digest(config: ComponentConfig) -> str:
    """The digest loading `config` gives (SPEC §2), without loading it (a reload compares
    digests to reuse what is loaded)."""
    return kind_of(config.type).digest(config, _read(config))


def _load_one_sync(config: ComponentConfig, ctx: LoadContext) -> LoadedComponent:
    return kind_of(config.type).load(config, _read(config), ctx)


T = TypeVar("T")

#: Told, on the event loop, when a component starts loading (`ready` False) and when it
#: is loaded (`ready` True, with the seconds it took): a first start compiles WASM for a
#: while, and a console shows what it is doing meanwhile.
LoadProgress = Callable[[str, bool, float], None]


def component_label(config: ComponentConfig) -> str:
    """How progress messages name a component: `activity_wasm "step"`."""
    return f'{config.type} "{config.name}"'


async def load_components(
    deployment: Deployment,
    configs: Sequence[ComponentConfig],
    ctx: LoadContext,
    on_progress: LoadProgress | None = None,
) -> list[LoadedComponent]:
    """Load `configs` (in threads: compiling WASM takes a while), after preparing their
    kinds once. DeploymentError names the deployment file."""
    tell = on_progress or (lambda _label, _ready, _seconds: None)
    # Once per preparation, not per kind: the JS kinds share one QuickJS warm-up.
    prepares = {type(kind_of(c.type)).prepare: kind_of(c.type) for c in configs}

    async def timed(label: str, call: Callable[[], T]) -> T:
        tell(label, False, 0.0)
        started = time.monotonic()
        result = await asyncio.to_thread(call)
        tell(label, True, time.monotonic() - started)
        return result

    try:
        for kind in prepares.values():
            await timed(
                f"{kind.section}: shared runtime", functools.partial(kind.prepare, ctx.cache_dir)
            )
        loads = (
            timed(component_label(c), functools.partial(_load_one_sync, c, ctx)) for c in configs
        )
        return list(await asyncio.gather(*loads))
    except DeploymentError as e:  # name the deployment file, like every other load error
        raise DeploymentError(f"{deployment.path}: {e}") from None


async def index_registry(deployment: Deployment, components: Iterable[LoadedComponent]) -> Registry:
    """The registry of `components`: every export indexed once (a function exported twice,
    or not returning a result, is refused), then each component checked against all of
    them by its kind (a workflow's imports: checked again even for a component reused by
    a reload, since what it imports may have gone)."""
    registry = Registry(deployment)
    for component in components:
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
        *(asyncio.to_thread(check_component, c, registry) for c in registry.components)
    )
    return registry


def check_component(component: LoadedComponent, registry: Registry) -> None:
    """`component` against every function of `registry` (its kind decides what to check:
    a workflow's imports). DeploymentError names the deployment file."""
    functions = {ffqn: info for ffqn, (info, _) in registry.functions.items()}
    try:
        kind_of(component.config.type).check(component, functions)
    except DeploymentError as e:
        raise DeploymentError(f"{registry.deployment.path}: {e}") from None


async def load_registry(
    deployment: Deployment,
    wasm_engine: Any,
    cache_dir: Path,
    on_progress: LoadProgress | None = None,
) -> Registry:
    """Load every component and index its exports."""
    ctx = LoadContext(wasm_engine, cache_dir)
    loaded = await load_components(deployment, deployment.components, ctx, on_progress)
    return await index_registry(deployment, loaded)


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
