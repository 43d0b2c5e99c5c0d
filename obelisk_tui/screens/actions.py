"""Pause / unpause / cancel of one execution or many, and stub of one: the one code that
the screens' keys (`p` `u` `c` `X` `S`) and the `:` command line (`:pause …`) run
(`act`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.client import ApiError
from engine.views import ExecutionInfo
from obelisk_tui import model
from obelisk_tui.screens.confirm import ConfirmScreen

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
        "\n".join(model.name_executions(reasons, 3)),
        title=f"cannot {action}",
        severity="warning",
    )


async def act(app: ObeliskApp, action: str, targets: list[ExecutionInfo]) -> bool:
    """What a key and a command do to `targets` (an action of `ACTIONS`): one that
    applies to none of them says why (`explain`: the engine's own rules, through
    `model.refusal`); a cancel asks first, naming them, a forced one says what it
    overrides; then `perform`, or the stub's dialog. Whether it went ahead (not refused,
    not declined)."""
    if not applicable(action, targets):
        explain(app, action, targets)
        return False
    if action == "stub":
        return await stub(app, targets[0])
    question = confirmation(action, targets)
    if question is not None and not await app.push_screen_wait(ConfirmScreen(question)):
        return False
    await perform(app, action, targets)
    return True


def confirmation(action: str, targets: list[ExecutionInfo]) -> str | None:
    """The question an action asks before it acts, if it asks one."""
    if action == "cancel":
        return cancel_question(targets)
    if action == "force_cancel":
        if len(targets) == 1:
            return force_question(targets[0])
        ids = [t["execution_id"] for t in targets]
        return "\n".join([f"End {len(ids)} executions by force?", *model.name_executions(ids, 3)])
    return None


async def stub(app: ObeliskApp, info: ExecutionInfo) -> bool:
    """Ask for the stub's return value and write it (`StubScreen`): whether it was."""
    from obelisk_tui.screens.stub import StubScreen

    if model.refusal("stub", info) is not None:
        return False
    written: bool = await app.push_screen_wait(StubScreen(info))
    return written


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
    # One line per item: a batch's ids are read down a column, and a toast wraps its
    # lines between words (never inside an id, see app.tcss's Toast width).
    lines: list[str] = []
    if len(done) == 1:
        lines.append(f"{VERBS[action]} {done[0]}")
    elif done:
        lines += [f"{VERBS[action]} {len(done)} executions:", *model.name_executions(done)]
    if len(skipped) == 1:
        lines.append(f"skipped: {skipped[0]}")
    elif skipped:
        lines += [f"{len(skipped)} skipped:", *model.name_executions(skipped, 3)]
    if failed:
        app.notify(
            "\n".join([*lines, *model.name_executions(failed, 5)]),
            title=f"{action} failed",
            severity="error",
            timeout=8,
        )
    elif lines:
        app.notify("\n".join(lines), title=action)
    app.request_refresh()
    return len(done)


def cancel_question(targets: list[ExecutionInfo]) -> str:
    """The confirmation of a cancel: it names the executions (a batch one per line)."""
    ids = [t["execution_id"] for t in targets]
    if len(ids) == 1:
        return f"Cancel {ids[0]}?"
    return "\n".join([f"Cancel {len(ids)} executions?", *model.name_executions(ids, 3)])
