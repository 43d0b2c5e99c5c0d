"""The logical transactions: async functions on the writer's connection (`_Conn`), run in
a batch (`engine.storage.postgres.batches`): create, lock pending, append, responses,
logs, backtraces, delays. Each notes what to announce after the commit (`Notes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from engine.core import events as ev
from engine.core.ids import DelayId, IdError, parent_id_text
from engine.core.records import LogLine
from engine.core.state import (
    ExecutionSummary,
    IllegalAppend,
    PendingAt,
    apply_event,
    apply_response,
    created_summary,
)
from engine.storage.common import (
    Notes,
    PreparedBacktrace,
    direct_locked,
    dt,
    not_before,
    projection,
    response_source,
    summary_decoder,
    us,
)
from engine.storage.contract import (
    AppendExtras,
    Conflict,
    CreateRequest,
    DirectLock,
    LockedExecution,
    NotFound,
    StorageError,
    VersionConflict,
)
from engine.storage.postgres.batches import _Conn

# ---------------------------------------------------------------------------------------
# Logical transactions
# ---------------------------------------------------------------------------------------


async def _load_for_update(c: _Conn, execution_id: str) -> tuple[ExecutionSummary, int]:
    """The summary and `updated_at` (µs), the row locked until the commit: appends to one
    execution are serialised here, whichever process makes them."""
    row = await c.row(
        "SELECT summary, updated_at FROM executions WHERE execution_id = $1 FOR UPDATE",
        execution_id,
    )
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    return summary_decoder.decode(row[0]), int(row[1])


_UPDATE_SUMMARY = (
    "UPDATE executions SET state = $2, pending_at = $3, lock_expires_at = $4, "
    "next_version = $5, updated_at = $6, summary = $7 WHERE execution_id = $1"
)


async def _write_summary(
    c: _Conn,
    execution_id: str,
    s: ExecutionSummary,
    at: datetime,
    events: Sequence[tuple[int, int, bytes, int | None]] = (),
) -> None:
    """The new summary and the events (version, created_at, blob, backtrace id): one
    statement, one round trip."""
    state, pending_at, lock_expires_at = projection(s)
    args: list[Any] = [
        execution_id,
        state,
        pending_at,
        lock_expires_at,
        s.next_version,
        us(at),
        ev.encode(s),
    ]
    if not events:
        await c.write(_UPDATE_SUMMARY, *args)
        return
    await c.write(
        f"WITH u AS ({_UPDATE_SUMMARY}) "
        "INSERT INTO events (execution_id, version, created_at, event, backtrace_id) "
        "SELECT $1, v, t, e, b FROM unnest($8::int[], $9::bigint[], $10::bytea[], $11::bigint[]) "
        "AS x(v, t, e, b)",
        *args,
        [e[0] for e in events],
        [e[1] for e in events],
        [e[2] for e in events],
        [e[3] for e in events],
    )


async def _create_many(
    c: _Conn, notes: Notes, requests: Sequence[CreateRequest], now: datetime
) -> None:
    """Insert executions and their `created` events in one statement; an id that exists
    already is fine with the same FFQN and params (idempotent), a Conflict otherwise."""
    unique: dict[str, CreateRequest] = {}
    for req in requests:
        seen = unique.get(req.execution_id)
        if seen is None:
            unique[req.execution_id] = req
        elif (seen.created.ffqn, seen.created.params) != (req.created.ffqn, req.created.params):
            raise Conflict(f"execution {req.execution_id} already exists with other parameters")
    if not unique:
        return
    t = us(now)
    cols: list[list[Any]] = [[] for _ in range(11)]
    locked: dict[str, tuple[DirectLock, ExecutionSummary]] = {}
    for req in unique.values():
        created = req.created
        s = created_summary(created, now)
        lock_blob: bytes | None = None
        if req.lock is not None:
            try:
                s = apply_event(s, req.lock.locked, now)
                locked[req.execution_id] = (req.lock, s)
                lock_blob = ev.encode(req.lock.locked)
            except IllegalAppend:  # not due yet: created pending
                notes.direct.append((req.lock, None))
        state, pending_at, lock_expires_at = projection(s)
        for col, value in zip(
            cols,
            (
                req.execution_id,
                created.ffqn,
                created.component_id.type,
                created.parent[0] if created.parent else None,
                state,
                pending_at,
                lock_expires_at,
                ev.encode(s),
                ev.encode(created),
                s.next_version,
                lock_blob,
            ),
            strict=True,
        ):
            col.append(value)
    inserted = await c.write_rows(
        "WITH x AS (SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], "
        "$5::text[], $6::bigint[], $7::bigint[], $8::bytea[], $9::bytea[], $10::int[], "
        "$11::bytea[]) AS x(id, ffqn, ctype, parent, state, pending_at, lock_expires_at, "
        "summary, created, next_version, locked)), "
        "ins AS (INSERT INTO executions (execution_id, ffqn, component_type, parent_id, state, "
        "pending_at, lock_expires_at, next_version, created_at, updated_at, summary) "
        "SELECT id, ffqn, ctype, parent, state, pending_at, lock_expires_at, next_version, "
        "$12, $12, summary FROM x ON CONFLICT (execution_id) DO NOTHING RETURNING execution_id), "
        "evs AS (INSERT INTO events (execution_id, version, created_at, event) "
        "SELECT x.id, 0, $12, x.created FROM x JOIN ins ON ins.execution_id = x.id "
        "UNION ALL SELECT x.id, 1, $12, x.locked FROM x JOIN ins ON ins.execution_id = x.id "
        "WHERE x.locked IS NOT NULL) "
        "SELECT execution_id FROM ins",
        *cols,
        t,
    )
    done = {r[0] for r in inserted}
    for execution_id in done:
        if execution_id in locked:
            lock, s = locked[execution_id]
            notes.direct.append((lock, direct_locked(unique[execution_id], lock, s)))
        else:
            created = unique[execution_id].created
            notes.became_pending(created.ffqn, created.scheduled_at, now)
    for execution_id, (lock, _) in locked.items():
        if execution_id not in done:  # it existed already: not locked here
            notes.direct.append((lock, None))
    existing = [eid for eid in unique if eid not in done]
    if not existing:
        return
    rows = await c.rows(
        "SELECT execution_id, event FROM events WHERE version = 0 "
        "AND execution_id = ANY($1::text[])",
        existing,
    )
    found = {r[0]: r[1] for r in rows}
    for execution_id in existing:
        blob = found.get(execution_id)
        if blob is None:
            raise StorageError(f"execution {execution_id} exists without its created event")
        old = ev.decode_event(blob)
        assert isinstance(old, ev.Created)
        new = unique[execution_id].created
        if (old.ffqn, old.params) != (new.ffqn, new.params):
            raise Conflict(f"execution {execution_id} already exists with other parameters")


async def _lock_pending(
    c: _Conn,
    notes: Notes,
    ffqns: list[str],
    batch_size: int,
    now: datetime,
    locked: ev.Locked,
    with_log: bool,
    pinned_digest: str | None,
) -> list[LockedExecution]:
    if not ffqns or batch_size <= 0:
        return []
    pin = "e.pinned_digest IS NULL" if pinned_digest is None else "e.pinned_digest = $4"
    args: list[Any] = [ffqns, us(now), batch_size]
    if pinned_digest is not None:
        args.append(pinned_digest)
    # SKIP LOCKED: rows another process's batch is locking right now are left to it.
    rows = await c.rows(
        "SELECT e.execution_id, e.summary, e.updated_at, cr.event FROM executions e "
        "JOIN events cr ON cr.execution_id = e.execution_id AND cr.version = 0 "
        f"WHERE e.ffqn = ANY($1::text[]) AND e.pending_at <= $2 AND {pin} "
        "ORDER BY e.pending_at LIMIT $3 FOR UPDATE OF e SKIP LOCKED",
        *args,
    )
    if not rows:
        return []
    event_blob = ev.encode(locked)
    ids: list[str] = []
    summaries: list[ExecutionSummary] = []
    ats: list[int] = []
    cols: list[list[Any]] = [[] for _ in range(6)]
    for execution_id, blob, updated_at, _ in rows:
        at = not_before(now, updated_at)
        s = apply_event(summary_decoder.decode(blob), locked, at)
        state, pending_at, lock_expires_at = projection(s)
        ids.append(execution_id)
        summaries.append(s)
        ats.append(us(at))
        for col, value in zip(
            cols,
            (state, pending_at, lock_expires_at, s.next_version, us(at), ev.encode(s)),
            strict=True,
        ):
            col.append(value)
    await c.write(
        "WITH x AS (SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], "
        "$5::int[], $6::bigint[], $7::bytea[]) AS x(id, state, pending_at, lock_expires_at, "
        "next_version, updated_at, summary)), "
        "u AS (UPDATE executions e SET state = x.state, pending_at = x.pending_at, "
        "lock_expires_at = x.lock_expires_at, next_version = x.next_version, "
        "updated_at = x.updated_at, summary = x.summary FROM x WHERE e.execution_id = x.id) "
        "INSERT INTO events (execution_id, version, created_at, event) "
        "SELECT id, next_version - 1, updated_at, $8 FROM x",
        ids,
        *cols,
        event_blob,
    )
    events_of: dict[str, list[ev.StoredEvent]] = {}
    responses_of: dict[str, list[ev.StoredResponse]] = {}
    if with_log:
        for eid, v, t, b, bt in await c.rows(
            "SELECT execution_id, version, created_at, event, backtrace_id FROM events "
            "WHERE execution_id = ANY($1::text[]) ORDER BY execution_id, version",
            ids,
        ):
            events_of.setdefault(eid, []).append(ev.StoredEvent(v, dt(t), ev.decode_event(b), bt))
        for eid, cur, t, b in await c.rows(
            "SELECT execution_id, cursor, created_at, response FROM responses "
            "WHERE execution_id = ANY($1::text[]) ORDER BY execution_id, cursor",
            ids,
        ):
            responses_of.setdefault(eid, []).append(
                ev.StoredResponse(cur, dt(t), ev.decode_response(b))
            )
    result: list[LockedExecution] = []
    for (execution_id, _, _, created_blob), s in zip(rows, summaries, strict=True):
        created = ev.decode_event(created_blob)
        assert isinstance(created, ev.Created)
        result.append(
            LockedExecution(
                execution_id=execution_id,
                ffqn=created.ffqn,
                params=created.params,
                next_version=s.next_version,
                run_id=locked.run_id,
                lock_expires_at=locked.lock_expires_at,
                parent=created.parent,
                summary=s,
                events=events_of.get(execution_id, []) if with_log else None,
                responses=responses_of.get(execution_id, []) if with_log else None,
            )
        )
    return result


async def _append(
    c: _Conn,
    notes: Notes,
    execution_id: str,
    expected_version: int,
    events: list[ev.Event],
    now: datetime,
    extras: AppendExtras | None,
    backtraces: Sequence[PreparedBacktrace] = (),
) -> ExecutionSummary:
    s, updated_at = await _load_for_update(c, execution_id)
    now = not_before(now, updated_at)
    if s.next_version != expected_version:
        raise VersionConflict(
            f"execution {execution_id}: expected version {expected_version}, "
            f"but the next version is {s.next_version}"
        )
    creates = {r.execution_id: r for r in (extras.creates if extras else [])}
    # Validate everything first (pure): a rejected append writes nothing at all.
    to_create: list[CreateRequest] = []
    delays: list[tuple[str, str, int]] = []
    due_delays: list[ev.DelayFinished] = []
    finished: ev.ExecutionResult | None = None
    states: list[ExecutionSummary] = []
    for event in events:
        try:
            s = apply_event(s, event, now)
        except IllegalAppend as e:
            raise Conflict(f"execution {execution_id}: {e}") from None
        match event:
            case ev.HistoryEvent(event=ev.JoinSetRequest(join_set_id=js, request=req)):
                if isinstance(req, ev.ChildExecutionRequest):
                    to_create.append(_creation(creates, req.child_execution_id))
                elif req.expires_at <= now:
                    # Already due (e.g. a clock read): answered in the same transaction.
                    response = ev.DelayFinished(req.delay_id, js, "ok")
                    try:
                        s = apply_response(s, response, now)
                    except IllegalAppend as e:
                        raise Conflict(f"execution {execution_id}: {e}") from None
                    due_delays.append(response)
                    notes.responses.add(execution_id)
                else:
                    delays.append((req.delay_id, js, us(req.expires_at)))
            case ev.HistoryEvent(event=ev.Schedule(execution_id=scheduled)):
                to_create.append(_creation(creates, scheduled))
            case ev.Finished(result=result):
                finished = result
                notes.finished.append((execution_id, result))
            case ev.CancellationRequested():
                notes.cancelled.add(execution_id)
            case _:
                pass
        states.append(s)
    backtrace_of = await _backtrace_ids(c, backtraces)
    t = us(now)
    first = expected_version
    rows = [(first + i, t, ev.encode(event), backtrace_of.get(i)) for i, event in enumerate(events)]
    await _write_summary(c, execution_id, s, now, rows)
    if to_create:
        await _create_many(c, notes, to_create, now)
    if delays:
        await c.write(
            "INSERT INTO delays (delay_id, execution_id, join_set_id, expires_at) "
            "SELECT d, $1, j, x FROM unnest($2::text[], $3::text[], $4::bigint[]) AS u(d, j, x)",
            execution_id,
            [d[0] for d in delays],
            [d[1] for d in delays],
            [d[2] for d in delays],
        )
    if due_delays:
        # The cursors the summary counted: the last len(due_delays) ones.
        first_cursor = s.responses - len(due_delays) + 1
        notes.response_items += [
            (execution_id, ev.StoredResponse(first_cursor + i, dt(t), d))
            for i, d in enumerate(due_delays)
        ]
        await c.write(
            "INSERT INTO responses (execution_id, cursor, created_at, source_id, response) "
            "SELECT $1, c, $2, src, r FROM unnest($3::int[], $4::text[], $5::bytea[]) "
            "AS u(c, src, r)",
            execution_id,
            t,
            list(range(first_cursor, s.responses + 1)),
            [d.delay_id for d in due_delays],
            [ev.encode(d) for d in due_delays],
        )
    if finished is not None:
        if s.is_workflow:  # only workflows have delays
            await c.write("DELETE FROM delays WHERE execution_id = $1", execution_id)
        # (The id was read from storage: valid, so its text is enough.)
        parent = parent_id_text(execution_id)
        if parent is not None:
            parent_id, join_set = parent
            await _add_response(
                c,
                notes,
                parent_id,
                ev.ChildExecutionFinished(execution_id, join_set, s.next_version - 1, finished),
                now,
            )
    if isinstance(s.state, PendingAt):
        notes.became_pending(s.ffqn, s.state.scheduled_at, now)
    if s.cancelling:
        notes.cancelling.add(execution_id)
    if extras and extras.logs:
        await _insert_logs(c, execution_id, extras.run_id, extras.logs, now)
    return s


def _creation(creates: dict[str, CreateRequest], execution_id: str) -> CreateRequest:
    req = creates.get(execution_id)
    if req is None:
        raise StorageError(f"missing creation request for {execution_id}")
    return req


async def _add_response(
    c: _Conn, notes: Notes, execution_id: str, response: ev.Response, now: datetime
) -> ExecutionSummary:
    """A response to `execution_id` (locked here), at `now` or just after its last write;
    a second response from the same child or delay is a Conflict."""
    s, updated_at = await _load_for_update(c, execution_id)
    at = not_before(now, updated_at)
    source = response_source(response)
    try:
        s = apply_response(s, response, at)
    except IllegalAppend as e:
        raise Conflict(f"execution {execution_id}: {e}") from None
    state, pending_at, lock_expires_at = projection(s)
    delete_delay = (
        "d AS (DELETE FROM delays WHERE delay_id = $12 AND EXISTS (SELECT 1 FROM r)), "
        if isinstance(response, ev.DelayFinished)
        else ""
    )
    args: list[Any] = [
        execution_id,
        s.responses,
        us(at),
        source,
        ev.encode(response),
        state,
        pending_at,
        lock_expires_at,
        s.next_version,
        us(at),
        ev.encode(s),
    ]
    if delete_delay:
        args.append(response.delay_id)  # type: ignore[union-attr]
    # One statement: insert unless duplicate, then the delay and summary only if inserted.
    # A duplicate (watchers of several processes answering one delay) changes nothing, so
    # it counts as no write: the batch goes on without a rollback.
    row = await c.row(
        "WITH r AS (INSERT INTO responses (execution_id, cursor, created_at, source_id, "
        "response) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING 1), "
        + delete_delay
        + "u AS (UPDATE executions SET state = $6, pending_at = $7, lock_expires_at = $8, "
        "next_version = $9, updated_at = $10, summary = $11 "
        "WHERE execution_id = $1 AND EXISTS (SELECT 1 FROM r)) "
        "SELECT count(*) FROM r",
        *args,
    )
    if row is None or row[0] == 0:
        raise Conflict(f"execution {execution_id} already has a response for {source}")
    c.wrote = True
    notes.responses.add(execution_id)
    stored = ev.StoredResponse(s.responses, dt(us(at)), response)
    notes.response_items.append((execution_id, stored))
    if isinstance(s.state, PendingAt):
        notes.became_pending(s.ffqn, s.state.scheduled_at, at)
    if s.cancelling:
        notes.cancelling.add(execution_id)
    return s


async def _insert_logs(
    c: _Conn, execution_id: str, run_id: str | None, lines: Sequence[LogLine], now: datetime
) -> None:
    await c.write(
        "INSERT INTO logs (execution_id, run_id, created_at, level, stream, message) "
        "SELECT $1, $2, t, l, s, m FROM unnest($3::bigint[], $4::text[], $5::text[], "
        "$6::text[]) WITH ORDINALITY AS u(t, l, s, m, n) ORDER BY n",
        execution_id,
        run_id,
        [us(line.written_at(now)) for line in lines],
        [line.level for line in lines],
        [line.stream for line in lines],
        [line.message for line in lines],
    )


async def _backtrace_ids(c: _Conn, backtraces: Sequence[PreparedBacktrace]) -> dict[int, int]:
    """`at` → backtrace id, each distinct stack looked up (and inserted if new) once."""
    by_key: dict[bytes, int] = {}
    out: dict[int, int] = {}
    for bt in backtraces:
        found = by_key.get(bt.key)
        if found is None:
            found = by_key[bt.key] = await _backtrace_id(c, bt)
        out[bt.at] = found
    return out


async def _backtrace_id(c: _Conn, bt: PreparedBacktrace) -> int:
    row = await c.row("SELECT backtrace_id FROM backtraces WHERE hash = $1", bt.key)
    if row is None:
        row = await c.row(
            "INSERT INTO backtraces (hash, component_digest, frames) VALUES ($1, $2, $3) "
            "ON CONFLICT (hash) DO NOTHING RETURNING backtrace_id",
            bt.key,
            bt.component_digest,
            bt.frames,
        )
        if row is not None:
            c.wrote = True
        else:  # another process inserted it meanwhile: read it in a fresh snapshot
            row = await c.row("SELECT backtrace_id FROM backtraces WHERE hash = $1", bt.key)
    assert row is not None
    return int(row[0])


async def _replace_backtraces(
    c: _Conn, execution_id: str, backtraces: Sequence[PreparedBacktrace], below_version: int
) -> int:
    await _load_for_update(c, execution_id)  # NotFound
    await c.write(
        "UPDATE events SET backtrace_id = NULL "
        "WHERE execution_id = $1 AND version < $2 AND backtrace_id IS NOT NULL",
        execution_id,
        below_version,
    )
    ids = await _backtrace_ids(c, [bt for bt in backtraces if bt.at < below_version])
    if not ids:
        return 0
    status = await c.write(
        "UPDATE events e SET backtrace_id = u.b FROM unnest($2::int[], $3::bigint[]) AS u(v, b) "
        "WHERE e.execution_id = $1 AND e.version = u.v",
        execution_id,
        list(ids),
        list(ids.values()),
    )
    return int(status.split()[-1])


async def _cancel_delay(c: _Conn, notes: Notes, delay_id: str, now: datetime) -> ExecutionSummary:
    """`delay_finished(cancelled)` to the owner of a live delay (SPEC §8)."""
    row = await c.row("SELECT execution_id, join_set_id FROM delays WHERE delay_id = $1", delay_id)
    if row is None:
        try:
            owner = str(DelayId.parse(delay_id).owner()[0])
        except IdError:
            raise NotFound(f"delay {delay_id} not found") from None
        answered = await c.row(
            "SELECT 1 FROM responses WHERE execution_id = $1 AND source_id = $2", owner, delay_id
        )
        if answered is not None:
            raise Conflict(f"delay {delay_id} has already finished")
        requested = await c.row(
            "SELECT 1 FROM events WHERE execution_id = $1 AND position($2::bytea IN event) > 0 "
            "LIMIT 1",
            owner,
            ev.encode(delay_id),
        )
        if requested is not None:  # its execution finished without it
            raise Conflict(f"delay {delay_id} cannot be cancelled: {owner} is already finished")
        raise NotFound(f"delay {delay_id} not found")
    execution_id, join_set_id = row
    try:
        return await _add_response(
            c, notes, execution_id, ev.DelayFinished(delay_id, join_set_id, "cancelled"), now
        )
    except Conflict:
        # Answered meanwhile by another process (the delay expired there).
        raise Conflict(f"delay {delay_id} has already finished") from None
