"""The refusals of the engine's data model: what a storage operation, the engine facade
and the pure legality rules (`engine.core.legality`) raise or return.

They live in `core` so that the rules deciding them are pure and import no storage; the
storage contract (`engine.storage.contract`) re-exports them under their old names.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base of every error a storage operation raises on purpose."""


class NotFound(StorageError):
    """Unknown execution (or delay) id. The message names it."""


class Conflict(StorageError):
    """The request contradicts the stored state (SPEC §11: 409)."""


class VersionConflict(Conflict):
    """An append named a version other than the next one (optimistic concurrency)."""


class NotCancellable(StorageError):
    """Cancellation of something that is neither an activity nor a `-cancellable` workflow."""


class StorageFull(StorageError):
    """The database's disk (or its size limit) is full: nothing of the write was made,
    later writes fail the same way until space is freed (SPEC §11 maps it to 503)."""


__all__ = [
    "Conflict",
    "NotCancellable",
    "NotFound",
    "StorageError",
    "StorageFull",
    "VersionConflict",
]
