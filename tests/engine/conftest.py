"""Helpers to start a real embedded engine on a temporary data dir and deployment."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from engine.engine import Engine
from tests.fixtures.deployments import Deployment

StartEngine = Callable[..., Awaitable[Engine]]


@pytest.fixture
async def start_engine(tmp_path: Path) -> AsyncIterator[StartEngine]:
    """`await start_engine(toml, files={"a.js": "..."})` → a running Engine; stopped after.

    `toml` is the text of `deployment.toml` or a `Deployment` (written into `tmp_path`)."""
    engines: list[Engine] = []

    async def start(
        toml: str | Deployment, files: dict[str, str] | None = None, **kwargs: object
    ) -> Engine:
        for name, text in (files or {}).items():
            (tmp_path / name).write_text(textwrap.dedent(text))
        deployment = tmp_path / "deployment.toml"
        if isinstance(toml, Deployment):
            toml.write(tmp_path)
        else:
            deployment.write_text(textwrap.dedent(toml))
        engine = await Engine.start(deployment, tmp_path / "data", **kwargs)  # type: ignore[arg-type]
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        await engine.stop()
