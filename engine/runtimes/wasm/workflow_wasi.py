"""Deterministic WASI 0.2 for `workflow_wasm` guests (SPEC §7.5; see
`engine.runtimes.wasm.workflow`): every WASI function a workflow may use, defined by the
runtime itself (frozen clocks, zero randomness, empty environment, stdout / stderr to the
run's log). Any other WASI function traps when called (`workflow_host_functions`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from wasmtime import WasmtimeError

from engine.runtimes.wasm.workflow_run import MAX_LINE_BYTES, GuestError, WorkflowRun
from engine.runtimes.wasm.workflow_wit import Case, Own

__all__ = ["WASI_FUNCTIONS"]

_MAX_RANDOM_BYTES = 1 << 24


def _stream_rep(store: Any, handle: Any) -> int:
    try:
        return int(handle.to_host(store).rep)
    except (WasmtimeError, AttributeError):
        return -1


_OK_NONE = Case("ok", None)
_CLOSED = Case("err", Case("closed"))
_POLLABLE = Own(0)


def _wasi_functions() -> dict[tuple[str, str], Callable[..., Any]]:
    """(interface without version, function) → implementation returning a `lower_value` value."""

    def const(value: Any) -> Callable[..., Any]:
        return lambda run, store, *args: value

    def zero_bytes(run: WorkflowRun, store: Any, n: int) -> bytes:
        if n > _MAX_RANDOM_BYTES:
            raise GuestError(f"asked for {n} random bytes")
        return bytes(n)

    def write(run: WorkflowRun, store: Any, handle: Any, contents: bytes) -> Case:
        run.write(_stream_rep(store, handle), bytes(contents))
        return _OK_NONE

    def write_zeroes(run: WorkflowRun, store: Any, handle: Any, n: int) -> Case:
        run.write(_stream_rep(store, handle), bytes(min(n, MAX_LINE_BYTES)))
        return _OK_NONE

    def exit_(run: WorkflowRun, store: Any, status: Any) -> None:
        code = status if isinstance(status, int) else (0 if status is None else 1)
        raise GuestError(f"the workflow called wasi:cli/exit (code {code})")

    def poll(run: WorkflowRun, store: Any, pollables: list[Any]) -> list[int]:
        return list(range(len(pollables)))

    out: dict[tuple[str, str], Callable[..., Any]] = {
        ("wasi:clocks/wall-clock", "now"): const({"seconds": 0, "nanoseconds": 0}),
        ("wasi:clocks/wall-clock", "resolution"): const({"seconds": 0, "nanoseconds": 1}),
        ("wasi:clocks/monotonic-clock", "now"): const(0),
        ("wasi:clocks/monotonic-clock", "resolution"): const(1),
        ("wasi:clocks/monotonic-clock", "subscribe-instant"): const(_POLLABLE),
        ("wasi:clocks/monotonic-clock", "subscribe-duration"): const(_POLLABLE),
        ("wasi:random/random", "get-random-bytes"): zero_bytes,
        ("wasi:random/random", "get-random-u64"): const(0),
        ("wasi:random/insecure", "get-insecure-random-bytes"): zero_bytes,
        ("wasi:random/insecure", "get-insecure-random-u64"): const(0),
        ("wasi:random/insecure-seed", "insecure-seed"): const((0, 0)),
        ("wasi:cli/environment", "get-environment"): const([]),
        ("wasi:cli/environment", "get-arguments"): const([]),
        ("wasi:cli/environment", "initial-cwd"): const(Case("none")),
        ("wasi:cli/exit", "exit"): exit_,
        ("wasi:cli/exit", "exit-with-code"): exit_,
        ("wasi:cli/stdin", "get-stdin"): const(Own(0)),
        ("wasi:cli/stdout", "get-stdout"): const(Own(1)),
        ("wasi:cli/stderr", "get-stderr"): const(Own(2)),
        ("wasi:cli/terminal-stdin", "get-terminal-stdin"): const(Case("none")),
        ("wasi:cli/terminal-stdout", "get-terminal-stdout"): const(Case("none")),
        ("wasi:cli/terminal-stderr", "get-terminal-stderr"): const(Case("none")),
        ("wasi:io/error", "[method]error.to-debug-string"): const(""),
        ("wasi:io/poll", "[method]pollable.ready"): const(True),
        ("wasi:io/poll", "[method]pollable.block"): const(None),
        ("wasi:io/poll", "poll"): poll,
        ("wasi:filesystem/preopens", "get-directories"): const([]),
        ("wasi:filesystem/types", "filesystem-error-code"): const(Case("none")),
    }
    streams = "wasi:io/streams"
    for method in ("write", "blocking-write-and-flush"):
        out[streams, f"[method]output-stream.{method}"] = write
    for method in ("write-zeroes", "blocking-write-zeroes-and-flush"):
        out[streams, f"[method]output-stream.{method}"] = write_zeroes
    for method in ("flush", "blocking-flush"):
        out[streams, f"[method]output-stream.{method}"] = const(_OK_NONE)
    out[streams, "[method]output-stream.check-write"] = const(Case("ok", 1 << 20))
    for method in ("splice", "blocking-splice"):
        out[streams, f"[method]output-stream.{method}"] = const(Case("ok", 0))
    for method in ("read", "blocking-read", "skip", "blocking-skip"):
        out[streams, f"[method]input-stream.{method}"] = const(_CLOSED)
    for resource in ("input-stream", "output-stream"):
        out[streams, f"[method]{resource}.subscribe"] = const(_POLLABLE)
    return out


WASI_FUNCTIONS = _wasi_functions()
