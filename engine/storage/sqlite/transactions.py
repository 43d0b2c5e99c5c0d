"""The logical transactions: synchronous functions run on the writer's connection in a
batch (`engine.storage.sqlite.batches`): create, lock pending, append, responses,
logs, backtraces, pause / cancel, delays. Each notes what the loop must announce after
the commit (`Notes`).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from engine.core import events as ev
from engine.core.ids import DelayId, parent_id_text
from engine.core.records import LogLine
from engine.core.state import (
    ExecutionSummary,
    IllegalAppend,
    PendingAt,
    PendingState,
    apply_event,
    apply_response,
    created_summary,
)
from engine.storage.common import (
    Notes,
    PreparedBacktrace,
    cancel_events,
    direct_locked,
    dt,
    not_before_us,
    pause_events,
    prepare_backtraces,
    projection,
    summary_decoder,
    us,
)
from engine.storage.contract import (
    AppendExtras,
    Conflict,
    CreateRequest,
    LockedExecution,
    NotFound,
    StorageError,
    VersionConflict,
)
from engine.storage.sqlite.connection import _summaries
from engine.storage.sqlite.optimistic import (
    UPDATE_SUMMARY,
    BufferedConnection,
    NeedsWriteLock,
    update_summaries_sql,
)

_summary_decoder = summary_decoder
_PreparedBacktrace = PreparedBacktrace
_prepare_backtraces = prepare_backtraces
_us = us
_dt = dt
_not_before_us = not_before_us
_projection = projection
_Notes = Notes


# ---------------------------------------------------------------------------------------
# Logical transactions: synchronous, run on the writer thread inside a SAVEPOINT.
# ---------------------------------------------------------------------------------------


def _load_summary(conn: sqlite3.Connection, execution_id: str) -> ExecutionSummary:
    cache = _summaries(conn)
    if cache is not None and (found := cache.get(execution_id)) is not None:
        return found[0]
    row = conn.execute(
        "SELECT summary FROM executions WHERE execution_id = ?", (execution_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    return _summary_decoder.decode(row[0])


def _load_summary_for_write(
    conn: sqlite3.Connection, execution_id: str, now: datetime
) -> tuple[ExecutionSummary, datetime, int]:
    """The summary, and `now` or just after the execution's last write if that is later
    (as a datetime and in µs), with one read of the row.

    Callers take `now` before their transaction is queued (a workflow run on its worker
    thread, the watcher before a read), so transactions can commit out of timestamp
    order. A log is read back by interleaving events and responses by time
    (`replay_stored`, the console): a transaction of an execution never gets a timestamp
    before the previous one, so that this order is the commit order.
    """
    cache = getattr(conn, "summaries", None)  # `_summaries`, inline: every write
    if cache is not None and (found := cache.get(execution_id)) is not None:
        return found[0], *_not_before_us(now, found[1])
    row = conn.execute(
        "SELECT summary, updated_at FROM executions WHERE execution_id = ?", (execution_id,)
    ).fetchone()
    if row is None:
        raise NotFound(f"execution {execution_id} not found")
    s: ExecutionSummary = _summary_decoder.decode(row[0])
    if cache is not None:
        cache.put(execution_id, s, row[1])
    return s, *_not_before_us(now, row[1])


def _write_summary(
    conn: sqlite3.Connection,
    execution_id: str,
    s: ExecutionSummary,
    now: datetime,
    t: int | None = None,
    state: PendingState | None = None,
) -> None:
    """`t`: `now` in µs, `state`: `s.state`, when the caller has them."""
    name, pending_at, lock_expires_at = _projection(s, state)
    if t is None:
        t = _us(now)
    conn.execute(
        UPDATE_SUMMARY,
        (name, pending_at, lock_expires_at, s.next_version, t, ev.encode(s), execution_id),
    )
    cache = getattr(conn, "summaries", None)  # `_summaries`, inline: every write
    if cache is not None:
        cache.put(execution_id, s, t)


def _create(
    conn: sqlite3.Connection,
    notes: _Notes,
    req: CreateRequest,
    now: datetime,
    event_rows: list[Any] | None = None,
) -> None:
    """Create `req`'s execution. With `event_rows` (a parent's `_append`), its events
    go there, to be inserted with the parent's in one statement."""
    created = req.created
    t = _us(now)
    s = created_summary(created, now)
    lock = req.lock
    if lock is not None:
        try:
            s = apply_event(s, lock.locked, now)
        except IllegalAppend:  # not due yet (or a lock in the past): created pending
            notes.direct.append((lock, None))
            lock = None
    state, pending_at, lock_expires_at = _projection(s)
    parent_id = created.parent[0] if created.parent else None
    try:
        # Insert first: the id exists only on a re-submission (no read on the usual path).
        conn.execute(
            "INSERT INTO executions (execution_id, ffqn, component_type, parent_id, state, "
            "pending_at, lock_expires_at, next_version, created_at, updated_at, summary) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                req.execution_id,
                created.ffqn,
                created.component_id.type,
                parent_id,
                state,
                pending_at,
                lock_expires_at,
                s.next_version,
                t,
                t,
                ev.encode(s),
            ),
        )
    except sqlite3.IntegrityError:
        existing = conn.execute(
            "SELECT event FROM events WHERE execution_id = ? AND version = 0", (req.execution_id,)
        ).fetchone()
        if existing is None:
            raise
        old = ev.decode_event(existing[0])
        assert isinstance(old, ev.Created)
        if old.ffqn == created.ffqn and old.params == created.params:
            if lock is not None:
                notes.direct.append((lock, None))  # someone else's: not locked here
            return  # idempotent re-submission
        raise Conflict(
            f"execution {req.execution_id} already exists with other parameters"
        ) from None
    cache = _summaries(conn)
    if cache is not None:
        cache.put(req.execution_id, s, t)
    if lock is None:
        if event_rows is not None:
            event_rows += (req.execution_id, 0, t, ev.encode(created), None)
        else:
            conn.execute(
                "INSERT INTO events (execution_id, version, created_at, event) VALUES (?,?,?,?)",
                (req.execution_id, 0, t, ev.encode(created)),
            )
        notes.became_pending(created.ffqn, created.scheduled_at, now)
        return
    rows: list[Any] = [req.execution_id, 0, t, ev.encode(created), None]
    rows += (req.execution_id, 1, t, ev.encode(lock.locked), None)
    if event_rows is not None:
        event_rows += rows
    else:
        conn.execute(
            "INSERT INTO events (execution_id, version, created_at, event, backtrace_id) "
            "VALUES (?,?,?,?,?),(?,?,?,?,?)",
            rows,
        )
    notes.direct.append((lock, direct_locked(req, lock, s)))


