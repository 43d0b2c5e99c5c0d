"""Thread placement (`engine.affinity`, `Engine.start(cpu_affinity=...)`) on real threads."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest

from engine import affinity
from engine.core import events as ev

from .conftest import StartEngine
from .test_workflows import FILES, deployment

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to split over")


@pytest.fixture(autouse=True)
def _restored() -> Iterator[None]:
    before = set(CPUS)
    yield
    affinity.configure("off")
    if before:
        os.sched_setaffinity(0, before)


def _placement() -> dict[str, set[int]]:
    """The CPUs of the live threads, by name without the pool number."""
    out: dict[str, set[int]] = {}
    for t in threading.enumerate():
        if t.native_id is None:
            continue
        try:
            cpus = os.sched_getaffinity(t.native_id)
        except OSError:  # ended meanwhile
            continue
        out.setdefault(t.name.rsplit("_", 1)[0], set()).update(cpus)
    return out


def test_an_unknown_mode_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="cpu_affinity must be one of off, split, not 'both'"):
        affinity.configure("both")  # type: ignore[arg-type]


@needs_two_cpus
def test_split_places_the_caller_and_off_gives_its_cpus_back() -> None:
    assert affinity.configure("split")
    assert os.sched_getaffinity(0) == {CPUS[0]}
    assert affinity.cpus_of("writer") == {CPUS[-1]}
    assert affinity.cpus_of("free") == set(CPUS[1:])
    assert affinity.configure("split")  # again: still from all the CPUs
    assert affinity.cpus_of("writer") == {CPUS[-1]}
    assert not affinity.configure("off")
    assert os.sched_getaffinity(0) == set(CPUS)
    assert affinity.cpus_of("turns") is None


@needs_two_cpus
async def test_an_engine_with_split_threads_runs_workflows_and_puts_them_back(
    start_engine: StartEngine,
) -> None:
    engine = await start_engine(deployment(), files=FILES, cpu_affinity="split")
    eid = await engine.submit("myapp:demo/workflow.serial", [])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("45")
    placed = _placement()
    assert placed["obelisk-sqlite-writer"] == {CPUS[-1]}
    assert placed["obelisk-wf"] == {CPUS[0]}  # the workflow runs take turns with the loop
    assert placed["obelisk-run"] == set(CPUS[1:])  # activities compute without the GIL
    assert os.sched_getaffinity(0) == {CPUS[0]}
    await engine.stop()
    assert os.sched_getaffinity(0) == set(CPUS)


async def test_engines_leave_threads_alone_by_default(start_engine: StartEngine) -> None:
    engine = await start_engine(deployment(), files=FILES)
    eid = await engine.submit("myapp:demo/workflow.serial", [])
    assert await engine.result(eid, timeout=30) == ev.ResultOk("45")
    placed = _placement()
    assert placed["obelisk-sqlite-writer"] == set(CPUS)
    assert placed["obelisk-wf"] == set(CPUS)
