"""The state of one run of a `workflow_wasm` guest (`engine.runtimes.wasm.workflow`),
reachable from the host functions (`engine.runtimes.wasm.workflow_host_functions`) through
a thread-local: the host, the guest's join sets, buffered stdout / stderr, and what
stopped the run (an interrupt, `RunAborted`, a spin timeout, a trap, a host failure)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from wasmtime import WasmtimeError
from wasmtime import component as wc

from engine.runtimes.wasm.common import error_cause
from engine.runtimes.wasm.workflow_wit import Own
from engine.runtimes.workflow_host import RunAborted, WorkflowCallError, WorkflowHost

_log = logging.getLogger(__name__)

ABORT_MARKER = "obelisk: workflow run aborted"
MAX_LINE_BYTES = 64 * 1024
JOIN_SET_RESOURCE = 0x0B_5E_0001  # host resource type id of `join-set`


class GuestError(Exception):
    """The guest misused an import: trap with this message."""


@dataclass(slots=True)
class JoinSet:
    id: str
    closed: bool = False
    last_id: tuple[str, str] | None = None  # ("execution-id" | "delay-id", id)


CURRENT_RUN = threading.local()


def current_run() -> WorkflowRun | None:
    run: WorkflowRun | None = getattr(CURRENT_RUN, "run", None)
    return run


class WorkflowRun:
    """One run of the guest; reachable from host functions through a thread-local."""

    def __init__(self, host: WorkflowHost, spin_timeout: float | None) -> None:
        self.host = host
        self.execution_id = host.execution_id
        self.spin_timeout = spin_timeout
        self.stop = False  # interrupt() was called
        self.aborted = False  # the host raised RunAborted
        self.timed_out = False
        self.trap: str | None = None
        self.host_failure: BaseException | None = None
        self.in_guest = False
        self.guest_since = time.monotonic()
        self.join_sets: dict[int, JoinSet] = {}
        self.join_set_ids: set[str] = set()
        self.child_ffqn: dict[str, str] = {}
        self._partial: dict[int, bytes] = {1: b"", 2: b""}

    # -- guarding host calls --

    def enter(self, impl: Callable[..., Any], store: Any, args: Sequence[Any]) -> Any:
        """Run a host function: map host exceptions to traps (see the module docstring)."""
        if self.aborted or self.stop or self.host_failure is not None:
            self.aborted = True
            raise WasmtimeError(ABORT_MARKER)
        try:
            return impl(self, store, *args)
        except RunAborted:
            self.aborted = True
            raise WasmtimeError(ABORT_MARKER) from None
        except (WorkflowCallError, GuestError) as e:
            message = str(e) or type(e).__name__
            if self.trap is None:
                self.trap = message
            raise WasmtimeError(message) from None
        except WasmtimeError:
            raise
        except BaseException as e:  # a bug in the host or here: stop, re-raise from run()
            self.host_failure = e
            raise WasmtimeError(ABORT_MARKER) from None
        finally:
            self.guest_since = time.monotonic()

    def check(self) -> str | None:
        """Epoch tick (on the guest's thread, only while guest code runs)."""
        if self.stop or self.aborted or self.host_failure is not None:
            return "aborted"
        if (
            self.spin_timeout is not None
            and time.monotonic() - self.guest_since > self.spin_timeout
        ):
            self.timed_out = True
            return "timeout"
        return None

    # -- join sets --

    def new_join_set(self, join_set_id: str) -> Own:
        rep = len(self.join_sets) + 1
        self.join_sets[rep] = JoinSet(join_set_id)
        self.join_set_ids.add(join_set_id)
        return Own(rep)

    def join_set(self, store: Any, handle: Any) -> JoinSet:
        if not isinstance(handle, wc.ResourceAny):
            raise GuestError(f"expected a join-set handle, got {type(handle).__name__}")
        try:
            host = handle.to_host(store)
        except WasmtimeError as e:
            raise GuestError(f"not a join-set handle: {error_cause(str(e))}") from None
        if host.type != JOIN_SET_RESOURCE:
            raise GuestError("not a join-set handle")
        js = self.join_sets.get(host.rep)
        if js is None:
            raise GuestError(f"unknown join-set handle {host.rep}")
        return js

    def close(self, js: JoinSet) -> None:
        if not js.closed:
            js.closed = True
            self.host.join_set_close(js.id)

    # -- stdout / stderr --

    def write(self, stream: int, data: bytes) -> None:
        if stream not in self._partial:
            return
        buf = self._partial[stream] + data
        *lines, rest = buf.split(b"\n")
        while len(rest) > MAX_LINE_BYTES:
            lines.append(rest[:MAX_LINE_BYTES])
            rest = rest[MAX_LINE_BYTES:]
        self._partial[stream] = rest
        for line in lines:
            self._emit(stream, line)

    def flush_output(self) -> None:
        for stream, rest in list(self._partial.items()):
            if rest:
                self._partial[stream] = b""
                self._emit(stream, rest)

    def _emit(self, stream: int, line: bytes) -> None:
        text = line.removesuffix(b"\r").decode("utf-8", errors="replace")
        try:
            self.host.log("info" if stream == 1 else "error", text)
        except RunAborted:
            raise
        except Exception:
            _log.exception("workflow %s: cannot store a log line", self.execution_id)


# ---------------------------------------------------------------------------------------------
# Reading wasmtime errors
