"""The console's pure parts: states and refusals, filters, event summaries, the diagram,
time travel through the engine's state machine, the submit form's templates and checks."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from rich.console import Console

from engine.answers import event_entries, response_entries
from engine.core import events as ev
from engine.engine import Engine
from engine.views import ExecutionInfo
from obelisk_tui import diagram, list_query, model, submitting, timeline
from obelisk_tui.list_query import ExecutionQuery
from obelisk_tui.model import short_end as short_ffqn
from obelisk_tui.model import short_id
from obelisk_tui.widgets.execution_list import layout
from tests.console.conftest import FANOUT, ORDER

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def info(
    state: dict[str, Any],
    *,
    ctype: str = "activity_wasm",
    ffqn: str = "a:b/c.d",
    result: dict[str, Any] | None = None,
) -> ExecutionInfo:
    return {
        "execution_id": "E_01KAAAAAAAAAAAAAAAAAAAAAAA",
        "ffqn": ffqn,
        "component_type": ctype,
        "state": state,
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-01T00:00:00Z",
        "next_version": 1,
        "parent_id": None,
        "scheduled_at": None,
        "lock_expires_at": None,
        "temporary_event_count": 0,
        "result": result,
    }


PENDING = {"type": "pending_at", "scheduled_at": "2026-01-01T00:00:00Z", "last_lock": None}
LOCKED = {
    "type": "locked",
    "executor_id": "Exr_1",
    "run_id": "Run_1",
    "lock_expires_at": "2026-01-01T00:00:01Z",
}
BLOCKED = {
    "type": "blocked_by_join_set",
    "join_set_id": "g:1",
    "lock_expires_at": "2026-01-01T00:00:01Z",
    "closing": False,
}
FINISHED = {
    "type": "finished",
    "version": 2,
    "finished_at": "2026-01-01T00:00:02Z",
    "result_kind": "ok",
}


@pytest.mark.parametrize(
    ("state", "ctype", "ffqn", "action", "refused"),
    [
        (PENDING, "activity_wasm", "a:b/c.d", "pause", None),
        (LOCKED, "activity_wasm", "a:b/c.d", "pause", "a running activity cannot be paused"),
        (LOCKED, "workflow_js", "a:b/c.d", "pause", None),  # released first (SPEC §4.3)
        (
            {"type": "paused", "underlying": PENDING},
            "activity_js",
            "a:b/c.d",
            "pause",
            "already paused",
        ),
        ({"type": "paused", "underlying": BLOCKED}, "workflow_js", "a:b/c.d", "unpause", None),
        (PENDING, "activity_js", "a:b/c.d", "unpause", "is not paused"),
        (
            {"type": "cancelling", "underlying": LOCKED},
            "activity_js",
            "a:b/c.d",
            "pause",
            "being cancelled",
        ),
        (
            {"type": "cancelling", "underlying": LOCKED},
            "activity_js",
            "a:b/c.d",
            "cancel",
            "already requested",
        ),
        (BLOCKED, "workflow_js", "a:b/c.run", "cancel", "not cancellable"),
        (BLOCKED, "workflow_js", "a:b/c.run", "force_cancel", None),
        (BLOCKED, "workflow_js", "a:b/c.run-cancellable", "force_cancel", "without force"),
        (LOCKED, "activity_js", "a:b/c.d", "force_cancel", "without force"),
        (
            {"type": "cancelling", "underlying": LOCKED},
            "workflow_js",
            "a:b/c.run",
            "force_cancel",
            "already requested",
        ),
        (FINISHED, "workflow_js", "a:b/c.run", "force_cancel", "is finished"),
        (BLOCKED, "workflow_js", "a:b/c.run-cancellable", "cancel", None),
        (LOCKED, "activity_stub", "a:b/c.d", "cancel", None),
        (FINISHED, "activity_js", "a:b/c.d", "cancel", "is finished"),
        (FINISHED, "activity_js", "a:b/c.d", "unpause", "is finished"),
        (PENDING, "activity_stub", "a:b/c.d", "stub", None),
        (PENDING, "activity_js", "a:b/c.d", "stub", "is not a stub activity"),
        (FINISHED, "activity_stub", "a:b/c.d", "stub", "is finished"),
        (FINISHED, "workflow_js", "a:b/c.d", "stub", "is not a stub activity"),
    ],
)
def test_refusal(
    state: dict[str, Any], ctype: str, ffqn: str, action: str, refused: str | None
) -> None:
    got = model.refusal(action, info(state, ctype=ctype, ffqn=ffqn))
    if refused is None:
        assert got is None
    else:
        assert got is not None and refused in got and "E_01KAAAAAAAAAAAAAAAAAAAAAAA" in got


@pytest.mark.parametrize(
    ("state", "result", "label"),
    [
        (PENDING, None, "pending"),
        (LOCKED, None, "locked"),
        (BLOCKED, None, "blocked"),
        ({"type": "paused", "underlying": BLOCKED}, None, "paused·blocked"),
        ({"type": "cancelling", "underlying": LOCKED}, None, "cancelling·locked"),
        (FINISHED, {"ok": 1}, "finished ok"),
        (FINISHED, {"err": "x"}, "finished err"),
        (FINISHED, {"execution_failure": {"kind": "timed_out"}}, "failed timed_out"),
    ],
)
def test_state_label(state: dict[str, Any], result: dict[str, Any] | None, label: str) -> None:
    assert model.state_label(info(state, result=result))[0] == label


@pytest.mark.parametrize(
    ("text", "query"),
    [
        ("", ExecutionQuery()),
        ("state:locked,paused", ExecutionQuery(states=("locked", "paused"))),
        (
            "state:blocked state:pending",
            ExecutionQuery(states=("blocked_by_join_set", "pending_at")),
        ),
        ("ffqn:myapp:demo/ top", ExecutionQuery(ffqn_prefix="myapp:demo/", top_level_only=True)),
        ("myapp:demo/activity.step", ExecutionQuery(ffqn_prefix="myapp:demo/activity.step")),
        ("E_01K", ExecutionQuery(id_prefix="E_01K")),
        ("id:E_01K.g:1", ExecutionQuery(id_prefix="E_01K.g:1")),
    ],
)
def test_parse_filter_and_back(text: str, query: ExecutionQuery) -> None:
    assert list_query.parse_filter(text) == query
    assert list_query.parse_filter(list_query.format_filter(query)) == query


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("state:asleep", "unknown state 'asleep'"),
        ("state:", "needs a state"),
        ("ffqn:", "`ffqn:` needs a prefix"),
        ("id:", "`id:` needs a prefix"),
        ("top:", "`top:` takes no value"),
    ],
)
def test_parse_filter_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        list_query.parse_filter(text)


def test_orders_cycle() -> None:
    q = ExecutionQuery()
    seen = []
    for _ in range(3):
        q = list_query.next_order(q)
        seen.append(q.order)
    assert seen == ["created_asc", "updated_desc", "created_desc"]


def test_spans_and_relative_times() -> None:
    assert [model.span(s) for s in (0.25, 3.04, 42, 300, 7200, 200000)] == [
        "250ms",
        "3.0s",
        "42s",
        "5m",
        "2h",
        "2d",
    ]
    assert model.relative(T0 + timedelta(seconds=2), T0) == "in 2.0s"
    assert model.relative(T0 - timedelta(minutes=5), T0) == "5m ago"
    assert model.relative(None, T0) == ""


@pytest.mark.parametrize(
    ("event", "name", "summary"),
    [
        (
            ev.Created(
                "a:b/c.d",
                [1, "x"],
                scheduled_at=T0,
                component_id=ev.ComponentId("activity_js", "d", "sha256:0"),
                deployment_id="Dep_1",
                parent=("E_P", "g:1"),
            ),
            "created",
            'a:b/c.d [1,"x"], child of E_P in g:1',
        ),
        (
            ev.Locked(
                ev.ComponentId("activity_js", "d", "sha256:0"),
                "Exr_1",
                "Run_1",
                T0 + timedelta(seconds=1),
                ev.RetryConfig(3, 100),
            ),
            "locked",
            "by Exr_1 run Run_1 until 00:00:01.000, max retries 3",
        ),
        (
            ev.TemporarilyFailed(T0, "returned err", '"nope"'),
            "temporarily_failed",
            'returned err "nope"; retry at 00:00:00.000',
        ),
        (ev.Finished(ev.ResultErr("bad")), "finished", 'err "bad"'),
        (
            ev.Finished(ev.ExecutionFailure("timed_out", "lock expired", "")),
            "finished",
            "execution failure timed_out: lock expired",
        ),
        (
            ev.HistoryEvent(
                ev.JoinSetRequest("g:1", ev.ChildExecutionRequest("E_P.g:1_1", "a:b/c.d", [7]))
            ),
            "join_set_request",
            "g:1 → E_P.g:1_1 a:b/c.d [7]",
        ),
        (ev.HistoryEvent(ev.JoinNext("g:1", T0, None, True)), "join_next", "g:1 (closing)"),
        (
            ev.HistoryEvent(ev.Schedule("E_S", ev.ScheduleAtIn(300_000), "a:b/c.mail")),
            "schedule",
            "E_S a:b/c.mail in 5m",
        ),
        (ev.HistoryEvent(ev.Persist(7, ev.PersistRandomU64(0, 9))), "persist", "random_u64 = 7"),
        (
            ev.ComponentUpgradeFinished("sha256:" + "a" * 64, "D_1", ev.UpgradeSuccess()),
            "component_upgrade_finished",
            "success: continues on sha256:aaaaaaaaaaaa",
        ),
        (
            ev.ComponentUpgradeFinished("sha256:" + "b" * 64, "D_1", ev.UpgradeFailed("at v3")),
            "component_upgrade_finished",
            "failed: stays on its version, not sha256:bbbbbbbbbbbb: at v3",
        ),
    ],
)
def test_event_summaries(event: ev.Event, name: str, summary: str) -> None:
    as_json = ev.to_builtins(event)
    assert model.event_name(as_json) == name
    assert model.event_summary(as_json) == summary


def test_template_and_check_params() -> None:
    params = [
        {"name": "n", "type": "u32"},
        {"name": "tags", "type": "list<string>"},
        {"name": "maybe", "type": "option<bool>"},
        {"name": "pair", "type": "tuple<string, f64>"},
    ]
    template = submitting.params_template(params)  # type: ignore[arg-type]
    assert template == '[0, [], null, ["", 0.0]]'
    assert submitting.check_params("f", params, template) == ([0, [], None, ["", 0.0]], None)  # type: ignore[arg-type]
    _, error = submitting.check_params("f", params, '[1, [2], null, ["", 0]]')  # type: ignore[arg-type]
    assert error == "params[1] (tags)[0]: expected string, got 2"
    _, error = submitting.check_params("f", params, "[1]")  # type: ignore[arg-type]
    assert (
        error
        == "f takes 4 parameter(s) (n: u32, tags: list<string>, maybe: option<bool>, pair: tuple<string, f64>), got 1"
    )
    _, error = submitting.check_params("f", params, "{")  # type: ignore[arg-type]
    assert error is not None and error.startswith("not JSON")


def test_stub_template_and_check() -> None:
    assert submitting.stub_template("result<bool, string>") == '{"ok": false}'
    assert submitting.stub_template(None) == '{"ok": null}'
    rt = "result<u32, string>"
    assert submitting.check_stub(rt, '{"ok": 7}') == ({"ok": 7}, None)
    assert submitting.check_stub(rt, '{"err": "no"}') == ({"err": "no"}, None)
    for text, error in [
        ('{"ok": "7"}', "expected u32"),
        ('{"ok": 1, "err": "x"}', '{"ok": …} or {"err": …}'),
        ("7", '{"ok": …} or {"err": …}'),
        ("{", "not JSON"),
    ]:
        value, got = submitting.check_stub(rt, text)
        assert value is None and got is not None and error in got, (text, got)


def test_when_column_of_a_blocked_workflow_shows_only_a_lock_still_held() -> None:
    from obelisk_tui.widgets.execution_list import render_execution

    blocked = info(BLOCKED, ctype="workflow_js")
    blocked["lock_expires_at"] = "2026-01-01T00:00:01Z"
    cols = [("WHEN", 12)]
    held = render_execution(blocked, cols, T0, False).plain
    assert held.strip() == "in 1.0s"
    gone = render_execution(blocked, cols, T0 + timedelta(minutes=5), False).plain
    assert gone.strip() == ""
    locked = info(LOCKED)
    locked["lock_expires_at"] = "2026-01-01T00:00:01Z"
    # A lock that expired and was not released yet says so.
    assert (
        render_execution(locked, cols, T0 + timedelta(minutes=5), False)
        .plain.strip()
        .endswith("ago")
    )


def test_execution_list_columns_fit_the_width() -> None:
    for width in (60, 80, 120, 200):
        cols = layout(width)
        assert sum(w + 1 for _, w in cols) <= max(width, 80)
        assert [t for t, _ in cols][:3] == [" ", "EXECUTION", "FFQN"]
    assert "LAST EVENT" in [t for t, _ in layout(160)]
    assert "CH" not in [t for t, _ in layout(80)]
    assert short_id("E_01KAAAAAAAAAAAAAAAAAAAAAAA.g:1_12", 20) == "E_01KA…AAAAAA.g:1_12"
    assert short_ffqn("myapp:demo/activity.step", 16) == "…o/activity.step"
    assert short_ffqn("myapp:demo/activity.step", 30) == "myapp:demo/activity.step"


# -- the diagram --------------------------------------------------------------------------


def test_diagram_highlights_the_state_the_overlay_and_the_last_edge() -> None:
    cells = diagram.owners(None, None)
    assert set(diagram.EDGES.values()) <= set(cells)
    assert set(diagram.BOXES) <= set(cells)
    lines = diagram.draw("blocked_by_join_set", ["paused"], "join_next")
    text = "\n".join(line.plain for line in lines)
    for title in ("PendingAt", "Locked", "BlockedByJoinSet", "Finished", "join_next"):
        assert title in text
    assert "─ Paused " in text  # the overlay is written on the box of its underlying state
    console = Console()
    row, col = next(iter(cells["join_next"]))
    assert lines[row].get_style_at_offset(console, col).bold  # the last transition
    row, col = next(iter(cells["locked"]))
    assert not lines[row].get_style_at_offset(console, col).bold
    row, col = next(iter(cells["blocked_by_join_set"] - cells.get("overlay", set())))
    assert lines[row].get_style_at_offset(console, col).bold  # the current state
    finished = "\n".join(x.plain for x in diagram.draw("finished", [], "finished_locked", "ok"))
    assert "Finished · ok" in finished


def test_edges_of_transitions() -> None:
    assert diagram.edge_of(None, "pending_at") == "created"
    assert diagram.edge_of("locked", "pending_at") == "released"
    assert diagram.edge_of("blocked_by_join_set", "pending_at") == "response"
    assert diagram.edge_of("pending_at", "finished") == "finished_pending"
    assert diagram.edge_of("finished", "locked") is None


# -- time travel on a real log --------------------------------------------------------------


async def test_steps_follow_the_engine_state_machine(console_engine: Engine) -> None:
    engine = console_engine
    eid = await engine.submit(FANOUT, [2])
    await engine.result(eid, timeout=30)
    events = event_entries(await engine.storage.get_events(eid), True)
    responses = response_entries(await engine.storage.get_responses(eid))
    steps = timeline.steps(events, responses)
    assert [s.version for s in steps] == list(range(len(events)))
    assert steps[0] == timeline.Step(0, "pending_at", (), None, "created")
    assert steps[1].underlying == "locked" and steps[1].edge == "locked"
    assert steps[-1].underlying == "finished" and steps[-1].result_kind == "ok"
    assert steps[-1].edge == "finished_locked"
    # Folded piece by piece as a live console sees the log grow: the same steps.
    live = timeline.Timeline()
    for n in range(1, len(events) + 1):
        upto = events[n - 1]["created_at"]
        live.update(events[:n], [r for r in responses if r["created_at"] <= upto])
    assert live.update(events, responses) == steps
    # A read that raced with the writes: the responses, but not yet the events that
    # requested them. The fold breaks there, then is redone once the events arrive.
    racing = timeline.Timeline()
    first_request = next(
        i for i, e in enumerate(events) if e["event"].get("type") == "history_event"
    )
    partial = racing.update(events[:first_request], responses)
    assert len(partial) <= first_request
    assert racing.update(events, responses) == steps


async def test_steps_show_overlays_and_responses(console_engine: Engine) -> None:
    engine = console_engine
    eid = await engine.submit(ORDER, ["t"])
    child = f"{eid}.o:1-approve_1"

    async def blocked() -> bool:
        return (
            await engine.storage.get_row(eid)
        ).state.__struct_config__.tag == "blocked_by_join_set"

    for _ in range(500):  # the workflow's first run blocks it on the approval
        if await blocked():
            break
        await asyncio.sleep(0.01)
    await engine.pause(eid)
    await engine.stub(child, {"ok": True})  # answered while paused: pending underneath
    events = event_entries(await engine.storage.get_events(eid), True)
    responses = response_entries(await engine.storage.get_responses(eid))
    last = timeline.steps(events, responses)[-1]
    assert last.overlays == ("paused",) and last.underlying == "pending_at"
    assert last.edge == "response"


def test_throughput_is_finished_over_wall_clock_time() -> None:
    from obelisk_tui.model import THROUGHPUT_HISTORY, Throughput

    t = Throughput()
    t.sample(100, 1000.0)  # the baseline
    assert t.rate == 0.0 and t.bars == [0.0] * THROUGHPUT_HISTORY
    t.sample(112, 1001.0)
    assert t.rate == 12.0 and t.bars[-1] == 12.0
    t.sample(112, 1001.0)  # the clock did not move: nothing to say yet
    assert t.rate == 12.0
    t.sample(112, 1002.0)  # idle: the rate says so
    assert t.rate == 0.0 and t.bars[-2:] == [12.0, 0.0]
    # A late sample (five minutes, 3,600 finished: 12/s) is that average over each of
    # its seconds, not a spike.
    t.sample(3712, 1302.0)
    assert t.rate == 12.0 and t.bars == [12.0] * THROUGHPUT_HISTORY
    t.sample(3700, 1303.0)  # a smaller count is no negative rate
    assert t.rate == 0.0


async def test_throughput_sparkline_moves_each_second() -> None:
    from textual.app import App, ComposeResult
    from textual.widgets import Sparkline, Static

    from obelisk_tui.model import Throughput
    from obelisk_tui.widgets.state_counts import StateCounts

    throughput = Throughput()

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield StateCounts(throughput, id="counts")

    async with Host().run_test(size=(160, 5)) as pilot:
        bar = pilot.app.query_one(StateCounts)
        throughput.sample(0, 200.0)
        throughput.sample(6, 201.0)
        bar.show_rate()
        assert bar.query_one(Sparkline).data[-1] == 6.0
        assert "6.0 fin/s" in str(bar.query_one("#rate", Static).render())
        throughput.sample(6, 202.0)  # nothing finished: the rate says so
        bar.show_rate()
        assert bar.query_one(Sparkline).data[-2:] == [6.0, 0.0]
        assert "0.0 fin/s" in str(bar.query_one("#rate", Static).render())


@pytest.mark.parametrize(("width", "wide"), [(80, False), (150, True)])
async def test_counts_bar_fits_a_narrow_terminal(width: int, wide: bool) -> None:
    from textual.app import App, ComposeResult
    from textual.widgets import Sparkline, Static

    from obelisk_tui.widgets.state_counts import StateCounts

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield StateCounts(id="counts")

    counts = {
        "pending_at": 3,
        "locked": 1,
        "blocked_by_join_set": 20,
        "paused": 1,
        "cancelling": 2,
        "finished": 12_345,
    }
    async with Host().run_test(size=(width, 5)) as pilot:
        bar = pilot.app.query_one(StateCounts)
        bar.show(counts)
        await pilot.pause()
        assert bar.query_one(Sparkline).display is wide
        counts_box = bar.query_one("#counts", Static)
        text = str(counts_box.render())
        assert ("cancelling 2" in text) is wide and ("canc 2" in text) is not wide
        assert "12,345" in text
        assert len(text.rstrip()) <= counts_box.size.width


BIG_COUNTS = {
    "pending_at": 4_528,
    "locked": 1_941,
    "blocked_by_join_set": 700,
    "paused": 80,
    "cancelling": 0,
    "finished": 92_751,
    "ok": 80_000,
    "err": 7_000,
    "failed": 5_751,
}


@pytest.mark.parametrize(
    ("counts", "frozen", "last"),
    [
        (  # the tmux test's pane (719 executions), where it was seen
            {
                **dict.fromkeys(BIG_COUNTS, 0),
                **{"pending_at": 4, "locked": 1, "blocked_by_join_set": 2},
                **{"finished": 712, "ok": 693, "err": 14, "failed": 5},
            },
            False,
            "fail 5",
        ),
        (BIG_COUNTS, False, "fail 5.8k"),
        (BIG_COUNTS, True, "fail 5.8k"),
    ],
)
async def test_counts_are_never_cut_at_80_columns(
    counts: dict[str, int], frozen: bool, last: str
) -> None:
    """At 80 columns the short names with `1,234` numbers did not fit beside the rate
    once there were hundreds of executions: the failures' count, last, was cut off. The
    numbers shorten (`5.8k`), then the rate goes; the counts stay whole."""
    from textual.app import App, ComposeResult
    from textual.widgets import Static

    from obelisk_tui.widgets.state_counts import StateCounts

    class Host(App[None]):
        def compose(self) -> ComposeResult:
            yield StateCounts(id="counts")

    async with Host().run_test(size=(80, 5)) as pilot:
        bar = pilot.app.query_one(StateCounts)
        bar.show(counts, frozen=frozen)
        await pilot.pause()
        counts_box = bar.query_one("#counts", Static)
        text = str(counts_box.render()).rstrip()
        assert text.endswith(last) or (frozen and last + "  ❚❚" in text), text
        assert "…" not in text and len(text) <= counts_box.size.width
        rate = bar.query_one("#rate", Static)
        assert rate.display is (counts is not BIG_COUNTS), "the rate gives way last"


def test_short_numbers() -> None:
    from obelisk_tui.widgets.state_counts import short_number

    assert [short_number(n) for n in (0, 999, 1_049, 9_949, 9_950, 12_345, 999_999)] == [
        "0",
        "999",
        "1.0k",
        "9.9k",
        "10k",
        "12k",
        "1.0M",
    ]
    assert short_number(1_234_567) == "1.2M" and short_number(123_456_789) == "123M"


def test_columns_at_80_keep_age_and_narrow_state() -> None:
    titles = dict(layout(77))  # 80 columns less the scrollbar
    assert titles["STATE"] == 14 and "AGE" in titles and titles["FFQN"] >= 24
    assert "WHEN" in dict(layout(100)) and "AGE" in dict(layout(100))


def test_ids_keep_their_distinguishing_end() -> None:
    eid = "E_01M94NJDAKZ8M907WD2CBK80HY.o:1-approve_1"
    assert model.short_id(eid, 26) == "E_01M9…Z8M907WD2CBK80HY.o:1-approve_1"[:6] + "…" + eid[-19:]
    assert model.short_id(eid, 26).endswith(".o:1-approve_1") and len(model.short_id(eid, 26)) == 26
    assert model.short_id(eid, 60) == eid
    assert model.short_id(eid, 1) == "…"


def test_text_is_cut_between_words_with_an_ellipsis() -> None:
    assert model.cut_words("delay until 2026-12-06T10:00:00Z expired", 24) == "delay until…"
    assert model.cut_words("short", 10) == "short"
    assert model.wrap_words("cancelled E_01M94NJDAKZ8M907WD2CBK80HY now", 20) == [
        "cancelled",
        "E_01M94NJDAKZ8M907WD2CBK80HY",
        "now",
    ]


def test_the_list_title_keeps_the_filters_ffqn() -> None:
    query = list_query.parse_filter("state:blocked ffqn:test:console/workflow.order-cancellable")
    title = list_query.list_title(1234, query, 2, 72)
    assert len(title) <= 72 and "ffqn:…" in title and title.endswith("cancellable · 2 marked")


def test_the_detail_title_keeps_the_ffqn() -> None:
    eid, ffqn, parent = model.detail_title(
        "pending",
        "E_01M94NJDAKZ8M907WD2CBK80HY.o:1-approve_1",
        "test:console/approval.approve",
        "E_01M94NJDAKZ8M907WD2CBK80HY",
        80,
    )
    assert eid.endswith(".o:1-approve_1") and ffqn.endswith("approval.approve")
    assert len(" pending ") + 1 + len(eid) + 2 + len(ffqn) + len(parent) <= 80


def test_a_reload_that_kept_executions_on_the_old_version_is_a_warning() -> None:
    from obelisk_tui.screens.components import reload_role

    ok = {"ok": True, "upgrades": [{"outcome": "success"}]}
    kept = {"ok": True, "upgrades": [{"outcome": "success"}, {"outcome": "failed"}]}
    assert reload_role(ok) == "ok"
    assert reload_role(kept) == "warning"
    assert reload_role({"ok": False}) == "error"
