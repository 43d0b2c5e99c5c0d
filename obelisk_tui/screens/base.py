"""What every screen of the console shares."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from textual.dom import DOMNode

if TYPE_CHECKING:
    from textual.app import App

    from obelisk_tui.app import ObeliskApp

#: The header's glyph: none. Textual's `⭘` (and every geometric shape) is missing from
#: the browser's bundled font (Roboto Mono) and from the PNG snapshots' font: a box.
HEADER_ICON = ""


def is_live(node: DOMNode) -> bool:
    """Whether `node` is attached and not being torn down. A screen popped while one of
    its workers awaited the engine is pruned child by child: for a while it is still
    attached but its widgets are gone, and a worker that resumes then must write nothing
    (Textual cancels it only at its next await)."""
    return node.is_attached and not (node._closing or node._closed or node._pruning)


class ObeliskScreenMixin:
    """`self.obelisk`: the app, typed (its backend, `now`, `report_error`, …)."""

    app: App[None]

    @property
    def obelisk(self) -> ObeliskApp:
        return cast("ObeliskApp", self.app)

    def trail(self) -> tuple[str, ...]:
        """The breadcrumb's crumbs of the screens up to this one: each screen's `crumb`
        ("executions" for the list, an execution id, "components"); dialogs and the
        start-up screen have none."""
        out: list[str] = []
        for screen in self.app.screen_stack:
            crumb = getattr(screen, "crumb", None)
            if isinstance(crumb, str):
                out.append(crumb)
            if screen is cast(DOMNode, self):
                break
        return tuple(out)

    @property
    def is_live(self) -> bool:
        """Attached and not being torn down: workers check it after every await before
        they touch a widget (`is_live`)."""
        return is_live(cast(DOMNode, self))
