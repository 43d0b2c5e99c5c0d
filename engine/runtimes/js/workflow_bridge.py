"""The host bridge of a `workflow_js` run (`engine.runtimes.js.workflow`): the one host
function the prelude calls, `__obelisk_host(request)`, decoding each request, checking its
arguments and calling the run's `WorkflowHost`, and encoding the reply."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.runtimes.js.common import BIGINT_PREFIX, parse_json_result
from engine.runtimes.js.workflow_prelude import LOG_LEVELS, STACK_OPS
from engine.runtimes.workflow_host import (
    AllProcessed,
    ChildResponse,
    DelayResponse,
    FunctionMismatch,
    Pending,
    RunAborted,
    ScheduleAtArg,
    WorkflowCallError,
    WorkflowHost,
)

if TYPE_CHECKING:
    from engine.runtimes.js.workflow import JsWorkflowRunner

__all__ = ["ABORT_REPLY", "HostBridge", "wide_ints_as_bigints"]

ABORT_REPLY = json.dumps({"e": "the workflow run was aborted"})
"""The bridge's reply once the run is stopping: the guest's host call throws."""
#: `json.dumps(value, allow_nan=False)` without building an encoder on every call.
_encode_reply = json.JSONEncoder(allow_nan=False).encode


class _BadArgs(Exception):
    """Malformed arguments reached the host bridge: becomes a JS TypeError."""


_MAX_SAFE_INTEGER = 2**53 - 1


def wide_ints_as_bigints(value: Any) -> Any:
    """Integers beyond JS's safe range cross as BigInts (like quickjs-rs does), so the
    guest sees them exactly; the prelude's JSON reviver turns the markers back."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return (
            value if -_MAX_SAFE_INTEGER <= value <= _MAX_SAFE_INTEGER else f"{BIGINT_PREFIX}{value}"
        )
    if isinstance(value, list):
        return [wide_ints_as_bigints(v) for v in value]
    if isinstance(value, dict):
        return {k: wide_ints_as_bigints(v) for k, v in value.items()}
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadArgs(f"{what} must be an integer, got {value!r}")
    return value


def _str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise _BadArgs(f"{what} must be a string, got {value!r}")
    return value


def _opt_str(value: Any, what: str) -> str | None:
    return None if value is None else _str(value, what)


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _BadArgs(f"{what} must be an array, got {value!r}")
    return value


def _schedule_at(value: Any) -> ScheduleAtArg:
    if value == "now":
        return "now"
    if isinstance(value, list) and len(value) == 2 and value[0] in ("in", "at"):
        ms = _int(value[1], "schedule-at")
        return ("in", ms) if value[0] == "in" else ("at", ms)
    raise _BadArgs(f"bad schedule-at {value!r}")


def _answer(answer: Any) -> dict[str, Any]:
    if isinstance(answer, ChildResponse):
        return {
            "kind": "child",
            "id": answer.execution_id,
            "ffqn": answer.ffqn,
            "result": answer.result,
        }
    if isinstance(answer, DelayResponse):
        return {"kind": "delay", "id": answer.delay_id, "cancelled": answer.outcome == "cancelled"}
    if isinstance(answer, AllProcessed):
        return {"kind": "all_processed"}
    if isinstance(answer, Pending):
        return {"kind": "pending"}
    if isinstance(answer, FunctionMismatch):
        return {
            "kind": "function_mismatch",
            "id": answer.response.execution_id,
            "ffqn": answer.response.ffqn,
            "requested": answer.requested_ffqn,
        }
    raise TypeError(f"the host returned an unexpected join-next answer {answer!r}")


# ---------------------------------------------------------------------------
# The bridge
# ---------------------------------------------------------------------------


