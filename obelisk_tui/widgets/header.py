"""The screens' header: Textual's `Header`, whose title watchers survive a header that
is not (or no longer) composed.

Textual's `Header` watches the app's and the screen's title from its mount on and
updates its `HeaderTitle` child on every change. The app's watchers run in the app's
own message loop, so a title change while a header is mounting (its child not there
yet) or being removed (a screen closed within a frame of opening: the monkey test,
seed 3270066058) raised `NoMatches` there — which ends the app, and an embedded engine
with it. Here such an update is skipped: the header draws the current title when its
child arrives (Textual's `HeaderTitle` is given it at compose)."""

from __future__ import annotations

import contextlib

from textual.css.query import NoMatches
from textual.dom import NoScreen
from textual.events import Mount
from textual.widgets import Header
from textual.widgets._header import HeaderTitle  # noqa: PLC2701 (textual internals, version pinned)


class ObeliskHeader(Header):
    def _on_mount(self, event: Mount) -> None:
        # Textual calls the `_on_mount` of every class in the MRO: Header's (the watchers
        # that raise) is skipped; Widget's only shows scrollbars a header has none of.
        event.prevent_default()

        async def set_title() -> None:
            # Not composed yet, or being removed: nothing to update.
            with contextlib.suppress(NoScreen, NoMatches):
                # One line whatever the title (nowrap, ellipsis): no layout of the screen.
                self.query_one(HeaderTitle).update(self.format_title(), layout=False)

        self.watch(self.app, "title", set_title)
        self.watch(self.app, "sub_title", set_title)
        self.watch(self.screen, "title", set_title)
        self.watch(self.screen, "sub_title", set_title)
