"""What the SQLite and PostgreSQL backends share: time encoding, projections, the
events of pause/unpause/cancel (decided by `engine.core.legality`), backtrace
preparation, post-commit notes.

Only pure code lives here (no SQL): each backend runs its own statements around these.
The state machine itself is `engine.core.state`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import msgspec

from engine.core import events as ev
from engine.core import legality
from engine.core.records import Frame
from engine.core.state import (
    BlockedByJoinSet,
    ExecutionSummary,
    Locked,
    PendingAt,
    PendingState,
    state_name,
)
from engine.core.state_names import RESULT_CLASSES
from engine.storage.contract import (
    CreateRequest,
    DirectLock,
    ExecutionRow,
    LockedExecution,
)

if TYPE_CHECKING:
    from engine.storage.notify import Notifier

log = logging.getLogger("obelisk.storage")

summary_decoder = msgspec.json.Decoder(ExecutionSummary)
frames_decoder = msgspec.json.Decoder(list[Frame])
_frames_encoder = msgspec.json.Encoder()

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message ("" if it has none): database errors
    carry details and hints on the lines after it."""
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def counts_with_results(rows: Iterable[tuple[str, str | None, int]]) -> dict[str, int]:
    """`count_by_state(results=True)` from (state, result class or None, count) rows:
    per state, and per result class (`ok`, `err`, `failed`, always there)."""
    counts: dict[str, int] = dict.fromkeys(RESULT_CLASSES, 0)
    for state, result, n in rows:
        counts[state] = counts.get(state, 0) + n
        if result is not None:
            counts[result] += n
    return counts


def us(dt: datetime) -> int:
    """Exact integer microseconds since the epoch (floats lose the last digit)."""
    return ((dt if dt.tzinfo else dt.replace(tzinfo=UTC)) - EPOCH) // _MICRO


