"""`StateView`: the state-machine diagram at a version, and the execution's metadata."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from engine.views import EventEntry, ExecutionInfo
from obelisk_tui import diagram, model, palette
from obelisk_tui.timeline import Step


def metadata(info: ExecutionInfo, events: list[EventEntry], now: datetime) -> Table:
    """Params, parent, component, retries, lock holder and times, as a two-column grid."""
    created: dict[str, Any] = events[0]["event"] if events else {}
    locks = [e["event"] for e in events if e["event"].get("type") == "locked"]
    last_lock = locks[-1] if locks else None
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold " + palette.COLOURS["label"], no_wrap=True)
    table.add_column()
    table.add_row("execution", info["execution_id"])
    table.add_row("function", f"{info['ffqn']}  ({info['component_type']})")
    params = json.dumps(created.get("params", []), ensure_ascii=False)
    params = params if len(params) < 400 else params[:399] + "…"
    table.add_row("params", palette.highlight_json(params))
    table.add_row("parent", info["parent_id"] or "— (top-level)")
    if created.get("scheduled_by"):
        table.add_row("scheduled by", str(created["scheduled_by"]))
    component = created.get("component_id") or {}
    if component:
        table.add_row("component", f"{component.get('name')}  {component.get('digest')}")
    table.add_row("created", str(info["created_at"]))
    table.add_row("updated", str(info["updated_at"]))
    finished = model.finished_at(events)
    took = model.duration(info, now, finished)
    table.add_row("duration", f"{took}  (created → {'finished' if finished else 'now'})")
    if info.get("scheduled_at"):
        table.add_row("pending at", str(info["scheduled_at"]))
    under = model.state_name(model.underlying(info["state"]))
    expires = model.parse_ts(info.get("lock_expires_at"))
    holder = f"{(last_lock or {}).get('executor_id')} / {(last_lock or {}).get('run_id')}"
    if last_lock is not None and under == "locked":
        table.add_row("lock", f"{holder} until {info.get('lock_expires_at')}")
    elif last_lock is not None and under == "blocked_by_join_set" and expires and expires > now:
        # With `await`, the run that blocked may still be waiting in memory until then.
        table.add_row("waiting run", f"{holder} until {info.get('lock_expires_at')}")
    retry = (last_lock or {}).get("retry_config") or {}
    failures = info["temporary_event_count"]
    if "max_retries" in retry:
        limit = retry["max_retries"]
        left = "∞ (retried forever)" if limit is None else str(max(0, limit - failures))
        table.add_row(
            "retries",
            f"{failures} temporary failure(s), {left} left, backoff {retry.get('retry_exp_backoff_ms')} ms",
        )
    elif failures:
        table.add_row("retries", f"{failures} temporary failure(s)")
    table.add_row("events", str(info["next_version"]))
    return table


def render_state(
    info: ExecutionInfo, events: list[EventEntry], step: Step | None, live: bool, now: datetime
) -> RenderableType:
    head = Text()
    label, colour = model.state_label(info)
    if step is None:
        under = model.state_name(model.underlying(info["state"]))
        overlays = model.overlays(info["state"])
        kind = model.result_kind(info.get("result"))
        edge = None
        head.append(" now ", palette.badge("ok"))
    else:
        under, overlays, kind, edge = (
            step.underlying,
            list(step.overlays),
            step.result_kind,
            step.edge,
        )
        total = max(0, info["next_version"] - 1)
        if live:
            head.append(" live ", palette.badge("ok"))
        else:
            head.append(" time travel ", palette.badge("mark"))
        head.append(f"  at version {step.version} of {total}", "bold")
        head.append("   [ ] versions", palette.COLOURS["muted"])
    head.append("   state now: ", palette.COLOURS["muted"])
    head.append(label, f"bold {colour}")
    finished_as = None
    if kind is not None:
        finished_as = kind.replace("execution_failure:", "failure ")
    lines = diagram.draw(under, list(overlays), edge, finished_as)
    return Group(head, Text(), *lines, Text(), metadata(info, events, now))


class StateView(Static):
    DEFAULT_CSS = """
    StateView { height: auto; padding: 0 1; }
    """

    def show(
        self,
        info: ExecutionInfo,
        events: list[EventEntry],
        step: Step | None,
        live: bool,
        now: datetime,
    ) -> None:
        self.update(render_state(info, events, step, live, now))