def _due_rows(
    conn: sqlite3.Connection,
    ffqns: list[str],
    limit: int,
    now_us: int,
    pinned_digest: str | None,
) -> list[tuple[str, int, bytes, int]]:
    """The first `limit` due executions of `ffqns` by `pending_at`:
    (execution_id, pending_at, summary, updated_at).

    One ordered, limited index range per FFQN (`UNION ALL`), merged here. A single
    `ffqn IN (…) ORDER BY pending_at LIMIT n` sorts *every* due row of those FFQNs first
    (a temp b-tree): with a backlog of N due executions each lock would read all N.
    """
    pin = "pinned_digest IS NULL" if pinned_digest is None else "pinned_digest = ?"
    one = (
        "SELECT * FROM (SELECT execution_id, pending_at, summary, updated_at FROM executions "
        f"WHERE ffqn = ? AND pending_at <= ? AND {pin} ORDER BY pending_at LIMIT ?)"
    )
    pin_args = [] if pinned_digest is None else [pinned_digest]
    rows: list[tuple[str, int, bytes, int]] = []
    for i in range(0, len(ffqns), 200):  # SQLite allows up to 500 terms in a compound select
        chunk = ffqns[i : i + 200]
        args: list[Any] = []
        for ffqn in chunk:
            args += [ffqn, now_us, *pin_args, limit]
        rows += conn.execute(" UNION ALL ".join([one] * len(chunk)), args).fetchall()
    if len(ffqns) > 1:
        rows.sort(key=lambda row: row[1])
        del rows[limit:]
    return rows


