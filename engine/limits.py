"""How large an execution's params may be (SPEC §11 leaves it to the implementation).

Every execution is created through `Registry.validate_params`: a submit through the REST
API or the `Engine` facade (CLI, console) and a child or scheduled execution created by a
workflow. Params far larger than any sandbox can hold (a JS activity has 64 MiB for the
JSON text, its copy in the guest and the JS string made from it) would only be stored,
retried and copied around until every attempt fails; they are refused before anything is
written, with one message naming the limit. Obelisk's gRPC API refuses messages over
4 MiB (tonic's default), so the same bound is used here.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["MAX_PARAMS_BYTES", "describe_bytes", "params_size_problem"]

MAX_PARAMS_BYTES = 4 * 2**20
"""Largest params of an execution, measured as compact UTF-8 JSON."""

_encode = msgspec.json.Encoder().encode


def describe_bytes(n: int) -> str:
    """`4 MiB`, `512 KiB` or `1000 bytes`: a limit as a person would write it."""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n:,} bytes"


def params_size_problem(ffqn: str, params: Any, limit: int = MAX_PARAMS_BYTES) -> str | None:
    """Why `params` of `ffqn` are refused for their size (None: they fit). Params that are
    not JSON at all are left to the type check, which names the bad one."""
    try:
        size = len(_encode(params))
    except (TypeError, msgspec.EncodeError, OverflowError):
        return None
    if size <= limit:
        return None
    return (
        f"params of {ffqn} are too large: {size:,} bytes of JSON "
        f"(the limit is {describe_bytes(limit)})"
    )
