"""The storage contract every backend implements (SQLite now, PostgreSQL later).

Operations are *logical transactions*: each either happens completely or not at all.
Callers pass `now` explicitly so that tests drive time with a manual clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from engine.core import events as ev

# The storage contract's errors (defined in core, where the legality rules build them).
from engine.core.errors import Conflict as Conflict
from engine.core.errors import NotCancellable as NotCancellable
from engine.core.errors import NotFound as NotFound
from engine.core.errors import StorageError as StorageError
from engine.core.errors import StorageFull as StorageFull
from engine.core.errors import VersionConflict as VersionConflict
from engine.core.records import Frame, LogLine
from engine.core.state import ExecutionSummary, PendingState
from engine.storage.notify import ResponseInbox


class DirectLock(Protocol):
    """A lock that an executor of this process takes on an execution as it is created,
    in the creating transaction: the execution runs at once, without being announced as
    pending, woken for and locked by a transaction of its own (one commit less)."""

    @property
    def locked(self) -> ev.Locked:
        """The `locked` event to append right after `created` (same timestamp)."""
        ...

    def taken(self, execution: LockedExecution | None) -> None:
        """Once the creating transaction is written, on any thread (SQLite: its writer's,
        just before the COMMIT): the execution is now locked for the executor (run it),
        or None: it existed already and nothing was locked. Must be quick and must not
        raise. Only the first of `taken` and `release` counts: a storage that hands
        locks over before the COMMIT calls `taken` again when a failed COMMIT made it
        write them a second time, and the creator may then see its write fail."""

    def release(self) -> None:
        """The creating transaction failed: nothing was locked. Called by the creator
        (any thread), never by the storage; a no-op after `taken`."""


@dataclass(frozen=True, slots=True)
class CreateRequest:
    execution_id: str
    created: ev.Created
    #: Lock the new execution in the same transaction (its `created` must be due then).
    lock: DirectLock | None = None


@dataclass(frozen=True, slots=True)
class LockedExecution:
    """An execution this executor now holds, with what it needs to run it."""

    execution_id: str
    ffqn: str
    params: list[Any]
    next_version: int
    run_id: str
    lock_expires_at: datetime
    parent: tuple[str, str] | None
    summary: ExecutionSummary
    #: Full log and responses, only when asked for (workflows replay from them).
    events: list[ev.StoredEvent] | None = None
    responses: list[ev.StoredResponse] | None = None


@dataclass(frozen=True, slots=True)
class ExpiredLock:
    execution_id: str
    next_version: int
    summary: ExecutionSummary


@dataclass(frozen=True, slots=True)
class ExpiredDelay:
    execution_id: str
    delay_id: str
    join_set_id: str


@dataclass(frozen=True, slots=True)
class ExecutionRow:
    """One line of `list_executions` (and the status endpoint)."""

    execution_id: str
    ffqn: str
    component_type: str
    state: PendingState
    created_at: datetime
    updated_at: datetime
    next_version: int
    parent_id: str | None
    scheduled_at: datetime | None
    lock_expires_at: datetime | None
    result: ev.ExecutionResult | None
    temporary_event_count: int
    #: Only with `ListFilter.with_extras`: the number of direct children, and the type of
    #: the last event (the inner type for history events, e.g. "join_next").
    children: int | None = None
    last_event: str | None = None


#: Orders of `list_executions`: newest first (default), oldest first, last change first.
ListOrder = Literal["created_desc", "created_asc", "updated_desc"]
LIST_ORDERS: tuple[ListOrder, ...] = ("created_desc", "created_asc", "updated_desc")


@dataclass(frozen=True, slots=True)
class ListFilter:
    ffqn_prefix: str | None = None
    states: Sequence[str] | None = None  # state names, e.g. ("pending_at", "locked")
    #: Finished executions of these result classes only (`RESULT_CLASSES`: ok, err, failed).
    results: Sequence[str] | None = None
    hide_finished: bool = False
    top_level_only: bool = False
    id_prefix: str | None = None
    limit: int = 100
    #: Paging: return rows created strictly before this (execution_id) cursor.
    before_id: str | None = None
    #: With `before_id`: that row's `created_at`. A backend that does not hold the row
    #: (another shard: `engine.storage.sharded`) pages after it by this pair.
    before_created_at: datetime | None = None
    #: Paging by position (a virtual list): skip this many rows of the order.
    offset: int = 0
    order: ListOrder = "created_desc"
    #: Fill `ExecutionRow.children` and `.last_event` (two more indexed reads per page).
    with_extras: bool = False


@dataclass(frozen=True, slots=True, order=True)
class UnfinishedExecution:
    """A not finished execution, for workflow upgrades (SPEC §9.3)."""

    execution_id: str
    ffqn: str
    #: Set after a failed upgrade: only an executor of this component digest may lock it.
    pinned_digest: str | None


@dataclass(frozen=True, slots=True)
class StoredLog:
    id: int
    execution_id: str
    run_id: str | None
    created_at: datetime
    level: str
    stream: str
    message: str


@dataclass(slots=True)
class AppendExtras:
    """Side writes of one append, made in the same transaction."""

    creates: list[CreateRequest] = field(default_factory=list)
    logs: list[LogLine] = field(default_factory=list)
    run_id: str | None = None
    #: Guest stacks of appended history events: (index into the appended events, frames
    #: innermost first). Stored deduplicated against the versions they get (SPEC §7.4).
    backtraces: list[tuple[int, list[Frame]]] = field(default_factory=list)
    #: The digest of the component whose code produced `backtraces`.
    component_digest: str | None = None


@dataclass(frozen=True, slots=True)
class Backtrace:
    """The guest stack of the host call that wrote an event, innermost frame first."""

    backtrace_id: int
    #: The component (code) that ran; its source is kept by `get_component_source`.
    component_digest: str
    frames: list[Frame]


@dataclass(frozen=True, slots=True)
class ComponentSource:
    """The source text of a loaded (JS) component, kept by digest for backtraces."""

    digest: str
    file: str
    source: str


class Storage(Protocol):
    async def close(self) -> None: ...

    # -- writes -------------------------------------------------------------
    async def create(self, request: CreateRequest, now: datetime) -> None:
        """Create an execution. Idempotent for the same id and params; 409 otherwise."""

    async def lock_pending(
        self,
        *,
        ffqns: Sequence[str],
        batch_size: int,
        now: datetime,
        component_id: ev.ComponentId,
        executor_id: str,
        run_id: str,
        lock_expires_at: datetime,
        retry_config: ev.RetryConfig,
        with_log: bool = False,
        pinned_digest: str | None = None,
    ) -> list[LockedExecution]:
        """Lock up to `batch_size` due executions of `ffqns`, oldest first.

        Executions pinned to a component digest (a failed upgrade, SPEC §9.3) are locked
        only when `pinned_digest` names that digest; with `pinned_digest=None` (every
        executor of the current deployment) only executions that are not pinned."""

    async def append(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None = None,
    ) -> ExecutionSummary:
        """Append events at `expected_version`. A `finished` of a child also writes the
        parent's response; child requests create the children (in `extras.creates`)."""

    def append_from_thread(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None = None,
        inbox: ResponseInbox | None = None,
    ) -> ExecutionSummary:
        """`append` for a caller on a thread other than the event loop's (a workflow
        run on its worker thread): blocks that thread until the outcome. A backend may
        skip the loop (SQLite: its writer thread answers the caller directly).

        `inbox`: the caller's, whose responses this write depends on. The write is
        refused (`Conflict`) when one of them was not committed. A backend that orders
        writes itself (SQLite's one writer) may take the write before those are
        durable, and answer before the write itself is (noting it in the inbox): the
        caller then waits for `inbox.wait_committed()` before it reads the database or
        stops."""

    def append_then(
        self,
        execution_id: str,
        expected_version: int,
        events: Sequence[ev.Event],
        now: datetime,
        extras: AppendExtras | None,
        callback: Callable[[bool, Any], None],
    ) -> None:
        """`append` started from any thread, with no future: `callback(True, summary)` or
        `callback(False, exception)` once the outcome is known, on whichever thread the
        backend has it (SQLite: its writer, right after the COMMIT). The callback must be
        quick and must not raise. (An activity run's outcome: no event-loop hop.)"""

    async def append_response(
        self, execution_id: str, response: ev.Response, now: datetime
    ) -> None:
        """Write a response (a delay finished); duplicates are rejected with Conflict."""

    async def append_upgrade_finished(
        self,
        execution_id: str,
        expected_version: int,
        event: ev.ComponentUpgradeFinished,
        pinned_digest: str | None,
        now: datetime,
    ) -> ExecutionSummary:
        """Append `component_upgrade_finished` at `expected_version` and, in the same
        transaction, pin the execution to `pinned_digest` (the version it must keep
        running on after a failed upgrade) or unpin it (None, after a success)."""

    async def append_logs(
        self, execution_id: str, run_id: str | None, lines: Sequence[LogLine], now: datetime
    ) -> None: ...

    async def pause(self, execution_id: str, now: datetime) -> ExecutionSummary: ...

    async def unpause(self, execution_id: str, now: datetime) -> ExecutionSummary: ...

    async def request_cancellation(
        self, execution_id: str, now: datetime, force: bool = False
    ) -> ExecutionSummary:
        """Cancel an activity or a `-cancellable` workflow (SPEC §8); with `force`, any
        workflow (`cancel_refusal`). A pending activity is finished `cancelled` at once; a
        locked one is interrupted by its executor."""

    async def cancel_delay(self, delay_id: str, now: datetime) -> ExecutionSummary:
        """Answer a live delay with `delay_finished(cancelled)`; returns the owning
        execution's summary. NotFound for an unknown delay, Conflict when it already
        finished (expired or cancelled) or its execution did."""

    async def cancelling_executions(
        self, after_id: str = "", limit: int = 1000
    ) -> list[tuple[str, ExecutionSummary]]:
        """Executions in the Cancelling state with an id above `after_id`, by id."""

    # -- timers -------------------------------------------------------------
    async def expired_timers(
        self, now: datetime, limit: int = 100
    ) -> tuple[list[ExpiredLock], list[ExpiredDelay]]: ...

    async def next_timer_at(self) -> datetime | None:
        """The earliest lock expiry, delay expiry or pending time (for sleeping watchers)."""

    # -- executor liveness: a dead process's locks are released at once ------------------
    def hold_executor_lease(self, executor_id: str) -> ExecutorLease:
        """Mark `executor_id` alive until the lease is released (the executor stopped)
        or its process dies, which other processes (and this one, after a restart) learn
        from `dead_executors`. A backend without leases returns one that does nothing:
        the locks of a dead process then wait for their expiry (SPEC §6.3)."""

    async def dead_executors(self) -> set[str]:
        """Executors known to be dead: their process ended without releasing its lease."""

    async def held_by_executors(self, executor_ids: set[str]) -> list[ExpiredLock]:
        """Unfinished executions that a run of one of `executor_ids` holds: locked by it,
        or claimed by a run waiting for a response (`engine.core.state.on_executor_died`
        decides what each gets). May include a few that it no longer holds."""

    async def forget_executors(self, executor_ids: set[str]) -> None:
        """Drop the leases of dead executors that hold nothing any more."""

    # -- reads --------------------------------------------------------------
    async def get_summary(self, execution_id: str) -> ExecutionSummary: ...

    async def get_created(self, execution_id: str) -> ev.Created: ...

    async def get_events(
        self, execution_id: str, from_version: int = 0, length: int | None = None
    ) -> list[ev.StoredEvent]: ...

    async def get_responses(
        self, execution_id: str, from_cursor: int = 0
    ) -> list[ev.StoredResponse]: ...

    async def get_row(self, execution_id: str) -> ExecutionRow: ...

    async def list_executions(self, flt: ListFilter) -> list[ExecutionRow]: ...

    async def with_extras(self, rows: list[ExecutionRow]) -> list[ExecutionRow]:
        """`rows` (of this database) with `children` and `last_event` filled, as
        `list_executions` gives them with `ListFilter.with_extras`."""

    async def count_by_state(self, *, results: bool = False) -> dict[str, int]:
        """Executions per state name (overlays as their own states); with `results`, the
        finished ones also per result class (`ok`, `err`, `failed` keys, in the same
        query: the class is read from the summary of the finished rows only)."""

    async def count_executions(self, flt: ListFilter) -> int:
        """How many rows `list_executions(flt)` would page through (limit, offset and
        order ignored)."""

    async def unfinished_executions(
        self, ffqns: Sequence[str] | None = None, *, pinned_only: bool = False
    ) -> list[UnfinishedExecution]:
        """Executions that are not finished (of `ffqns`, or all), with their pin; only the
        pinned ones with `pinned_only`."""

    async def get_logs(
        self, execution_id: str, after_id: int = 0, limit: int = 1000
    ) -> list[StoredLog]: ...

    # -- backtraces and component sources (SPEC §7.4) ----------------------------------
    async def get_backtrace(self, execution_id: str, version: int) -> Backtrace | None:
        """The backtrace stored for that event, None when it has none. NotFound for an
        unknown execution."""

    async def replace_backtraces(
        self,
        execution_id: str,
        component_digest: str,
        backtraces: Sequence[tuple[int, list[Frame]]],
        below_version: int,
    ) -> int:
        """Replace the backtraces of the events below `below_version` with `backtraces`
        (version, frames): the others lose theirs. Returns how many events got one."""

    async def save_component_sources(self, sources: Sequence[ComponentSource]) -> None:
        """Keep component sources by digest (a digest already kept is left as is)."""

    async def get_component_source(self, digest: str) -> ComponentSource | None: ...

    # -- waiting ------------------------------------------------------------
    async def wait_for_finished(
        self, execution_id: str, timeout: float | None = None
    ) -> ev.ExecutionResult:
        """The result, waiting for it without polling. TimeoutError after `timeout`."""

    async def wait_for_response(
        self, execution_id: str, after_cursor: int, timeout: float
    ) -> list[ev.StoredResponse]:
        """Responses with a cursor above `after_cursor`, waiting up to `timeout` seconds
        for the first one to arrive ([] on timeout)."""

    async def wait_for_pending(self, ffqns: Sequence[str], timeout: float) -> None:
        """Return when an execution of one of `ffqns` may have become pending, or after
        `timeout` seconds (other processes sharing the database do not notify)."""

    def open_inbox(self, execution_id: str) -> ResponseInbox:
        """Subscribe a workflow run (on its worker thread) to the responses of
        `execution_id` committed from now on: the backend posts each one, or pokes the
        inbox when it only knows that some arrived (the run then reads them). Responses
        committed before, and those of other processes it is not told about, must be
        read (`get_responses`). Close it with `close_inbox`."""

    def close_inbox(self, execution_id: str, inbox: ResponseInbox) -> None: ...

    def subscribe_cancellations(self) -> CancellationListener: ...

    def changes(self) -> ChangeFeed: ...


class ExecutorLease(Protocol):
    def release(self) -> None:
        """The executor stopped and released its runs: it is gone, not dead."""


class CancellationListener(Protocol):
    """Executors learn here that a locked execution they run is being cancelled."""

    def add(self, execution_id: str, callback: Any) -> None: ...

    def remove(self, execution_id: str, callback: Any = None) -> None:
        """Forget the listener (only if it is `callback`, when given)."""

    async def wait_cancelling(self, timeout: float) -> set[str]:
        """For the cancellation driver: the cancelling executions that changed since the
        last call (requested, got a response, were released), waiting up to `timeout`."""
        ...


class ChangeFeed(Protocol):
    """A counter bumped after each commit, for clients that refresh on change (console)."""

    @property
    def generation(self) -> int: ...

    async def wait_changed(self, since: int, timeout: float) -> int: ...
