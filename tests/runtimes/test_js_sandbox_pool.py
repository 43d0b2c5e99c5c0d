"""Sandboxes kept from one JS workflow run to the next (`engine.runtimes.js.sandbox_pool`):
reset byte for byte, the same results as fresh ones, and only after a clean end."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import pytest

from engine.runtimes.js import sandbox_pool
from engine.runtimes.js import workflow as js_runtime
from engine.runtimes.js.heap import memory_of
from engine.runtimes.js.workflow import (
    JsWorkflowRunner,
    WfErr,
    WfOk,
    WfTimedOut,
    WfTrap,
    warm_up,
)
from tests.runtimes.fake_host import FakeFunction, FakeHost

STEP = "myapp:demo/activity.step"
FUNCTIONS = {STEP: FakeFunction(("idx", "sleep-millis"), lambda p: {"ok": p[0] * 10})}

SERIAL = """
import { step } from "myapp:demo/activity";
const table = [1, 2, 3].map((x) => x * 2);
let calls = 0;  // module state: a reused sandbox must not carry it over
export default function serial(n) {
  calls += 1;
  globalThis.leftover = (globalThis.leftover || 0) + 1;
  let acc = 0;
  for (let i = 0; i < n; i++) acc += step(i, 0);
  return [acc, table, calls, globalThis.leftover, Math.random(), obelisk.executionIdCurrent()];
}
"""


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    warm_up()


@pytest.fixture(autouse=True)
def _no_sandboxes_kept_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts with the process-wide count of idle sandboxes at 0: runners of
    earlier tests in this worker keep theirs until the collector drops them, and at
    `KEEP_IN_PROCESS` a sandbox given back is closed, not kept (seen under load)."""
    monkeypatch.setattr(sandbox_pool, "_kept", 0)


def _run(
    runner: JsWorkflowRunner, execution_id: str, params: list[Any] | None = None, **kw: Any
) -> Any:
    host = FakeHost(dict(FUNCTIONS), execution_id=execution_id)
    return runner.run(host, params if params is not None else [3], **kw)


def _runner(source: str = SERIAL) -> JsWorkflowRunner:
    runner = JsWorkflowRunner(source, "wf.js")
    runner.check(FakeHost(dict(FUNCTIONS)).interfaces())
    return runner


def test_a_sandbox_given_back_is_reset_byte_for_byte_to_a_fresh_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runner = _runner()
    assert isinstance(_run(runner, "E_A"), WfOk)
    assert len(runner.sandboxes) == 1
    [image] = [i for i in runner._module_images.values() if i is not None]
    sandbox = runner.sandboxes.take(image)
    assert sandbox is not None and len(runner.sandboxes) == 0
    # A fresh sandbox restored from the same image, as a run without reuse opens it.
    monkeypatch.setattr(js_runtime, "REUSE_SANDBOXES", False)
    fresh = js_runtime._Run(runner, None, {}, "E_B", None, runner._last_modules[1])  # type: ignore[index]
    fresh.module_image = image
    fresh.open()
    try:
        inst = fresh.ctx._engine_ctx._inst
        assert memory_of(sandbox.inst) == memory_of(inst)
        assert sandbox.inst.sp.value(sandbox.inst.store) == inst.sp.value(inst.store)
    finally:
        fresh.close()
        sandbox.close()


def test_runs_on_reused_sandboxes_give_what_fresh_sandboxes_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[bool] = []  # per run: from a pooled sandbox?
    original = js_runtime._Run._open_pooled

    def spy(self: js_runtime._Run, pooled: Any) -> None:
        opened.append(True)
        original(self, pooled)

    monkeypatch.setattr(js_runtime._Run, "_open_pooled", spy)
    runner = _runner()
    reused = [_run(runner, eid) for eid in ("E_A", "E_B", "E_A", "E_C")]
    assert len(opened) == 3  # every run but the first
    monkeypatch.setattr(js_runtime, "REUSE_SANDBOXES", False)
    fresh_runner = _runner()
    fresh = [_run(fresh_runner, eid) for eid in ("E_A", "E_B", "E_A", "E_C")]
    assert len(opened) == 3 and len(fresh_runner.sandboxes) == 0
    assert reused == fresh
    value = reused[2].value
    # Module state and globals start over in every run; the randomness is the execution's.
    assert value[:4] == [30, [2, 4, 6], 1, 1] and value[5] == "E_A"
    assert reused[0] == reused[2] and reused[0] != reused[1]


def test_a_thrown_error_ends_cleanly_and_the_sandbox_serves_the_next_run() -> None:
    runner = _runner('export default function f(n) { if (n) throw "no"; return "yes"; }')
    assert _run(runner, "E_A", [1]) == WfErr("no")
    assert len(runner.sandboxes) == 1
    assert _run(runner, "E_B", [0]) == WfOk("yes")
    assert len(runner.sandboxes) == 1


