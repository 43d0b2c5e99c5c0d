"""Pure helpers of the console: state names and colours, what applies to an execution,
readable one-line summaries of events, times. No Textual, no I/O (unit-tested alone).
The executions list's query (filter, order, title) is `list_query`."""

from __future__ import annotations

import json
from collections import deque
from datetime import UTC, datetime
from typing import Any

from engine.core import legality
from engine.core.events import accepts_stub, is_workflow_type
from engine.views import (
    EventEntry,
    ExecutionInfo,
    ResponseEntry,
)

# ---------------------------------------------------------------------------------------
# States
# ---------------------------------------------------------------------------------------

#: Display name of each state (the seeds' names).
STATE_TITLES: dict[str, str] = {
    "pending_at": "PendingAt",
    "locked": "Locked",
    "blocked_by_join_set": "BlockedByJoinSet",
    "paused": "Paused",
    "cancelling": "Cancelling",
    "finished": "Finished",
}

#: Short names for dense tables.
STATE_SHORT: dict[str, str] = {
    "pending_at": "pending",
    "locked": "locked",
    "blocked_by_join_set": "blocked",
    "paused": "paused",
    "cancelling": "cancelling",
    "finished": "finished",
}

#: Colours before a theme is applied (and where a theme names no colour).
DEFAULT_STATE_COLOURS: dict[str, str] = {
    "pending_at": "#d7a94b",
    "locked": "#4f9fe8",
    "blocked_by_join_set": "#b07fe0",
    "paused": "#e08a3c",
    "cancelling": "#e0606a",
    "finished": "#5fb86a",
    "err": "#e0606a",
    "failed": "#c94f4f",
}
#: The states' colours in the current theme: the app updates it on every theme change
#: (`state_colours`), in place, so every renderer reads the theme's.
STATE_COLOURS: dict[str, str] = dict(DEFAULT_STATE_COLOURS)


#: The theme colour (a Textual theme variable) each state's colour comes from.
STATE_THEME_VARIABLES: dict[str, str] = {
    "pending_at": "warning",
    "locked": "primary",
    "blocked_by_join_set": "accent",
    "paused": "secondary",
    "cancelling": "error",
    "finished": "success",
    "err": "error",
    "failed": "error",
}
#: The least contrast (WCAG ratio) of a state's colour against the background.
MIN_CONTRAST = 3.0


def _rgb(colour: str) -> tuple[int, int, int] | None:
    if len(colour) != 7 or not colour.startswith("#"):
        return None
    try:
        return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)
    except ValueError:
        return None


