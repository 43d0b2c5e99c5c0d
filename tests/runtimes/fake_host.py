"""An in-memory `WorkflowHost` for runtime tests (a test double: no log, no replay).

Children "finish" at once by calling a Python function from a table; responses arrive in
submission order (delays too), except for FFQNs listed in `never_finish`, whose children
stay pending until the workflow stubs them. Every history call is recorded in `calls`
together with the stack the runtime set just before it.
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.core.records import Frame
from engine.runtimes.workflow_host import (
    AllProcessed,
    ChildResponse,
    DelayResponse,
    FunctionMismatch,
    FunctionShape,
    JoinNextAnswer,
    Pending,
    RunAborted,
    ScheduleAtArg,
    WorkflowCallError,
)

START_MS = 1_700_000_000_000


@dataclass
class FakeFunction:
    param_names: tuple[str, ...]
    impl: Callable[[list[Any]], dict[str, Any]]
    is_workflow: bool = False


@dataclass
class Call:
    method: str
    args: tuple[Any, ...]
    stack: list[Frame] | None


@dataclass
class _JoinSet:
    closed: bool = False
    submitted: int = 0
    queue: list[JoinNextAnswer] = field(default_factory=list)
    outstanding: set[str] = field(default_factory=set)  # pending children (never_finish)


class FakeHost:
    def __init__(
        self,
        functions: dict[str, FakeFunction],
        *,
        execution_id: str = "E_01TESTEXECUTION0000000000",
        never_finish: frozenset[str] = frozenset(),
        cancel_delays: bool = False,
        abort_after: int | None = None,
        block_seconds: float = 0.0,
    ) -> None:
        self.execution_id = execution_id
        self.functions = functions
        self.never_finish = never_finish
        self.cancel_delays = cancel_delays
        self.abort_after = abort_after
        self.block_seconds = block_seconds
        self.clock = START_MS
        self.rng = random.Random(execution_id)
        self.calls: list[Call] = []
        self.logs: list[tuple[str, str]] = []
        self.host_calls_after_abort = 0
        self.aborted = False
        self._stack: list[Frame] | None = None
        self._join_sets: dict[str, _JoinSet] = {}
        self._generated = 0
        self._one_off = 0
        self._ids = 0
        self._pending_children: dict[str, tuple[str, str]] = {}  # child id -> (js, ffqn)
        self._processed: dict[str, dict[str, Any]] = {}

    # -- bookkeeping --

    def _record(self, method: str, *args: Any) -> None:
        if self.aborted:
            self.host_calls_after_abort += 1
            raise RunAborted
        self.calls.append(Call(method, args, self._stack))
        self._stack = None
        if self.abort_after is not None and len(self.calls) >= self.abort_after:
            self.aborted = True
            raise RunAborted

    def history(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def _js(self, join_set_id: str) -> _JoinSet:
        js = self._join_sets.get(join_set_id)
        if js is None:
            raise WorkflowCallError(f"unknown join set '{join_set_id}'")
        return js

    def _finish(self, js_id: str, child_id: str, ffqn: str, result: dict[str, Any]) -> None:
        self._join_sets[js_id].queue.append(ChildResponse(child_id, ffqn, result))
        self._join_sets[js_id].outstanding.discard(child_id)

    def _at_ms(self, at: ScheduleAtArg) -> int:
        if at == "now":
            return self.clock
        kind, ms = at
        return self.clock + ms if kind == "in" else ms

    def _take(self, js: _JoinSet) -> JoinNextAnswer:
        answer = js.queue.pop(0)
        if isinstance(answer, ChildResponse):
            self._processed[answer.execution_id] = answer.result
        return answer

    # -- determinism --

    def now_ms(self) -> int:
        self._record("now_ms")
        self.clock += 1
        return self.clock

    def random_u64(self, min_: int, max_inclusive: int) -> int:
        self._record("random_u64", min_, max_inclusive)
        return self.rng.randint(min_, max_inclusive)

    def random_string(self, min_len: int, max_len_exclusive: int) -> str:
        self._record("random_string", min_len, max_len_exclusive)
        n = self.rng.randrange(min_len, max_len_exclusive)
        return "".join(self.rng.choice(string.ascii_letters + string.digits) for _ in range(n))

    def execution_id_generate(self) -> str:
        self._record("execution_id_generate")
        self._ids += 1
        return f"E_GENERATED{self._ids:015d}"

    # -- join sets --

    def join_set_create(self, name: str | None = None) -> str:
        self._record("join_set_create", name)
        if name is None:
            self._generated += 1
            js_id = f"g:{self._generated}"
        else:
            js_id = f"n:{name}"
            if js_id in self._join_sets:
                raise WorkflowCallError(f"join set '{js_id}' already exists")
        self._join_sets[js_id] = _JoinSet()
        return js_id

    def submit(self, join_set_id: str, ffqn: str, params: list[Any]) -> str:
        self._record("submit", join_set_id, ffqn, params)
        js = self._js(join_set_id)
        if js.closed:
            raise WorkflowCallError(f"join set '{join_set_id}' is closed")
        fn = self.functions.get(ffqn)
        if fn is None:
            raise WorkflowCallError(f"function '{ffqn}' not found")
        js.submitted += 1
        child_id = f"{self.execution_id}.{join_set_id}_{js.submitted}"
        if ffqn in self.never_finish:
            js.outstanding.add(child_id)
            self._pending_children[child_id] = (join_set_id, ffqn)
        else:
            self._finish(join_set_id, child_id, ffqn, fn.impl(list(params)))
        return child_id

    def submit_delay(self, join_set_id: str, schedule_at: ScheduleAtArg) -> str:
        self._record("submit_delay", join_set_id, schedule_at)
        js = self._js(join_set_id)
        js.submitted += 1
        delay_id = f"Delay_{self.execution_id[2:]}.{join_set_id}_{js.submitted}"
        js.queue.append(DelayResponse(delay_id, "cancelled" if self.cancel_delays else "ok"))
        return delay_id

    def join_next(
        self, join_set_id: str, requested_ffqn: str | None = None
    ) -> JoinNextAnswer | AllProcessed | FunctionMismatch:
        self._record("join_next", join_set_id, requested_ffqn)
        js = self._js(join_set_id)
        if self.block_seconds:
            time.sleep(self.block_seconds)
        if not js.queue:
            if js.outstanding:
                # A real host would block (await) or unload (interrupt) here.
                self.aborted = True
                raise RunAborted
            return AllProcessed()
        answer = self._take(js)
        if (
            requested_ffqn is not None
            and isinstance(answer, ChildResponse)
            and answer.ffqn != requested_ffqn
        ):
            return FunctionMismatch(answer, requested_ffqn)
        return answer

    def join_next_try(self, join_set_id: str) -> JoinNextAnswer | Pending | AllProcessed:
        self._record("join_next_try", join_set_id)
        js = self._js(join_set_id)
        if js.queue:
            return self._take(js)
        return Pending() if js.outstanding else AllProcessed()

    def join_set_close(self, join_set_id: str) -> None:
        self._record("join_set_close", join_set_id)
        self._js(join_set_id).closed = True

    def get_result(self, child_execution_id: str) -> dict[str, Any]:
        result = self._processed.get(child_execution_id)
        if result is None:
            raise WorkflowCallError(f"no processed response for '{child_execution_id}'")
        return result

    # -- conveniences --

    def call(self, ffqn: str, params: list[Any]) -> dict[str, Any]:
        self._record("call", ffqn, params)
        fn = self.functions.get(ffqn)
        if fn is None:
            raise WorkflowCallError(f"function '{ffqn}' not found")
        if self.block_seconds:
            time.sleep(self.block_seconds)
        self._one_off += 1
        result = fn.impl(list(params))
        self._processed[f"{self.execution_id}.o:{self._one_off}_1"] = result
        return result

    def sleep(self, schedule_at: ScheduleAtArg, name: str | None = None) -> int | None:
        self._record("sleep", schedule_at, name)
        if self.cancel_delays:
            return None
        wake = self._at_ms(schedule_at)
        self.clock = max(self.clock, wake)
        return wake

    def schedule(self, ffqn: str, params: list[Any], schedule_at: ScheduleAtArg) -> str:
        self._record("schedule", ffqn, params, schedule_at)
        if ffqn not in self.functions:
            raise WorkflowCallError(f"function '{ffqn}' not found")
        self._ids += 1
        return f"E_SCHEDULED{self._ids:015d}"

    def stub(self, execution_id: str, result: dict[str, Any]) -> None:
        self._record("stub", execution_id, result)
        pending = self._pending_children.pop(execution_id, None)
        if pending is None:
            raise WorkflowCallError(f"'{execution_id}' is not a pending stub child")
        self._finish(pending[0], execution_id, pending[1], result)

    # -- not history --

    def log(self, level: str, message: str) -> None:
        self.logs.append((level, message))

    def set_stack(self, frames: list[Frame]) -> None:
        self._stack = frames

    def function_exists(self, ffqn: str) -> bool:
        return ffqn in self.functions

    def interfaces(self) -> dict[str, dict[str, FunctionShape]]:
        out: dict[str, dict[str, FunctionShape]] = {}
        for ffqn, fn in self.functions.items():
            interface, _, name = ffqn.rpartition(".")
            out.setdefault(interface, {})[name] = FunctionShape(
                ffqn, fn.param_names, fn.is_workflow
            )
        return out
