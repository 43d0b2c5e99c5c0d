"""What every screen of the console shares."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from textual.app import App

    from obelisk_tui.app import ObeliskApp


class ObeliskScreenMixin:
    """`self.obelisk`: the app, typed (its backend, `now`, `report_error`, …)."""

    app: App[None]

    @property
    def obelisk(self) -> ObeliskApp:
        return cast("ObeliskApp", self.app)
