"""Component digests (SPEC §2): what names a version of a component in the log."""

from __future__ import annotations

import hashlib

from engine.runtimes.config import ComponentConfig


def file_digest(data: bytes) -> str:
    """A file's digest: WASM components are their file."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def typed_digest(config: ComponentConfig, source: bytes) -> str:
    """A digest of the source plus the declared FFQN and types: JS and stubs, whose
    function is declared in `deployment.toml` (changing a type is a new version)."""
    h = hashlib.sha256(source)
    h.update(f"\0{config.ffqn}\0{config.return_type_text}".encode())
    for p in config.params:
        h.update(f"\0{p.name}:{p.type_text}".encode())
    return "sha256:" + h.hexdigest()
