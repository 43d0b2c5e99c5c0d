"""The console's colours other than the states' (`model.STATE_COLOURS`): each is a role
(an outcome, a highlight, a name, a type, muted text) that takes a colour of the current
theme, made readable on its background (`model.readable`), so that every built-in theme,
light ones included, reads well. The app updates `COLOURS` in place on every theme
change (`ObeliskApp._theme_changed`); renderers look a role up when they draw.
No Textual, no I/O."""

from __future__ import annotations

from obelisk_tui import model

#: The theme variable each role's colour comes from.
ROLE_VARIABLES: dict[str, str] = {
    "ok": "success",  # it worked: ✓, ok outcomes, the live / now badge
    "error": "error",  # ✗, failed reloads and upgrades, errors
    "warning": "warning",  # what waits, warn log lines
    "mark": "accent",  # what is picked out: marks, ◆ backtraces, time travel, keys
    "label": "primary",  # names: the State tab's field names, params, `created`
    "type": "secondary",  # WIT types, join set requests
}
#: Roles that are the foreground faded into the background by this much (of the
#: foreground): "muted" (empty counts, the diagram's lines), "box" (its boxes).
FADED: dict[str, float] = {"muted": 0.55, "box": 0.75}
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
    "muted": "#838383",
    "box": "#acacac",
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
    readable on its `background`; the defaults where the theme names no `#rrggbb`
    colour (the ANSI themes)."""
    background = theme.get("background", "#121212")
    if _hex(background) is None:
        return dict(DEFAULTS)
    foreground = theme.get("foreground", "")
    if _hex(foreground) is None:
        foreground = DEFAULTS["foreground"]
    out = {"foreground": foreground.upper()}
    for role, variable in ROLE_VARIABLES.items():
        colour = theme.get(variable, "")
        base = colour.upper() if _hex(colour) else DEFAULTS[role]
        out[role] = model.readable(base, background, TEXT_CONTRAST)
    for role, weight in FADED.items():
        faded = fade(foreground, background, weight)
        out[role] = model.readable(faded, background, FADED_CONTRAST)
    return out


def badge(role: str) -> str:
    """A role's colour as a badge's background, with black or white text on it."""
    colour = COLOURS[role]
    return f"bold {model.text_on(colour)} on {colour}"
