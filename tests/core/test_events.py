"""Events, history events, responses and results (SPEC §3, §5.1): JSON round trips."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from engine.core import events as ev

T0 = datetime(2026, 1, 15, 10, 0, 0, 123456, tzinfo=UTC)
COMPONENT = ev.ComponentId("activity_wasm", "step", "sha256:" + "ab" * 32)
WF_COMPONENT = ev.ComponentId("workflow_js", "serial", "sha256:" + "cd" * 32)
EXEC = "E_01JKX3M7V9Q2R8T5W0Y4Z6A1BC"
CHILD = EXEC + ".g:1_1"
DELAY = "Delay_01JKX3M7V9Q2R8T5W0Y4Z6A1BC.o:2-sleep_1"

RESULTS: list[ev.ExecutionResult] = [
    ev.ResultOk(),
    ev.ResultOk(42),
    ev.ResultOk([1, "two", {"three": [3.5, None, True]}]),
    ev.ResultErr("boom"),
    ev.ResultErr({"permanent-failure": "nope"}),
    ev.ResultErr(None),
    *[
        ev.ExecutionFailure(kind, "reason", "detail")
        for kind in (
            "timed_out",
            "nondeterminism_detected",
            "cancelled",
            "out_of_fuel",
            "uncategorized",
        )
    ],
    ev.ExecutionFailure("timed_out"),
]

HISTORY: list[ev.HistoryEventKind] = [
    ev.Persist(12345, ev.PersistRandomU64(0, 100)),
    ev.Persist("xYz", ev.PersistRandomString(1, 10)),
    ev.Persist("E_01JKX3M7V9Q2R8T5W0Y4Z6A1BD", ev.PersistExecutionId()),
    ev.JoinSetCreate("g:1"),
    ev.JoinSetRequest(
        "g:1", ev.ChildExecutionRequest(CHILD, "myapp:demo/activity.step", [1, "a", None])
    ),
    ev.JoinSetRequest("o:2-sleep", ev.DelayRequest(DELAY, T0, ev.ScheduleAtNow())),
    ev.JoinSetRequest("o:2-sleep", ev.DelayRequest(DELAY, T0, ev.ScheduleAtTime(T0))),
    ev.JoinSetRequest("o:2-sleep", ev.DelayRequest(DELAY, T0, ev.ScheduleAtIn(1500))),
    ev.JoinNext("g:1", T0),
    ev.JoinNext("g:1", T0, "myapp:demo/activity.step", True),
    ev.JoinNextTry("g:1", "found"),
    ev.JoinNextTry("g:1", "pending"),
    ev.JoinNextTry("g:1", "all_processed"),
    ev.JoinNextTooMany("g:1"),
    ev.JoinNextTooMany("g:1", "myapp:demo/activity.step"),
    ev.Schedule(EXEC, ev.ScheduleAtNow(), "myapp:demo/activity.step"),
    ev.Schedule(EXEC, ev.ScheduleAtIn(60_000), "myapp:demo/activity.step"),
    ev.Schedule(EXEC, ev.ScheduleAtTime(T0), "myapp:demo/activity.step"),
    ev.Stub(CHILD, "sha256:" + "00" * 32, "written"),
    ev.Stub(CHILD, "sha256:" + "00" * 32, "conflict"),
]

EVENTS: list[ev.Event] = [
    ev.Created("myapp:demo/activity.step", [1, "x"], T0, COMPONENT, "Dep_1"),
    ev.Created(
        "myapp:demo/activity.step",
        [],
        T0,
        COMPONENT,
        "Dep_1",
        parent=(EXEC, "g:1"),
        metadata={"trace": {"id": 7}},
        scheduled_by=EXEC,
    ),
    ev.Locked(COMPONENT, "Exr_1", "Run_1", T0, ev.RetryConfig(5, 100)),
    ev.Locked(WF_COMPONENT, "Exr_1", "Run_1", T0, ev.RetryConfig(None, 100)),
    ev.Unlocked(T0, "executor closing"),
    ev.TemporarilyFailed(T0, "trap", "wasm backtrace…"),
    ev.TemporarilyFailed(T0, "connection refused"),
    ev.TemporarilyTimedOut(T0),
    *[ev.Finished(r) for r in RESULTS],
    *[ev.HistoryEvent(h) for h in HISTORY],
    ev.Paused(),
    ev.Unpaused(),
    ev.CancellationRequested(),
    ev.ComponentUpgradeFinished("sha256:" + "ef" * 32, "Dep_2", ev.UpgradeSuccess()),
    ev.ComponentUpgradeFinished("sha256:" + "ef" * 32, "Dep_2", ev.UpgradeFailed("nondet")),
]

RESPONSES: list[ev.Response] = [
    *[ev.ChildExecutionFinished(CHILD, "g:1", 3, r) for r in RESULTS],
    ev.DelayFinished(DELAY, "o:2-sleep"),
    ev.DelayFinished(DELAY, "o:2-sleep", "cancelled"),
]


def _id(x: Any) -> str:
    return type(x).__name__


@pytest.mark.parametrize("event", EVENTS, ids=_id)
def test_event_round_trip(event: ev.Event) -> None:
    data = ev.encode(event)
    assert ev.decode_event(data) == event
    assert ev.decode_event(data.decode()) == event
    # tagged by "type", plain JSON
    obj = json.loads(data)
    assert obj["type"] == event.__struct_config__.tag
    assert json.loads(json.dumps(ev.to_builtins(event))) == obj


def test_every_event_type_covered() -> None:
    covered = {type(e) for e in EVENTS}
    assert covered == set(ev.Event.__args__)  # type: ignore[attr-defined]
    h_covered = {type(h) for h in HISTORY}
    assert h_covered == set(ev.HistoryEventKind.__args__)  # type: ignore[attr-defined]
    r_covered = {type(r) for r in RESPONSES}
    assert r_covered == set(ev.Response.__args__)  # type: ignore[attr-defined]


@pytest.mark.parametrize("response", RESPONSES, ids=_id)
def test_response_round_trip(response: ev.Response) -> None:
    data = ev.encode(response)
    assert ev.decode_response(data) == response
    assert json.loads(data)["type"] == response.__struct_config__.tag
    assert ev.response_join_set(response) == response.join_set_id


def test_wire_shapes() -> None:
    """The JSON forms other components (API, storage) rely on."""
    locked = json.loads(ev.encode(EVENTS[2]))
    assert locked == {
        "type": "locked",
        "component_id": {"type": "activity_wasm", "name": "step", "digest": COMPONENT.digest},
        "executor_id": "Exr_1",
        "run_id": "Run_1",
        "lock_expires_at": "2026-01-15T10:00:00.123456Z",
        "retry_config": {"max_retries": 5, "retry_exp_backoff_ms": 100},
    }
    created = json.loads(ev.encode(EVENTS[1]))
    assert created["parent"] == [EXEC, "g:1"]
    join_next = json.loads(ev.encode(ev.HistoryEvent(ev.JoinNext("g:1", T0))))
    assert join_next == {
        "type": "history_event",
        "event": {
            "type": "join_next",
            "join_set_id": "g:1",
            "run_expires_at": "2026-01-15T10:00:00.123456Z",
            "requested_ffqn": None,
            "closing": False,
        },
    }
    finished = json.loads(ev.encode(ev.Finished(ev.ExecutionFailure("cancelled"))))
    assert finished == {
        "type": "finished",
        "result": {"type": "execution_failure", "kind": "cancelled", "reason": "", "detail": ""},
    }
    delay = json.loads(ev.encode(RESPONSES[-1]))
    assert delay == {
        "type": "delay_finished",
        "delay_id": DELAY,
        "join_set_id": "o:2-sleep",
        "outcome": "cancelled",
    }


def test_decode_defaults() -> None:
    e = ev.decode_event(
        b'{"type":"history_event","event":{"type":"join_next","join_set_id":"g:1",'
        b'"run_expires_at":"2026-01-15T10:00:00Z"}}'
    )
    assert e == ev.HistoryEvent(ev.JoinNext("g:1", datetime(2026, 1, 15, 10, tzinfo=UTC)))
    r = ev.decode_response(b'{"type":"delay_finished","delay_id":"D","join_set_id":"g:1"}')
    assert r == ev.DelayFinished("D", "g:1", "ok")


@pytest.mark.parametrize(
    "data",
    [
        b"{}",
        b'{"type":"nope"}',
        b'{"type":"unlocked"}',  # missing fields
        b'{"type":"finished","result":{"type":"execution_failure","kind":"bogus"}}',
        b'{"type":"history_event","event":{"type":"join_next_try","join_set_id":"g:1",'
        b'"outcome":"maybe"}}',
        b'{"type":"child_execution_finished"}',
        b"not json",
    ],
)
def test_decode_event_rejects(data: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        ev.decode_event(data)


def test_decode_response_rejects_events() -> None:
    with pytest.raises(msgspec.DecodeError):
        ev.decode_response(ev.encode(ev.Paused()))
    with pytest.raises(msgspec.DecodeError):
        ev.decode_response(
            b'{"type":"delay_finished","delay_id":"D","join_set_id":"g:1","outcome":"late"}'
        )


def test_stored_event_and_response_round_trip() -> None:
    for i, event in enumerate(EVENTS):
        stored = ev.StoredEvent(i, T0 + timedelta(microseconds=i), event, backtrace_id=i or None)
        assert msgspec.json.decode(ev.encode(stored), type=ev.StoredEvent) == stored
    for i, response in enumerate(RESPONSES, start=1):
        sr = ev.StoredResponse(i, T0, response)
        assert msgspec.json.decode(ev.encode(sr), type=ev.StoredResponse) == sr


def test_naive_and_offset_datetimes_keep_their_instant() -> None:
    other_tz = T0.astimezone(__import__("datetime").timezone(timedelta(hours=2)))
    e = ev.Unlocked(other_tz, "x")
    back = ev.decode_event(ev.encode(e))
    assert isinstance(back, ev.Unlocked)
    assert back.backoff_expires_at == T0


def test_component_id_is_workflow() -> None:
    assert not COMPONENT.is_workflow
    assert WF_COMPONENT.is_workflow
    assert ev.ComponentId("workflow_wasm", "w", "d").is_workflow
    assert not ev.ComponentId("activity_stub", "s", "d").is_workflow
    assert not ev.ComponentId("activity_js", "s", "d").is_workflow


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("result", RESULTS, ids=_id)
def test_result_json_round_trip(result: ev.ExecutionResult) -> None:
    j = ev.result_to_json(result)
    assert ev.result_from_json(j) == result
    # survives a trip through real JSON text
    assert ev.result_from_json(json.loads(json.dumps(j))) == result


def test_result_json_shapes() -> None:
    assert ev.result_to_json(ev.ResultOk(1)) == {"ok": 1}
    assert ev.result_to_json(ev.ResultOk()) == {"ok": None}
    assert ev.result_to_json(ev.ResultErr("e")) == {"err": "e"}
    assert ev.result_to_json(ev.ExecutionFailure("timed_out", "r", "d")) == {
        "execution_failure": {"kind": "timed_out", "reason": "r", "detail": "d"}
    }
    assert ev.result_from_json({"execution_failure": {"kind": "cancelled"}}) == (
        ev.ExecutionFailure("cancelled")
    )


@pytest.mark.parametrize(
    "value",
    [
        None,
        1,
        "ok",
        [],
        {},
        {"ok": 1, "err": 2},
        {"value": 1},
        {"execution_failure": "timed_out"},
        {"execution_failure": {}},
        {"execution_failure": {"kind": "bogus"}},
        {"execution_failure": {"kind": "timed_out", "reason": 5}},
    ],
)
def test_result_from_json_rejects(value: Any) -> None:
    with pytest.raises(ValueError):
        ev.result_from_json(value)


def test_result_kind() -> None:
    assert ev.result_kind(ev.ResultOk(1)) == "ok"
    assert ev.result_kind(ev.ResultErr(1)) == "err"
    assert ev.result_kind(ev.ExecutionFailure("timed_out")) == "execution_failure:timed_out"
    assert (
        ev.result_kind(ev.ExecutionFailure("nondeterminism_detected"))
        == "execution_failure:nondeterminism_detected"
    )


def test_structs_are_frozen() -> None:
    e = ev.Unlocked(T0, "x")
    with pytest.raises(AttributeError):
        e.reason = "y"  # type: ignore[misc]
