"""The `:` command line's language: its commands (one table, which the help lists too),
how a line is parsed, which listed executions an id the operator typed names, tab
completion and history. No Textual, no I/O (unit-tested alone): `screens/run_command.py`
runs a parsed command through the same actions as the keys, and
`widgets/command_line.py` is the line itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from engine.api_types import ListOrder
from obelisk_tui import model

#: What a command takes after its name: execution ids (any number, none: what the keys
#: act on), at most one id, the rest of the line as it is, an order's name, or nothing.
Takes = Literal["ids", "id", "text", "order", "none"]


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    usage: str
    help: str
    takes: Takes
    #: The key that does the same (the help names it).
    key: str = ""
    aliases: tuple[str, ...] = ()


#: Every command, in the order the help and the "unknown command" message list them.
COMMANDS: tuple[Command, ...] = (
    Command("pause", "[ID …]", "pause them; no id: the marked or selected ones", "ids", "p"),
    Command("unpause", "[ID …]", "unpause them", "ids", "u"),
    Command("cancel", "[ID …]", "cancel them (asks first)", "ids", "c"),
    Command(
        "cancel!",
        "[ID]",
        "force-cancel a workflow that is not -cancellable (asks first; or :cancel --force)",
        "id",
        "X",
    ),
    Command("stub", "[ID]", "stub an activity_stub execution", "id", "S"),
    Command("open", "[ID]", "open an execution's screen", "id", "enter"),
    Command(
        "filter", "[FILTER]", "filter the list (the / grammar); nothing clears it", "text", "/"
    ),
    Command(
        "order",
        "[newest|oldest|changed]",
        "the list's order; nothing: the next one",
        "order",
        "o",
        aliases=("sort",),
    ),
    Command("failures", "", "the failures view on / off", "none", "F"),
    Command(
        "submit",
        "[FFQN [PARAMS]]",
        "submit FFQN with PARAMS (a JSON array) and open it; no params: the dialog",
        "text",
        "s",
    ),
    Command("components", "", "components and the last hot reload", "none", "C"),
    Command("list", "", "back to the executions list", "none", "h"),
    Command("help", "", "the help", "none", "?"),
    Command("quit", "", "quit the console", "none", "q", aliases=("q",)),
)

BY_NAME: dict[str, Command] = {name: c for c in COMMANDS for name in (c.name, *c.aliases)}

#: `:order`'s words → the list's orders (the storages index these only).
ORDERS: dict[str, ListOrder] = {
    "newest": "created_desc",
    "oldest": "created_asc",
    "changed": "updated_desc",
}
#: Columns an operator may try to sort by that no storage indexes.
UNSORTABLE = ("state", "ffqn", "id", "when", "events", "ev", "children", "ch")


class CommandError(ValueError):
    """What is wrong with a line, said to the operator (it names the command or id)."""


@dataclass(frozen=True, slots=True)
class Parsed:
    command: Command
    #: The words after the name (`--force` taken out).
    args: list[str] = field(default_factory=list)
    #: The text after the name, as typed (a filter, an FFQN and its JSON params).
    rest: str = ""
    #: The order `:order WORD` named (None: the next one).
    order: ListOrder | None = None


def command_names() -> str:
    return ", ".join(c.name for c in COMMANDS)


def parse(line: str) -> Parsed | None:
    """The command of a line (None for an empty one); CommandError says what is wrong."""
    text = line.strip().removeprefix(":").strip()
    if not text:
        return None
    name, _, rest = text.partition(" ")
    rest = rest.strip()
    command = BY_NAME.get(name.lower())
    if command is None:
        raise CommandError(f"unknown command :{name} (commands: {command_names()})")
    args = rest.split()
    if command.name == "cancel" and {"--force", "-f"} & set(args):
        command = BY_NAME["cancel!"]
        args = [a for a in args if a not in ("--force", "-f")]
    usage = f":{command.name} {command.usage}".rstrip()
    if command.takes == "none" and args:
        raise CommandError(f":{command.name} takes nothing after it, got {rest!r} ({usage})")
    if command.takes == "id" and len(args) > 1:
        raise CommandError(f":{command.name} takes one id, got {len(args)} ({usage})")
    for word in args if command.takes in ("ids", "id") else ():
        if word.startswith("-"):
            raise CommandError(f":{command.name} has no option {word} ({usage})")
    order: ListOrder | None = None
    if command.takes == "order":
        order = parse_order(command, args)
    return Parsed(command, args, rest, order)


def parse_order(command: Command, args: list[str]) -> ListOrder | None:
    if not args:
        return None
    if len(args) > 1:
        raise CommandError(f":{command.name} takes one order, got {len(args)}")
    word = args[0].lower()
    if word in ORDERS:
        return ORDERS[word]
    if word in UNSORTABLE:
        raise CommandError(
            f"the list cannot be sorted by {word}: the storages index only creation and last "
            f"change ({', '.join(ORDERS)}); narrow it with :filter instead (state:…, ffqn:…)"
        )
    raise CommandError(f"unknown order {args[0]!r} (one of: {', '.join(ORDERS)})")


# ---------------------------------------------------------------------------------------
# Ids as the operator types them
# ---------------------------------------------------------------------------------------


def normalise_id(word: str) -> str:
    """`e_01…` as `E_01…`, and `...` (typed for the list's `…`) as `…`."""
    word = word.strip().replace("...", "…")
    return "E_" + word[2:] if word[:2] == "e_" else word


def outermost(ids: list[str]) -> list[str]:
    """`ids` without the descendants of others among them (a child's id extends its
    parent's after a `.`): a start that stops within a workflow's id names the workflow,
    not its children."""
    return [i for i in ids if not any(i.startswith(j + ".") for j in ids if j != i)]


def match_listed(word: str, listed: Iterable[str]) -> list[str]:
    """The listed ids that `word` names: the id itself; else those it starts (a word
    that starts with `E_`), or ends (any other word: `approve_1`); or an id shortened as
    the list shows it (`E_01M9…XYNVK.o:1-approve_1`, `...` for `…`)."""
    w = normalise_id(word)
    ids = list(dict.fromkeys(listed))
    if w in ids:
        return [w]
    if "…" in w:
        head, _, tail = w.partition("…")
        found = [
            i
            for i in ids
            if i.startswith(head) and i.endswith(tail) and len(i) >= len(head) + len(tail)
        ]
    elif w.startswith("E_"):
        found = [i for i in ids if i.startswith(w)]
    else:
        found = [i for i in ids if i.endswith(w)]
    return outermost(found)


def ambiguity(word: str, ids: list[str], total: int | None = None) -> str:
    """The error of an id that names several executions: some of them, and how many."""
    n = len(ids) if total is None else total
    shown = ", ".join(model.short_id(i, 28) for i in ids[:3])
    more = ", …" if n > 3 else ""
    return f"ambiguous id {word}: it names {n} executions ({shown}{more}); type more of it"


# ---------------------------------------------------------------------------------------
# Tab completion
# ---------------------------------------------------------------------------------------

FILTER_WORDS = ("state:", "result:", "ffqn:", "id:", "top")


@dataclass(frozen=True, slots=True)
class Completion:
    #: The line completed (as far as the candidates agree).
    text: str
    #: What the last word could become (shown when there are several).
    candidates: list[str]


def complete(line: str, listed: list[str]) -> Completion:
    """Complete the last word of `line`: a command's name, then (by command) a listed
    execution's id, an order, or a filter's key or state."""
    head, sep, word = line.rpartition(" ")
    if not sep:  # the command's name
        names = [n for n in (c.name for c in COMMANDS) if n.startswith(word.lower())]
        names += [a for a in BY_NAME if a.startswith(word.lower()) and a not in names]
        return _extend(head, word, names, lambda n: BY_NAME[n].takes != "none")
    command = BY_NAME.get(line.split(" ", 1)[0].lower())
    prefix = head + sep
    if command is None:
        return Completion(line, [])
    if command.takes in ("ids", "id"):
        w = normalise_id(word)
        ids = [i for i in dict.fromkeys(listed) if i.startswith(w)]
        if not ids and w and not w.startswith("E_"):
            ids = [i for i in dict.fromkeys(listed) if w in i]
            if len(ids) == 1:  # `approve_1⇥`: the id it is part of
                return Completion(prefix + ids[0] + " ", ids)
            return Completion(line, ids)
        return _extend(prefix, w, ids, lambda _: True)
    if command.takes == "order":
        return _extend(prefix, word, [o for o in ORDERS if o.startswith(word)], lambda _: False)
    if command.name == "filter":
        key, colon, value = word.partition(":")
        if colon and key.lower() in ("state", "s"):
            done, _, last = value.rpartition(",")
            base = prefix + key + colon + (done + "," if done else "")
            names = [s for s in model.STATE_SHORT.values() if s.startswith(last)]
            return _extend(base, last, names, lambda _: False)
        if colon and key.lower() in ("result", "r"):
            done, _, last = value.rpartition(",")
            base = prefix + key + colon + (done + "," if done else "")
            results = [r for r in ("ok", "err", "failed") if r.startswith(last)]
            return _extend(base, last, results, lambda _: False)
        words = [f for f in FILTER_WORDS if f.startswith(word.lower())]
        return _extend(prefix, word, words, lambda f: f == "top")
    return Completion(line, [])


def _extend(
    prefix: str, word: str, candidates: list[str], spaced: Callable[[str], bool]
) -> Completion:
    """`word` completed to the one candidate (and a space after it when `spaced(it)`:
    another word follows), or to what all the candidates share."""
    if not candidates:
        return Completion(prefix + word, [])
    if len(candidates) == 1:
        only = candidates[0]
        return Completion(prefix + only + (" " if spaced(only) else ""), candidates)
    common = candidates[0]
    for other in candidates[1:]:  # what they all start with, character by character
        while not other.startswith(common):
            common = common[:-1]
    return Completion(prefix + (common if len(common) > len(word) else word), candidates)


# ---------------------------------------------------------------------------------------
# History
# ---------------------------------------------------------------------------------------


class History:
    """The lines run, oldest first, walked with up / down (the line being typed is kept
    as the newest, to come back to). One for the whole console: every screen's command
    line shares the app's."""

    def __init__(self, limit: int = 200) -> None:
        self.limit = limit
        self.entries: list[str] = []
        self._at: int | None = None  # index into `entries` while walking
        self._draft = ""

    def add(self, line: str) -> None:
        line = line.strip()
        if line and (not self.entries or self.entries[-1] != line):
            self.entries.append(line)
            del self.entries[: max(0, len(self.entries) - self.limit)]
        self.reset()

    def reset(self) -> None:
        self._at = None
        self._draft = ""

    def back(self, current: str) -> str | None:
        """The line before (up); None at the oldest."""
        if not self.entries:
            return None
        if self._at is None:
            self._draft = current
            self._at = len(self.entries)
        if self._at == 0:
            return None
        self._at -= 1
        return self.entries[self._at]

    def forward(self) -> str | None:
        """The line after (down), then the one that was being typed; None past it."""
        if self._at is None:
            return None
        self._at += 1
        if self._at >= len(self.entries):
            draft = self._draft
            self.reset()
            return draft
        return self.entries[self._at]
