"""The `workflow_wasm` runtime: run an export of a component-model workflow deterministically
against a `WorkflowHost` (SPEC §7.2, §7.5).

`WasmWorkflowRunner(component)` inspects the component once: its exported functions (FFQNs
and WIT types, like an activity) and its imports, from which it builds a wasmtime
`component.Linker` that defines exactly what the component imports. `check(interfaces,
signatures)` verifies the imports against a deployment; `run(host, params)` instantiates
the component in a fresh `Store` on the calling thread and calls the export. Every host
function is a plain synchronous call of the `WorkflowHost` on that thread, which may block
it (waiting for a child) for as long as the host likes.

Importable interfaces
=====================

* `obelisk:workflow/workflow-support@1.0.0` — the host API of §7.2 (`engine/wit/obelisk/
  workflow@1.0.0.wit`): `random-u64`, `random-u64-inclusive`, `random-string`, `sleep`,
  `join-set-create`, `join-set-create-named`, `join-set-close`, `submit-delay`,
  `join-next`, `join-next-try`, `execution-id-current`, `execution-id-generate`,
  `submit-json`, `schedule-json`, `call-json`, `stub-json`, `get-result-json`.
* `obelisk:types/*@1.0.0` (`types@1.0.0.wit`): `time`, `execution` (types only) and
  `join-set`, whose `join-set` resource is a host resource: `id()`, `last-id()`;
  dropping a handle closes the join set (§7.3), as does `join-set-close`.
* `obelisk:log/log@1.0.0` — `trace/debug/info/warn/error(message)` → `host.log`.
* For every deployed interface `ns:pkg/ifc` (versioned or not, exactly as exported):

  | import | function | host call |
  |---|---|---|
  | `ns:pkg/ifc` | `f(args) -> R` | `host.call` (direct call) |
  | `ns:pkg-obelisk-ext/ifc` | `f-submit(join-set: borrow<join-set>, args) -> execution-id` | `host.submit` |
  | | `f-await-next(join-set: borrow<join-set>) -> result<R, await-next-extension-error>` (SPEC shape) or `-> result<tuple<execution-id, R>, await-next-extension-error>` (the original's) | `host.join_next(js, ffqn)` |
  | | `f-get(execution-id) -> result<R, get-extension-error>` | `host.get_result` |
  | `ns:pkg-obelisk-schedule/ifc` | `f-schedule(schedule-at, args) -> execution-id` | `host.schedule` |
  | `ns:pkg-obelisk-stub/ifc` | `f-stub(execution-id, R)` or `-> result<_, stub-error>` | `host.stub` |

  `args` and `R` must be the target function's parameter and return types (checked by
  `check` when it is given the deployment's signatures). Values cross as §9.2 JSON through
  `engine.wit.codec`. When a child ended in an execution failure, `R`'s err becomes
  `"execution-failed"` (a `string` err), the `execution-failed` case of a variant or enum
  err (with the failure reason when that case carries a `string`), or `err` for
  `result<T>`; any other err type cannot represent it and the workflow traps.
* WASI 0.2 (any 0.2.x), deterministic (§7.5): the runtime does not use wasmtime's WASI
  (wasmtime-py 50 cannot replace its clocks or randomness) but defines every imported WASI
  function itself: `wasi:clocks/wall-clock` is frozen at the unix epoch (resolution 1 ns),
  `wasi:clocks/monotonic-clock` at 0 (its pollables are always ready, so a sleep returns at
  once), `wasi:random/*` returns zeros, `wasi:cli/environment` is empty (no variables,
  arguments or cwd), stdin is closed, stdout/stderr lines go to `host.log` (`info` /
  `error`), terminals are absent, `wasi:filesystem/preopens` has no directories, and every
  other WASI function (filesystem, sockets, http, `exit`) traps when called — a component
  may import them (Rust's std does) as long as it does not use them.

Any other import is a `WasmWorkflowLoadError` naming it.

Results and stopping
====================
`ok(v)` → `WfOk(v)`, `err(v)` → `WfErr(v)` (§9.2 JSON). A trap → `WfTrap(reason, detail)`;
misuse of the host API (a `WorkflowCallError` from a host call without an error channel,
a bad handle, a bad argument) traps the guest with that message. A `RunAborted` raised by
the host traps the guest at once (wasm cannot catch traps), every later host call of the
run raises again, and the outcome is `WfAborted()`. `runner.interrupt(execution_id)` (from
any thread) stops a computing guest within an epoch tick (~5 ms, `WasmEngine`'s epoch
interruption) → `WfAborted()`; `run(..., spin_timeout=s)` stops a guest that computes for
more than `s` seconds without a host call → `WfTimedOut()`. An unexpected exception in a
host call (a bug) traps the guest and is re-raised by `run()`.

Which export runs: `run(host, params, ffqn=…)`, else `host.ffqn` if the host has it, else
the component's only export.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import wasmtime
from wasmtime import WasmtimeError
from wasmtime import component as wc

from engine.runtimes.outcome import (
    WfAborted,
    WfErr,
    WfOk,
    WfTimedOut,
    WfTrap,
    WorkflowOutcome,
)
from engine.runtimes.wasm.activity import (
    ComponentLoadError,
    WasmEngine,
    engine_of,
    inspect_exports,
)
from engine.runtimes.wasm.common import (
    ExportTypes,
    call_result_func,
    error_cause,
    post_return,
    trap_reason,
)
from engine.runtimes.wasm.workflow_host_functions import build_linker
from engine.runtimes.wasm.workflow_imports import (
    Target,
    deployment_problems,
    find_join_set_type,
    inspect_imports,
    signatures_of,
    validate_imports,
    workflow_only_imports,
)
from engine.runtimes.wasm.workflow_run import (
    CURRENT_RUN,
    WorkflowRun,
    current_run,
)
from engine.runtimes.wasm.workflow_wit import (
    JOIN_SET_IFC,
    LOG_IFC,
    TYPES_VERSION,
    WORKFLOW_SUPPORT_IFC,
)
from engine.runtimes.workflow_host import FunctionShape, RunAborted, WorkflowHost
from engine.wit.codec import WitValueError, json_to_wasmtime, wasmtime_to_json
from engine.wit.types import FunctionSignature, WitResult, format_wit_type

__all__ = [
    "DEFAULT_MEMORY_LIMIT",
    "JOIN_SET_IFC",
    "LOG_IFC",
    "TYPES_VERSION",
    "WORKFLOW_SUPPORT_IFC",
    "WasmWorkflowLoadError",
    "WasmWorkflowRunner",
    "signatures_of",
    "workflow_only_imports",
]

DEFAULT_MEMORY_LIMIT = 512 * 1024 * 1024
"""Bytes of linear memory a workflow instance may use."""


class WasmWorkflowLoadError(Exception):
    """The component cannot run as a workflow (an import this engine does not provide, or
    whose types do not match), or does not match the deployment."""


# ---------------------------------------------------------------------------------------------
# Calling an export, reading traps


# ---------------------------------------------------------------------------------------------
# The runner


# ---------------------------------------------------------------------------------------------
# The runner


class WasmWorkflowRunner:
    """Runs the exported functions of one `workflow_wasm` component; one fresh instance
    (and store) per `run()`. Construction inspects the component and raises
    `WasmWorkflowLoadError` for imports this engine cannot provide; `check()` verifies the
    imports against a deployment."""

    def __init__(
        self,
        component: wc.Component,
        engine: WasmEngine | None = None,
        *,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        label: str = "component",
    ) -> None:
        self.component = component
        self.engine = engine or engine_of(component)
        self.memory_limit = memory_limit
        self.label = label
        try:
            self.exports: dict[str, FunctionSignature] = inspect_exports(component, self.engine)
        except ComponentLoadError as e:
            raise WasmWorkflowLoadError(f"{label}: {e}") from None
        if not self.exports:
            raise WasmWorkflowLoadError(f"{label}: the component exports no functions")
        eng = self.engine.engine
        self._exports = self._export_table(eng)
        self._imports = inspect_imports(component, eng)
        join_set_type = find_join_set_type(self._imports)
        self.targets: dict[str, Target]  # "<import>#<function>" → target
        self.targets, problems = validate_imports(self._imports, join_set_type)
        if problems:
            raise WasmWorkflowLoadError(
                f"{label}: cannot run as a workflow:\n  " + "\n  ".join(problems)
            )
        self._linker = build_linker(eng, self._imports, self.targets, join_set_type)
        self._lock = threading.Lock()
        self._active: set[WorkflowRun] = set()

    # -- inspection --

    def _export_table(self, eng: wasmtime.Engine) -> dict[str, ExportTypes]:
        out: dict[str, ExportTypes] = {}
        exported = self.component.type.exports(eng)
        for ffqn in self.exports:
            interface, _, function = ffqn.rpartition(".")
            ifc_index = self.component.get_export_index(interface)
            index = (
                None if ifc_index is None else self.component.get_export_index(function, ifc_index)
            )
            ifc_type = exported[interface].ty
            assert isinstance(ifc_type, wc.ComponentInstanceType)
            fty = ifc_type.exports(eng)[function].ty
            assert isinstance(fty, wc.FuncType)
            result = fty.result
            ok = result.ok if isinstance(result, wc.ResultType) else None
            err = result.err if isinstance(result, wc.ResultType) else None
            out[ffqn] = ExportTypes(index, tuple(t for _, t in fty.params), ok, err)
        return out

    @property
    def ffqns(self) -> list[str]:
        return sorted(self.exports)

    def imported_interfaces(self) -> dict[str, str]:
        """Imported interface → kind (`support`, `types`, `log`, `wasi`, `direct`, `ext`,
        `schedule`, `stub`)."""
        return {i.name: i.kind for i in self._imports}

    # -- validation against a deployment --

    def check(
        self,
        interfaces: Mapping[str, Mapping[str, FunctionShape]],
        signatures: Mapping[str, FunctionSignature] | None = None,
        *,
        timeout: float = 10.0,
    ) -> None:
        """Verify that every direct-call and extension import reaches a deployed function
        (`interfaces`, as `WorkflowHost.interfaces()` returns them) with the same parameter
        and return types (`signatures`: deployed FFQN → signature, when given), then
        instantiate once. Raises `WasmWorkflowLoadError` listing every problem."""
        problems = deployment_problems(self._imports, self.targets, interfaces, signatures)
        if problems:
            raise WasmWorkflowLoadError(
                f"{self.label}: imports do not match the deployment:\n  " + "\n  ".join(problems)
            )
        self._verify_instantiable(timeout)

    def _verify_instantiable(self, timeout: float) -> None:
        limit = time.monotonic() + timeout
        store, _ = self.engine.new_store(lambda: "timeout" if time.monotonic() > limit else None)
        try:
            self._linker.instantiate(store, self.component)
        except WasmtimeError as e:
            raise WasmWorkflowLoadError(
                f"{self.label}: cannot instantiate the component: {error_cause(str(e))}"
            ) from None

    # -- running --

    def interrupt(self, execution_id: str | None = None) -> None:
        """Stop the runs of this runner in progress (all, or that execution's), from any
        thread: their outcome is `WfAborted`. A guest blocked in a host call is not woken
        (the host must return or raise); a computing guest stops within an epoch tick."""
        with self._lock:
            for run in self._active:
                if execution_id is None or run.execution_id == execution_id:
                    run.stop = True

    def _select(self, ffqn: str | None, host: Any) -> str | WfTrap:
        if ffqn is None:
            ffqn = getattr(host, "ffqn", None)
        if ffqn is None:
            if len(self.exports) == 1:
                return next(iter(self.exports))
            return WfTrap(
                f"{self.label} exports several functions ({', '.join(self.ffqns)}): "
                "the caller must name the one to run"
            )
        if ffqn not in self.exports:
            return WfTrap(f"function not exported by the component: {ffqn}")
        return ffqn

    def run(
        self,
        host: WorkflowHost,
        params: list[Any],
        *,
        ffqn: str | None = None,
        spin_timeout: float | None = None,
    ) -> WorkflowOutcome:
        """Run an export once against `host` with §9.2 JSON `params`.

        Never raises for guest faults; re-raises an unexpected exception of the host.
        """
        selected = self._select(ffqn, host)
        if isinstance(selected, WfTrap):
            return selected
        signature = self.exports[selected]
        if not isinstance(signature.result, WitResult):
            return WfTrap(f"{selected} does not return a result: {signature.format()}")
        args = _convert_params(signature, params)
        if isinstance(args, WfTrap):
            return args
        run = WorkflowRun(host, spin_timeout)
        with self._lock:
            self._active.add(run)
        previous = current_run()
        CURRENT_RUN.run = run
        try:
            outcome = self._run(run, selected, signature.result, args)
        finally:
            CURRENT_RUN.run = previous
            with self._lock:
                self._active.discard(run)
        if run.host_failure is not None:
            raise run.host_failure
        if run.stop or run.aborted:
            return WfAborted()
        return outcome

    def _run(
        self, run: WorkflowRun, ffqn: str, result_type: WitResult, args: list[Any]
    ) -> WorkflowOutcome:
        export = self._exports[ffqn]
        store, interrupt = self.engine.new_store(run.check)
        store.set_limits(memory_size=self.memory_limit)
        run.guest_since = time.monotonic()
        run.in_guest = True
        try:
            instance = self._linker.instantiate(store, self.component)
            func = instance.get_func(store, export.index)
            if func is None:
                return WfTrap(f"function not exported by the component: {ffqn}")
            is_ok, raw = call_result_func(func._func, store, args, export)
            post_return(func._func, store)
        except WasmtimeError as e:
            return self._failure(run, e, interrupt.reason)
        except (TypeError, ValueError) as e:  # wasmtime-py rejected a converted value
            return WfTrap(f"invalid params: {e}", repr(e))
        finally:
            run.in_guest = False
            try:
                run.flush_output()
            except RunAborted:
                run.aborted = True
        side = result_type.ok if is_ok else result_type.err
        try:
            value = None if side is None else wasmtime_to_json(raw, side, "result")
        except WitValueError as e:
            return WfTrap(f"cannot read the result: {e}", repr(raw))
        return WfOk(value) if is_ok else WfErr(value)

    @staticmethod
    def _failure(run: WorkflowRun, error: WasmtimeError, reason: str | None) -> WorkflowOutcome:
        if run.stop or run.aborted or run.host_failure is not None or reason == "aborted":
            return WfAborted()
        if run.timed_out or reason == "timeout":
            return WfTimedOut()
        if run.trap is not None:
            return WfTrap(run.trap, str(error))
        return WfTrap(trap_reason(error), str(error))


def _convert_params(signature: FunctionSignature, params: Any) -> list[Any] | WfTrap:
    expected = signature.params
    if not isinstance(params, list) or len(params) != len(expected):
        got = f"{len(params)}" if isinstance(params, list) else type(params).__name__
        names = ", ".join(f"{n}: {format_wit_type(t)}" for n, t in expected)
        return WfTrap(f"invalid params: expected {len(expected)} ({names}), got {got}")
    args = []
    for i, ((name, t), value) in enumerate(zip(expected, params, strict=True)):
        try:
            args.append(json_to_wasmtime(value, t, f"params[{i}]"))
        except WitValueError as e:
            return WfTrap(f"invalid params: parameter {name!r}: {e}", str(e))
    return args
