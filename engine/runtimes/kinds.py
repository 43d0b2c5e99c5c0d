"""The registry of kinds of components: which `deployment.toml` sections exist and what
each one is (`engine.runtimes.api.ComponentKind`).

Adding a kind is one module with a `ComponentKind` and one line in `BUILTIN` below (or a
`register_kind` call, as tests do for kinds of their own). Nothing else switches on a
kind's name: parsing (`engine.deployment`), loading and reloading (`engine.components`,
`engine.reload`), executors and old versions ask the kind.
"""

from __future__ import annotations

from engine.core.events import is_workflow_type
from engine.runtimes.api import ComponentKind
from engine.runtimes.js.kinds import ActivityJs, WorkflowJs
from engine.runtimes.stub import ActivityStub
from engine.runtimes.wasm.kinds import ActivityWasm, WorkflowWasm

#: The kinds this engine ships, in the order their sections are listed in messages.
BUILTIN: tuple[ComponentKind, ...] = (
    ActivityWasm(),
    ActivityJs(),
    ActivityStub(),
    WorkflowJs(),
    WorkflowWasm(),
)

_KINDS: dict[str, ComponentKind] = {}


def register_kind(kind: ComponentKind) -> None:
    """Make `kind`'s section known (a later registration of the same section replaces it)."""
    section = kind.section
    if not (section.startswith("activity_") or is_workflow_type(section)):
        raise ValueError(f"a kind's section is activity_… or workflow_…, not {section!r}")
    _KINDS[section] = kind


def unregister_kind(section: str) -> None:
    """Forget a kind registered by `register_kind` (tests)."""
    _KINDS.pop(section, None)


def kind_of(section: str) -> ComponentKind:
    """The kind of `section`; KeyError for an unknown one (`sections()` lists them)."""
    return _KINDS[section]


def sections() -> tuple[str, ...]:
    """Every known section, built-in ones first."""
    return tuple(_KINDS)


for _kind in BUILTIN:
    register_kind(_kind)
