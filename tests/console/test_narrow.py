"""The console at 80×24: nothing cut silently (ids keep their end, titles their FFQN),
toasts wrapped between words, state colours from the theme, the header's glyph."""

from __future__ import annotations

from engine.engine import Engine
from obelisk_tui.screens.detail import ExecutionDetailScreen
from tests.console.conftest import APPROVE, ORDER, open_console, screen_text, until

NARROW = (80, 24)


async def test_ids_and_titles_at_80_columns(console_engine: Engine) -> None:
    engine = console_engine
    order = await engine.submit(ORDER, ["o-1"])
    approval = f"{order}.o:1-approve_1"
    async with open_console(engine, size=NARROW) as (app, pilot):
        await until(pilot, lambda: "approve_1" in screen_text(app), what="the approval's row")
        text = screen_text(app)
        # The child's distinguishing end, an ellipsis where the id is cut; the age stays.
        assert f"{order[:6]}…" in text and ".o:1-approve_1" in text
        assert "AGE" in text
        await pilot.press("slash", *"ffqn:test:console/workflow.order-cancellable", "enter")
        await until(
            pilot,
            lambda: "ffqn:test:console/workflow.order-cancellable" in screen_text(app),
            what="the filter's FFQN in the title",
        )
        await pilot.press("escape")
        app.open_execution(approval)
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        await until(pilot, lambda: APPROVE in screen_text(app), what="the FFQN in the title")
        title = next(line for line in screen_text(app).splitlines() if APPROVE in line)
        assert ".o:1-approve_1" in title


async def test_the_header_has_no_missing_glyph(console_engine: Engine) -> None:
    async with open_console(console_engine, size=NARROW) as (app, _):
        header = screen_text(app).splitlines()[0]
        assert "Obelisk" in header
        # Not in the browser's font (Roboto Mono) nor the PNGs': a box there.
        assert not any(ord(ch) >= 0x2500 for ch in header if ch not in "—·…")


def test_a_served_console_names_the_served_url_not_the_api() -> None:
    from obelisk_tui.backend import RestBackend
    from obelisk_tui.cli import parser

    args = parser().parse_args(
        ["--attach", "http://127.0.0.1:41234", "--served-at", "http://127.0.0.1:8000"]
    )
    backend = RestBackend(args.attach, None, served_at=args.served_at)
    assert "http://127.0.0.1:8000" in backend.label
    assert "41234" not in backend.label


async def test_state_colours_follow_the_theme(console_engine: Engine) -> None:
    from obelisk_tui import model
    from obelisk_tui.widgets.execution_list import ExecutionList

    engine = console_engine
    await engine.submit(ORDER, ["o-1"])

    def row_colours(app: object) -> set[str]:
        lst = app.screen.query_one(ExecutionList)  # type: ignore[attr-defined]
        row = lst.render_row(0, lst.size.width)
        return {str(span.style) for span in row.spans} if row is not None else set()

    async with open_console(engine, size=NARROW) as (app, pilot):
        await until(pilot, lambda: "approve_1" in screen_text(app), what="rows")
        app.theme = "textual-dark"
        await pilot.pause()
        dark = dict(model.STATE_COLOURS)
        dark_row = row_colours(app)
        app.theme = "textual-light"
        await until(pilot, lambda: dark != model.STATE_COLOURS, what="the light theme's colours")
        background = app.current_theme.to_color_system().generate()["background"]
        for state in ("pending_at", "locked", "blocked_by_join_set", "finished", "err"):
            assert model.contrast(model.STATE_COLOURS[state], background) >= 3.0, state
        assert row_colours(app) != dark_row  # what the list renders follows
        app.theme = "textual-dark"
        await until(pilot, lambda: dark == model.STATE_COLOURS, what="back to dark")


async def test_batch_cancel_names_the_executions_and_reports_one_per_line(
    console_engine: Engine,
) -> None:
    engine = console_engine
    orders = [await engine.submit(ORDER, [f"o-{i}"]) for i in range(2)]
    async with open_console(engine, size=NARROW) as (app, pilot):
        await pilot.press("slash", *f"ffqn:{ORDER}", "enter")
        await until(
            pilot, lambda: all(o in screen_text(app) for o in orders), what="both orders listed"
        )
        await pilot.press("g", "m", "m", "c")
        # The confirmation names both, whole.
        await until(
            pilot,
            lambda: (
                "Cancel 2 executions?" in screen_text(app)
                and all(o in screen_text(app) for o in orders)
            ),
            what="the confirmation naming both",
        )
        await pilot.press("y")

        def result() -> list[str]:
            found = [
                str(n.message) for n in app._notifications if "2 executions:" in str(n.message)
            ]
            return found[0].splitlines() if found else []

        await until(pilot, lambda: bool(result()), what="the result toast")
        assert sorted(result()[1:]) == sorted(orders)  # one line each, whole


async def test_first_and_last_in_an_empty_children_tab(console_engine: Engine) -> None:
    """Found by the monkey (seed 4): `g` on the Children tab before it has lines."""
    from tests.console.conftest import STEP

    engine = console_engine
    eid = await engine.submit(STEP, [1])
    async with open_console(engine, size=NARROW) as (app, pilot):
        app.open_execution(eid)
        await until(pilot, lambda: isinstance(app.screen, ExecutionDetailScreen), what="detail")
        from obelisk_tui.widgets.children_tree import ChildrenTree

        # The tab's tree is mounted when the tab is first shown; `3` then (a key pressed
        # while the screen is still being mounted does not switch tabs).
        await until(pilot, lambda: getattr(app.screen, "info", None) is not None, what="loaded")
        await pilot.press("3")
        await until(pilot, lambda: bool(app.screen.query(ChildrenTree)), what="the tab")
        tree = app.screen.query_one(ChildrenTree)
        tree.clear()  # no lines (its root hidden), as before the tab's first load
        tree.action_first()  # what `g` / `G` call, before the tree has lines again
        tree.action_last()
        await pilot.pause()
