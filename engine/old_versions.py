"""Old workflow versions, rebuilt for the executions pinned to them (SPEC §9.3).

An execution whose upgrade check failed is pinned to the component digest that wrote
its history and must finish on that code. While the engine that pinned it runs, the old
version is still in memory (`engine.reload`). After a restart, or when a workflow file
was edited while the engine was stopped, that version has to come from somewhere else:

* `workflow_js`: its source text, stored by digest in the database at every start and
  reload (`save_component_sources`; the same text backtraces show);
* `workflow_wasm`: its compiled code, in the engine's compiled-component cache
  (`<data dir>/cache`, by file digest; never pruned).

The settings (name, export, `exec.*`, retries) and the declared FFQN and types are the
deployed component's that exports the function now: they are not stored per digest.
When neither the text nor the compiled code is there (another data dir, a cleared
cache), or the deployment no longer has a workflow exporting the function, the pinned
executions wait, reported under `pinned` in the reload status, until a deployment brings
that digest back or a later version passes their upgrade check.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from engine.components import (
    LoadedComponent,
    Registry,
    check_workflow,
    js_workflow_component,
    wasm_workflow_component,
)
from engine.errors import DeploymentError

if TYPE_CHECKING:
    from engine.engine import Engine

log = logging.getLogger("obelisk.reload")


async def rebuild_old_version(
    engine: Engine, digest: str, ffqn: str, registry: Registry
) -> LoadedComponent | None:
    """The workflow component of `digest` (which exported `ffqn`), rebuilt and checked
    against `registry`; None, with the reason logged, when it cannot be."""
    target = registry.functions.get(ffqn)
    if target is None or not target[1].config.is_workflow:
        log.warning(
            "executions of %s are pinned to version %s, but no deployed workflow exports "
            "%s: they wait",
            ffqn,
            digest,
            ffqn,
        )
        return None
    config = target[1].config
    component: LoadedComponent | None = None
    try:
        if config.type == "workflow_js":
            stored = await engine.storage.get_component_source(digest)
            if stored is not None:
                component = await asyncio.to_thread(
                    js_workflow_component, config, stored.source, digest, stored.file
                )
        else:
            compiled = await asyncio.to_thread(
                engine.wasm_engine.load_cached, digest, engine.cache_dir
            )
            if compiled is not None:
                component = await asyncio.to_thread(
                    wasm_workflow_component, config, compiled, digest, engine.wasm_engine
                )
        if component is None:
            what = "source" if config.type == "workflow_js" else "compiled code"
            log.warning(
                "executions of %s are pinned to version %s, whose %s this engine does "
                "not have: they wait",
                ffqn,
                digest,
                what,
            )
            return None
        await asyncio.to_thread(check_workflow, component, registry)
    except DeploymentError as e:
        log.warning(
            "old version %s of %s, which executions are pinned to, does not load any "
            "more: %s; they wait",
            digest,
            ffqn,
            e,
        )
        return None
    log.info("old version %s of %s rebuilt for the executions pinned to it", digest, ffqn)
    return component


__all__ = ["rebuild_old_version"]
