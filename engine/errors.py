"""User-facing errors of the engine facade. Each message names the thing at fault."""

from __future__ import annotations

from engine.storage.contract import Conflict, NotCancellable, NotFound, StorageError


class EngineError(Exception):
    """Base of errors caused by a request (bad input), not by the engine."""


class UnknownFunction(EngineError):
    """No deployed component exports this FFQN (HTTP 404)."""


class InvalidParams(EngineError):
    """Params that do not match the function's WIT types (HTTP 400)."""


class DeploymentError(EngineError):
    """A deployment.toml or component that cannot be loaded; names file, section and key."""


__all__ = [
    "Conflict",
    "DeploymentError",
    "EngineError",
    "InvalidParams",
    "NotCancellable",
    "NotFound",
    "StorageError",
    "UnknownFunction",
]