def _luminance(rgb: tuple[int, int, int]) -> float:
    def channel(c: int) -> float:
        v = c / 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    """The WCAG contrast ratio of two `#rrggbb` colours (1 when one is not one)."""
    ra, rb = _rgb(a), _rgb(b)
    if ra is None or rb is None:
        return 1.0
    la, lb = sorted((_luminance(ra), _luminance(rb)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_on(colour: str) -> str:
    """Black or white, whichever reads on `colour` (a state's label on its colour)."""
    return "black" if contrast(colour, "#000000") >= contrast(colour, "#ffffff") else "white"


def readable(colour: str, background: str, minimum: float = MIN_CONTRAST) -> str:
    """`colour`, mixed towards white (dark backgrounds) or black (light ones) until it
    has `minimum` contrast against `background`."""
    rgb, bg = _rgb(colour), _rgb(background)
    if rgb is None or bg is None:
        return colour
    target = 255 if _luminance(bg) < 0.5 else 0
    out = colour
    for step in range(11):
        mixed = tuple(round(c + (target - c) * step / 10) for c in rgb)
        out = "#{:02x}{:02x}{:02x}".format(*mixed)
        if contrast(out, background) >= minimum:
            break
    return out


def state_colours(theme: dict[str, str]) -> dict[str, str]:
    """The states' colours from a theme's variables (`primary`, `success`, …, and
    `background`), each readable on that background; the defaults where the theme
    names no `#rrggbb` colour (the ANSI themes)."""
    background = theme.get("background", "#000000")
    out = dict(DEFAULT_STATE_COLOURS)
    for state, variable in STATE_THEME_VARIABLES.items():
        colour = theme.get(variable, "")
        base = colour.upper() if _rgb(colour) is not None else DEFAULT_STATE_COLOURS[state]
        out[state] = readable(base, background)
    return out


def state_name(state: dict[str, Any]) -> str:
    return str(state.get("type", "?"))


def underlying(state: dict[str, Any]) -> dict[str, Any]:
    """The state below the Paused / Cancelling overlays."""
    while state.get("type") in ("paused", "cancelling") and isinstance(
        state.get("underlying"), dict
    ):
        state = state["underlying"]
    return state


def overlays(state: dict[str, Any]) -> list[str]:
    out: list[str] = []
    while state.get("type") in ("paused", "cancelling"):
        out.append(str(state["type"]))
        inner = state.get("underlying")
        if not isinstance(inner, dict):
            break
        state = inner
    return out


def result_kind(result: dict[str, Any] | None) -> str | None:
    """ "ok", "err", "execution_failure:<kind>" or None when unfinished."""
    if result is None:
        return None
    if "ok" in result:
        return "ok"
    if "err" in result:
        return "err"
    failure = result.get("execution_failure") or {}
    return f"execution_failure:{failure.get('kind', '?')}"


def state_label(info: ExecutionInfo) -> tuple[str, str]:
    """A short label and its colour: "pending", "paused·blocked", "finished ok", …"""
    state = info["state"]
    name = state_name(state)
    if name == "finished":
        kind = result_kind(info.get("result")) or "?"
        if kind == "ok":
            return "finished ok", STATE_COLOURS["finished"]
        if kind == "err":
            return "finished err", STATE_COLOURS["err"]
        return f"failed {kind.split(':', 1)[1]}", STATE_COLOURS["failed"]
    layers = overlays(state)
    base = STATE_SHORT.get(state_name(underlying(state)), "?")
    if layers:
        return "·".join([*layers, base]), STATE_COLOURS[layers[0]]
    return base, STATE_COLOURS.get(name, "")  # (no colour: the theme's text)


# ---------------------------------------------------------------------------------------
# What applies (SPEC §4.3, §8)
# ---------------------------------------------------------------------------------------


def is_workflow(info: ExecutionInfo) -> bool:
    return is_workflow_type(info["component_type"])


def refusal(action: str, info: ExecutionInfo) -> str | None:
    """Why `action` (pause, unpause, cancel, force_cancel, stub) does not apply to the
    execution, or None. Pause, unpause and cancel ask the engine's own rules
    (`engine.core.legality`): the console words them as the API does."""
    state = info["state"]
    name = state_name(state)
    eid = info["execution_id"]
    if action == "stub" and not accepts_stub(info["component_type"]):
        return f"{eid} is not a stub activity: only activity_stub executions are stubbed"
    if name == "finished":
        return f"{eid} is finished"
    layers = overlays(state)
    if action == "pause":
        paused = legality.pause_refusal(
            eid,
            finished=False,  # answered above
            cancelling="cancelling" in layers,
            paused="paused" in layers,
            running_activity=state_name(underlying(state)) == "locked" and not is_workflow(info),
            subject=eid,  # the console names an execution by its id
        )
        return None if paused is None else str(paused)
    if action == "unpause":
        unpaused = legality.unpause_refusal(
            eid, finished=False, paused="paused" in layers, subject=eid
        )
        return None if unpaused is None else str(unpaused)
    if action == "stub":
        return None
    if action in ("cancel", "force_cancel"):
        force = action == "force_cancel"
        if force and legality.is_cancellable(info["ffqn"], is_workflow(info)):
            # Forcing it would be a plain cancel: `c` says so without the warning.
            return f"{eid} is cancellable: cancel it without force"
        refused = legality.cancel_refusal(
            eid,
            info["ffqn"],
            is_workflow=is_workflow(info),
            finished=False,  # answered above
            cancelling="cancelling" in layers,
            force=force,
        )
        return None if refused is None else str(refused)
    return f"unknown action {action}"


# ---------------------------------------------------------------------------------------
# Text that does not fit: never cut silently
# ---------------------------------------------------------------------------------------

#: Where a shortened id keeps its start: `E_` and the first characters of the ULID.
ID_HEAD = 6


def short_id(execution_id: str, width: int = 11) -> str:
    """An id in `width` columns: its start and, after an ellipsis, as much of its end as
    fits (`E_01M9…XYNVK.o:1-approve_1`): children of one parent differ at the end. The
    default, `E_01JA…7XQZ`, is the kind and creation time and the end that tells ids of
    the same second apart (breadcrumbs)."""
    if len(execution_id) <= width:
        return execution_id
    if width <= 1:
        return "…"[: max(0, width)]
    head = min(ID_HEAD, max(1, width - 5))
    return execution_id[:head] + "…" + execution_id[len(execution_id) - (width - head - 1) :]


def short_end(text: str, width: int) -> str:
    """`text` in `width` columns keeping its end (FFQNs: `…demo/activity.step`, the
    interface and function tell them apart, the shared namespace does not)."""
    if len(text) <= width:
        return text
    return "…" + text[len(text) - width + 1 :] if width > 1 else "…"[: max(0, width)]


def cut_words(text: str, width: int) -> str:
    """`text` in `width` columns, cut at a space (not inside a time, an id or a word)
    with an ellipsis; a first word longer than the width keeps its start."""
    if len(text) <= width:
        return text
    if width <= 1:
        return "…"[: max(0, width)]
    space = text.rfind(" ", 0, width)
    end = space if space > 0 else width - 1
    return text[:end].rstrip() + "…"


def wrap_words(text: str, width: int) -> list[str]:
    """`text` wrapped at spaces into lines of at most `width` columns (its own line
    breaks kept); a word longer than a line (an id) gets a line of its own, whole."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in paragraph.split(" "):
            if line and len(line) + 1 + len(word) > width:
                lines.append(line)
                line = word
            else:
                line = f"{line} {word}" if line else word
        lines.append(line)
    return lines


def name_executions(ids: list[str], limit: int = 4) -> list[str]:
    """One line per execution (a batch's confirmation and result), at most `limit`,
    then how many more."""
    lines = list(ids[:limit])
    if len(ids) > limit:
        lines.append(f"… and {len(ids) - limit} more")
    return lines


def detail_title(
    label: str, execution_id: str, ffqn: str, parent: str | None, width: int
) -> tuple[str, str, str]:
    """The detail title's id, FFQN and parent parts fitted into `width` columns after
    the state label (` label `): the FFQN stays (shortened at its start if need be),
    the id keeps its distinguishing end, the parent goes first (the breadcrumb above the
    title names it too)."""
    room = width - len(label) - 2 - 1 - 2  # ` label `, a space, two before the FFQN
    parent_part = f"   parent {parent} (P)" if parent else ""
    if len(execution_id) + len(ffqn) + len(parent_part) <= room:
        return execution_id, ffqn, parent_part
    # The breadcrumb above the title names the parent already.
    parent_part = "   parent: P" if parent and len(execution_id) + len(ffqn) + 12 <= room else ""
    room -= len(parent_part)
    if len(execution_id) + len(ffqn) > room:
        # The id keeps at least ~20 columns, the FFQN gets the rest (at least ~16).
        id_width = max(min(len(execution_id), room - len(ffqn)), min(len(execution_id), 20))
        execution_id = short_id(execution_id, id_width)
        ffqn = short_end(ffqn, max(room - len(execution_id), 16))
    return execution_id, ffqn, parent_part


# ---------------------------------------------------------------------------------------
# Times
# ---------------------------------------------------------------------------------------


def parse_ts(value: str | None) -> datetime | None:
    if value is None:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


#: Seconds of throughput history (the sparkline's bars).
THROUGHPUT_HISTORY = 60


class Throughput:
    """Executions finished per second, from samples of the engine's finished count.

    The app samples the count on its own timer, whatever screen is shown and frozen or
    not, so the rate is the engine's, not what one screen happened to see. A sample
    `sample(finished, at)` (`at` in seconds) gives the rate since the previous one:
    what finished over the wall-clock time between them. The bars are one per second:
    a sample that comes late (a busy loop, a slow query) fills the seconds it covers
    with that same average, so a long gap is never piled into a spike."""

    def __init__(self, history: int = THROUGHPUT_HISTORY) -> None:
        self.history: deque[float] = deque([0.0] * history, maxlen=history)
        self.rate = 0.0
        #: Samples taken (the first only sets the baseline): tests wait on it.
        self.samples = 0
        self._last: tuple[int, float] | None = None  # (finished, at) of the last sample

    def sample(self, finished: int, at: float) -> None:
        self.samples += 1
        if self._last is None:
            self._last = (finished, at)
            return
        before, then = self._last
        elapsed = at - then
        if elapsed <= 0:  # the clock did not move: keep counting from the last sample
            return
        self._last = (finished, at)
        # Executions are never un-finished; a smaller count (a retention sweep, another
        # server behind the same URL) is not negative throughput.
        self.rate = max(0, finished - before) / elapsed
        for _ in range(min(self.history.maxlen or 0, max(1, round(elapsed)))):
            self.history.append(self.rate)

    @property
    def bars(self) -> list[float]:
        return list(self.history)


def span(seconds: float) -> str:
    """A compact duration: 850ms, 12s, 5m, 3h, 2d."""
    s = abs(seconds)
    if s < 1:
        return f"{int(s * 1000)}ms"
    if s < 60:
        return f"{s:.0f}s" if s >= 10 else f"{s:.1f}s"
    if s < 3600:
        return f"{s // 60:.0f}m"
    if s < 86400:
        return f"{s // 3600:.0f}h"
    return f"{s // 86400:.0f}d"


def relative(at: datetime | None, now: datetime) -> str:
    """ "in 2.0s" / "5m ago" / "" for None."""
    if at is None:
        return ""
    delta = (at - now).total_seconds()
    return f"in {span(delta)}" if delta > 0 else f"{span(delta)} ago"


def clock_time(at: datetime | None) -> str:
    return "" if at is None else at.strftime("%H:%M:%S.%f")[:-3]


def duration_text(seconds: float) -> str:
    """A duration that keeps its second unit (`span` rounds to one): 850ms, 3.2s, 42s,
    5m 03s, 3h 05m, 2d 03h."""
    s = max(0.0, seconds)
    if s < 1:
        return f"{int(s * 1000)}ms"
    if s < 10:
        return f"{s:.1f}s"
    if s < 60:
        return f"{s:.0f}s"
    whole = int(s)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d {whole % 86400 // 3600:02d}h"


def finished_at(events: list[EventEntry]) -> datetime | None:
    """When the log's `finished` event was written (None while unfinished)."""
    for entry in reversed(events):
        if entry["event"].get("type") == "finished":
            return parse_ts(entry["created_at"])
    return None


def duration(info: ExecutionInfo, now: datetime, finished: datetime | None = None) -> str:
    """How long the execution took (created → finished), or has taken so far (→ now):
    "3.2s", "12s so far". `finished`: its `finished` event's time when the log is at
    hand; else a finished execution's last change stands for it (a response that
    reaches it later, e.g. of a child it did not await, moves that)."""
    created = parse_ts(info["created_at"])
    if created is None:
        return ""
    if state_name(info["state"]) != "finished":
        return f"{duration_text((now - created).total_seconds())} so far"
    end = finished or parse_ts(info["updated_at"]) or created
    return duration_text((end - created).total_seconds())


# ---------------------------------------------------------------------------------------
# Events
# ---------------------------------------------------------------------------------------


def _short_json(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _schedule_at(value: dict[str, Any] | None) -> str:
    if not value:
        return "now"
    kind = value.get("type")
    if kind == "now":
        return "now"
    if kind == "at":
        return f"at {value.get('at')}"
    if kind == "in":
        return f"in {span(float(value.get('milliseconds', 0)) / 1000)}"
    return _short_json(value)


def normal_result(result: dict[str, Any]) -> dict[str, Any]:
    """A result in the API's shape (`{"ok": v}`, …) from either that or the log's
    tagged shape (`{"type": "ok", "value": v}`)."""
    kind = result.get("type")
    if kind in ("ok", "err"):
        return {kind: result.get("value")}
    if kind == "execution_failure":
        return {"execution_failure": {k: v for k, v in result.items() if k != "type"}}
    return result


def result_summary(result: dict[str, Any] | None) -> str:
    if result is None:
        return ""
    result = normal_result(result)
    if "ok" in result:
        return f"ok {_short_json(result['ok'])}"
    if "err" in result:
        return f"err {_short_json(result['err'])}"
    f = result.get("execution_failure") or {}
    detail = f": {f['reason']}" if f.get("reason") else ""
    return f"execution failure {f.get('kind', '?')}{detail}"


def event_name(event: dict[str, Any]) -> str:
    """The event's type, the inner type for history events ("join_next")."""
    if event.get("type") == "history_event" and isinstance(event.get("event"), dict):
        return str(event["event"].get("type"))
    return str(event.get("type"))


def event_summary(event: dict[str, Any]) -> str:
    """A readable one-liner of an event (the name is shown beside it)."""
    kind = event.get("type")
    if kind == "created":
        params = _short_json(event.get("params", []), 50)
        parent = event.get("parent")
        via = f", child of {parent[0]} in {parent[1]}" if parent else ""
        return f"{event.get('ffqn')} {params}{via}"
    if kind == "locked":
        retry = event.get("retry_config") or {}
        retries = retry.get("max_retries")
        return (
            f"by {event.get('executor_id')} run {event.get('run_id')} until "
            f"{clock_time(parse_ts(event.get('lock_expires_at')))}"
            + (f", max retries {retries}" if retries is not None else "")
        )
    if kind == "unlocked":
        at = clock_time(parse_ts(event.get("backoff_expires_at")))
        return f"{event.get('reason')}, pending at {at}"
    if kind == "temporarily_failed":
        detail = f" {event['detail']}" if event.get("detail") else ""
        return (
            f"{event.get('reason')}{detail}; retry at "
            f"{clock_time(parse_ts(event.get('backoff_expires_at')))}"
        )
    if kind == "temporarily_timed_out":
        return f"retry at {clock_time(parse_ts(event.get('backoff_expires_at')))}"
    if kind == "finished":
        return result_summary(event.get("result"))
    if kind == "component_upgrade_finished":
        outcome = event.get("outcome") or {}
        digest = str(event.get("digest", ""))[:19]
        if outcome.get("type") == "success":
            return f"success: continues on {digest}"
        reason = f": {outcome['reason']}" if outcome.get("reason") else ""
        return f"failed: stays on its version, not {digest}{reason}"
    if kind in ("paused", "unpaused", "cancellation_requested"):
        return ""
    if kind == "history_event":
        return _history_summary(event.get("event") or {})
    return _short_json(event)


def requested_child(event: dict[str, Any]) -> str | None:
    """The child execution an event requested (`join_set_request` of a child), if any:
    what `enter` on its row opens."""
    if event.get("type") != "history_event":
        return None
    h = event.get("event") or {}
    req = h.get("request") or {}
    if h.get("type") == "join_set_request" and req.get("type") == "child_execution_request":
        child = req.get("child_execution_id")
        return str(child) if child else None
    return None


def requested_delay(event: dict[str, Any]) -> str | None:
    """The delay an event requested (`join_set_request` of a delay), if any: what `c`
    on its row cancels."""
    if event.get("type") != "history_event":
        return None
    h = event.get("event") or {}
    req = h.get("request") or {}
    if h.get("type") == "join_set_request" and req.get("type") == "delay_request":
        delay = req.get("delay_id")
        return str(delay) if delay else None
    return None


def delay_outcomes(responses: list[ResponseEntry]) -> dict[str, str]:
    """ "expired" or "cancelled" of every delay that finished (a delay absent: waiting)."""
    out: dict[str, str] = {}
    for r in responses:
        resp = r["response"]
        if resp.get("type") == "delay_finished":
            out[str(resp.get("delay_id"))] = (
                "cancelled" if resp.get("outcome") == "cancelled" else "expired"
            )
    return out


def delay_refusal(action: str, delay_id: str, outcome: str) -> str | None:
    """Why `action` (cancel, pause, unpause) does not apply to a delay whose outcome is
    `outcome` (waiting, expired, cancelled), or None. The engine pauses executions, not
    delays: a paused workflow's delay still expires (its response waits for the
    unpause)."""
    if action in ("pause", "unpause"):
        return (
            f"{delay_id} is a delay: the engine cannot {action} a delay, only an execution "
            "(c cancels the delay; on another row p / u act on this workflow)"
        )
    if action != "cancel":
        return f"unknown action {action}"
    if outcome != "waiting":
        return f"{delay_id} already {outcome}: nothing to cancel"
    return None


def breadcrumb(trail: list[str], tail: int = 20) -> list[str]:
    """Labels of a screen stack: the names of screens ("executions", "components") as
    they are, an execution id shortened (`short_id`), a child of the crumb before as
    `child …g:1_2` (what its id adds, its end kept)."""
    labels: list[str] = []
    previous = ""
    for crumb in trail:
        if previous and crumb.startswith(previous + "."):
            rest = crumb[len(previous) + 1 :]
            labels.append(f"child …{rest if len(rest) <= tail else rest[-tail:]}")
        elif crumb.startswith("E_"):
            labels.append(short_id(crumb))
        else:
            labels.append(crumb)
        previous = crumb
    return labels


def fit_breadcrumb(labels: list[str], width: int, separator: str = " › ") -> list[str]:
    """`labels` within `width` columns: the crumbs after the first go from the left (as
    one "…"), the last one always stays (where you are matters most)."""
    if len(separator.join(labels)) <= width or len(labels) <= 2:
        return labels
    for cut in range(2, len(labels)):
        fitted = [labels[0], "…", *labels[cut:]]
        if len(separator.join(fitted)) <= width:
            return fitted
    return [labels[0], "…", labels[-1]]


def resubmit_question(info: ExecutionInfo, params: list[Any]) -> str:
    """The confirmation of a re-submit: what is submitted, and that a failed execution
    is retried so (the engine retries only temporary failures, by itself, never a
    finished execution)."""
    eid = short_id(info["execution_id"])
    what = f"{info['ffqn']} {_short_json(params, 60)}"
    kind = result_kind(info.get("result"))
    if kind is not None and kind != "ok":
        return (
            f"Retry {eid}: submit {what} again as a new execution? (the engine has no "
            "retry of a finished execution: a re-submit is the retry)"
        )
    top = " top-level" if info["parent_id"] else ""
    return f"Re-submit {what} as a new{top} execution (a new id; {eid} stays as it is)?"


def _history_summary(h: dict[str, Any]) -> str:
    kind = h.get("type")
    js = h.get("join_set_id", "")
    if kind == "join_set_create":
        return str(js)
    if kind == "join_set_request":
        req = h.get("request") or {}
        if req.get("type") == "child_execution_request":
            params = _short_json(req.get("params", []), 40)
            return f"{js} → {req.get('child_execution_id')} {req.get('target_ffqn')} {params}"
        return f"{js} → {req.get('delay_id')} until {clock_time(parse_ts(req.get('expires_at')))}"
    if kind == "join_next":
        wanted = f" for {h['requested_ffqn']}" if h.get("requested_ffqn") else ""
        closing = " (closing)" if h.get("closing") else ""
        return f"{js}{wanted}{closing}"
    if kind == "join_next_try":
        return f"{js}: {h.get('outcome')}"
    if kind == "join_next_too_many":
        return f"{js} for {h.get('requested_ffqn')}"
    if kind == "persist":
        k = h.get("kind") or {}
        return f"{k.get('type')} = {_short_json(h.get('value'))}"
    if kind == "schedule":
        when = _schedule_at(h.get("schedule_at"))
        return f"{h.get('execution_id')} {h.get('target_ffqn')} {when}"
    if kind == "stub":
        return f"{h.get('target_execution_id')}: {h.get('outcome', '')}"
    return _short_json(h)


def response_summary(entry: ResponseEntry) -> str:
    r = entry["response"]
    if r.get("type") == "child_execution_finished":
        return f"{r.get('child_execution_id')} finished: {result_summary(r.get('result'))}"
    outcome = "cancelled" if r.get("outcome") == "cancelled" else "expired"
    return f"{r.get('delay_id')} {outcome}"


def child_requests(events: list[EventEntry]) -> list[tuple[int, dict[str, Any]]]:
    """(version, request) of every child or delay requested in a log, in order."""
    out: list[tuple[int, dict[str, Any]]] = []
    for e in events:
        ev = e["event"]
        if ev.get("type") == "history_event":
            h = ev.get("event") or {}
            if h.get("type") == "join_set_request":
                request = {**(h.get("request") or {}), "join_set_id": h.get("join_set_id")}
                out.append((e["version"], request))
    return out
