"""`deployment.toml` (SPEC §9.1): parsed into plain config objects, with located errors.

Only parsing and validation of the file itself happens here; loading the component
files (compiling WASM, checking JS) is `engine.components`.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import DeploymentError
from engine.runtimes.config import ComponentConfig, ExecConfig, Param
from engine.runtimes.kinds import kind_of, sections
from engine.wit.types import WitType, WitTypeError, format_wit_type, parse_wit_type

__all__ = [
    "ComponentConfig",
    "Deployment",
    "ExecConfig",
    "Param",
    "deployment_problem",
    "is_ffqn",
    "load_deployment",
]

_DURATION_UNITS_MS = {
    "milliseconds": 1,
    "seconds": 1000,
    "minutes": 60_000,
    "hours": 3_600_000,
    "days": 86_400_000,
}


@dataclass(frozen=True, slots=True)
class Deployment:
    path: Path
    components: tuple[ComponentConfig, ...]


_EXEC_KEYS = {"batch_size", "lock_expiry", "tick_sleep", "max_inflight"}


class _Ctx:
    def __init__(self, path: Path, section: str) -> None:
        self.path = path
        self.section = section

    def error(self, key: str | None, message: str) -> DeploymentError:
        where = f"{self.path}: {self.section}"
        if key:
            where += f", key `{key}`"
        return DeploymentError(f"{where}: {message}")


def deployment_problem(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with the deployment file (None: it loads): for front ends that
    check it before they print anything else or take over the terminal."""
    try:
        load_deployment(path)
    except DeploymentError as e:
        return str(e)
    return None


