"""The `:` command line: its language (`obelisk_tui.cmdline`, alone) and, on a real
engine through Pilot, that each command does what its key does, through the same code,
and that a wrong line says what is wrong (naming it) and leaves the line open."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core import events as ev
from engine.engine import Engine
from obelisk_tui import cmdline
from obelisk_tui.app import ObeliskApp
from obelisk_tui.cmdline import CommandError
from obelisk_tui.screens.confirm import ConfirmScreen
from obelisk_tui.screens.detail import ExecutionDetailScreen
from obelisk_tui.screens.executions import ExecutionsScreen
from obelisk_tui.screens.help import HelpScreen
from obelisk_tui.widgets.command_line import CommandLine
from obelisk_tui.widgets.execution_list import ExecutionList
from tests.console.conftest import ORDER, STEP, open_console, screen_text, until
from tests.console.test_console import listed, notices, select, state_of

# ---------------------------------------------------------------------------------------
# The language
# ---------------------------------------------------------------------------------------


def test_an_unknown_command_is_named_with_the_valid_ones() -> None:
    with pytest.raises(CommandError) as e:
        cmdline.parse(":frob E_01")
    message = str(e.value)
    assert ":frob" in message
    for name in ("pause", "unpause", "cancel", "filter", "open", "submit", "help", "quit"):
        assert name in message


def test_parse() -> None:
    assert cmdline.parse("   ") is None
    assert cmdline.parse(":") is None
    p = cmdline.parse("pause E_1 E_2")
    assert p is not None and p.command.name == "pause" and p.args == ["E_1", "E_2"]
    for forced in ("cancel! E_1", "cancel --force E_1", "cancel -f E_1", "CANCEL --force E_1"):
        p = cmdline.parse(forced)
        assert p is not None and p.command.name == "cancel!" and p.args == ["E_1"], forced
    p = cmdline.parse(":q")
    assert p is not None and p.command.name == "quit"
    p = cmdline.parse("filter  state:locked ffqn:a/b ")
    assert p is not None and p.rest == "state:locked ffqn:a/b"
    p = cmdline.parse("order oldest")
    assert p is not None and p.order == "created_asc"
    p = cmdline.parse("sort changed")
    assert p is not None and p.command.name == "order" and p.order == "updated_desc"


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("open E_1 E_2", ":open takes one id, got 2"),
        ("help me", ":help takes nothing after it, got 'me'"),
        ("pause --now E_1", ":pause has no option --now"),
        ("order sideways", "unknown order 'sideways'"),
        ("order state", "cannot be sorted by state"),
        ("cancel! E_1 E_2", ":cancel! takes one id, got 2"),
    ],
)
def test_a_wrong_line_says_what_is_wrong(line: str, named: str) -> None:
    with pytest.raises(CommandError, match=named.replace("(", r"\(")):
        cmdline.parse(line)


PARENT = "E_01KP0000000000000000000004"
CHILD_1 = PARENT + ".o:1-approve_1"
CHILD_11 = PARENT + ".o:1-approve_11"
OTHER = "E_01KP0000000000000000000005"
SHOWN = [PARENT, CHILD_1, CHILD_11, OTHER]


def test_ids_are_matched_whole_by_start_by_end_or_shortened() -> None:
    match = cmdline.match_listed
    assert match(PARENT, SHOWN) == [PARENT]  # whole, though its children start with it
    assert match("e_01kp0000000000000000000005", SHOWN) == []  # only the E_ is forgiven
    assert match("e_01KP0000000000000000000005", SHOWN) == [OTHER]
    # A start that stops within the workflow's id: the workflow, not its children.
    assert match(PARENT[:-1], [PARENT, CHILD_1, CHILD_11]) == [PARENT]
    assert sorted(match("E_01KP", SHOWN)) == sorted([PARENT, OTHER])
    assert match("approve_1", SHOWN) == [CHILD_1]  # an end: not approve_11
    assert match("E_01KP…0004.o:1-approve_11", SHOWN) == [CHILD_11]  # as the list shows it
    assert match("E_01KP...approve_1", SHOWN) == [CHILD_1]
    assert match("nothing", SHOWN) == []
    message = cmdline.ambiguity("E_01KP", [PARENT, OTHER])
    assert "ambiguous id E_01KP" in message and "2 executions" in message


def test_tab_completes_names_ids_orders_and_filter_words() -> None:
    complete = cmdline.complete
    assert complete("pa", []).text == "pause "
    done = complete("ca", [])
    assert done.text == "cancel" and done.candidates == ["cancel", "cancel!"]
    assert complete("he", []).text == "help"  # takes nothing: no space after it
    assert complete("frob", []).candidates == []
    assert complete("pause e_01KP", [OTHER]).text == "pause " + OTHER + " "
    done = complete("open E_01KP", SHOWN)
    assert done.text == "open E_01KP000000000000000000000" and len(done.candidates) == 4
    assert complete("open approve_11", SHOWN).text == "open " + CHILD_11 + " "
    assert complete("order ol", []).text == "order oldest"
    assert complete("filter state:lo", []).text == "filter state:locked"
    assert complete("filter state:locked,pa", []).text == "filter state:locked,paused"
    assert complete("filter result:f", []).text == "filter result:failed"
    assert complete("filter ff", []).text == "filter ffqn:"


def test_history_walks_back_and_returns_to_the_draft() -> None:
    h = cmdline.History()
    h.add("pause E_1")
    h.add("pause E_1")  # the same again: once
    h.add("open E_2")
    assert h.entries == ["pause E_1", "open E_2"]
    assert h.back("dra") == "open E_2"
    assert h.back("ignored") == "pause E_1"
    assert h.back("ignored") is None  # the oldest
    assert h.forward() == "open E_2"
    assert h.forward() == "dra"  # the line being typed
    assert h.forward() is None


def test_every_command_has_a_runner() -> None:
    from obelisk_tui.screens import run_command

    for command in cmdline.COMMANDS:
        assert command.name in run_command.ACTIONS or command.name in run_command.HANDLERS


# ---------------------------------------------------------------------------------------
# On a real engine
# ---------------------------------------------------------------------------------------


def line(app: ObeliskApp) -> CommandLine:
    return app.screen.query_one(CommandLine)


async def command(app: ObeliskApp, pilot: Any, text: str) -> None:
    """Type `:text` and enter, as an operator does."""
    await pilot.press("colon", *text, "enter")


async def test_pause_unpause_and_cancel_by_id_go_through_the_keys_code(
    console_engine: Engine,
) -> None:
    engine = console_engine
    order = await engine.submit(ORDER, ["o-1"])
    approval = f"{order}.o:1-approve_1"
    async with open_console(engine, size=(80, 24)) as (app, pilot):
        await until(pilot, lambda: approval in listed(app), what="the approval listed")
        await until(pilot, lambda: _blocked(engine, order), what="the order blocked")
        await command(app, pilot, f"pause {order}")
        await until(pilot, lambda: _state_is(engine, order, "paused"), what="paused")
        assert not line(app).is_open  # closed once run
        assert any(f"paused {order}" in n for n in notices(app))

        await command(app, pilot, f"unpause {order[:-2]}")  # a start of its id
        await until(pilot, lambda: _state_is(engine, order, "blocked_by_join_set"), what="again")

        await command(app, pilot, "cancel approve_1")  # an end, among the listed ones
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        assert isinstance(app.screen, ConfirmScreen)
        assert app.screen.question == f"Cancel {approval}?"  # the key's question
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="back")
        assert await state_of(engine, approval) != "finished"

        # Not paused: refused with the engine's reason, as `u` is, and nothing asked of it.
        await command(app, pilot, f"unpause {approval}")
        await until(pilot, lambda: any("cannot unpause" in n for n in _titles(app)), what="why")
        why = next(n for n in _titles(app) if "cannot unpause" in n)
        assert approval in why


def _titles(app: ObeliskApp) -> list[str]:
    return [f"{n.title}: {n.message}" for n in app._notifications]


async def _blocked(engine: Engine, eid: str) -> bool:
    return await state_of(engine, eid) == "blocked_by_join_set"


async def _state_is(engine: Engine, eid: str, state: str) -> bool:
    return await state_of(engine, eid) == state


async def test_a_wrong_line_is_named_and_stays_open(console_engine: Engine) -> None:
    engine = console_engine
    order = await engine.submit(ORDER, ["o-1"])
    await engine.submit(ORDER, ["o-2"])
    async with open_console(engine, size=(80, 24)) as (app, pilot):
        await until(pilot, lambda: order in listed(app), what="listed")
        await command(app, pilot, "frob now")
        await until(pilot, lambda: any(":frob" in n for n in notices(app)), what="the error")
        message = next(n for n in notices(app) if ":frob" in n)
        assert "pause" in message and "filter" in message  # the valid ones
        assert line(app).is_open and line(app).input.value == "frob now"  # to be fixed

        await pilot.press("escape")
        assert not line(app).is_open
        assert app.screen.focused is app.screen.query_one(ExecutionList)  # given back

        await command(app, pilot, "pause E_01ZZZZZZZZ")
        await until(pilot, lambda: any("no execution E_01ZZZZZZZZ" in n for n in notices(app)))
        await pilot.press("escape")
        await command(app, pilot, "pause E_")  # both orders' ids start so
        await until(pilot, lambda: any("ambiguous id E_" in n for n in notices(app)))
        assert not any(n.startswith("paused") for n in notices(app))
        await pilot.press("escape")
        await command(app, pilot, "filter state:bogus")
        await until(pilot, lambda: any("'bogus'" in n for n in notices(app)), what="bad filter")
        assert app.screen.query_state.states == ()  # type: ignore[attr-defined]
        assert app.screen_errors == []


async def test_filter_order_and_open_from_the_line(console_engine: Engine) -> None:
    engine = console_engine
    order = await engine.submit(ORDER, ["o-1"])
    step = await engine.submit(STEP, [2])
    async with open_console(engine) as (app, pilot):
        await until(pilot, lambda: step in listed(app), what="listed")
        # `:` and `/` typed into the line are text, not keys.
        await command(app, pilot, f"filter ffqn:{ORDER}")
        screen = app.screen
        assert isinstance(screen, ExecutionsScreen)
        await until(pilot, lambda: screen.query_state.ffqn_prefix == ORDER, what="filtered")
        await until(pilot, lambda: step not in listed(app), what="the step filtered out")
        await command(app, pilot, "order oldest")
        await until(pilot, lambda: screen.query_state.order == "created_asc", what="ordered")
        assert screen.query_state.ffqn_prefix == ORDER  # the filter stays
        await command(app, pilot, "filter")
        await until(pilot, lambda: not screen.query_state.is_filtered, what="cleared")

        await command(app, pilot, f"open {order}")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="opened")
        assert app.screen.execution_id == order  # type: ignore[attr-defined]
        # On an execution's screen: no id acts on it; a child is named by its end.
        await until(pilot, lambda: _blocked(engine, order), what="blocked")
        await command(app, pilot, "pause")
        await until(pilot, lambda: _state_is(engine, order, "paused"), what="paused")
        await command(app, pilot, "open approve_1")
        await until(
            pilot,
            lambda: getattr(app.screen, "execution_id", "") == f"{order}.o:1-approve_1",
            what="the child's screen",
        )
        # A list command from an execution's screen: back to the list, filtered.
        await command(app, pilot, "filter state:paused")
        await until(pilot, lambda: isinstance(app.screen, ExecutionsScreen), what="the list")
        await until(pilot, lambda: screen.query_state.states == ("paused",), what="filtered")


async def test_tab_history_and_escape(console_engine: Engine) -> None:
    engine = console_engine
    order = await engine.submit(ORDER, ["o-1"])
    async with open_console(engine) as (app, pilot):
        await until(pilot, lambda: order in listed(app), what="listed")
        await pilot.press("colon", "p", "a", "tab")
        assert line(app).input.value == "pause "
        await pilot.press(*order[:-4], "tab")
        # As far as the order and its approval child agree: the hint shows both.
        assert line(app).input.value == f"pause {order}"
        assert "approve_1" in str(line(app).query_one("#command-hint").render())
        await pilot.press("escape")
        await command(app, pilot, "order oldest")
        await command(app, pilot, "order newest")
        await pilot.press("colon", "x", "up")
        assert line(app).input.value == "order newest"
        await pilot.press("up")
        assert line(app).input.value == "order oldest"
        await pilot.press("down", "down")
        assert line(app).input.value == "x"  # what was being typed
        await pilot.press("escape")
        assert isinstance(app.screen, ExecutionsScreen)  # `esc` closed the line only


async def test_submit_help_and_quit(console_engine: Engine) -> None:
    engine = console_engine
    async with open_console(engine) as (app, pilot):
        await command(app, pilot, f"submit {STEP} [7]")
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="opened")
        eid = app.screen.execution_id  # type: ignore[attr-defined]
        assert await engine.result(eid, timeout=10) == ev.ResultOk(70)
        await command(app, pilot, f"submit {STEP} [-1]")
        await until(pilot, lambda: any("params[0]" in n for n in notices(app)), what="refused")
        await pilot.press("escape")
        await command(app, pilot, "submit test:console/activity.nope")
        await until(pilot, lambda: any("no exported function" in n for n in notices(app)))
        await pilot.press("escape")

        await command(app, pilot, "help")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), what="help")
        await pilot.press("end")  # after the keys; written as typed (not taken for markup)
        await until(
            pilot,
            lambda: (
                ":order [newest|oldest|changed]" in (text := screen_text(app))
                and ":submit [FFQN [PARAMS]]" in text
            ),
            what="the commands at the end of the help",
        )
        await pilot.press("escape")
        await command(app, pilot, "q")
        await until(pilot, lambda: not app.is_running, what="quit")


async def test_a_stub_is_refused_where_the_key_is(console_engine: Engine) -> None:
    engine = console_engine
    eid = await engine.submit(STEP, [1])
    await engine.result(eid, timeout=10)
    async with open_console(engine) as (app, pilot):
        await select(app, pilot, eid)
        await command(app, pilot, f"stub {eid}")
        await until(pilot, lambda: any("not a stub activity" in n for n in notices(app)))


async def test_forced_cancel_and_stub_from_the_line(console_engine: Engine) -> None:
    from datetime import timedelta

    from obelisk_tui.screens.stub import StubScreen
    from tests.console.conftest import FANOUT

    engine = console_engine
    # Not -cancellable, and pending for a day: only a forced cancel ends it.
    fanout = await engine.submit(FANOUT, [1], scheduled_at=engine.clock.now() + timedelta(days=1))
    order = await engine.submit(ORDER, ["o-1"])
    async with open_console(engine) as (app, pilot):
        await until(pilot, lambda: fanout in listed(app), what="listed")
        await command(app, pilot, f"cancel --force {order}")  # cancellable: refused, as `X` is
        await until(pilot, lambda: any("without force" in n for n in notices(app)), what="why")
        assert not isinstance(app.screen, ConfirmScreen)

        await command(app, pilot, f"cancel! {fanout}")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
        assert isinstance(app.screen, ConfirmScreen)
        assert "is not cancellable. End it by force?" in app.screen.question  # `X`'s question
        await pilot.press("y")
        assert await engine.result(fanout, timeout=10) == ev.ExecutionFailure(
            "cancelled", "cancellation requested"
        )

        approval = f"{order}.o:1-approve_1"
        await until(pilot, lambda: approval in listed(app), what="the approval")
        await command(app, pilot, "stub approve_1")
        await until(pilot, lambda: isinstance(app.screen, StubScreen), what="the stub dialog")
        assert app.screen.info["execution_id"] == approval  # type: ignore[attr-defined]
        await pilot.press("escape")
