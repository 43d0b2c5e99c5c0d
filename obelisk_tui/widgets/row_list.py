"""`RowList`: a virtual list of rows on Textual's line API, with a cursor.

Only the visible rows are rendered (`render_line`), so a list of 100,000 rows costs what
its screenful costs. Subclasses say how many rows there are and how to draw one; the
base class owns the cursor, scrolling, the sticky header line and the key bindings, and
posts `CursorMoved` / `Activated` messages (attributes down, messages up).
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip


class _RowMessage(Message):
    def __init__(self, row_list: RowList, index: int) -> None:
        super().__init__()
        self.row_list = row_list
        self.index = index

    @property
    def control(self) -> RowList:
        return self.row_list


class RowList(ScrollView, can_focus=True):
    """Subclass and implement `row_count`, `render_row` (and `render_header`)."""

    BINDINGS = [
        Binding("up,k", "cursor_up", "Up", show=False),
        Binding("down,j", "cursor_down", "Down", show=False),
        Binding("pageup,ctrl+b", "page_up", "Page up", show=False),
        Binding("pagedown,ctrl+f", "page_down", "Page down", show=False),
        Binding("home,g", "first", "First", show=False),
        Binding("end,G", "last", "Last", show=False),
        Binding("enter", "activate", "Open", show=False),
        # No horizontal scrolling here (overflow-x: hidden): the keys ScrollView gives it
        # stay bound as before but out of the help panel.
        Binding("left", "scroll_left", "Scroll left", show=False, system=True),
        Binding("right", "scroll_right", "Scroll right", show=False, system=True),
        Binding("ctrl+pageup", "page_left", "Page left", show=False, system=True),
        Binding("ctrl+pagedown", "page_right", "Page right", show=False, system=True),
    ]

    COMPONENT_CLASSES = {"row-list--cursor", "row-list--header", "row-list--placeholder"}

    DEFAULT_CSS = """
    RowList {
        height: 1fr;
        overflow-x: hidden;
    }
    RowList > .row-list--cursor { background: $primary 25%; }
    RowList:focus > .row-list--cursor { background: $primary 45%; text-style: bold; }
    RowList > .row-list--header { text-style: bold; color: $text-muted; background: $panel; }
    RowList > .row-list--placeholder { color: $text-disabled; }
    """

    cursor: reactive[int] = reactive(0, init=False)

    #: Whether line 0 is a sticky header.
    has_header = True

    class CursorMoved(_RowMessage):
        """The cursor is on row `index` (or what that row shows changed)."""

    class Activated(_RowMessage):
        """`enter` (or a double click) on row `index`."""

    # -- for subclasses ------------------------------------------------------------------
    def row_count(self) -> int:
        raise NotImplementedError

    def render_row(self, index: int, width: int) -> Text | None:
        """Row `index` as one line of text, or None while it is not loaded."""
        raise NotImplementedError

    def render_header(self, width: int) -> Text:
        return Text()

    # -- geometry ------------------------------------------------------------------------
    @property
    def _header_lines(self) -> int:
        return 1 if self.has_header else 0

    @property
    def page_rows(self) -> int:
        return max(1, self.scrollable_content_region.height - self._header_lines)

    @property
    def first_visible(self) -> int:
        return int(self.scroll_y)

    def visible_range(self) -> range:
        first = self.first_visible
        return range(first, min(self.row_count(), first + self.page_rows))

    def rows_changed(self) -> None:
        """Call after the number or content of rows changed."""
        count = self.row_count()
        self.virtual_size = Size(self.size.width, count + self._header_lines)
        if count == 0:
            self.set_reactive(RowList.cursor, 0)
        elif self.cursor >= count:
            self.cursor = count - 1
        self.refresh()

    # -- rendering -----------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        if self.has_header and y == 0:
            style = self.get_component_rich_style("row-list--header")
            return self._strip(self.render_header(width), width, style)
        index = self.first_visible + y - self._header_lines
        if index >= self.row_count():
            return Strip.blank(width, self.rich_style)
        text = self.render_row(index, width)
        if text is None:
            text = Text("…", style=self.get_component_rich_style("row-list--placeholder"))
        style = self.rich_style
        if index == self.cursor:
            style = style + self.get_component_rich_style("row-list--cursor")
        return self._strip(text, width, style)

    def _strip(self, text: Text, width: int, style: Style) -> Strip:
        text = text.copy()
        text.truncate(width, overflow="ellipsis", pad=True)
        segments = list(text.render(self.app.console))
        strip = Strip(segments, width).apply_style(style)
        return strip.crop_extend(0, width, style)

    # -- cursor --------------------------------------------------------------------------
    def watch_cursor(self, old: int, new: int) -> None:
        self._scroll_to_cursor()
        self.refresh_line_of(old)
        self.refresh_line_of(new)
        self.post_message(self.CursorMoved(self, new))

    def refresh_line_of(self, index: int) -> None:
        y = index - self.first_visible + self._header_lines
        if self._header_lines <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def on_resize(self) -> None:
        # Moved while hidden (another tab on top, no size yet): show the cursor now.
        self._scroll_to_cursor()

    def _scroll_to_cursor(self) -> None:
        top = self.first_visible
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + self.page_rows:
            self.scroll_to(y=self.cursor - self.page_rows + 1, animate=False)

    def move_cursor(self, index: int) -> None:
        count = self.row_count()
        if count:
            self.cursor = max(0, min(count - 1, index))

    def action_cursor_up(self) -> None:
        self.move_cursor(self.cursor - 1)

    def action_cursor_down(self) -> None:
        self.move_cursor(self.cursor + 1)

    def action_page_up(self) -> None:
        self.move_cursor(self.cursor - self.page_rows)

    def action_page_down(self) -> None:
        self.move_cursor(self.cursor + self.page_rows)

    def action_first(self) -> None:
        self.move_cursor(0)

    def action_last(self) -> None:
        self.move_cursor(self.row_count() - 1)

    def action_activate(self) -> None:
        if self.row_count():
            self.post_message(self.Activated(self, self.cursor))

    def on_click(self, event: object) -> None:
        y = getattr(event, "y", None)
        if y is None:
            return
        index = self.first_visible + int(y) - self._header_lines
        if 0 <= index < self.row_count():
            if index == self.cursor and getattr(event, "chain", 1) >= 2:
                self.action_activate()
            self.cursor = index
