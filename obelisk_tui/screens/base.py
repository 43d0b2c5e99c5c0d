"""What every screen of the console shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from textual.dom import DOMNode
from textual.worker import Worker

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

    # -- loads a change asks for ----------------------------------------------------------
    def load_for_change(self, load: Callable[[], object], group: str = "default") -> None:
        """`load()` for a `DataChanged`, unless a load of `group` is in flight: then once
        it ends. Loads are exclusive workers (a new one cancels the one before), and
        changes come every half second while the engine is busy: a read slower than that
        (a large database, a distant server) was cancelled each time and the screen never
        changed. What changed meanwhile is read by the one load after it."""
        node = cast(DOMNode, self)
        if any(w.node is node and w.group == group and not w.is_finished for w in node.workers):
            node.__dict__.setdefault("_loads_after", {})[group] = load
            return
        load()

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A load ended (done, failed or replaced): the one a change asked for meanwhile."""
        worker = event.worker
        after: dict[str, Callable[[], object]] = cast(DOMNode, self).__dict__.get(
            "_loads_after", {}
        )
        if worker.is_finished and worker.group in after and self.is_live:
            self.load_for_change(after.pop(worker.group), worker.group)
