"""Old versions of workflows: executions pinned to a version that is no longer deployed
(SPEC §9.3: their log does not replay on the new code) keep running on it. Its
component is rebuilt by its kind (`ComponentKind.rebuild`: a JS workflow from its stored
source, a WASM one from the compiled cache) and checked against the deployed functions.
"""

from __future__ import annotations

import asyncio
import logging

from engine.components import LoadedComponent, Registry, check_component
from engine.errors import DeploymentError
from engine.runtimes.api import LoadContext
from engine.runtimes.kinds import kind_of

log = logging.getLogger("obelisk.reload")


async def rebuild_old_version(
    ctx: LoadContext, digest: str, ffqn: str, registry: Registry
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
    kind = kind_of(config.type)
    try:
        component = await kind.rebuild(config, digest, ctx)
        if component is None:
            log.warning(
                "executions of %s are pinned to version %s, whose %s this engine does "
                "not have: they wait",
                ffqn,
                digest,
                kind.old_version_from or "code",
            )
            return None
        await asyncio.to_thread(check_component, component, registry)
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
