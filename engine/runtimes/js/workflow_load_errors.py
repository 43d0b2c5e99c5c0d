"""What a JS workflow module that does not load is told: `JsWorkflowLoadError`, with a
message naming the file, the line and what was wrong (an unknown interface or function,
a syntax error, a top-level throw)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from quickjs_rs import JSError

from engine.runtimes.js.common import source_line
from engine.runtimes.js.workflow_prelude import (
    API_NAMES,
    LOG_LEVELS,
    LOG_MODULE,
    WORKFLOW_MODULE,
    VirtualModule,
    split_interface,
)


class JsWorkflowLoadError(Exception):
    """The module does not load (syntax, unknown import, top-level throw), or the export
    is missing or not a function. The message names the file (and line where known)."""

    def __init__(self, message: str, *, filename: str, line: int | None = None) -> None:
        super().__init__(message)
        self.filename = filename
        self.line = line


_RESOLVE_ERR = re.compile(r"Error resolving module '(.*)' from '(.*)'")
_EXPORT_ERR = re.compile(r"Could not find export '(.*)' in module '(.*)'")
_STACK_POS = re.compile(r":(\d+):(\d+)\)?\s*$")


def _line_of(source: str, offset: int) -> int:
    return source.count("\n", 0, offset) + 1


def _import_line(source: str, module: str, name: str | None = None) -> int | None:
    """The line of the import of `name` (or of the module specifier) from `module`."""
    quoted = r"(?P<q>['\"])" + re.escape(module) + r"(?P=q)"
    first: int | None = None
    for m in re.finditer(r"\bimport\b(?P<clause>[^;'\"]*?)\bfrom\s*" + quoted, source):
        if first is None:
            first = _line_of(source, m.start("q"))
        if name is not None:
            hit = re.search(r"(?<![\w$])" + re.escape(name) + r"(?![\w$])", m.group("clause"))
            if hit is not None:
                return _line_of(source, m.start("clause") + hit.start())
    if first is not None:
        return first
    m2 = re.search(quoted, source)
    return None if m2 is None else _line_of(source, m2.start())


def _stack_position(stack: str | None, filename: str) -> tuple[int, int] | None:
    for text in (stack or "").splitlines():
        if filename in text:
            m = _STACK_POS.search(text)
            if m is not None:
                return int(m.group(1)), int(m.group(2))
    return None


def load_error(
    filename: str,
    source: str,
    modules: Mapping[str, VirtualModule],
    e: JSError,
    load: Callable[[str], str | None],
) -> JsWorkflowLoadError:
    """The load error of `source` (the module `filename`) for the guest's error `e`;
    `modules` are the importable interfaces, `load` gives a virtual module's source."""
    fname = filename
    m = _RESOLVE_ERR.search(e.message)
    if m is not None:
        spec, base = m.group(1), m.group(2)
        line = _import_line(source, spec) if base == fname else None
        where = f"{fname}:{line}" if line else fname
        if split_interface(spec) is not None or spec.startswith("obelisk:"):
            known = sorted({v.interface for v in modules.values()} | {WORKFLOW_MODULE, LOG_MODULE})
            return JsWorkflowLoadError(
                f"{where}: unknown interface '{spec}' imported: no deployed component "
                f"exports it (importable: {', '.join(known)}, and their -obelisk-ext, "
                "-obelisk-schedule and -obelisk-stub variants)",
                filename=fname,
                line=line,
            )
        return JsWorkflowLoadError(
            f"{where}: cannot import '{spec}': a workflow_js module may import only "
            f"deployed interfaces and {WORKFLOW_MODULE}",
            filename=fname,
            line=line,
        )
    m = _EXPORT_ERR.search(e.message)
    if m is not None:
        name, spec = m.group(1), m.group(2)
        line = _import_line(source, spec, name)
        where = f"{fname}:{line}" if line else fname
        available = _exports_of(spec, load)
        return JsWorkflowLoadError(
            f"{where}: '{spec}' has no function '{name}' "
            f"(available: {', '.join(available) if available else 'none'})",
            filename=fname,
            line=line,
        )
    pos = _stack_position(e.stack, fname)
    where = f" (line {pos[0]}, column {pos[1]})" if pos else ""
    line = pos[0] if pos else None
    if e.name == "SyntaxError":
        # The line and its text (QuickJS's column of a parse error is unreliable).
        where = f" (line {line}: {source_line(source, line)})" if line else ""
        return JsWorkflowLoadError(
            f"{fname}: SyntaxError: {e.message}{where}", filename=fname, line=line
        )
    return JsWorkflowLoadError(
        f"{fname}: module evaluation failed: {e.name}: {e.message}{where}",
        filename=fname,
        line=line,
    )


def _exports_of(spec: str, load: Callable[[str], str | None]) -> list[str]:
    if spec == WORKFLOW_MODULE:
        return [*API_NAMES, "default"]
    if spec == LOG_MODULE:
        return sorted(LOG_LEVELS)
    source = load(spec) or ""
    return re.findall(r"export \{ \w+ as ([\w$]+) \}", source)
