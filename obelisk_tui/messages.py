"""Messages the app sends to its screens, and those its widgets send up."""

from __future__ import annotations

from textual.message import Message

from engine.views import DeploymentInfo


class DataChanged(Message):
    """Something was committed: refresh what is shown (throttled by the app)."""


class Restyled(Message):
    """The theme changed: redraw what was drawn once with its colours (`palette`)."""


class Tick(Message):
    """A second passed: relative times ("3s ago") need repainting; no I/O."""


class DeploymentReloaded(Message):
    def __init__(self, deployment: DeploymentInfo) -> None:
        super().__init__()
        self.deployment = deployment


class DelayKey(Message):
    """`c`, `p` or `u` pressed on a row that shows a delay (the Events and Children tabs):
    the screen cancels it, or says why not."""

    def __init__(self, delay_id: str, action: str) -> None:
        super().__init__()
        self.delay_id = delay_id
        self.action = action
