"""What a `workflow_wasm` component imports (`engine.runtimes.wasm.workflow`): each imported
interface classified (the workflow host API, `obelisk:types`, `obelisk:log`, WASI, or a
deployed interface called directly or through an extension), its functions checked
against what this engine provides, and the deployed functions they reach
(`Target`s) checked against a deployment."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import wasmtime
from wasmtime import component as wc

from engine.runtimes.wasm.workflow_wit import (
    AWAIT_NEXT_ERROR,
    BORROW_JOIN_SET,
    EXECUTION_ID,
    GET_EXTENSION_ERROR,
    JOIN_SET_IFC,
    JOIN_SET_METHOD_SIGNATURES,
    LOG_IFC,
    LOG_LEVELS,
    SCHEDULE_AT,
    STUB_ERROR,
    SUPPORT_SIGNATURES,
    TYPES_VERSION,
    WORKFLOW_SUPPORT_IFC,
    render_type,
)
from engine.runtimes.workflow_host import FunctionShape
from engine.wit.codec import wit_type_from_wasmtime
from engine.wit.types import (
    FunctionSignature,
    WitResult,
    WitTuple,
    WitType,
    WitTypeError,
    format_wit_type,
)

_EXT_SUFFIXES = {"-obelisk-ext": "ext", "-obelisk-schedule": "schedule", "-obelisk-stub": "stub"}
_INTERFACE_RE = re.compile(r"([^:/@\s]+):([^:/@\s]+)/([^/@\s]+)(@[^\s]+)?")
TARGET_KINDS = ("direct", "ext", "schedule", "stub")
"""The kinds of imported interfaces whose functions reach deployed functions."""

# ---------------------------------------------------------------------------------------------
# Import analysis


@dataclass(frozen=True, slots=True)
class ImportedFunc:
    name: str
    params: tuple[tuple[str, Any], ...]  # wasmtime value types
    result: Any  # wasmtime value type or None


@dataclass(slots=True)
class ImportedInterface:
    name: str
    kind: str  # support | types | log | wasi | direct | ext | schedule | stub
    target: str | None  # the deployed interface for direct/ext/schedule/stub
    functions: dict[str, ImportedFunc] = field(default_factory=dict)
    resources: dict[str, wc.ResourceType] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Target:
    """An import that reaches a deployed function (direct call or extension function)."""

    kind: str  # direct | submit | await-next | get | schedule | stub
    ffqn: str
    label: str  # `ns:pkg-obelisk-ext/ifc.f-submit`, for messages
    params: tuple[WitType, ...]  # the target's parameters, as the import declares them
    returns: WitResult  # R, the target's return type, as the import declares it
    result: WitType | None  # the import function's own result type
    with_id: bool = False  # await-next returns tuple<execution-id, R>


def split_interface(name: str) -> tuple[str, str, str, str] | None:
    m = _INTERFACE_RE.fullmatch(name)
    if m is None:
        return None
    return m.group(1), m.group(2), m.group(3), m.group(4) or ""


def classify_import(name: str) -> tuple[str, str | None]:
    if name.startswith("wasi:"):
        return "wasi", None
    if name == WORKFLOW_SUPPORT_IFC:
        return "support", None
    if name == LOG_IFC:
        return "log", None
    split = split_interface(name)
    if split is None:
        return "unsupported", None
    ns, pkg, ifc, version = split
    if ns == "obelisk":
        if pkg == "types" and version == f"@{TYPES_VERSION}":
            return "types", None
        return "unsupported", None
    for suffix, kind in _EXT_SUFFIXES.items():
        if pkg.endswith(suffix) and len(pkg) > len(suffix):
            return kind, f"{ns}:{pkg[: -len(suffix)]}/{ifc}{version}"
    return "direct", name


def workflow_only_imports(component: wc.Component, engine: wasmtime.Engine) -> list[str]:
    """The imports of `component` that only a workflow is given (the workflow host API,
    extension interfaces, other components' functions): an activity importing one can
    never be instantiated."""
    return [
        name
        for name in component.type.imports(engine)
        if classify_import(name)[0] not in ("wasi", "log", "types", "unsupported")
    ]


def inspect_imports(component: wc.Component, engine: wasmtime.Engine) -> list[ImportedInterface]:
    out: list[ImportedInterface] = []
    for name, ext in component.type.imports(engine).items():
        ty = ext.ty
        kind, target = classify_import(name)
        if not isinstance(ty, wc.ComponentInstanceType):
            out.append(ImportedInterface(name, "unsupported-item", None))
            continue
        ifc = ImportedInterface(name, kind, target)
        for item_name, item in ty.exports(engine).items():
            it = item.ty
            if isinstance(it, wc.FuncType):
                ifc.functions[item_name] = ImportedFunc(item_name, tuple(it.params), it.result)
            elif isinstance(it, wc.ResourceType):
                ifc.resources[item_name] = it
        out.append(ifc)
    return out


def signatures_of(registry_functions: Mapping[str, Any]) -> dict[str, FunctionSignature]:
    """Deployed FFQN → signature, from `Registry.functions` (FFQN → (FunctionInfo, …))."""
    out: dict[str, FunctionSignature] = {}
    for ffqn, entry in registry_functions.items():
        info = entry[0] if isinstance(entry, tuple) else entry
        out[ffqn] = FunctionSignature([(p.name, p.type) for p in info.params], info.return_type)
    return out


def find_join_set_type(imports: Sequence[ImportedInterface]) -> wc.ResourceType | None:
    """The `join-set` resource type of the component's `obelisk:types/join-set` import."""
    for ifc in imports:
        if ifc.name == JOIN_SET_IFC and "join-set" in ifc.resources:
            return ifc.resources["join-set"]
    return None


# ---------------------------------------------------------------------------------------------
# Validation against what this engine provides


class _ImportProblem(Exception):
    """An imported function this engine cannot provide as the component declares it."""


def validate_imports(
    imports: Sequence[ImportedInterface], join_set_type: wc.ResourceType | None
) -> tuple[dict[str, Target], list[str]]:
    """The deployed functions the direct-call and extension imports reach
    (`"<import>#<function>"` → target), and a problem for every import this engine cannot
    provide as declared."""
    checker = _ImportChecker(join_set_type)
    problems: list[str] = []
    for ifc in imports:
        problems.extend(checker.problems(ifc))
    return checker.targets, problems


def _unsupported(where: str) -> str:
    hint = ""
    if where.startswith("obelisk:workflow/"):
        hint = f" (this engine provides {WORKFLOW_SUPPORT_IFC})"
    elif where.startswith("obelisk:types/"):
        hint = f" (this engine provides obelisk:types/*@{TYPES_VERSION})"
    elif where.startswith("obelisk:log/"):
        hint = f" (this engine provides {LOG_IFC})"
    return f"unsupported import `{where}`{hint}"


def _returns_of(t: WitType | None, what: str) -> WitResult:
    if not isinstance(t, WitResult):
        shown = "nothing" if t is None else format_wit_type(t)
        raise _ImportProblem(f"{what} must be the target's result<…> type, got {shown}")
    return t


_EXTENSION_FUNCTION_SUFFIXES = {
    "ext": ("-submit", "-await-next", "-get"),
    "schedule": ("-schedule",),
    "stub": ("-stub",),
}


class _ImportChecker:
    """Checks imported interfaces one by one, collecting the targets of those that reach
    deployed functions."""

    def __init__(self, join_set_type: wc.ResourceType | None) -> None:
        self.join_set_type = join_set_type
        self.targets: dict[str, Target] = {}  # "<import>#<function>" → target

    def problems(self, ifc: ImportedInterface) -> list[str]:
        if ifc.kind == "unsupported-item":
            return [f"import `{ifc.name}` is not an interface"]
        if ifc.kind == "unsupported":
            return [_unsupported(ifc.name)]
        if ifc.kind == "support":
            return self._support_problems(ifc)
        if ifc.kind == "types":
            return self._types_problems(ifc)
        if ifc.kind == "log":
            return self._log_problems(ifc)
        if ifc.kind in TARGET_KINDS:
            return self._target_problems(ifc)
        return []

    # -- the interfaces of this engine --

    def _support_problems(self, ifc: ImportedInterface) -> list[str]:
        problems: list[str] = []
        for name, fn in ifc.functions.items():
            sig = SUPPORT_SIGNATURES.get(name)
            if sig is None:
                problems.append(
                    f"{ifc.name} has no function `{name}` (available: "
                    f"{', '.join(sorted(SUPPORT_SIGNATURES))})"
                )
            elif (p := self._signature_problem(f"{ifc.name}.{name}", fn, sig)) is not None:
                problems.append(p)
        return problems

    def _types_problems(self, ifc: ImportedInterface) -> list[str]:
        problems: list[str] = []
        for name, fn in ifc.functions.items():
            sig = JOIN_SET_METHOD_SIGNATURES.get(name) if ifc.name == JOIN_SET_IFC else None
            if sig is None:
                problems.append(f"{ifc.name} has no function `{name}`")
            elif (p := self._signature_problem(f"{ifc.name}.{name}", fn, sig)) is not None:
                problems.append(p)
        return problems

    def _log_problems(self, ifc: ImportedInterface) -> list[str]:
        problems: list[str] = []
        for name, fn in ifc.functions.items():
            if name not in LOG_LEVELS:
                problems.append(f"{ifc.name} has no function `{name}`")
            elif (
                p := self._signature_problem(f"{ifc.name}.{name}", fn, (("string",), None))
            ) is not None:
                problems.append(p)
        return problems

    def _signature_problem(
        self, where: str, fn: ImportedFunc, expected: tuple[tuple[str, ...], str | None]
    ) -> str | None:
        got_params = tuple(self._render(t) for _, t in fn.params)
        got_result = None if fn.result is None else self._render(fn.result)
        if (got_params, got_result) == expected:
            return None

        def show(params: Sequence[str], result: str | None) -> str:
            return f"func({', '.join(params)})" + ("" if result is None else f" -> {result}")

        return (
            f"{where}: expected {show(*expected)}, the component imports "
            f"{show(got_params, got_result)}"
        )

    # -- deployed functions: direct calls and extension functions --

    def _target_problems(self, ifc: ImportedInterface) -> list[str]:
        problems: list[str] = []
        for name, fn in ifc.functions.items():
            try:
                self.targets[f"{ifc.name}#{name}"] = self._target(ifc, name, fn)
            except _ImportProblem as e:
                problems.append(f"{ifc.name}.{name}: {e}")
        return problems

    def _target(self, ifc: ImportedInterface, name: str, fn: ImportedFunc) -> Target:
        assert ifc.target is not None
        label = f"{ifc.name}.{name}"
        result = None if fn.result is None else self._plain(fn.result, "the result")
        if ifc.kind == "direct":
            ffqn = f"{ifc.target}.{name}"
            return Target(
                "direct",
                ffqn,
                label,
                self._plain_params(fn.params),
                _returns_of(result, "the result"),
                result,
            )
        kind_suffixes = _EXTENSION_FUNCTION_SUFFIXES[ifc.kind]
        suffix = next((s for s in kind_suffixes if name.endswith(s) and len(name) > len(s)), None)
        if suffix is None:
            raise _ImportProblem(
                f"an {ifc.kind} function must be named <function>{' / <function>'.join(kind_suffixes)}"
            )
        ffqn = f"{ifc.target}.{name[: -len(suffix)]}"
        if suffix == "-submit":
            return self._submit(ffqn, label, fn, result)
        if suffix == "-await-next":
            return self._await_next(ffqn, label, fn, result)
        if suffix == "-get":
            return self._get(ffqn, label, fn, result)
        if suffix == "-schedule":
            return self._schedule(ffqn, label, fn, result)
        return self._stub(ffqn, label, fn, result)

    def _submit(self, ffqn: str, label: str, fn: ImportedFunc, result: WitType | None) -> Target:
        self._expect_join_set(fn.params)
        if result != EXECUTION_ID:
            raise _ImportProblem(f"must return execution-id, got {self._show(fn.result)}")
        # R is unknown from a submit alone: checked against the deployment in check().
        return Target("submit", ffqn, label, self._plain_params(fn.params[1:]), WitResult(), result)

    def _await_next(
        self, ffqn: str, label: str, fn: ImportedFunc, result: WitType | None
    ) -> Target:
        self._expect_join_set(fn.params)
        if len(fn.params) != 1:
            raise _ImportProblem("takes only the join set")
        if not isinstance(result, WitResult) or result.err != AWAIT_NEXT_ERROR:
            raise _ImportProblem(
                "must return result<R, await-next-extension-error> (or "
                f"result<tuple<execution-id, R>, …>), got {self._show(fn.result)}"
            )
        ok = result.ok
        with_id = (
            isinstance(ok, WitTuple) and len(ok.elements) == 2 and ok.elements[0] == EXECUTION_ID
        )
        inner = ok.elements[1] if with_id and isinstance(ok, WitTuple) else ok
        return Target(
            "await-next", ffqn, label, (), _returns_of(inner, "R"), result, with_id=with_id
        )

    def _get(self, ffqn: str, label: str, fn: ImportedFunc, result: WitType | None) -> Target:
        params = fn.params
        if len(params) != 1 or self._plain(params[0][1], "the parameter") != EXECUTION_ID:
            raise _ImportProblem("takes one execution-id")
        if not isinstance(result, WitResult) or result.err != GET_EXTENSION_ERROR:
            raise _ImportProblem(
                f"must return result<R, get-extension-error>, got {self._show(fn.result)}"
            )
        return Target("get", ffqn, label, (), _returns_of(result.ok, "R"), result)

    def _schedule(self, ffqn: str, label: str, fn: ImportedFunc, result: WitType | None) -> Target:
        params = fn.params
        if not params or self._plain(params[0][1], "the first parameter") != SCHEDULE_AT:
            raise _ImportProblem("the first parameter must be schedule-at")
        if result != EXECUTION_ID:
            raise _ImportProblem(f"must return execution-id, got {self._show(fn.result)}")
        return Target("schedule", ffqn, label, self._plain_params(params[1:]), WitResult(), result)

    def _stub(self, ffqn: str, label: str, fn: ImportedFunc, result: WitType | None) -> Target:
        params = fn.params
        if len(params) != 2 or self._plain(params[0][1], "the first parameter") != EXECUTION_ID:
            raise _ImportProblem("takes (execution-id, R)")
        if result is not None and result != WitResult(None, STUB_ERROR):
            raise _ImportProblem(
                f"must return nothing or result<_, stub-error>, got {self._show(fn.result)}"
            )
        returns = _returns_of(self._plain(params[1][1], "the value"), "the value")
        return Target("stub", ffqn, label, (), returns, result)

    # -- reading the declared types --

    def _render(self, vt: Any) -> str:
        return render_type(vt, self.join_set_type)

    def _show(self, vt: Any) -> str:
        return "nothing" if vt is None else self._render(vt)

    def _plain(self, vt: Any, what: str) -> WitType:
        try:
            return wit_type_from_wasmtime(vt)
        except WitTypeError as e:
            raise _ImportProblem(f"{what} has type {self._render(vt)}: {e}") from None

    def _plain_params(self, items: Sequence[tuple[str, Any]]) -> tuple[WitType, ...]:
        return tuple(self._plain(t, f"parameter `{n}`") for n, t in items)

    def _expect_join_set(self, items: Sequence[tuple[str, Any]]) -> None:
        if not items or self._render(items[0][1]) != BORROW_JOIN_SET:
            raise _ImportProblem(
                f"the first parameter must be `borrow<join-set>` of {JOIN_SET_IFC}"
            )


# ---------------------------------------------------------------------------------------------
# Validation against a deployment


def deployment_problems(
    imports: Sequence[ImportedInterface],
    targets: Mapping[str, Target],
    interfaces: Mapping[str, Mapping[str, FunctionShape]],
    signatures: Mapping[str, FunctionSignature] | None,
) -> list[str]:
    """Every direct-call and extension import that does not reach a deployed function
    (`interfaces`, as `WorkflowHost.interfaces()` returns them) with the same parameter and
    return types (`signatures`: deployed FFQN → signature, when given)."""
    problems: list[str] = []
    for ifc in imports:
        if ifc.kind not in TARGET_KINDS:
            continue
        assert ifc.target is not None
        deployed = interfaces.get(ifc.target)
        if deployed is None:
            problems.append(
                f"unknown interface `{ifc.name}` imported: no deployed component exports "
                f"`{ifc.target}` (deployed: {', '.join(sorted(interfaces)) or 'none'})"
            )
            continue
        for name in ifc.functions:
            t = targets[f"{ifc.name}#{name}"]
            fname = t.ffqn.rpartition(".")[2]
            if fname not in deployed:
                problems.append(
                    f"`{ifc.name}` has no function `{name}`: `{ifc.target}` has no "
                    f"`{fname}` (available: {', '.join(sorted(deployed))})"
                )
                continue
            if signatures is None or t.ffqn not in signatures:
                continue
            problem = compare_with_deployed(t, signatures[t.ffqn])
            if problem is not None:
                problems.append(f"{t.label}: {problem}")
    return problems


def compare_with_deployed(t: Target, deployed: FunctionSignature) -> str | None:
    """Whether an import's view of a deployed function matches its real signature."""
    want_params = tuple(pt for _, pt in deployed.params)
    show = ", ".join(format_wit_type(p) for p in want_params)
    if t.kind in ("direct", "submit", "schedule") and t.params != want_params:
        got = ", ".join(format_wit_type(p) for p in t.params)
        return f"the deployed function takes ({show}), the import passes ({got})"
    if t.kind in ("direct", "await-next", "get", "stub") and t.returns != deployed.result:
        want = "nothing" if deployed.result is None else format_wit_type(deployed.result)
        return (
            f"the deployed function returns {want}, the import expects {format_wit_type(t.returns)}"
        )
    return None