def _write_locks(
    conn: sqlite3.Connection,
    locks: list[tuple[str, int, ExecutionSummary]],
    event_blob: bytes,
) -> None:
    """The `locked` events (at µs `t` of each `(id, t, summary)`) and new summaries of a
    lock batch, in two statements per 500 executions (not two each: every statement is
    a GIL hand-off on the writer thread)."""
    cache = _summaries(conn)
    for i in range(0, len(locks), 500):
        chunk = locks[i : i + 500]
        events: list[Any] = []
        values: list[Any] = []
        for execution_id, t, s in chunk:
            events += (execution_id, s.next_version - 1, t, event_blob)
            state, pending_at, lock_expires_at = _projection(s)
            values += (
                execution_id,
                state,
                pending_at,
                lock_expires_at,
                s.next_version,
                t,
                ev.encode(s),
            )
            if cache is not None:
                cache.put(execution_id, s, t)
        conn.execute(
            "INSERT INTO events (execution_id, version, created_at, event) VALUES "
            + ",".join(["(?,?,?,?)"] * len(chunk)),
            events,
        )
        conn.execute(update_summaries_sql(len(chunk)), values)


def _lock_pending(
    conn: sqlite3.Connection,
    notes: _Notes,
    ffqns: list[str],
    batch_size: int,
    now: datetime,
    locked: ev.Locked,
    with_log: bool,
    pinned_digest: str | None = None,
) -> list[LockedExecution]:
    now_us = _us(now)
    rows = _due_rows(conn, ffqns, batch_size, now_us, pinned_digest)
    cache = _summaries(conn)
    # An optimistic batch reads the database as it was before the batch: a row an earlier
    # transaction of the batch wrote is not as read here. (Every row is noted as touched
    # when its lock is written below.)
    if (
        cache is not None
        and isinstance(conn, BufferedConnection)
        and any(row[0] in cache.tx for row in rows)
    ):
        raise NeedsWriteLock("a due execution was written earlier in the batch")
    created_blobs: dict[str, bytes] = {}
    if rows and not with_log:
        ids = [row[0] for row in rows]
        created_blobs = dict(
            conn.execute(
                "SELECT execution_id, event FROM events WHERE version = 0 "
                f"AND execution_id IN ({','.join('?' * len(ids))})",
                ids,
            ).fetchall()
        )
    locks: list[tuple[str, int, ExecutionSummary]] = []  # (id, µs of the lock, summary)
    for execution_id, _, summary_blob, updated_at in rows:
        at, t = _not_before_us(now, updated_at, now_us)
        s = apply_event(_summary_decoder.decode(summary_blob), locked, at)
        locks.append((execution_id, t, s))
    # The logs are read before the locks are written (an optimistic batch does not see
    # its own writes): each gets its `locked` event added here.
    logs: dict[str, tuple[list[ev.StoredEvent], list[ev.StoredResponse]]] = {}
    if with_log:
        for execution_id, t_locked, s in locks:
            logs[execution_id] = (
                [
                    ev.StoredEvent(v, _dt(t), ev.decode_event(b), bt)
                    for v, t, b, bt in conn.execute(
                        "SELECT version, created_at, event, backtrace_id FROM events "
                        "WHERE execution_id = ? ORDER BY version",
                        (execution_id,),
                    )
                ]
                + [ev.StoredEvent(s.next_version - 1, _dt(t_locked), locked, None)],
                [
                    ev.StoredResponse(c, _dt(t), ev.decode_response(b))
                    for c, t, b in conn.execute(
                        "SELECT cursor, created_at, response FROM responses "
                        "WHERE execution_id = ? ORDER BY cursor",
                        (execution_id,),
                    )
                ],
            )
    _write_locks(conn, locks, ev.encode(locked))
    result: list[LockedExecution] = []
    for execution_id, _, s in locks:
        stored_events = None
        stored_responses = None
        if with_log:
            stored_events, stored_responses = logs[execution_id]
            created = stored_events[0].event
        else:
            created = ev.decode_event(created_blobs[execution_id])
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
                events=stored_events,
                responses=stored_responses,
            )
        )
    return result


