"""The shape of the code, checked: no import cycles at run time and no oversized modules.
The layers themselves are import-linter's contracts (`[tool.importlinter]` in
pyproject.toml, run by `python3 dev.py test` before pytest)."""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
#: Lines a module may have (docs/ARCHITECTURE.md: "modules under ~900 lines").
MAX_MODULE_LINES = 900
#: Modules still over the limit, each to be split (the list only shrinks: a module that
#: is no longer over the limit must leave it).
OVERSIZED: frozenset[str] = frozenset()


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    modules = sorted(graph.modules)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for m in modules:
        if m not in index:
            visit(m)
    return found


def test_no_import_cycles_at_run_time() -> None:
    """Every import that runs (module level or in a function) goes down the layers: no
    two modules need each other. (Imports under `TYPE_CHECKING` are for the type checker
    only and may point back up, e.g. a screen naming its app's type.)"""
    graph = grimp.build_graph(
        "engine", "obelisk_tui", exclude_type_checking_imports=True, cache_dir=None
    )
    assert _cycles(graph) == []


def test_modules_stay_under_the_size_limit() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for package in ("engine", "obelisk_tui")
        for p in (ROOT / package).rglob("*.py")
    }
    over = {path for path, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert over - OVERSIZED == set(), {p: sizes[p] for p in over - OVERSIZED}
    assert OVERSIZED - over == set(), "no longer oversized: take them off OVERSIZED"
