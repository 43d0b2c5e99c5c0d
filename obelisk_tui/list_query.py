"""What the executions list shows: its query (filters and order, `ExecutionQuery`), the
filter language typed after `/` (`parse_filter`, and `format_filter` back), the failures
view (`F`), the order's cycle (`o`) and the list's title line. No Textual, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.api_types import LIST_ORDERS, ListFilter, ListOrder
from engine.views import RESULT_CLASSES, STATE_NAMES
from obelisk_tui.model import STATE_SHORT, cut_words, short_end


@dataclass(frozen=True, slots=True)
class ExecutionQuery:
    """What the executions list shows: filters and order (the page is separate)."""

    ffqn_prefix: str | None = None
    id_prefix: str | None = None
    states: tuple[str, ...] = ()
    #: Finished ones that ended so: `ok`, `err`, `failed` (`RESULT_CLASSES`).
    results: tuple[str, ...] = ()
    top_level_only: bool = False
    order: ListOrder = "created_desc"

    def to_filter(self, offset: int = 0, limit: int = 100, *, extras: bool = False) -> ListFilter:
        return ListFilter(
            ffqn_prefix=self.ffqn_prefix,
            id_prefix=self.id_prefix,
            states=self.states or None,
            results=self.results or None,
            top_level_only=self.top_level_only,
            order=self.order,
            offset=offset,
            limit=limit,
            with_extras=extras,
        )

    def to_query(self) -> list[tuple[str, str]]:
        """The REST query string of the filters."""
        q: list[tuple[str, str]] = [("order", self.order)]
        if self.ffqn_prefix:
            q.append(("ffqn", self.ffqn_prefix))
        if self.id_prefix:
            q.append(("id_prefix", self.id_prefix))
        q += [("state", s) for s in self.states]
        q += [("result", r) for r in self.results]
        if self.top_level_only:
            q.append(("top_level_only", "true"))
        return q

    @property
    def is_filtered(self) -> bool:
        return bool(
            self.ffqn_prefix or self.id_prefix or self.states or self.results or self.top_level_only
        )


#: Accepted spellings of states in a filter.
STATE_ALIASES: dict[str, str] = {
    **{name: name for name in STATE_NAMES},
    **{short: name for name, short in STATE_SHORT.items()},
    "pending": "pending_at",
    "blocked": "blocked_by_join_set",
    "running": "locked",
    "done": "finished",
}

ORDER_TITLES: dict[str, str] = {
    "created_desc": "newest first",
    "created_asc": "oldest first",
    "updated_desc": "last change first",
}


def parse_filter(text: str, order: ListOrder = "created_desc") -> ExecutionQuery:
    """`state:locked,paused result:err,failed ffqn:myapp:demo/ id:E_01 top`, or bare
    words: an `E_…` word is an id prefix, any other an FFQN prefix. ValueError names
    what is wrong."""
    ffqn: str | None = None
    id_prefix: str | None = None
    states: list[str] = []
    results: list[str] = []
    top = False
    for word in text.split():
        key, sep, value = word.partition(":")
        key = key.lower()
        if sep and key in ("state", "states", "s"):
            for name in filter(None, value.split(",")):
                if name.lower() not in STATE_ALIASES:
                    known = ", ".join(STATE_SHORT.values())
                    raise ValueError(f"unknown state {name!r} (one of: {known})")
                states.append(STATE_ALIASES[name.lower()])
            if not value:
                raise ValueError("`state:` needs a state, e.g. state:locked,paused")
        elif sep and key in ("result", "results", "r"):
            results += parse_results(value)
        elif sep and key in ("ffqn", "f", "id", "i") and not value:
            raise ValueError(f"`{word}` needs a prefix, e.g. ffqn:myapp:demo/ or id:E_01")
        elif sep and key in ("ffqn", "f"):
            ffqn = value
        elif sep and key in ("id", "i"):
            id_prefix = value
        elif sep and not value and key in ("top", "top-level", "toplevel"):
            raise ValueError(f"`{word}` takes no value: write `top`")
        elif word.lower() in ("top", "top-level", "toplevel"):
            top = True
        elif word.startswith(("E_", "e_")):
            id_prefix = "E_" + word[2:]
        else:
            ffqn = word
    return ExecutionQuery(
        ffqn_prefix=ffqn,
        id_prefix=id_prefix,
        states=tuple(dict.fromkeys(states)),
        results=tuple(dict.fromkeys(results)),
        top_level_only=top,
        order=order,
    )


def parse_results(value: str) -> list[str]:
    """The classes of `result:ok,err`; ValueError names a bad one."""
    names = [name.lower() for name in value.split(",") if name]
    if not names:
        raise ValueError("`result:` needs a result, e.g. result:err,failed")
    for name in names:
        if name not in RESULT_CLASSES:
            raise ValueError(f"unknown result {name!r} (one of: {', '.join(RESULT_CLASSES)})")
    return names


#: The failures view (`F`): finished with an error or an execution failure.
FAILURES: tuple[str, ...] = ("err", "failed")


def toggle_failures(query: ExecutionQuery) -> ExecutionQuery:
    """The failures view on (other filters kept), or off again."""
    return replace(query, results=() if query.results == FAILURES else FAILURES)


def format_filter(query: ExecutionQuery) -> str:
    """The filter text that `parse_filter` turns back into `query` (order aside)."""
    words: list[str] = []
    if query.states:
        words.append("state:" + ",".join(STATE_SHORT[s] for s in query.states))
    if query.results:
        words.append("result:" + ",".join(query.results))
    if query.ffqn_prefix:
        words.append(f"ffqn:{query.ffqn_prefix}")
    if query.id_prefix:
        words.append(f"id:{query.id_prefix}")
    if query.top_level_only:
        words.append("top")
    return " ".join(words)


def list_title(
    total: int | None, query: ExecutionQuery, marked: int, width: int, follow: bool = False
) -> str:
    """The executions list's title line in `width` columns: the count, the order, the
    filter, the marks and whether the cursor follows the top row. When it does not fit
    the order goes first, then the filter's FFQN is shortened at its start: the filter
    stays readable, `ffqn:` part included."""
    count = "" if total is None else f"{total:,} "
    noun = "execution" if total == 1 else "executions"

    def title(q: ExecutionQuery, with_order: bool, following: str) -> str:
        text = f" {count}{noun}"
        if with_order:
            text += f" · {ORDER_TITLES[q.order]}"
        if q.is_filtered:
            text += f" · filter: {format_filter(q)}"
        return text + (f" · {marked} marked" if marked else "") + following

    # What goes first when the line is short: the order, then the words of following.
    followings = (" · cursor follows the top row (f)", " · following (f)", "") if follow else ("",)
    for with_order, following in [(True, followings[0])] + [(False, f) for f in followings]:
        if len(text := title(query, with_order, following)) <= width:
            return text
    if query.ffqn_prefix:
        placeholder = len(title(replace(query, ffqn_prefix="x"), False, "")) - 1
        ffqn = short_end(query.ffqn_prefix, max(width - placeholder, 12))
        text = title(replace(query, ffqn_prefix=ffqn), False, "")
    return cut_words(text, width)


def next_order(query: ExecutionQuery) -> ExecutionQuery:
    i = LIST_ORDERS.index(query.order)
    return replace(query, order=LIST_ORDERS[(i + 1) % len(LIST_ORDERS)])
