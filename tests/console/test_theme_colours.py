"""Every screen draws in the theme's colours (`palette`, as the list's states do with
`model.STATE_COLOURS`): under light themes the submit and stub dialogs, the components
screen, the help and an execution's State tab use the theme's colours, readable on what
they are drawn on, and none of the fixed colours of a dark theme that were there before."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from textual.pilot import Pilot
from textual.widget import Widget
from textual.widgets import TextArea

from engine.views import EventEntry
from obelisk_tui import model, palette
from obelisk_tui.app import ObeliskApp
from obelisk_tui.screens.components import ComponentsScreen
from obelisk_tui.screens.detail import ExecutionDetailScreen
from obelisk_tui.screens.event_json import EventJsonScreen
from obelisk_tui.screens.help import HelpScreen
from obelisk_tui.screens.stub import StubScreen
from obelisk_tui.screens.submit import SubmitScreen
from tests.console import fixed_data
from tests.console.conftest import screen_text, until
from tests.console.test_snapshots import _loaded

#: A dark theme and two light ones (one of them not Textual's own).
SOME_THEMES = ("gruvbox", "textual-light", "solarized-light")

#: The fixed colours (made for dark backgrounds) these screens drew before.
DARK_ONLY = {"#e0606a", "#5fb86a", "#b5bd68", "#8abeb7", "#f0c674", "#e0b050", "#e08a3c"}


def drawn_lines(app: ObeliskApp, widget: Widget) -> list[list[tuple[str, str, str]]]:
    """(text, foreground, background) of what is drawn of `widget` now, line by line, in
    runs of one colour (blanks left out)."""
    region = widget.region
    update = app.screen._compositor.render_full_update()
    lines: list[list[tuple[str, str, str]]] = []
    for y in range(region.y, region.bottom):
        line = update.strips[y]
        runs: list[tuple[str, str, str]] = []
        x = 0
        previous: tuple[str, str] | None = None
        for segment in (s for strip in ([line] if hasattr(line, "text") else line) for s in strip):
            text, style = segment.text, segment.style
            start, x = x, x + len(text)
            if not text.strip() or x <= region.x or start >= region.right or style is None:
                previous = None
                continue
            fg = style.color.triplet.hex if style.color and style.color.triplet else ""
            bg = style.bgcolor.triplet.hex if style.bgcolor and style.bgcolor.triplet else ""
            if previous == (fg, bg):
                runs[-1] = (runs[-1][0] + text, fg, bg)
            else:
                runs.append((text, fg, bg))
            previous = (fg, bg)
        lines.append(runs)
    return lines


def drawn(app: ObeliskApp, widget: Widget) -> list[tuple[str, str, str]]:
    """(text, foreground, background) of what is drawn of `widget` now, in runs of one
    colour (blanks left out)."""
    return [run for line in drawn_lines(app, widget) for run in line]


def colour_of(app: ObeliskApp, widget: Widget, text: str) -> str:
    found = [fg for t, fg, _ in drawn(app, widget) if text in t]
    assert found, f"{text!r} is not drawn in {widget!r}: {drawn(app, widget)[:20]}"
    return found[0]


def assert_readable(app: ObeliskApp, widget: Widget) -> None:
    for text, fg, bg in drawn(app, widget):
        assert fg.lower() not in DARK_ONLY, (text, fg)
        if fg and bg and any(c.isalnum() for c in text):  # text, not a border's lines
            assert model.contrast(fg, bg) >= 3.0, (text, fg, bg)


async def shown(app: ObeliskApp, pilot: Pilot[None], screen_type: type) -> None:
    await until(pilot, lambda: isinstance(app.screen, screen_type), what=screen_type.__name__)
    await pilot.pause()  # composed


@pytest.mark.parametrize("theme", ["textual-light", "solarized-light"])
async def test_screens_draw_in_a_light_themes_colours(tmp_path: Path, theme: str) -> None:
    deployment, data = await fixed_data.build(tmp_path)
    app = ObeliskApp(fixed_data.connector(deployment, data), now=lambda: fixed_data.NOW, live=False)
    async with app.run_test(size=(110, 50)) as pilot:
        await _loaded(pilot)
        app.theme = theme
        await pilot.pause()
        variables = app.current_theme.to_color_system().generate()
        assert palette.theme_colours(variables) == palette.COLOURS
        colours = dict(palette.COLOURS)

        # Submit: the signature's names and types, the check's ✗ and ✓.
        await pilot.press("s")
        await shown(app, pilot, SubmitScreen)
        await pilot.press(*"step", "enter")
        signature = app.screen.query_one("#signature")
        await until(pilot, lambda: "u32" in str(signature.render()), what="the signature")
        await pilot.pause()
        assert colour_of(app, signature, "idx") == colours["label"]
        assert colour_of(app, signature, "u32") == colours["type"]
        assert_readable(app, signature)
        check = app.screen.query_one("#params-error")
        assert colour_of(app, check, "params match") == colours["ok"]
        app.screen.query_one(TextArea).text = '["x"]'
        await until(pilot, lambda: "✗" in str(check.render()), what="the error")
        await pilot.pause()
        assert colour_of(app, check, "✗") == colours["error"]
        assert_readable(app, check)
        # Another theme while the dialog is open: drawn again in its colours.
        app.theme = "textual-dark"
        await until(pilot, lambda: palette.COLOURS["error"] != colours["error"], what="dark")
        await until(
            pilot,
            lambda: colour_of(app, check, "✗") == palette.COLOURS["error"],
            what="the error redrawn",
        )
        app.theme = theme
        await until(pilot, lambda: colour_of(app, check, "✗") == colours["error"], what="back")
        await pilot.press("escape")

        # Stub: the return type, the check.
        info = await app.backend.status(fixed_data.IDS["paused"])
        app.push_screen(StubScreen(info))
        await shown(app, pilot, StubScreen)
        stub_signature = app.screen.query_one("#stub-signature")
        await until(pilot, lambda: "->" in str(stub_signature.render()), what="its type")
        await pilot.pause()
        assert colour_of(app, stub_signature, "result<bool") == colours["type"]
        stub_check = app.screen.query_one("#stub-error")
        assert colour_of(app, stub_check, "matches") == colours["ok"]
        assert_readable(app, stub_check)
        await pilot.press("escape")

        # Components: the last reload's outcome.
        await pilot.press("C")
        await shown(app, pilot, ComponentsScreen)
        status = app.screen.query_one("#reload-status")
        await until(pilot, lambda: "started" in screen_text(app), what="the reload status")
        await pilot.pause()
        assert colour_of(app, status, "started") == colours["ok"]
        assert_readable(app, status)

        # The help: its keys.
        await pilot.press("question_mark")
        await shown(app, pilot, HelpScreen)
        await pilot.pause()
        help_text = app.screen.query_one("#help-text")
        assert colour_of(app, help_text, "esc") == colours["mark"]
        assert_readable(app, help_text)
        await pilot.press("escape", "escape")

        # An execution's State tab: the badge, the diagram, the field names.
        app.open_execution(fixed_data.IDS["fanout"])
        await shown(app, pilot, ExecutionDetailScreen)
        view = app.screen.query_one("#state-view")
        await until(pilot, lambda: "state now" in screen_text(app), what="the state")
        await pilot.pause()
        badge = [bg for t, _, bg in drawn(app, view) if "live" in t]
        assert badge == [colours["ok"]]
        assert colour_of(app, view, "Locked") == colours["box"]
        assert colour_of(app, view, "execution") == colours["label"]
        assert_readable(app, view)


def test_every_built_in_themes_colours_are_readable_on_it() -> None:
    from textual.app import App

    for name, theme in App().available_themes.items():
        variables = theme.to_color_system().generate()
        background = variables["background"]
        colours = palette.theme_colours(variables)
        if not background.startswith("#"):  # the ANSI themes: the terminal's own colours
            assert colours == palette.DEFAULTS
            continue
        for role in palette.ROLE_VARIABLES:
            assert model.contrast(colours[role], background) >= palette.TEXT_CONTRAST, (name, role)
        for role in palette.FADED:
            assert model.contrast(colours[role], background) >= 3.0, (name, role)
        for role in palette.ON_SURFACE:  # JSON: in a tab and in a dialog
            minimum = 3.0 if role in palette.FADED else palette.TEXT_CONTRAST
            assert model.contrast(colours[role], variables["surface"]) >= minimum, (name, role)
        assert colours["ok"] != colours["error"], name  # told apart by colour too
    dark = App().available_themes["textual-dark"].to_color_system().generate()
    assert palette.theme_colours(dark) == palette.DEFAULTS  # before a theme is applied


#: JSON's roles (`palette.json_text`) and the least contrast of each on what it is drawn on.
JSON_CONTRAST = {
    "json_key": palette.TEXT_CONTRAST,
    "json_string": palette.TEXT_CONTRAST,
    "json_number": palette.TEXT_CONTRAST,
    "json_literal": palette.TEXT_CONTRAST,
    "json_punctuation": palette.FADED_CONTRAST,
}
#: An event as its raw view shows it: every kind of JSON value.
EVENT: dict[str, Any] = {
    "version": 7,
    "created_at": "2026-03-14T09:27:43.689000+00:00",
    "backtrace_id": None,
    "event": {"type": "join_next", "closing": False, "tries": [1, -2.5], "ok": True},
}


def assert_json_drawn(
    app: ObeliskApp, runs: list[tuple[str, str, str]], tokens: dict[str, str], theme: str
) -> None:
    """`runs` (JSON only) are drawn in the JSON roles' colours, each readable on what it
    is drawn on; each of `tokens` in its role's colour."""
    role_of = {palette.COLOURS[role].lower(): role for role in JSON_CONTRAST}
    for text, fg, bg in runs:
        assert fg.lower() in role_of, (theme, text, fg, role_of)
        if bg:  # the ANSI themes draw on the terminal's own background
            minimum = JSON_CONTRAST[role_of[fg.lower()]]
            assert model.contrast(fg, bg) >= minimum, (theme, text, fg, bg)
    for token, role in tokens.items():
        found = [fg.lower() for text, fg, _ in runs if token in text]
        assert found[:1] == [palette.COLOURS[role].lower()], (theme, token, runs)