class HostBridge:
    """The host side of `__obelisk_host`, part of a run (`engine.runtimes.js.workflow`'s
    `_Run`, which sets these attributes): `_dispatch` answers the guest's requests and
    sets the run's stop flags when the host aborts it or fails."""

    runner: JsWorkflowRunner
    host: WorkflowHost | None
    # Stop flags: plain attributes, read by the interrupt handler (O(1)).
    stop: bool  # interrupt() was called
    aborted: bool  # the host raised RunAborted
    timed_out: bool
    host_failure: BaseException | None
    guest_since: float
    #: Host calls made so far (a module image needs a load that made none).
    dispatched: int
    _ops: dict[str, Callable[[list[Any]], Any]]

    def _host_operations(self) -> dict[str, Callable[[list[Any]], Any]]:
        """Operation name (the prelude's) → handler of its arguments."""
        return {
            "log": self._op_log,
            "now": lambda _a: self._host().now_ms(),
            "random_u64": self._op_random_u64,
            "random_string": self._op_random_string,
            "id_generate": lambda _a: self._host().execution_id_generate(),
            "js_create": self._op_js_create,
            "submit": self._op_submit,
            "submit_delay": self._op_submit_delay,
            "join_next": self._op_join_next,
            "join_next_try": self._op_join_next_try,
            "js_close": self._op_js_close,
            "get_result": self._op_get_result,
            "call": self._op_call,
            "sleep": self._op_sleep,
            "schedule": self._op_schedule,
            "stub": self._op_stub,
        }

    @property
    def stopping(self) -> bool:
        return self.stop or self.aborted or self.timed_out or self.host_failure is not None

    def _host(self) -> WorkflowHost:
        if self.host is None:
            raise WorkflowCallError(
                "the workflow host API cannot be used while the module is only being checked "
                "(top-level code runs without a host during validation)"
            )
        return self.host

    def _dispatch(self, request: Any) -> str:
        """The one host function the prelude calls: `[op, args, stack]` as JSON in, a
        JSON reply `{"v": value}` / `{"e": message, "t"?: "TypeError"}` out. (One string
        each way: every value crossing the QuickJS boundary costs several WASM calls.)"""
        self.dispatched += 1
        try:
            if self.stopping:
                return ABORT_REPLY
            op, args, stack = parse_json_result(str(request))
            handler = self._ops.get(str(op))
            if handler is None:
                return json.dumps({"e": f"unknown host operation {op!r}"})
            if not isinstance(args, list):
                raise _BadArgs("host arguments must be an array")
            if stack and self.host is not None and op in STACK_OPS:
                self.host.set_stack(self.runner.stack_frames(str(stack)))
            value = handler(args)
            return _encode_reply({"v": wide_ints_as_bigints(value)})
        except RunAborted:
            self.aborted = True
            return ABORT_REPLY
        except WorkflowCallError as e:
            return json.dumps({"e": str(e) or type(e).__name__})
        except _BadArgs as e:
            return json.dumps({"e": str(e), "t": "TypeError"})
        except BaseException as e:
            # A bug in the host (or in this bridge): stop the guest, re-raise from run().
            self.host_failure = e
            return ABORT_REPLY
        finally:
            self.guest_since = time.monotonic()

    def _op_log(self, a: list[Any]) -> None:
        level = a[0] if a and a[0] in LOG_LEVELS else "info"
        message = str(a[1]) if len(a) > 1 else ""
        if self.host is not None:
            self.host.log(level, message)

    def _op_random_u64(self, a: list[Any]) -> str:
        lo, hi = _int(a[0], "min"), _int(a[1], "max")
        return str(self._host().random_u64(lo, hi))

    def _op_random_string(self, a: list[Any]) -> str:
        return self._host().random_string(_int(a[0], "minLen"), _int(a[1], "maxLenExclusive"))

    def _op_js_create(self, a: list[Any]) -> str:
        return self._host().join_set_create(_opt_str(a[0], "join set name"))

    def _op_submit(self, a: list[Any]) -> str:
        js, ffqn = _str(a[0], "join set id"), _str(a[1], "ffqn")
        return self._host().submit(js, ffqn, _list(a[2], "params"))

    def _op_submit_delay(self, a: list[Any]) -> str:
        return self._host().submit_delay(_str(a[0], "join set id"), _schedule_at(a[1]))

    def _op_join_next(self, a: list[Any]) -> dict[str, Any]:
        js, ffqn = _str(a[0], "join set id"), _opt_str(a[1], "ffqn")
        return _answer(self._host().join_next(js, ffqn))

    def _op_join_next_try(self, a: list[Any]) -> dict[str, Any]:
        return _answer(self._host().join_next_try(_str(a[0], "join set id")))

    def _op_js_close(self, a: list[Any]) -> None:
        self._host().join_set_close(_str(a[0], "join set id"))

    def _op_get_result(self, a: list[Any]) -> dict[str, Any]:
        return self._host().get_result(_str(a[0], "execution id"))

    def _op_call(self, a: list[Any]) -> dict[str, Any]:
        return self._host().call(_str(a[0], "ffqn"), _list(a[1], "params"))

    def _op_sleep(self, a: list[Any]) -> int | None:
        return self._host().sleep(_schedule_at(a[0]), _opt_str(a[1], "sleep name"))

    def _op_schedule(self, a: list[Any]) -> str:
        ffqn = _str(a[0], "ffqn")
        return self._host().schedule(ffqn, _list(a[1], "params"), _schedule_at(a[2]))

    def _op_stub(self, a: list[Any]) -> None:
        result = a[1]
        if not isinstance(result, dict):
            raise _BadArgs(f"stub result must be an object, got {result!r}")
        self._host().stub(_str(a[0], "execution id"), result)
