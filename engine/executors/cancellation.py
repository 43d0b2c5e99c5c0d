"""The cancellation driver (SPEC §8): finishes what was asked to be cancelled and is not
running.

A `-cancellable` workflow is never run again once `cancellation_requested` is in its log.
Whenever it is not locked, the driver tears down its open join sets *from the log* — no
guest code runs — with the structured-concurrency rules of SPEC §7.3:

* join sets are closed in reverse creation order, one at a time;
* the members of the join set being closed that have no response yet are dealt with in
  reverse submission order: delays get `delay_finished(cancelled)`, activities and
  `-cancellable` child workflows get `cancellation_requested` (a child workflow is torn
  down by this same driver, recursively), other child workflows are awaited;
* one `join_next{closing: true}` is written per member the workflow had not awaited yet
  (history events are allowed while cancelling, without a lock), each when the previous
  one has its response, as the guest's own `join-set-close` would;
* once every member of every join set has answered, `finished(execution_failure
  {cancelled})` is appended, which also answers the workflow's parent.

A workflow that is not `-cancellable` gets here only by a *forced* cancellation (an
operator ending one that can never finish, `cancellation_requested{forced}`). It is torn
down the same way, except that its child workflows are forced too instead of awaited: a
child stuck in an endless loop would otherwise keep the forced parent from ending.

Everything is derived from the log and the responses on every pass, so the driver can
be stopped and run again at any point (a crash, another engine sharing the database):
a step that was already taken is recognised and not repeated, a step that raced with
someone else is rejected by the storage (a conflict) and re-planned on the next pass.

A cancelling workflow that is still locked is left to its run, which the executor
interrupts and releases with `unlocked("cancelled")`; when the lock expires first (the
engine died), the driver releases it itself, at once at the expiry, before the timers
watcher would finish it without a teardown. A cancelling activity that is not locked is
finished `cancelled` (a locked one is interrupted by its executor).

The driver runs every second, and at once when the storage announces that a cancelling
execution changed (cancellation requested, a response arrived, its run let go).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from engine.core import events as ev
from engine.core.clock import Clock
from engine.core.legality import is_cancellable
from engine.core.state import ExecutionSummary, Locked
from engine.storage.contract import Conflict, NotCancellable, NotFound, Storage, StorageError

log = logging.getLogger("obelisk.cancellation")

CANCELLED = ev.ExecutionFailure("cancelled", "cancellation requested")


# ---------------------------------------------------------------------------------------
# The plan: a pure function of the log and the responses
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Member:
    """A request submitted into a join set: a child execution or a delay."""

    id: str
    #: The child's function; None for a delay.
    ffqn: str | None

    @property
    def is_delay(self) -> bool:
        return self.ffqn is None


@dataclass(slots=True)
class JoinSetView:
    """One join set as the log and the responses describe it."""

    id: str
    #: In submission order.
    members: list[Member] = field(default_factory=list)
    #: Ids of the members that have a response.
    answered: set[str] = field(default_factory=set)
    #: `join_next` events plus `join_next_try` that found a response.
    consumed: int = 0

    @property
    def submitted(self) -> int:
        return len(self.members)

    @property
    def received(self) -> int:
        return len(self.answered)

    @property
    def done(self) -> bool:
        """Every member answered and awaited: nothing is left to close."""
        return self.consumed >= self.submitted and self.received >= self.submitted

    def unanswered(self) -> list[Member]:
        """Members without a response, in reverse submission order."""
        return [m for m in reversed(self.members) if m.id not in self.answered]

    def closing_join_nexts(self) -> int:
        """How many `join_next{closing}` to write now: each either takes a response that
        is already there or, the last one, waits for the next to arrive. None while an
        earlier `join_next` (the one the workflow was blocked on) still waits."""
        if self.received < self.consumed:
            return 0
        return min(self.submitted - self.consumed, self.received - self.consumed + 1)


@dataclass(slots=True)
class TeardownView:
    next_version: int
    finished: bool
    #: In creation order.
    join_sets: list[JoinSetView]
    #: The cancellation was forced: child workflows are forced too, not awaited.
    forced: bool = False

    def current(self) -> JoinSetView | None:
        """The join set to close now: the last created one that is not done."""
        for js in reversed(self.join_sets):
            if not js.done:
                return js
        return None


def join_sets_in(history: Iterable[ev.HistoryEventKind]) -> dict[str, JoinSetView]:
    """The join sets a workflow's recorded history has, in creation order: their members
    and how many were awaited (no responses yet). Shared by the teardown of a cancelled
    workflow and the close after a nondeterminism (`ReplayHost.close_from_log`)."""
    join_sets: dict[str, JoinSetView] = {}
    for event in history:
        match event:
            case ev.JoinSetCreate(join_set_id=js_id):
                join_sets.setdefault(js_id, JoinSetView(js_id))
            case ev.JoinSetRequest(join_set_id=js_id, request=request):
                js = join_sets.setdefault(js_id, JoinSetView(js_id))
                if isinstance(request, ev.ChildExecutionRequest):
                    js.members.append(Member(request.child_execution_id, request.target_ffqn))
                else:
                    js.members.append(Member(request.delay_id, None))
            case (
                ev.JoinNext(join_set_id=js_id) | ev.JoinNextTry(join_set_id=js_id, outcome="found")
            ) if js_id in join_sets:
                join_sets[js_id].consumed += 1
            case _:
                pass
    return join_sets


def teardown_view(
    events: Sequence[ev.StoredEvent], responses: Sequence[ev.StoredResponse]
) -> TeardownView:
    """The join sets of a workflow, from its log and responses."""
    finished = any(isinstance(stored.event, ev.Finished) for stored in events)
    forced = any(
        isinstance(stored.event, ev.CancellationRequested) and stored.event.forced
        for stored in events
    )
    join_sets = join_sets_in(
        stored.event.event for stored in events if isinstance(stored.event, ev.HistoryEvent)
    )
    for stored_response in responses:
        r = stored_response.response
        source = r.child_execution_id if isinstance(r, ev.ChildExecutionFinished) else r.delay_id
        js_view = join_sets.get(r.join_set_id)
        if js_view is not None:
            js_view.answered.add(source)
    next_version = events[-1].version + 1 if events else 0
    return TeardownView(next_version, finished, list(join_sets.values()), forced)


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------


class CancellationDriver:
    """Tears down cancelling workflows and finishes cancelling activities (SPEC §8)."""

    INTERVAL = 1.0
    #: Executions handled at once.
    CONCURRENCY = 16
    #: Planning rounds per execution and pass (each round makes progress or stops).
    MAX_ROUNDS = 1000

    def __init__(self, storage: Storage, clock: Clock) -> None:
        self.storage = storage
        self.clock = clock
        self._task: asyncio.Task[None] | None = None
        #: Executions that wait for responses, with the (version, responses) they wait at:
        #: the periodic pass skips them until something changed.
        self._waiting: dict[str, tuple[int, int]] = {}
        #: The earliest lock expiry of a cancelling locked workflow.
        self._next_expiry: datetime | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="cancellation driver")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        listener = self.storage.subscribe_cancellations()
        next_scan = loop.time()
        while True:
            try:
                if loop.time() >= next_scan:
                    await self.tick()
                    next_scan = loop.time() + self._until_next_scan()
                changed = await listener.wait_cancelling(next_scan - loop.time())
                if changed:
                    await self.handle(sorted(changed))
                    # A locked one may have been seen: be there when its lock expires.
                    next_scan = min(next_scan, loop.time() + self._until_next_scan())
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug or a storage failure: log, keep driving
                log.exception("cancellation driver failed; trying again")
                await asyncio.sleep(self.INTERVAL)

    def _until_next_scan(self) -> float:
        wait = self.INTERVAL
        if self._next_expiry is not None:
            until = (self._next_expiry - self.clock.now()).total_seconds()
            wait = min(wait, max(until, 0.01))
        return wait

    async def tick(self) -> int:
        """A pass over every cancelling execution; returns how many it looked at."""
        rows: list[tuple[str, ExecutionSummary]] = []
        after = ""
        while True:
            page = await self.storage.cancelling_executions(after, 1000)
            rows += page
            if len(page) < 1000:
                break
            after = page[-1][0]
        seen = {execution_id for execution_id, _ in rows}
        self._waiting = {k: v for k, v in self._waiting.items() if k in seen}
        self._next_expiry = None
        todo = [
            (execution_id, s)
            for execution_id, s in rows
            if self._waiting.get(execution_id) != (s.next_version, s.responses)
        ]
        await self._drive_all(todo)
        return len(rows)

    async def handle(self, execution_ids: Sequence[str]) -> None:
        """Drive the given executions (those the storage announced as changed)."""
        todo: list[tuple[str, ExecutionSummary]] = []
        for execution_id in execution_ids:
            try:
                s = await self.storage.get_summary(execution_id)
            except NotFound:
                continue
            if s.cancelling:
                todo.append((execution_id, s))
        await self._drive_all(todo)

    async def _drive_all(self, todo: list[tuple[str, ExecutionSummary]]) -> None:
        semaphore = asyncio.Semaphore(self.CONCURRENCY)

        async def one(execution_id: str, s: ExecutionSummary) -> None:
            async with semaphore:
                try:
                    await self.drive(execution_id, s)
                except StorageError as e:
                    log.warning("cancellation of %s: %s (trying again)", execution_id, e)

        await asyncio.gather(*(one(e, s) for e, s in todo))

    async def drive(self, execution_id: str, s: ExecutionSummary) -> None:
        """One step forward for one cancelling execution, as far as it can go now."""
        if s.is_finished or not s.cancelling:
            return
        now = self.clock.now()
        u = s.underlying
        if isinstance(u, Locked):
            if u.lock_expires_at > now:
                # Its run is being interrupted; the lock is released (or expires) soon.
                if self._next_expiry is None or u.lock_expires_at < self._next_expiry:
                    self._next_expiry = u.lock_expires_at
                return
            if not s.is_workflow:
                return  # the timers watcher finishes it (SPEC §6.3)
            # The run is gone without releasing the lock: release it here, or the
            # watcher would finish the workflow without tearing its join sets down.
            with contextlib.suppress(Conflict):
                await self.storage.append(
                    execution_id, s.next_version, [ev.Unlocked(now, "cancelled")], now
                )
            return
        if not s.is_workflow:
            with contextlib.suppress(Conflict):
                await self.storage.append(
                    execution_id, s.next_version, [ev.Finished(CANCELLED)], now
                )
            return
        await self._teardown(execution_id)

    async def _teardown(self, execution_id: str) -> None:
        for _ in range(self.MAX_ROUNDS):
            events = await self.storage.get_events(execution_id)
            responses = await self.storage.get_responses(execution_id)
            view = teardown_view(events, responses)
            if view.finished:
                self._waiting.pop(execution_id, None)
                return
            now = self.clock.now()
            js = view.current()
            if js is None:
                self._waiting.pop(execution_id, None)
                with contextlib.suppress(Conflict):  # someone else moved it on: next pass
                    await self.storage.append(
                        execution_id, view.next_version, [ev.Finished(CANCELLED)], now
                    )
                return
            if await self._cancel_members(execution_id, js.unanswered(), now, view.forced):
                continue  # cancelled members may have answered already: plan again
            count = js.closing_join_nexts()
            if count == 0:
                # Waiting for responses (awaited children, interrupted activities).
                self._waiting[execution_id] = (view.next_version, len(responses))
                return
            closing = ev.HistoryEvent(ev.JoinNext(js.id, now, None, closing=True))
            try:
                await self.storage.append(execution_id, view.next_version, [closing] * count, now)
            except Conflict:
                return  # raced with another writer: the next pass plans again
        log.error("cancellation of %s: no end after %d rounds", execution_id, self.MAX_ROUNDS)

    async def _cancel_members(
        self, execution_id: str, members: list[Member], now: datetime, forced: bool
    ) -> bool:
        """Cancel what may be cancelled (with `forced`, every child), in the given
        (reverse submission) order. Returns whether anything was written."""
        summaries = await asyncio.gather(*(self._child_summary(m) for m in members))
        writes = []
        for member, child in zip(members, summaries, strict=True):
            if member.is_delay:
                writes.append(self.storage.cancel_delay(member.id, now))
            elif child is not None and _needs_cancellation(child, forced):
                writes.append(self.storage.request_cancellation(member.id, now, forced))
        if not writes:
            return False
        # Started in order, the writes are queued (and committed) in that order.
        results = await asyncio.gather(*writes, return_exceptions=True)
        wrote = False
        for result in results:
            if isinstance(result, Conflict | NotFound | NotCancellable):
                continue  # answered meanwhile, or not ours to cancel: fine
            if isinstance(result, BaseException):
                raise result
            wrote = True
        if not wrote:
            log.debug("cancellation of %s: members were already answered", execution_id)
        return wrote

    async def _child_summary(self, member: Member) -> ExecutionSummary | None:
        if member.is_delay:
            return None
        try:
            return await self.storage.get_summary(member.id)
        except NotFound:
            log.warning("cancellation: child %s is missing", member.id)
            return None


def _needs_cancellation(child: ExecutionSummary, forced: bool) -> bool:
    """An activity or a `-cancellable` workflow (with `forced`, any child) that was not
    cancelled yet; other child workflows are awaited."""
    if child.is_finished or child.cancelling:
        return False
    return forced or is_cancellable(child.ffqn, child.is_workflow)


__all__ = ["CancellationDriver", "JoinSetView", "Member", "TeardownView", "teardown_view"]
