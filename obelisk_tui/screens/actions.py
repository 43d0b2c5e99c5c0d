"""Pause / unpause / cancel of one execution or many, and stub of one, shared by the
screens."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.client import ApiError
from engine.views import ExecutionInfo
from obelisk_tui import model

if TYPE_CHECKING:
    from obelisk_tui.app import ObeliskApp

VERBS = {
    "pause": "paused",
    "unpause": "unpaused",
    "cancel": "cancellation requested for",
    "force_cancel": "forced cancellation requested for",
}
#: Every action a footer key stands for (`stub` opens `StubScreen`, for one execution).
ACTIONS = ("pause", "unpause", "cancel", "force_cancel", "stub")
#: Rarely applicable: their keys are hidden, not greyed, where they do not apply.
RARE = ("stub", "force_cancel")


def applicable(action: str, targets: list[ExecutionInfo]) -> bool:
    if action == "stub" and len(targets) != 1:
        return False
    return any(model.refusal(action, t) is None for t in targets)


def key_state(action: str, targets: list[ExecutionInfo]) -> bool | None:
    """`check_action`'s answer for an action key: shown (True), greyed (None: pressing it
    says why), or, for the rarely applicable stub, hidden (False) where it does not apply."""
    if applicable(action, targets):
        return True
    return False if action in RARE else None


def explain(app: ObeliskApp, action: str, targets: list[ExecutionInfo]) -> None:
    """Say why an action that the footer shows disabled does not apply."""
    if not targets:
        app.notify(f"nothing selected to {action}", severity="warning")
        return
    if action == "stub" and len(targets) > 1:
        app.notify("stub one execution at a time (clear the marks)", severity="warning")
        return
    reasons = [r for r in (model.refusal(action, t) for t in targets) if r]
    app.notify(
        reasons[0]
        if len(reasons) == 1
        else f"cannot {action}: {reasons[0]} (+{len(reasons) - 1} more)",
        title=f"cannot {action}",
        severity="warning",
    )


async def stub(app: ObeliskApp, info: ExecutionInfo) -> None:
    """Ask for the stub's return value and write it (`StubScreen`)."""
    from obelisk_tui.screens.stub import StubScreen

    if model.refusal("stub", info) is None:
        await app.push_screen_wait(StubScreen(info))


def force_question(info: ExecutionInfo) -> str:
    """The confirmation a forced cancel needs: what the operator overrides, and what
    happens."""
    return (
        f"{info['execution_id']} ({info['ffqn']}) is not cancellable. End it by force? "
        "Its run is interrupted, its children are cancelled and it finishes cancelled; "
        "the log records the forced cancellation."
    )


async def perform(app: ObeliskApp, action: str, targets: list[ExecutionInfo]) -> int:
    """Run `action` on every target it applies to; report the outcome. Returns how many
    succeeded."""
    done: list[str] = []
    failed: list[str] = []
    skipped: list[str] = []  # refusals (they name the execution)
    for info in targets:
        if (why := model.refusal(action, info)) is not None:
            skipped.append(why)
            continue
        eid = info["execution_id"]
        try:
            if action == "force_cancel":
                await app.backend.cancel(eid, force=True)
            else:
                await getattr(app.backend, action)(eid)
            done.append(eid)
        except ApiError as e:
            failed.append(f"{eid}: {e.message}")
    parts = []
    if done:
        parts.append(
            f"{VERBS[action]} {done[0]}"
            if len(done) == 1
            else f"{VERBS[action]} {len(done)} executions"
        )
    if len(skipped) == 1:
        parts.append(f"skipped: {skipped[0]}")
    elif skipped:
        parts.append(f"{len(skipped)} skipped, e.g. {skipped[0]}")
    if failed:
        app.notify(
            "\n".join([*parts, *failed[:5]]), title=f"{action} failed", severity="error", timeout=8
        )
    elif parts:
        app.notify("; ".join(parts), title=action)
    app.request_refresh()
    return len(done)