def load_deployment(
    path: str | os.PathLike[str], environ: dict[str, str] | None = None
) -> Deployment:
    """Read and validate a deployment file. Raises DeploymentError naming file/section/key."""
    p = Path(path)
    env = dict(os.environ if environ is None else environ)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DeploymentError(f"{p}: deployment file not found") from None
    except OSError as e:
        raise DeploymentError(f"{p}: cannot read deployment file: {e.strerror}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise DeploymentError(f"{p}: malformed TOML: {e}") from None
    components: list[ComponentConfig] = []
    known = sections()
    for section, value in doc.items():
        if section not in known:
            raise DeploymentError(
                f"{p}: unknown section `{section}` (expected one of: {', '.join(known)})"
            )
        if not isinstance(value, list):
            raise DeploymentError(f"{p}: `{section}` must be an array of tables: [[{section}]]")
        for index, table in enumerate(value, start=1):
            components.append(_component(p, section, index, table, env))
    names: dict[tuple[str, str], str] = {}
    for c in components:
        key = (c.type, c.name)
        if key in names:
            raise DeploymentError(
                f"{p}: {c.section}: duplicate name `{c.name}` (also {names[key]})"
            )
        names[key] = c.section
    return Deployment(p, tuple(components))


def _component(
    path: Path, section: str, index: int, table: dict[str, Any], env: dict[str, str]
) -> ComponentConfig:
    kind = kind_of(section)
    label = f"[[{section}]] #{index}"
    name = table.get("name")
    if not kind.has_location and name is None and isinstance(table.get("ffqn"), str):
        name = table["ffqn"]  # a stub is named after its function unless named
    if isinstance(name, str):
        label += f' "{name}"'
    ctx = _Ctx(path, label)
    for key in table:
        if key not in kind.keys:
            raise ctx.error(key, f"unknown key (allowed: {', '.join(sorted(kind.keys))})")
    if not isinstance(name, str) or not name:
        raise ctx.error("name", "missing or not a string")
    location: Path | None = None
    if kind.has_location:
        loc = table.get("location")
        if not isinstance(loc, str) or not loc:
            raise ctx.error("location", "missing or not a string")
        location = (path.parent / loc).resolve()
        if not location.is_file():
            raise ctx.error("location", f"file not found: {location}")
    ffqn: str | None = None
    params: tuple[Param, ...] = ()
    return_type: WitType | None = None
    return_text: str | None = None
    if kind.declares_function:
        ffqn = _ffqn(ctx, table.get("ffqn"))
        params = _params(ctx, table.get("params", []))
        rt = table.get("return_type")
        if not isinstance(rt, str):
            raise ctx.error(
                "return_type", 'missing or not a string (e.g. "result<string, string>")'
            )
        return_type = _wit_type(ctx, "return_type", rt)
        if not format_wit_type(return_type).startswith("result"):
            raise ctx.error("return_type", f"must be a result<…>, got `{rt}`")
        return_text = rt
    is_workflow = kind.role == "workflow"
    exec_cfg = _exec(ctx, table.get("exec", {}), workflow=is_workflow)
    max_retries: int | None = None if is_workflow else 5
    if "max_retries" in table:
        mr = table["max_retries"]
        if not isinstance(mr, int) or isinstance(mr, bool) or mr < 0:
            raise ctx.error("max_retries", "must be a non-negative integer")
        max_retries = mr
    backoff = 100
    if "retry_exp_backoff" in table:
        backoff = _duration_ms(ctx, "retry_exp_backoff", table["retry_exp_backoff"])
    strategy = table.get("blocking_strategy", "await")
    if strategy not in ("await", "interrupt"):
        raise ctx.error("blocking_strategy", f'must be "await" or "interrupt", got {strategy!r}')
    export = table.get("export")
    if export is not None and not isinstance(export, str):
        raise ctx.error("export", "must be a string")
    return ComponentConfig(
        type=section,
        name=name,
        location=location,
        section=label,
        ffqn=ffqn,
        params=params,
        return_type=return_type,
        return_type_text=return_text,
        env_vars=_env_vars(ctx, table.get("env_vars", []), env),
        max_retries=max_retries,
        retry_exp_backoff_ms=backoff,
        exec=exec_cfg,
        allowed_hosts=_allowed_hosts(ctx, table.get("allowed_host", [])),
        blocking_strategy=strategy,
        export=export,
    )


def _ffqn(ctx: _Ctx, value: Any) -> str:
    if not isinstance(value, str):
        raise ctx.error("ffqn", 'missing or not a string (e.g. "myapp:demo/activity.step")')
    if not is_ffqn(value):
        raise ctx.error("ffqn", f"`{value}` is not namespace:package/interface.function")
    return value


def is_ffqn(value: str) -> bool:
    ns, _, rest = value.partition(":")
    pkg, _, ifc_fn = rest.partition("/")
    ifc, _, fn = ifc_fn.rpartition(".")
    return all((ns, pkg, ifc, fn)) and " " not in value


def _wit_type(ctx: _Ctx, key: str, text: str) -> WitType:
    try:
        return parse_wit_type(text)
    except WitTypeError as e:
        raise ctx.error(key, f"invalid type `{text}`: {e}") from None


def _params(ctx: _Ctx, value: Any) -> tuple[Param, ...]:
    if not isinstance(value, list):
        raise ctx.error("params", 'must be an array like [{ name = "x", type = "string" }]')
    out: list[Param] = []
    for i, item in enumerate(value):
        key = f"params[{i}]"
        if not isinstance(item, dict) or set(item) != {"name", "type"}:
            raise ctx.error(key, "must be a table with exactly `name` and `type`")
        if not isinstance(item["name"], str) or not isinstance(item["type"], str):
            raise ctx.error(key, "`name` and `type` must be strings")
        out.append(Param(item["name"], _wit_type(ctx, key + ".type", item["type"]), item["type"]))
    return tuple(out)


def _duration_ms(ctx: _Ctx, key: str, value: Any) -> int:
    if not isinstance(value, dict) or len(value) != 1:
        raise ctx.error(
            key, f"must be one of {', '.join(_DURATION_UNITS_MS)} (e.g. {key}.seconds = 1)"
        )
    ((unit, amount),) = value.items()
    if unit not in _DURATION_UNITS_MS:
        raise ctx.error(f"{key}.{unit}", f"unknown unit (use {', '.join(_DURATION_UNITS_MS)})")
    if not isinstance(amount, int | float) or isinstance(amount, bool) or amount < 0:
        raise ctx.error(f"{key}.{unit}", "must be a non-negative number")
    return int(amount * _DURATION_UNITS_MS[unit])


def _exec(ctx: _Ctx, value: Any, *, workflow: bool) -> ExecConfig:
    if not isinstance(value, dict):
        raise ctx.error("exec", "must be a table")
    for key in value:
        if key not in _EXEC_KEYS:
            raise ctx.error(
                f"exec.{key}", f"unknown key (allowed: {', '.join(sorted(_EXEC_KEYS))})"
            )
    cfg: dict[str, int] = {}
    for key in ("batch_size", "max_inflight"):
        if key in value:
            v = value[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ctx.error(f"exec.{key}", "must be a positive integer")
            cfg[key] = v
    if "lock_expiry" in value:
        cfg["lock_expiry_ms"] = _duration_ms(ctx, "exec.lock_expiry", value["lock_expiry"])
        if cfg["lock_expiry_ms"] <= 0:
            raise ctx.error("exec.lock_expiry", "must be positive")
    if "tick_sleep" in value:
        cfg["tick_sleep_ms"] = _duration_ms(ctx, "exec.tick_sleep", value["tick_sleep"])
        if cfg["tick_sleep_ms"] <= 0:  # 0 would poll the database in a busy loop
            raise ctx.error("exec.tick_sleep", "must be positive")
    return ExecConfig(**cfg)


def _env_vars(ctx: _Ctx, value: Any, env: dict[str, str]) -> dict[str, str]:
    if not isinstance(value, list):
        raise ctx.error("env_vars", 'must be an array of names or { key = "K", value = "V" }')
    out: dict[str, str] = {}
    for i, item in enumerate(value):
        if isinstance(item, str):
            if item in env:  # passed through from the server's environment when set
                out[item] = env[item]
        elif (
            isinstance(item, dict)
            and set(item) == {"key", "value"}
            and all(isinstance(v, str) for v in item.values())
        ):
            out[item["key"]] = item["value"]
        else:
            raise ctx.error(f"env_vars[{i}]", 'must be a name or { key = "K", value = "V" }')
    return out


def _allowed_hosts(ctx: _Ctx, value: Any) -> tuple[str, ...]:
    """`allowed_host = ["api.example.com"]` or `[[…allowed_host]] pattern = "…"`."""
    if not isinstance(value, list):
        raise ctx.error("allowed_host", "must be an array of host patterns")
    out: list[str] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("pattern"), str):
            out.append(item["pattern"])
        else:
            raise ctx.error(f"allowed_host[{i}]", 'must be a pattern string or { pattern = "…" }')
    return tuple(out)
