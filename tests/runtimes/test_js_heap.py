"""Heap images of the JS workflow runtime: the page-wise restore and the module images."""

from __future__ import annotations

from typing import Any

import pytest
from quickjs_rs import Runtime

from engine.runtimes.js import workflow as js_runtime
from engine.runtimes.js.heap import HeapImage, memory_of
from engine.runtimes.js.workflow import JsWorkflowRunner, WfOk, warm_up
from tests.runtimes.fake_host import FakeFunction, FakeHost

STEP = "myapp:demo/activity.step"
FUNCTIONS = {STEP: FakeFunction(("idx", "sleep-millis"), lambda p: {"ok": p[0] * 10})}

SERIAL = """
import { step } from "myapp:demo/activity";
const table = [1, 2, 3].map((x) => x * 2);  // top-level code without the host
export default function serial(n) {
  let acc = 0;
  for (let i = 0; i < n; i++) acc += step(i, 0);
  return [acc, table, Math.random(), obelisk.executionIdCurrent()];
}
"""


@pytest.fixture(scope="module", autouse=True)
def _warm() -> None:
    warm_up()


def _sandbox() -> tuple[Any, Any, Any]:
    rt = Runtime(memory_limit=js_runtime.DEFAULT_MEMORY_LIMIT)
    ctx = rt.new_context(timeout=60)
    return rt, ctx, ctx._engine_ctx._inst


def test_a_restored_image_is_byte_for_byte_quickjs_rs_own_restore() -> None:
    rt, ctx, inst = _sandbox()
    fresh_rt, fresh_ctx, fresh_inst = _sandbox()
    try:
        ctx.eval("globalThis.big = 'x'.repeat(300000); globalThis.o = {a: [1, 2, 3]};")
        image = HeapImage.capture(inst, memory_of(fresh_inst))
        snapshot = ctx.create_snapshot()
        assert 0 < image.written_bytes < image.memory_size  # zero pages are skipped
    finally:
        fresh_ctx.close()
        fresh_rt.close()
    ours, theirs = _sandbox(), _sandbox()
    try:
        image.restore(ours[2])
        theirs[0].restore_snapshot(snapshot, theirs[1])
        assert memory_of(ours[2]) == memory_of(theirs[2]) == memory_of(inst)
        assert ours[1].eval("big.length + o.a[2]") == 300003
    finally:
        for r, c, _ in (ours, theirs):
            c.close()
            r.close()
        ctx.close()
        rt.close()


def _run(source: str, execution_id: str, runner: JsWorkflowRunner | None = None) -> Any:
    host = FakeHost(dict(FUNCTIONS), execution_id=execution_id)
    runner = runner or JsWorkflowRunner(source, "wf.js")
    runner.check(host.interfaces())
    outcome = runner.run(host, [3])
    assert isinstance(outcome, WfOk), outcome
    return outcome.value, host


@pytest.mark.parametrize("module_image", [True, False])
def test_runs_from_the_module_image_match_runs_that_load_the_module(
    monkeypatch: pytest.MonkeyPatch, module_image: bool
) -> None:
    monkeypatch.setattr(js_runtime, "USE_MODULE_IMAGE", module_image)
    loaded: list[bool] = []
    original_open = js_runtime._Run.open

    def spy(self: js_runtime._Run, **kwargs: Any) -> None:
        original_open(self, **kwargs)
        if self.host is not None:
            loaded.append(self.module_loaded)

    monkeypatch.setattr(js_runtime._Run, "open", spy)
    runner = JsWorkflowRunner(SERIAL, "wf.js")
    a, host_a = _run(SERIAL, "E_A", runner)
    b, _ = _run(SERIAL, "E_B", runner)
    assert loaded == [module_image, module_image]
    assert a[:2] == [30, [2, 4, 6]] and a[3] == "E_A" and b[3] == "E_B"
    assert a[2] != b[2]  # Math.random is seeded by the execution, image or not
    # The same values as a runner that never uses an image.
    monkeypatch.setattr(js_runtime, "USE_MODULE_IMAGE", False)
    assert _run(SERIAL, "E_A")[0] == a
    assert [c.method for c in host_a.calls] == ["call"] * 3


@pytest.mark.parametrize(
    "body",
    [
        "return step(n, 0);",  # a host call
        'throw new Error("boom " + n);',
        "await null; return n + 1;",  # settles once the pending jobs ran
        'await null; throw new TypeError("bad");',  # a rejected promise
        "await new Promise(() => {}); return 1;",  # never settles
        "while (true) {}",  # interrupted (spin_timeout)
    ],
)
def test_runs_without_an_event_loop_end_as_runs_on_one(
    monkeypatch: pytest.MonkeyPatch, body: str
) -> None:
    """A run restored with its module (the image) invokes the function without an event
    loop (`quickjs_fast.eval_script_sync`); a run that loads the module goes through
    quickjs-rs's `eval_async`. Both end alike, whatever the function does."""
    source = (
        'import { step } from "myapp:demo/activity";\n'
        f"export default async function wf(n) {{ {body} }}"
    )
    synchronous: list[bool] = []
    original = js_runtime.eval_script_sync

    def spy(*args: Any) -> Any:
        synchronous.append(True)
        return original(*args)

    monkeypatch.setattr(js_runtime, "eval_script_sync", spy)

    def outcome() -> Any:
        host = FakeHost(dict(FUNCTIONS), execution_id="E_A")
        runner = JsWorkflowRunner(source, "wf.js")
        runner.check(host.interfaces())
        return runner.run(host, [3], spin_timeout=0.2)

    with_image = outcome()
    assert synchronous == [True]
    monkeypatch.setattr(js_runtime, "USE_MODULE_IMAGE", False)
    assert outcome() == with_image and synchronous == [True]


@pytest.mark.parametrize(
    "top_level",
    [
        "const r = Math.random();",
        "const r = obelisk.executionIdCurrent();",
        'console.log("loading"); const r = 0;',
    ],
)
def test_top_level_code_that_reads_the_execution_gets_no_module_image(top_level: str) -> None:
    source = f"""
import {{ step }} from "myapp:demo/activity";
{top_level}
export default function f(n) {{ return [r, step(n, 0)]; }}
"""
    runner = JsWorkflowRunner(source, "wf.js")
    a, host_a = _run(source, "E_A", runner)
    b, _ = _run(source, "E_B", runner)
    assert list(runner._module_images.values()) == [None]
    assert a[1] == 30
    if "random" in top_level:
        assert a[0] != b[0]  # seeded by each execution, as without images
    elif "executionIdCurrent" in top_level:
        assert (a[0], b[0]) == ("E_A", "E_B")
    else:
        assert host_a.logs == [("info", "loading")]