@pytest.mark.parametrize(
    ("source", "outcome"),
    [
        (
            "export default () => { const a = []; for (;;) a.push('x'.repeat(1e6)); };",
            WfTrap("out of memory (the JS sandbox's limit is 64 MiB)"),
        ),
        ("export default () => { for (;;) {} };", WfTimedOut()),
        ("export default () => new Promise(() => {});", None),
    ],
    ids=["out of memory", "spinning", "never settles"],
)
def test_a_sandbox_whose_run_did_not_end_cleanly_is_not_kept(source: str, outcome: Any) -> None:
    runner = _runner(source)
    got = _run(runner, "E_A", spin_timeout=0.2)
    if outcome is not None:
        assert got == outcome
    else:
        assert isinstance(got, WfTrap) and "never settles" in got.reason
    assert len(runner.sandboxes) == 0


def test_a_handle_left_by_an_earlier_run_does_not_reach_the_next_one() -> None:
    runner = _runner()
    assert isinstance(_run(runner, "E_A"), WfOk)
    [image] = [i for i in runner._module_images.values() if i is not None]
    sandbox = runner.sandboxes.take(image)
    assert sandbox is not None
    # A run's context with a handle nobody disposed, then retired as a run's is.
    ctx = sandbox.new_context(60)
    leaked = ctx.eval_handle("({big: 'x'.repeat(1000)})")
    js_runtime.retire_context(sandbox.rt, ctx)
    runner.sandboxes.give(sandbox)
    calls: list[str] = []
    original_c = sandbox.inst.c
    sandbox.inst.c = lambda name, *a: (calls.append(name), original_c(name, *a))[1]
    with pytest.warns(ResourceWarning):
        del leaked
        gc.collect()
    assert "free_value" not in calls  # its context is closed: the guest is not touched
    sandbox.inst.c = original_c
    assert _run(runner, "E_B") == _run(_runner(), "E_B")


def test_the_process_keeps_a_bounded_number_of_idle_sandboxes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sandbox_pool, "KEEP_IN_PROCESS", 1)
    monkeypatch.setattr(sandbox_pool, "_kept", 0)
    first, second = _runner(), _runner()
    try:
        assert isinstance(_run(first, "E_A"), WfOk)
        assert isinstance(_run(second, "E_B"), WfOk)
        assert (len(first.sandboxes), len(second.sandboxes)) == (1, 0)  # closed instead
        assert isinstance(_run(first, "E_C"), WfOk)  # takes it, gives it back
        assert sandbox_pool._kept == 1
    finally:
        first.sandboxes.clear()
        second.sandboxes.clear()
    assert sandbox_pool._kept == 0


def test_a_sandbox_idle_for_idle_seconds_is_closed() -> None:
    """After a burst, the sandboxes it left go back once nobody takes them for
    `IDLE_SECONDS` (the trimmer thread calls `trim_all` with the time)."""
    first, second = _runner(), _runner()
    try:
        assert isinstance(_run(first, "E_A"), WfOk)
        now = time.monotonic()
        assert isinstance(_run(second, "E_B"), WfOk)
        later = time.monotonic()
        kept = sandbox_pool._kept
        # Not idle long enough: kept.
        soon = now + sandbox_pool.IDLE_SECONDS - 1
        assert first.sandboxes.trim(soon) == 0 and second.sandboxes.trim(soon) == 0
        assert (len(first.sandboxes), len(second.sandboxes)) == (1, 1)
        # Idle long enough: closed, and no longer counted in the process.
        assert first.sandboxes.trim(later + sandbox_pool.IDLE_SECONDS) == 1
        assert len(first.sandboxes) == 0 and sandbox_pool._kept == kept - 1
        # Every pool of the process (earlier tests' too: hence no exact count).
        assert sandbox_pool.trim_all(later + sandbox_pool.IDLE_SECONDS) >= 1
        assert len(second.sandboxes) == 0
        # A run after that opens a new sandbox, and works.
        assert _run(first, "E_C") == _run(_runner(), "E_C")
    finally:
        first.sandboxes.clear()
        second.sandboxes.clear()


def test_a_sandbox_given_back_starts_the_trimmer() -> None:
    runner = _runner()
    try:
        assert isinstance(_run(runner, "E_A"), WfOk)
        assert len(runner.sandboxes) == 1
        trimmers = [t for t in threading.enumerate() if t.name == "obelisk-sandbox-trim"]
        assert len(trimmers) == 1 and trimmers[0].daemon and trimmers[0].is_alive()
    finally:
        runner.sandboxes.clear()
