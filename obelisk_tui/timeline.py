"""Time travel: the pending state of an execution after each version of its log.

Folds the log and its responses (API JSON) through the engine's own state machine
(`engine.core.state`), so the console's diagram at version N is exactly the state the
engine computed then. Pure: no Textual, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

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
from engine.views import EventEntry, ResponseEntry
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


class Timeline:
    """`Step`s of a growing log, folded incrementally: `update` decodes and applies only
    what arrived since the last call (a long workflow's log is not re-read per refresh).

    New events and responses always come after everything already folded (an execution's
    writes are timestamped in commit order), so they are interleaved among themselves
    and applied at the end. Reads that race with writes can still hand over a response
    before the event it answers: the fold then stops where it broke and is redone from
    the start on the next update, when the missing part has arrived."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.steps: list[Step] = []
        self._summary: ExecutionSummary | None = None
        self._events = 0
        self._responses = 0
        self._before = ""
        self._broken = False

    def update(self, events: list[EventEntry], responses: list[ResponseEntry]) -> list[Step]:
        if self._broken:
            broken_at = (self._events, self._responses)
            if broken_at == (len(events), len(responses)):
                return self.steps  # nothing new: it would break the same way
            shown = self.steps
            self._reset()
            steps = self.update(events, responses)
            if self._broken and len(steps) < len(shown):
                self.steps = shown  # keep what was shown until the log reads whole
            return self.steps
        new_events = [msgspec.convert(e, ev.StoredEvent) for e in events[self._events :]]
        new_responses = [
            msgspec.convert(r, ev.StoredResponse) for r in responses[self._responses :]
        ]
        self._events, self._responses = len(events), len(responses)
        for at, item, version in interleave_stored(new_events, new_responses):
            try:
                if self._summary is None:
                    if not isinstance(item, ev.Created):
                        self._broken = True
                        break
                    self._summary = created_summary(item, at)
                elif version is None:
                    self._summary = apply_response(self._summary, item, at)  # type: ignore[arg-type]
                else:
                    self._summary = apply_event(self._summary, item, at)  # type: ignore[arg-type]
            except IllegalAppend:
                self._broken = True  # shown up to where the log breaks
                break
            name, layers, kind = _describe(self._summary)
            if version is not None:
                self.steps.append(Step(version, name, layers, kind, edge_of(self._before, name)))
            elif self.steps:  # a response moved the state on after the last event
                last = self.steps[-1]
                edge = edge_of(last.underlying, name) or last.edge
                self.steps[-1] = Step(last.version, name, layers, kind, edge)
            self._before = name
        return self.steps


def steps(events: list[EventEntry], responses: list[ResponseEntry]) -> list[Step]:
    """One `Step` per version. A log the state machine rejects stops where it breaks."""
    return Timeline().update(events, responses)
