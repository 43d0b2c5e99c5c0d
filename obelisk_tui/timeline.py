"""Time travel: the pending state of an execution after each version of its log.

Folds the log and its responses (API JSON) through the engine's own state machine
(`engine.core.state`), so the console's diagram at version N is exactly the state the
engine computed then. Pure: no Textual, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from engine.client import EventEntry, ResponseEntry
from engine.core import events as ev
from engine.core.state import (
    BlockedByJoinSet,
    Cancelling,
    ExecutionSummary,
    Finished,
    IllegalAppend,
    Locked,
    Paused,
    PendingAt,
    PendingState,
    apply_event,
    apply_response,
    created_summary,
    interleave_stored,
)
from obelisk_tui.diagram import edge_of


@dataclass(frozen=True, slots=True)
class Step:
    """The state while `version` was the last event (responses that came before the next
    event included), and the diagram edge of the last change."""

    version: int
    underlying: str
    overlays: tuple[str, ...]
    result_kind: str | None
    edge: str | None


def _name(state: PendingState) -> str:
    if isinstance(state, PendingAt):
        return "pending_at"
    if isinstance(state, Locked):
        return "locked"
    if isinstance(state, BlockedByJoinSet):
        return "blocked_by_join_set"
    return "finished"


def _describe(s: ExecutionSummary) -> tuple[str, tuple[str, ...], str | None]:
    state = s.state
    layers: list[str] = []
    while isinstance(state, Paused | Cancelling):
        layers.append("paused" if isinstance(state, Paused) else "cancelling")
        state = state.underlying
    kind = ev.result_kind(s.result) if isinstance(state, Finished) and s.result else None
    return _name(state), tuple(layers), kind


def steps(events: list[EventEntry], responses: list[ResponseEntry]) -> list[Step]:
    """One `Step` per version. A log the state machine rejects stops where it breaks."""
    stored = [msgspec.convert(e, ev.StoredEvent) for e in events]
    answers = [msgspec.convert(r, ev.StoredResponse) for r in responses]
    out: list[Step] = []
    summary: ExecutionSummary | None = None
    before = ""
    for at, item, version in interleave_stored(stored, answers):
        try:
            if summary is None:
                if not isinstance(item, ev.Created):
                    break
                summary = created_summary(item, at)
            elif version is None:
                summary = apply_response(summary, item, at)  # type: ignore[arg-type]
            else:
                summary = apply_event(summary, item, at)  # type: ignore[arg-type]
        except IllegalAppend:
            break
        name, layers, kind = _describe(summary)
        if version is not None:
            out.append(Step(version, name, layers, kind, edge_of(before, name)))
        elif out:  # a response moved the state on after the last event
            last = out[-1]
            edge = edge_of(last.underlying, name) or last.edge
            out[-1] = Step(last.version, name, layers, kind, edge)
        before = name
    return out