async def redrawn(app: ObeliskApp, pilot: Pilot[None], theme: str) -> None:
    app.theme = theme
    variables = app.current_theme.to_color_system().generate()
    await until(pilot, lambda: palette.theme_colours(variables) == palette.COLOURS, what=theme)
    await pilot.pause()  # Restyled and DataChanged handled
    await pilot.pause()


async def test_json_is_drawn_in_every_built_in_themes_colours(tmp_path: Path) -> None:
    """The raw event view, the Result tab and the State tab's params draw JSON in the
    theme's JSON roles, readable on every built-in theme (dark and light), redrawn when
    the theme changes; none in Rich's own fixed JSON colours.

    Every theme is drawn on the State tab; the Result tab and the raw event view, which
    draw through the same roles, on a dark theme and two light ones (a theme switch
    restyles the whole screen: ~0.35 s each, 20 s for all three views)."""
    deployment, data = await fixed_data.build(tmp_path)
    app = ObeliskApp(fixed_data.connector(deployment, data), now=lambda: fixed_data.NOW, live=False)
    async with app.run_test(size=(110, 50)) as pilot:
        await _loaded(pilot)
        themes = sorted(app.available_themes)
        assert set(SOME_THEMES) <= set(themes)

        app.open_execution(fixed_data.IDS["err"])
        await shown(app, pilot, ExecutionDetailScreen)
        view = app.screen.query_one("#state-view")
        await until(pilot, lambda: "state now" in screen_text(app), what="the state")
        for theme in themes:
            await redrawn(app, pilot, theme)
            params = [
                line for line in drawn_lines(app, view) if line and line[0][0].strip() == "params"
            ]
            assert params, theme
            assert_json_drawn(
                app, params[0][1:], {"13": "json_number", "[": "json_punctuation"}, theme
            )

        await pilot.press("5")  # the Result tab: err "unlucky 13"
        result = app.screen.query_one("#result-view")
        await until(pilot, lambda: "unlucky 13" in screen_text(app), what="the result")
        for theme in SOME_THEMES:
            await redrawn(app, pilot, theme)
            lines = [line for line in drawn_lines(app, result) if line]
            assert lines[0][0][0].strip() == "err"  # the heading (a state's colour), then the JSON
            assert_json_drawn(app, lines[1], {'"unlucky 13"': "json_string"}, theme)

        app.push_screen(EventJsonScreen(fixed_data.IDS["err"], cast(EventEntry, EVENT)))
        await shown(app, pilot, EventJsonScreen)
        raw = app.screen.query_one("#event-json-text")
        tokens = {
            '"version"': "json_key",
            "7": "json_number",
            '"2026-03-14T09:27:43.689000+00:00"': "json_string",
            "null": "json_literal",
            "false": "json_literal",
            "true": "json_literal",
            "-2.5": "json_number",
            "{": "json_punctuation",
        }
        for theme in SOME_THEMES:
            await redrawn(app, pilot, theme)
            runs = [run for line in drawn_lines(app, raw) for run in line]
            assert_json_drawn(app, runs, tokens, theme)
