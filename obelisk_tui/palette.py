"""The console's colours other than the states' (`model.STATE_COLOURS`): each is a role
(an outcome, a highlight, a name, a type, muted text) that takes a colour of the current
theme, made readable on its background (`model.readable`), so that every built-in theme,
light ones included, reads well. The app updates `COLOURS` in place on every theme
change (`ObeliskApp._theme_changed`); renderers look a role up when they draw.
JSON (params, results, an event's raw view) is drawn in roles too (`json_text`): Rich's
own JSON colours are fixed ANSI ones, unreadable on light themes.
No Textual, no I/O."""

from __future__ import annotations

import json
from typing import Any

from rich.highlighter import JSONHighlighter
from rich.text import Span, Text

from obelisk_tui import model

#: The theme variable each role's colour comes from.
ROLE_VARIABLES: dict[str, str] = {
    "ok": "success",  # it worked: ✓, ok outcomes, the live / now badge
    "error": "error",  # ✗, failed reloads and upgrades, errors
    "warning": "warning",  # what waits, warn log lines
    "mark": "accent",  # what is picked out: marks, ◆ backtraces, time travel, keys
    "label": "primary",  # names: the State tab's field names, params, `created`
    "type": "secondary",  # WIT types, join set requests
    # JSON (`json_text`): its keys, strings, numbers, and true / false / null
    "json_key": "primary",
    "json_string": "success",
    "json_number": "accent",
    "json_literal": "secondary",
}
#: Roles that are the foreground faded into the background by this much (of the
#: foreground): "muted" (empty counts, the diagram's lines), "box" (its boxes),
#: "json_punctuation" (JSON's braces, brackets, commas and colons: they recede).
FADED: dict[str, float] = {"muted": 0.55, "box": 0.75, "json_punctuation": 0.75}
#: Roles readable on the theme's `surface` too, not only on its `background`: JSON is
#: drawn in a dialog (an event's raw view, on `$surface`) as well as in a tab.
ON_SURFACE = frozenset(role for role in [*ROLE_VARIABLES, *FADED] if role.startswith("json_"))
#: The least contrast (WCAG ratio) against the background: text that is read (4.5, the
#: WCAG's for text), and text that is meant to recede (as the states' colours, 3).
TEXT_CONTRAST = 4.5
FADED_CONTRAST = model.MIN_CONTRAST

#: Before a theme is applied: textual-dark's (`theme_colours` of it).
DEFAULTS: dict[str, str] = {
    "ok": "#4ebf71",
    "error": "#c7637c",
    "warning": "#fea62b",
    "mark": "#fea62b",
    "label": "#1a86d8",
    "type": "#668fae",
    "json_key": "#3192dc",
    "json_string": "#4ebf71",
    "json_number": "#fea62b",
    "json_literal": "#668fae",
    "muted": "#838383",
    "box": "#acacac",
    "json_punctuation": "#acacac",
    "foreground": "#E0E0E0",
}
#: The current theme's (updated in place: renderers read it when they draw).
COLOURS: dict[str, str] = dict(DEFAULTS)


def _hex(colour: str) -> tuple[int, int, int] | None:
    if len(colour) != 7 or colour[0] != "#":
        return None
    try:
        return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)
    except ValueError:
        return None


def fade(foreground: str, background: str, weight: float) -> str:
    """`foreground` mixed with `background`, `weight` of it the foreground's."""
    fg, bg = _hex(foreground), _hex(background)
    if fg is None or bg is None:
        return foreground
    mixed = (round(f * weight + b * (1 - weight)) for f, b in zip(fg, bg, strict=True))
    return "#{:02X}{:02X}{:02X}".format(*mixed)


def theme_colours(theme: dict[str, str]) -> dict[str, str]:
    """Every role's colour from a theme's variables (`ColorSystem.generate()`), each
    readable on its `background` (and `surface`: `ON_SURFACE`); the defaults where the theme names no `#rrggbb`
    colour (the ANSI themes)."""
    background = theme.get("background", "#121212")
    if _hex(background) is None:
        return dict(DEFAULTS)
    foreground = theme.get("foreground", "")
    if _hex(foreground) is None:
        foreground = DEFAULTS["foreground"]
    surface = theme.get("surface", "")
    out = {"foreground": foreground.upper()}

    def readable(role: str, colour: str, minimum: float) -> str:
        colour = model.readable(colour, background, minimum)
        if role in ON_SURFACE and _hex(surface):
            # Moved further the same way (from a dark background and surface to white,
            # from light ones to black): readable on both.
            colour = model.readable(colour, surface, minimum)
        return colour

    for role, variable in ROLE_VARIABLES.items():
        colour = theme.get(variable, "")
        base = colour.upper() if _hex(colour) else DEFAULTS[role]
        out[role] = readable(role, base, TEXT_CONTRAST)
    for role, weight in FADED.items():
        out[role] = readable(role, fade(foreground, background, weight), FADED_CONTRAST)
    return out


def badge(role: str) -> str:
    """A role's colour as a badge's background, with black or white text on it."""
    colour = COLOURS[role]
    return f"bold {model.text_on(colour)} on {colour}"


#: Rich's JSON highlighter's styles (`json.*`) and the role that draws each. Braces and
#: brackets are punctuation, as the text that no style covers (commas, colons) is.
JSON_ROLES: dict[str, tuple[str, str]] = {
    "json.key": ("json_key", "bold"),
    "json.str": ("json_string", ""),
    "json.number": ("json_number", ""),
    "json.bool_true": ("json_literal", "italic"),
    "json.bool_false": ("json_literal", "italic"),
    "json.null": ("json_literal", "italic"),
    "json.brace": ("json_punctuation", ""),
}


def highlight_json(text: str) -> Text:
    """JSON text (whole or cut short) in the current theme's JSON roles. Rich's
    highlighter finds the parts; its style names, which Rich would draw in its own fixed
    colours, are replaced by the roles' (a key's span comes after its string's: it wins)."""
    highlighted = JSONHighlighter()(text)
    spans = []
    for span in highlighted.spans:
        role, attributes = JSON_ROLES.get(str(span.style), ("", ""))
        if role:
            spans.append(Span(span.start, span.end, f"{attributes} {COLOURS[role]}".strip()))
    highlighted.spans = spans
    highlighted.style = COLOURS["json_punctuation"]
    return highlighted


def json_text(value: Any, indent: int | None = 2) -> Text:
    """A JSON value, pretty (`indent`) and highlighted in the theme's roles, lines not
    wrapped (as Rich's `JSON` draws it)."""
    text = highlight_json(json.dumps(value, indent=indent, ensure_ascii=False, default=str))
    text.no_wrap = True
    text.overflow = None
    return text