def _append_fn(
    execution_id: str,
    expected_version: int,
    events: Sequence[ev.Event],
    now: datetime,
    extras: AppendExtras | None,
) -> Callable[[sqlite3.Connection, _Notes], ExecutionSummary]:
    """The logical transaction of an append (backtraces prepared by the caller's thread,
    not the writer's)."""
    backtraces = _prepare_backtraces(extras.component_digest, extras.backtraces) if extras else []
    # A `partial`, not a lambda: called in C, a Python frame less for every append.
    return functools.partial(
        _append,
        execution_id=execution_id,
        expected_version=expected_version,
        events=list(events),
        now=now,
        extras=extras,
        backtraces=backtraces,
    )


def _append(
    conn: sqlite3.Connection,
    notes: _Notes,
    execution_id: str,
    expected_version: int,
    events: list[ev.Event],
    now: datetime,
    extras: AppendExtras | None,
    backtraces: Sequence[_PreparedBacktrace] = (),
) -> ExecutionSummary:
    s, now, t = _load_summary_for_write(conn, execution_id, now)
    if s.next_version != expected_version:
        raise VersionConflict(
            f"execution {execution_id}: expected version {expected_version}, "
            f"but the next version is {s.next_version}"
        )
    # (No comprehension nor call when there is nothing: most appends.)
    creates = {c.execution_id: c for c in extras.creates} if extras and extras.creates else {}
    backtrace_of = _backtrace_ids(conn, backtraces) if backtraces else {}
    # Nothing below reads this execution's events: they are inserted at the end, in one
    # statement (each statement is a GIL hand-off on this thread).
    rows: list[Any] = []
    for index, event in enumerate(events):
        try:
            s = apply_event(s, event, now)
        except IllegalAppend as e:
            raise Conflict(f"execution {execution_id}: {e}") from None
        rows += (execution_id, s.next_version - 1, t, ev.encode(event), backtrace_of.get(index))
        match event:
            case ev.HistoryEvent(event=ev.JoinSetRequest(join_set_id=js, request=req)):
                if isinstance(req, ev.ChildExecutionRequest):
                    _create_side(conn, notes, creates, req.child_execution_id, now, rows)
                elif req.expires_at <= now:
                    # Already due (e.g. a clock read): answered in the same transaction.
                    response = ev.DelayFinished(req.delay_id, js, "ok")
                    s = _add_response(conn, notes, execution_id, response, now, summary=s)
                else:
                    conn.execute(
                        "INSERT INTO delays (delay_id, execution_id, join_set_id, expires_at) "
                        "VALUES (?,?,?,?)",
                        (req.delay_id, execution_id, js, _us(req.expires_at)),
                    )
            case ev.HistoryEvent(event=ev.Schedule(execution_id=scheduled)):
                _create_side(conn, notes, creates, scheduled, now, rows)
            case ev.Finished(result=result):
                notes.finished.append((execution_id, result))
                if s.is_workflow:  # only workflows have delays
                    conn.execute("DELETE FROM delays WHERE execution_id = ?", (execution_id,))
                # (The id was read from storage: valid, so its text is enough.)
                parent = parent_id_text(execution_id)
                if parent is not None:
                    parent_id, join_set = parent
                    _add_response(
                        conn,
                        notes,
                        parent_id,
                        ev.ChildExecutionFinished(
                            execution_id, join_set, s.next_version - 1, result
                        ),
                        now,
                    )
            case ev.CancellationRequested():
                notes.cancelled.add(execution_id)
            case _:
                pass
    for i in range(0, len(rows), 2500):  # 500 events per statement
        chunk = rows[i : i + 2500]
        conn.execute(
            "INSERT INTO events (execution_id, version, created_at, event, backtrace_id) VALUES "
            + ",".join(["(?,?,?,?,?)"] * (len(chunk) // 5)),
            chunk,
        )
    state = s.state
    _write_summary(conn, execution_id, s, now, t, state)
    if isinstance(state, PendingAt):
        notes.became_pending(s.ffqn, state.scheduled_at, now)
    if s.cancelling:
        notes.cancelling.add(execution_id)
    if extras and extras.logs:
        _insert_logs(conn, execution_id, extras.run_id, extras.logs, now)
    return s


def _backtrace_id(conn: sqlite3.Connection, bt: _PreparedBacktrace) -> int:
    """The id of the stored backtrace with these frames, inserted when new (dedup)."""
    known = getattr(conn, "backtrace_ids", None)
    if known is not None and (found := known.get(bt.key)) is not None:
        return int(found)
    row = conn.execute("SELECT backtrace_id FROM backtraces WHERE hash = ?", (bt.key,)).fetchone()
    if row is not None:
        if known is not None and bt.key not in conn.new_backtraces:  # type: ignore[attr-defined]
            known[bt.key] = int(row[0])  # committed: it stays (backtraces are never deleted)
        return int(row[0])
    cursor = conn.execute(
        "INSERT INTO backtraces (hash, component_digest, frames) VALUES (?,?,?)",
        (bt.key, bt.component_digest, bt.frames),
    )
    if known is not None:
        conn.new_backtraces.add(bt.key)  # type: ignore[attr-defined]
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _backtrace_ids(
    conn: sqlite3.Connection, backtraces: Sequence[_PreparedBacktrace]
) -> dict[int, int]:
    """`at` → backtrace id, looking each distinct stack up once."""
    by_key: dict[bytes, int] = {}
    out: dict[int, int] = {}
    for bt in backtraces:
        found = by_key.get(bt.key)
        if found is None:
            found = by_key[bt.key] = _backtrace_id(conn, bt)
        out[bt.at] = found
    return out


def _replace_backtraces(
    conn: sqlite3.Connection,
    execution_id: str,
    backtraces: Sequence[_PreparedBacktrace],
    below_version: int,
) -> int:
    _load_summary(conn, execution_id)  # NotFound
    conn.execute(
        "UPDATE events SET backtrace_id = NULL "
        "WHERE execution_id = ? AND version < ? AND backtrace_id IS NOT NULL",
        (execution_id, below_version),
    )
    count = 0
    ids = _backtrace_ids(conn, [bt for bt in backtraces if bt.at < below_version])
    for version, backtrace_id in ids.items():
        cursor = conn.execute(
            "UPDATE events SET backtrace_id = ? WHERE execution_id = ? AND version = ?",
            (backtrace_id, execution_id, version),
        )
        count += cursor.rowcount
    return count


def _create_side(
    conn: sqlite3.Connection,
    notes: _Notes,
    creates: dict[str, CreateRequest],
    execution_id: str,
    now: datetime,
    event_rows: list[Any] | None = None,
) -> None:
    req = creates.get(execution_id)
    if req is None:
        raise StorageError(f"missing creation request for {execution_id}")
    _create(conn, notes, req, now, event_rows)


def _add_response(
    conn: sqlite3.Connection,
    notes: _Notes,
    execution_id: str,
    response: ev.Response,
    now: datetime,
    summary: ExecutionSummary | None = None,
) -> ExecutionSummary:
    """Write a response to `execution_id`, at `now` or just after its last write, and
    its new summary. With `summary` (the execution's own append, which writes it at the
    end) the response is applied to that instead and the summary is not written."""
    if summary is None:
        s, now, t = _load_summary_for_write(conn, execution_id, now)
    else:
        s, t = summary, _us(now)
    source = (
        response.child_execution_id
        if isinstance(response, ev.ChildExecutionFinished)
        else response.delay_id
    )
    try:
        s = apply_response(s, response, now)
    except IllegalAppend as e:
        raise Conflict(f"execution {execution_id}: {e}") from None
    try:
        conn.execute(
            "INSERT INTO responses (execution_id, cursor, created_at, source_id, response) "
            "VALUES (?,?,?,?,?)",
            (execution_id, s.responses, t, source, ev.encode(response)),
        )
    except sqlite3.IntegrityError:
        raise Conflict(f"execution {execution_id} already has a response for {source}") from None
    if isinstance(response, ev.DelayFinished):
        conn.execute("DELETE FROM delays WHERE delay_id = ?", (response.delay_id,))
    notes.responses.add(execution_id)
    notes.response_items.append((execution_id, ev.StoredResponse(s.responses, _dt(t), response)))
    if summary is not None:
        return s
    state = s.state
    _write_summary(conn, execution_id, s, now, t, state)
    if isinstance(state, PendingAt):
        notes.became_pending(s.ffqn, state.scheduled_at, now)
    if s.cancelling:
        notes.cancelling.add(execution_id)
    return s


def _insert_logs(
    conn: sqlite3.Connection,
    execution_id: str,
    run_id: str | None,
    lines: Sequence[LogLine],
    now: datetime,
) -> None:
    conn.executemany(
        "INSERT INTO logs (execution_id, run_id, created_at, level, stream, message) "
        "VALUES (?,?,?,?,?,?)",
        [
            (execution_id, run_id, _us(line.written_at(now)), line.level, line.stream, line.message)
            for line in lines
        ],
    )


def _pause(
    conn: sqlite3.Connection, notes: _Notes, execution_id: str, now: datetime
) -> ExecutionSummary:
    s = _load_summary(conn, execution_id)
    events = pause_events(s, execution_id, now, notes)
    return _append(conn, notes, execution_id, s.next_version, events, now, None)


def _cancel(
    conn: sqlite3.Connection, notes: _Notes, execution_id: str, now: datetime, force: bool
) -> ExecutionSummary:
    s = _load_summary(conn, execution_id)
    events = cancel_events(s, execution_id, force)
    return _append(conn, notes, execution_id, s.next_version, events, now, None)


def _cancel_delay(
    conn: sqlite3.Connection, notes: _Notes, delay_id: str, now: datetime
) -> ExecutionSummary:
    """`delay_finished(cancelled)` to the owner of a live delay (SPEC §8)."""
    row = conn.execute(
        "SELECT execution_id, join_set_id FROM delays WHERE delay_id = ?", (delay_id,)
    ).fetchone()
    if row is None:
        owner = str(DelayId.parse(delay_id).owner()[0])
        answered = conn.execute(
            "SELECT 1 FROM responses WHERE execution_id = ? AND source_id = ?", (owner, delay_id)
        ).fetchone()
        if answered is not None:
            raise Conflict(f"delay {delay_id} has already finished")
        requested = conn.execute(
            "SELECT 1 FROM events WHERE execution_id = ? AND instr(event, ?) > 0 LIMIT 1",
            (owner, ev.encode(delay_id)),
        ).fetchone()
        if requested is not None:  # its execution finished without it
            raise Conflict(f"delay {delay_id} cannot be cancelled: {owner} is already finished")
        raise NotFound(f"delay {delay_id} not found")
    execution_id, join_set_id = row
    return _add_response(
        conn, notes, execution_id, ev.DelayFinished(delay_id, join_set_id, "cancelled"), now
    )