def dt(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def not_before(now: datetime, updated_at: int) -> datetime:
    """`now`, or just after `updated_at` (µs) if that is later.

    Callers take `now` before their transaction is queued, so transactions can commit
    out of timestamp order (and, with several hosts, clocks differ a little). A log is
    read back by interleaving events and responses by time: a transaction of an
    execution never gets a timestamp before the previous one, so that this order is the
    commit order."""
    return not_before_us(now, updated_at)[0]


def not_before_us(
    now: datetime, updated_at: int, now_us: int | None = None
) -> tuple[datetime, int]:
    """`not_before`, and the same time in µs (`now_us`: `us(now)`, when the caller has
    it): the writer's hot paths need both, and `us` is a Python call."""
    if now_us is None:
        now_us = us(now)
    if updated_at <= now_us:
        return now, now_us
    return dt(updated_at + 1), updated_at + 1


class Notes(msgspec.Struct):
    """What to announce once the transaction has committed. (A msgspec struct: made in C,
    for every logical transaction.)"""

    pending: set[str] = msgspec.field(default_factory=set)
    finished: list[tuple[str, ev.ExecutionResult]] = msgspec.field(default_factory=list)
    responses: set[str] = msgspec.field(default_factory=set)
    #: The responses written, as a read would return them (for `Notifier.post_responses`:
    #: a waiting workflow run gets them without reading them back).
    response_items: list[tuple[str, ev.StoredResponse]] = msgspec.field(default_factory=list)
    #: Creations with a direct lock: what the executor gets (None: not locked).
    direct: list[tuple[DirectLock, LockedExecution | None]] = msgspec.field(default_factory=list)
    #: FFQNs with executions that became pending but are due only later: seconds from
    #: the transaction's `now` to the earliest (executors are woken then, not now).
    pending_later: dict[str, float] = msgspec.field(default_factory=dict)

    def became_pending(self, ffqn: str, scheduled_at: datetime, now: datetime) -> None:
        """An execution of `ffqn` is PendingAt(`scheduled_at`) after this transaction.
        Waking an executor for one that is not due yet only makes it lock nothing (a
        transaction for nothing on every response to a warm workflow run, which is
        pending until its lock expires, in case the run died)."""
        if scheduled_at <= now:
            self.pending.add(ffqn)
            return
        delay = (scheduled_at - now).total_seconds()
        known = self.pending_later.get(ffqn)
        if known is None or delay < known:
            self.pending_later[ffqn] = delay

    cancelled: set[str] = msgspec.field(default_factory=set)
    #: Cancelling executions that changed (for the cancellation driver).
    cancelling: set[str] = msgspec.field(default_factory=set)


@dataclass(slots=True)
class RemoteNotes:
    """What one commit tells the other processes sharing the database (PostgreSQL's
    NOTIFY, SQLite's `engine.storage.sqlite.peers`): one line each, after the sender."""

    lines: list[str] = field(default_factory=list)

    def add(self, notes: Notes) -> None:
        self.lines += [f"p {f}" for f in notes.pending]
        self.lines += [f"l {delay!r} {f}" for f, delay in notes.pending_later.items()]
        self.lines += [f"f {e}" for e, _ in notes.finished]
        self.lines += [f"r {e}" for e in notes.responses]
        self.lines += [f"c {e}" for e in notes.cancelled]
        self.lines += [f"x {e}" for e in notes.cancelling]

    def chunks(self, sender: str, limit: int = 7000) -> list[str]:
        """Payloads of at most about `limit` bytes (NOTIFY takes < 8000), each with the
        sender first."""
        out: list[str] = []
        current = [sender]
        size = len(sender.encode())
        for line in dict.fromkeys(self.lines):  # deduplicated, in order
            length = len(line.encode()) + 1
            if size + length > limit and len(current) > 1:
                out.append("\n".join(current))
                current, size = [sender], len(sender.encode())
            current.append(line)
            size += length
        out.append("\n".join(current))
        return out


@dataclass(slots=True)
class RemoteChecks:
    """What a `RemoteNotes` payload asks this process to re-read: a peer only wakes."""

    #: Executions said finished that someone here awaits (the caller reads the results).
    finished: list[str] = field(default_factory=list)
    #: Executions said cancelled (or released) that a run here holds: the caller reads
    #: their summaries and stops the runs the log stops (`stop_runs_the_log_stops`).
    stops: list[str] = field(default_factory=list)


def apply_remote_notes(notifier: Notifier, body: str) -> RemoteChecks:
    """Wake this process's waiters for what another process committed (the lines of a
    `RemoteNotes` payload after its sender); returns what must be read back first.

    Whoever can send (a NOTIFY by any database user; a datagram, though the bus checks
    the sender's uid) cannot decide an outcome: each line only makes a waiter re-read
    the database (pending work, responses, the cancellation driver), and what would act
    at once, a cancellation stopping a run, is left to the caller to confirm from the
    log. Lines that do not parse are ignored."""
    checks = RemoteChecks()
    finished: list[str] = []
    for line in body.split("\n"):
        kind, _, arg = line.partition(" ")
        if not arg:
            continue
        if kind == "p":
            notifier.pending(arg)
        elif kind == "l":
            delay, _, ffqn = arg.partition(" ")
            seconds = _seconds(delay)
            if seconds is not None:
                notifier.pending_later(ffqn, seconds)
        elif kind == "r":
            notifier.response(arg)
        elif kind == "f":
            finished.append(arg)
        elif kind == "c":
            if notifier.listens(arg):  # no read for what runs elsewhere (or nowhere)
                checks.stops.append(arg)
        elif kind == "x":
            notifier.cancelling(arg)
    if finished:
        awaited = set(notifier.awaited_results())
        checks.finished = [e for e in dict.fromkeys(finished) if e in awaited]
    checks.stops = list(dict.fromkeys(checks.stops))
    return checks


def _seconds(text: str) -> float | None:
    """A delay of an `l` line: finite, not negative (None: not a delay)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return max(0.0, value) if math.isfinite(value) else None


def run_must_stop(s: ExecutionSummary) -> bool:
    """Whether the log says that the run holding `s` must let go of it: its cancellation
    was requested (`cancel_events`), it was paused (`pause_events` released it), it
    finished, or it is no longer locked at all. The rule for a cancellation announced
    by another process, whose word alone is no reason to stop a run."""
    return s.is_finished or s.cancelling or s.paused or not isinstance(s.underlying, Locked)


async def stop_runs_the_log_stops(
    notifier: Notifier,
    execution_ids: Sequence[str],
    read: Callable[[str], Awaitable[ExecutionSummary]],
) -> None:
    """The `stops` of `RemoteChecks`: read each summary (`read`: the backend's batched
    summary read) and stop the local run only where `run_must_stop`. A failed read
    (e.g. while closing) stops nothing, as a lost wake-up would not."""
    summaries = await asyncio.gather(*(read(e) for e in execution_ids), return_exceptions=True)
    for execution_id, s in zip(execution_ids, summaries, strict=True):
        if isinstance(s, ExecutionSummary) and run_must_stop(s):
            notifier.cancelled(execution_id)


def direct_locked(req: CreateRequest, lock: DirectLock, s: ExecutionSummary) -> LockedExecution:
    """What the executor of a direct lock gets: `s` is the summary after `locked`."""
    created = req.created
    return LockedExecution(
        execution_id=req.execution_id,
        ffqn=created.ffqn,
        params=created.params,
        next_version=s.next_version,
        run_id=lock.locked.run_id,
        lock_expires_at=lock.locked.lock_expires_at,
        parent=created.parent,
        summary=s,
    )


def announce_direct(notes: Notes) -> None:
    """Hand directly locked executions to their executors (once their creation is written)."""
    for lock, execution in notes.direct:
        try:
            lock.taken(execution)
        except Exception:  # an executor's bug must not stop the writer
            log.exception("direct lock of %s: handing it over failed", execution)


def grouped_responses(notes: Notes) -> dict[str, list[ev.StoredResponse]]:
    """`notes.response_items` by execution, in write order."""
    out: dict[str, list[ev.StoredResponse]] = {}
    for execution_id, item in notes.response_items:
        out.setdefault(execution_id, []).append(item)
    return out


def projection(
    s: ExecutionSummary, state: PendingState | None = None
) -> tuple[str, int | None, int | None]:
    """(state name, pending_at µs, lock_expires_at µs) of the projection row: pending_at
    only while the state is exactly PendingAt, lock_expires_at while the underlying state
    is Locked (the indexed columns of due work and expired locks). `state`: `s.state`,
    when the caller has it."""
    if state is None:
        state = s.state
    u = s.underlying
    pending_at = us(state.scheduled_at) if isinstance(state, PendingAt) else None
    lock_expires_at = us(u.lock_expires_at) if isinstance(u, Locked) else None
    return state_name(state), pending_at, lock_expires_at


def execution_row(
    execution_id: str,
    ffqn: str,
    component_type: str,
    parent_id: str | None,
    created_at: int,
    updated_at: int,
    s: ExecutionSummary,
) -> ExecutionRow:
    u = s.underlying
    scheduled_at = u.scheduled_at if isinstance(u, PendingAt) else None
    lock_expires_at = u.lock_expires_at if isinstance(u, Locked | BlockedByJoinSet) else None
    return ExecutionRow(
        execution_id=execution_id,
        ffqn=ffqn,
        component_type=component_type,
        state=s.state,
        created_at=dt(created_at),
        updated_at=dt(updated_at),
        next_version=s.next_version,
        parent_id=parent_id,
        scheduled_at=scheduled_at,
        lock_expires_at=lock_expires_at,
        result=s.result,
        temporary_event_count=s.temporary_event_count,
    )


# -- decisions of the steering commands (SPEC §4.3, §8) --------------------------------


def pause_events(
    s: ExecutionSummary, execution_id: str, now: datetime, notes: Notes
) -> list[ev.Event]:
    """The events that pause `s`, or Conflict (`legality.pause_refusal`). A locked
    workflow is released first."""
    locked = isinstance(s.underlying, Locked)
    refused = legality.pause_refusal(
        execution_id,
        finished=s.is_finished,
        cancelling=s.cancelling,
        paused=s.paused,
        running_activity=locked and not s.is_workflow,
    )
    if refused is not None:
        raise refused
    events: list[ev.Event] = [ev.Paused()]
    if locked:
        # A locked workflow's run is released first (SPEC §4.3).
        events.insert(0, ev.Unlocked(now, "paused"))
        notes.cancelled.add(execution_id)  # tells a warm run to stop
    return events


def check_unpause(s: ExecutionSummary, execution_id: str) -> None:
    """Raise Conflict unless `s` may be unpaused (`legality.unpause_refusal`)."""
    refused = legality.unpause_refusal(execution_id, finished=s.is_finished, paused=s.paused)
    if refused is not None:
        raise refused


def cancel_events(s: ExecutionSummary, execution_id: str, force: bool = False) -> list[ev.Event]:
    """The events that request the cancellation of `s` (SPEC §8), or the error of
    `legality.cancel_refusal`. A forced request is recorded as such only where the force
    was needed (`legality.cancel_is_forced`)."""
    refused = legality.cancel_refusal(
        execution_id,
        s.ffqn,
        is_workflow=s.is_workflow,
        finished=s.is_finished,
        cancelling=s.cancelling,
        force=force,
    )
    if refused is not None:
        raise refused
    forced = legality.cancel_is_forced(s.ffqn, s.is_workflow, force)
    events: list[ev.Event] = [ev.CancellationRequested(forced=forced)]
    if not s.is_workflow and not isinstance(s.underlying, Locked):
        # Nothing runs: the activity is finished right away.
        events.append(ev.Finished(ev.ExecutionFailure("cancelled", "cancellation requested")))
    return events


def response_source(response: ev.Response) -> str:
    """The child execution or delay a response answers: one response each."""
    if isinstance(response, ev.ChildExecutionFinished):
        return response.child_execution_id
    return response.delay_id


class _EventType(msgspec.Struct):
    """Just enough of a stored event to name it (other fields are skipped)."""

    type: str
    event: _InnerType | None = None


class _InnerType(msgspec.Struct):
    type: str


_event_type_decoder = msgspec.json.Decoder(_EventType)


def event_type(blob: bytes) -> str:
    """The type of a stored event; the inner type for history events (`join_next`)."""
    e = _event_type_decoder.decode(blob)
    return e.event.type if e.type == "history_event" and e.event is not None else e.type


# -- backtraces (SPEC §7.4) ---------------------------------------------------------------


class PreparedBacktrace(msgspec.Struct, frozen=True):
    """A backtrace ready for the writer: `at` is an index into the appended events (append)
    or a version (replace_backtraces). (A msgspec struct: made in C, for every event
    with a stack.)"""

    at: int
    key: bytes
    component_digest: str
    frames: bytes


def prepare_backtraces(
    component_digest: str | None, backtraces: Sequence[tuple[int, list[Frame]]]
) -> list[PreparedBacktrace]:
    """Encode and hash on the caller's side (the writer only runs SQL). Empty stacks are
    left out; the same frames list object is encoded once."""
    if not backtraces:
        return []
    digest = component_digest or ""
    encoded: dict[int, tuple[bytes, bytes]] = {}
    out: list[PreparedBacktrace] = []
    for at, frames in backtraces:
        if not frames:
            continue
        pair = encoded.get(id(frames))
        if pair is None:
            blob = _frames_encoder.encode(frames)
            key = hashlib.sha256(digest.encode() + b"\0" + blob).digest()
            pair = encoded[id(frames)] = (key, blob)
        out.append(PreparedBacktrace(at, pair[0], digest, pair[1]))
    return out
