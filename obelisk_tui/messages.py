"""Messages the app sends to its screens."""

from __future__ import annotations

from textual.message import Message

from engine.views import DeploymentInfo


class DataChanged(Message):
    """Something was committed: refresh what is shown (throttled by the app)."""


class Tick(Message):
    """A second passed: relative times ("3s ago") need repainting; no I/O."""


class DeploymentReloaded(Message):
    def __init__(self, deployment: DeploymentInfo) -> None:
        super().__init__()
        self.deployment = deployment
