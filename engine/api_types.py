"""The types a front end (the REST API, the console, the CLI's server) passes to `Engine`
or catches from it, from one public module: front ends import no `engine.storage.*`.

Also how a refusal is reported over HTTP (`error_status`): the API answers with it, and
the embedded console reports an engine refusal as if the API had.
"""

from __future__ import annotations

from engine.core.errors import Conflict, NotCancellable, NotFound, StorageError, StorageFull
from engine.errors import DeploymentError, EngineError, InvalidParams, UnknownFunction
from engine.storage.contract import LIST_ORDERS, ListFilter, ListOrder
from engine.storage.disk_full import LOG_INTERVAL, report_disk_full

#: Engine and storage errors → HTTP status. Order matters: subclasses first.
_STATUS_OF: tuple[tuple[type[Exception], int], ...] = (
    (NotFound, 404),
    (UnknownFunction, 404),
    (InvalidParams, 400),
    (NotCancellable, 422),
    (Conflict, 409),
    (StorageFull, 503),
)
#: The refusals of a request (its fault, answered with their status and message).
REFUSALS = (NotFound, UnknownFunction, InvalidParams, NotCancellable, Conflict)


#: Seconds a client should wait after a 503 (disk full): as often as the server logs it
#: (`report_disk_full`, which a front end calls to log one).
RETRY_AFTER_FULL = LOG_INTERVAL


def error_status(error: Exception) -> int:
    """The HTTP status of an engine or storage error (500 for anything not a refusal):
    what the API answers, and what the embedded console reports as if it had."""
    return next((code for cls, code in _STATUS_OF if isinstance(error, cls)), 500)


__all__ = [
    "LIST_ORDERS",
    "REFUSALS",
    "RETRY_AFTER_FULL",
    "Conflict",
    "DeploymentError",
    "EngineError",
    "InvalidParams",
    "ListFilter",
    "ListOrder",
    "NotCancellable",
    "NotFound",
    "StorageError",
    "StorageFull",
    "UnknownFunction",
    "error_status",
    "report_disk_full",
]
