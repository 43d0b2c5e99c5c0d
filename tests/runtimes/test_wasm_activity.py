"""The WASM activity runner against the WAT-built `testing:fixtures/activity` component."""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if (
    str(ROOT) not in sys.path
):  # tests/runtimes may be imported outside pytest: make `tests.fixtures` importable
    sys.path.insert(0, str(ROOT))

from engine.runtimes.outcome import (  # noqa: E402
    LogLine,
    RunCancelled,
    RunErr,
    RunOk,
    RunOutcome,
    RunTimedOut,
    RunTrap,
)
from engine.runtimes.wasm import activity as wasm_activity  # noqa: E402
from engine.runtimes.wasm import plumbing as wasm_plumbing  # noqa: E402
from engine.runtimes.wasm.activity import (  # noqa: E402
    _POOL_TABLE_ELEMENTS,
    ACTIVITY_POOL_SLOTS,
    ComponentLoadError,
    Interrupt,
    WasmActivityRunner,
    WasmEngine,
    inspect_exports,
    load_activity,
)
from engine.runtimes.wasm.plumbing import SlotTokens  # noqa: E402
from engine.wit.types import STRING, U32, U64, FunctionSignature, WitResult  # noqa: E402
from tests.fixtures import components as fx  # noqa: E402
from tests.reliability.conftest import wait_until  # noqa: E402


@pytest.fixture(scope="module")
def runner() -> Iterator[WasmActivityRunner]:
    engine = WasmEngine.shared()
    component = engine.load_component(fx.activity_component())
    yield WasmActivityRunner(component, inspect_exports(component))


def run(
    runner: WasmActivityRunner,
    function: str,
    params: list[Any],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 5.0,
    cancel: threading.Event | None = None,
    log: list[LogLine] | None = None,
) -> RunOutcome:
    return runner.call(
        fx.ffqn(function),
        params,
        env or {},
        time.monotonic() + timeout,
        cancel or threading.Event(),
        (log if log is not None else []).append,
    )


def test_exports_are_inspected_with_names_and_types(runner: WasmActivityRunner) -> None:
    sigs = runner.signatures
    assert set(sigs) == {
        fx.ffqn(f)
        for f in (
            "echo",
            "add",
            "fail",
            "fail-permanent",
            "fail-temporary",
            "trap",
            "trap-until",
            "spin",
            "env-vars",
            "print",
            "print-err",
            "log-info",
            "log-levels",
        )
    }
    assert sigs[fx.ffqn("add")] == FunctionSignature(
        [("a", U64), ("b", U64)], WitResult(U64, STRING)
    )
    assert sigs[fx.ffqn("trap-until")].params == [("unix-ms", U64)]
    assert sigs[fx.ffqn("fail-permanent")].format() == (
        "func(msg: string) -> result<string, variant { permanent-failure(string), temporary(string) }>"
    )


def test_ok(runner: WasmActivityRunner) -> None:
    assert run(runner, "echo", ["héllo"]) == RunOk("héllo")
    assert run(runner, "add", [2**63, 5]) == RunOk(2**63 + 5)
    assert run(runner, "print", ["x"]) == RunOk(None)


def test_err_string_is_temporary(runner: WasmActivityRunner) -> None:
    assert run(runner, "fail", ["boom"]) == RunErr("boom", permanent=False)


def test_err_variant_permanent_case(runner: WasmActivityRunner) -> None:
    assert run(runner, "fail-permanent", ["no"]) == RunErr(
        {"permanent-failure": "no"}, permanent=True
    )
    assert run(runner, "fail-temporary", ["later"]) == RunErr(
        {"temporary": "later"}, permanent=False
    )


def test_trap(runner: WasmActivityRunner) -> None:
    outcome = run(runner, "trap", [])
    assert isinstance(outcome, RunTrap)
    assert outcome.reason == "trap: unreachable"
    assert "unreachable" in outcome.detail and "wasm backtrace" in outcome.detail


def test_trap_until_uses_the_wall_clock(runner: WasmActivityRunner) -> None:
    future = int(time.time() * 1000) + 60_000
    assert isinstance(run(runner, "trap-until", [future]), RunTrap)
    outcome = run(runner, "trap-until", [0])
    assert isinstance(outcome, RunOk) and abs(outcome.value - time.time() * 1000) < 60_000


def test_spin_times_out_at_the_deadline(runner: WasmActivityRunner) -> None:
    start = time.monotonic()
    assert run(runner, "spin", [], timeout=0.15) == RunTimedOut()
    elapsed = time.monotonic() - start
    assert 0.14 <= elapsed < 0.5


def test_deadline_already_passed(runner: WasmActivityRunner) -> None:
    assert run(runner, "echo", ["x"], timeout=-1) == RunTimedOut()


def test_cancel_interrupts_a_spinning_guest_quickly(runner: WasmActivityRunner) -> None:
    cancel = threading.Event()
    outcome: list[RunOutcome] = []
    worker = threading.Thread(target=lambda: outcome.append(run(runner, "spin", [], cancel=cancel)))
    worker.start()
    time.sleep(0.1)
    cancelled_at = time.monotonic()
    cancel.set()
    worker.join(2)
    latency = time.monotonic() - cancelled_at
    assert outcome == [RunCancelled()]
    # At most 8 epoch ticks of 5 ms when the machine is idle; the bound leaves room for a
    # loaded one (0.11 s seen with the suite on both cores) and still tells an interrupted
    # spin from one left to run (it never ends).
    assert latency < 0.5


def test_a_spinning_guest_is_checked_about_25_times_a_second(
    runner: WasmActivityRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each check takes the GIL: a check every 5 ms tick for each spinning guest starved
    the event loop with many of them; the checks are spaced out to every 8 ticks."""
    checks: list[float] = []
    install = wasm_activity.install_interrupt

    def counting(store: Any, check: Any) -> Interrupt:
        def counted() -> str | None:
            checks.append(time.monotonic())
            return check()  # type: ignore[no-any-return]

        return install(store, counted)

    monkeypatch.setattr(wasm_activity, "install_interrupt", counting)
    assert run(runner, "spin", [], timeout=0.5) == RunTimedOut()
    # 1, 2, 4, then every 8 ticks (40 ms): ~16 in 0.5 s; every tick would be ~100.
    assert 3 <= len(checks) <= 30, len(checks)


def test_the_epoch_ticker_parks_without_stores_and_wakes_for_the_next() -> None:
    """An idle engine's ticker stops waking the process; a guest started afterwards is
    still stopped at its deadline (only ticks can stop it)."""
    engine = WasmEngine()  # its own ticker
    component = engine.load_component(fx.activity_component())
    runner = WasmActivityRunner(component, inspect_exports(component))
    assert run(runner, "echo", ["x"]) == RunOk("x")
    wait_until(lambda: not engine.ticking, 5, "the ticker to park once no store is alive")
    start = time.monotonic()
    assert run(runner, "spin", [], timeout=0.15) == RunTimedOut()
    assert 0.14 <= time.monotonic() - start < 0.5
    # A store kept alive (a WASM workflow's, between host calls) keeps it ticking.
    store, _ = engine.new_store(lambda: None)
    wait_until(lambda: engine.ticking, 5, "a new store to wake the ticker")
    del store
    wait_until(lambda: not engine.ticking, 5, "the ticker to park once the store is gone")


def test_cancel_already_set(runner: WasmActivityRunner) -> None:
    cancel = threading.Event()
    cancel.set()
    assert run(runner, "echo", ["x"], cancel=cancel) == RunCancelled()


def test_only_declared_env_vars_are_visible(
    runner: WasmActivityRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OBELISK_TEST_HOST_SECRET", "do-not-leak")
    assert run(runner, "env-vars", []) == RunOk([])
    outcome = run(runner, "env-vars", [], env={"GREETING": "hi", "MODE": "test"})
    assert isinstance(outcome, RunOk)
    assert sorted(outcome.value) == [["GREETING", "hi"], ["MODE", "test"]]


def test_stdout_and_stderr_are_captured_as_lines(runner: WasmActivityRunner) -> None:
    log: list[LogLine] = []
    assert run(runner, "print", ["first\r\nsecond\n\nlast without newline"], log=log) == RunOk(None)
    assert run(runner, "print-err", ["oops\n"], log=log) == RunOk(None)
    assert log == [
        LogLine("info", "first", "stdout"),
        LogLine("info", "second", "stdout"),
        LogLine("info", "", "stdout"),
        LogLine("info", "last without newline", "stdout"),
        LogLine("error", "oops", "stderr"),
    ]


def test_output_callbacks_go_with_their_runs(runner: WasmActivityRunner) -> None:
    """Each run's stdout/stderr callbacks (`plumbing.RunStore.set_wasi`) are dropped with its
    store: none is left behind, whatever the run did."""
    before = len(wasm_plumbing._OUTPUTS)
    for _ in range(5):
        assert run(runner, "print", ["x\n"]) == RunOk(None)
        assert isinstance(run(runner, "trap", []), RunTrap)
        assert run(runner, "spin", [], timeout=0.02) == RunTimedOut()
    assert len(wasm_plumbing._OUTPUTS) == before


def test_slot_tokens_count_like_a_bounded_semaphore() -> None:
    slots = SlotTokens(2)
    assert slots.acquire() and slots.acquire(blocking=False)
    assert not slots.acquire(blocking=False)
    started = time.monotonic()
    assert not slots.acquire(timeout=0.05)
    assert time.monotonic() - started >= 0.04
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(slots.acquire(timeout=10)))
    waiter.start()
    slots.release()  # the waiter takes it
    waiter.join()
    assert got == [True]
    slots.release()
    slots.release()
    with pytest.raises(ValueError, match="released too many times"):
        slots.release()


def test_obelisk_log(runner: WasmActivityRunner) -> None:
    log: list[LogLine] = []
    assert run(runner, "log-info", ["hello"], log=log) == RunOk(None)
    assert log == [LogLine("info", "hello")]
    log.clear()
    assert run(runner, "log-levels", ["m"], log=log) == RunOk(None)
    assert [(line.level, line.message, line.stream) for line in log] == [
        (level, "m", "log") for level in ("trace", "debug", "info", "warn", "error")
    ]


def test_sink_is_called_on_the_worker_thread(runner: WasmActivityRunner) -> None:
    threads: set[int] = set()
    runner.call(
        fx.ffqn("print"),
        ["a\nb\n"],
        {},
        time.monotonic() + 5,
        threading.Event(),
        lambda _line: threads.add(threading.get_ident()),
    )
    assert threads == {threading.get_ident()}


def test_failing_log_sink_does_not_break_the_run(runner: WasmActivityRunner) -> None:
    def sink(_line: LogLine) -> None:
        raise RuntimeError("sink down")

    outcome = runner.call(
        fx.ffqn("log-levels"), ["m"], {}, time.monotonic() + 5, threading.Event(), sink
    )
    assert outcome == RunOk(None)


def test_bad_params_name_the_parameter(runner: WasmActivityRunner) -> None:
    outcome = run(runner, "add", [1, -1])
    assert isinstance(outcome, RunTrap)
    assert (
        outcome.reason
        == "invalid params: parameter 'b': params[1]: expected u64, got -1 (out of range 0..18446744073709551615)"
    )
    outcome = run(runner, "add", [1])
    assert isinstance(outcome, RunTrap)
    assert outcome.reason == "invalid params: expected 2 (a: u64, b: u64), got 1"


def test_unknown_function(runner: WasmActivityRunner) -> None:
    outcome = runner.call(
        "testing:fixtures/activity.nope", [], {}, time.monotonic() + 1, threading.Event(), print
    )
    assert isinstance(outcome, RunTrap) and "nope" in outcome.reason


def test_concurrent_runs_keep_their_own_logs_and_outcomes(runner: WasmActivityRunner) -> None:
    results: dict[int, tuple[RunOutcome, list[LogLine]]] = {}
    spin_cancel = threading.Event()

    def work(i: int) -> None:
        log: list[LogLine] = []
        if i == 0:
            outcome = run(runner, "spin", [], cancel=spin_cancel, log=log)
        elif i % 3 == 1:
            outcome = run(runner, "trap", [], log=log)
        else:
            outcome = run(runner, "log-levels", [f"run {i}"], log=log)
            outcome2 = run(runner, "print", [f"out {i}\n"], log=log)
            assert outcome2 == RunOk(None)
        results[i] = (outcome, log)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    spin_cancel.set()
    for t in threads:
        t.join(5)
    assert results[0][0] == RunCancelled()
    for i in range(1, 12):
        outcome, log = results[i]
        if i % 3 == 1:
            assert isinstance(outcome, RunTrap) and outcome.reason == "trap: unreachable"
            assert log == []
        else:
            assert outcome == RunOk(None)
            assert [line.message for line in log] == [f"run {i}"] * 5 + [f"out {i}"]


def test_not_a_component(tmp_path: Path) -> None:
    engine = WasmEngine.shared()
    core = fx.core_module_file()
    with pytest.raises(
        ComponentLoadError,
        match=rf"^not a WebAssembly component: {core}: it is a core WebAssembly module",
    ):
        engine.load(core)
    text = tmp_path / "x.wasm"
    text.write_text("hello")
    with pytest.raises(
        ComponentLoadError, match=rf"^not a WebAssembly component: {text}: not a WebAssembly binary"
    ):
        engine.load(text)
    empty = tmp_path / "empty.wasm"
    empty.write_bytes(b"")
    with pytest.raises(ComponentLoadError, match="the file is empty"):
        engine.load(empty)
    broken = tmp_path / "broken.wasm"
    broken.write_bytes(fx.activity_component().read_bytes()[:200])
    with pytest.raises(ComponentLoadError, match=rf"^invalid WebAssembly component: {broken}: "):
        engine.load(broken)
    with pytest.raises(ComponentLoadError, match=r"^cannot read component: .*missing\.wasm"):
        engine.load(tmp_path / "missing.wasm")


def test_compiled_cache(tmp_path: Path) -> None:
    engine = WasmEngine.shared()
    path = fx.activity_component()
    digest = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    first = engine.load(path, tmp_path)
    assert (first.digest, first.cache_hit) == (digest, False)
    cached = list(tmp_path.iterdir())
    assert len(cached) == 1 and cached[0].name.startswith(digest.removeprefix("sha256:"))
    second = engine.load(path, tmp_path)
    assert (second.digest, second.cache_hit) == (digest, True)
    assert engine.load(path.read_bytes(), tmp_path).cache_hit
    # the cached code works
    runner = WasmActivityRunner(second.component, inspect_exports(second.component))
    assert runner.call(
        fx.ffqn("echo"), ["c"], {}, time.monotonic() + 5, threading.Event(), print
    ) == RunOk("c")
    # a corrupt cache entry is replaced
    cached[0].write_bytes(b"garbage")
    assert not engine.load(path, tmp_path).cache_hit
    assert engine.load(path, tmp_path).cache_hit


def test_unsatisfied_import(tmp_path: Path) -> None:
    wit = """\
package testing:unknown;
interface thing { poke: func(); }
interface activity { go: func() -> result; }
world w { import thing; export activity; export bare: func(); }
"""
    wat = """\
(module
  (import "cm32p2|testing:unknown/thing" "poke" (func $poke))
  (memory (export "cm32p2_memory") 1)
  (func (export "cm32p2||bare"))
  (func (export "cm32p2|testing:unknown/activity|go") (result i32) (call $poke) (i32.const 0)))
"""
    path = fx.build_component("unknown-import", {"w.wit": wit}, wat)
    engine = WasmEngine.shared()
    component = engine.load_component(path)
    sigs = inspect_exports(component)
    assert list(sigs) == ["testing:unknown/activity.go"]  # the bare function is ignored
    runner = WasmActivityRunner(component, sigs)
    with pytest.raises(ComponentLoadError, match="testing:unknown/thing"):
        runner.verify_instantiable()
    outcome = runner.call(
        "testing:unknown/activity.go", [], {}, time.monotonic() + 5, threading.Event(), print
    )
    assert isinstance(outcome, RunTrap) and outcome.reason.startswith("cannot instantiate")


def test_component_of_another_engine_runs_on_that_engine() -> None:
    engine = WasmEngine()  # not the shared one
    component = engine.load_component(fx.activity_component())
    runner = WasmActivityRunner(component, inspect_exports(component))
    assert runner.engine is engine
    outcome = runner.call(
        fx.ffqn("spin"), [], {}, time.monotonic() + 0.05, threading.Event(), print
    )
    assert outcome == RunTimedOut()  # its own epoch ticker is running
    assert runner.call(
        fx.ffqn("echo"), ["e"], {}, time.monotonic() + 5, threading.Event(), print
    ) == RunOk("e")


# ---------------------------------------------------------------------------------------------
# Pooled instances


def test_activities_load_on_the_pooled_engine_and_run() -> None:
    fallback = WasmEngine()
    component = load_activity(fx.activity_component(), None, fallback)
    runner = WasmActivityRunner(component, inspect_exports(component))
    assert runner.engine is WasmEngine.activity_pool() and runner.engine.pooled
    assert run(runner, "echo", ["p"]) == RunOk("p")
    assert run(runner, "spin", [], timeout=0.05) == RunTimedOut()
    assert isinstance(run(runner, "trap", []), RunTrap)
    # every run gave its slot back
    slots = runner.engine.slots
    assert slots is not None
    taken = [slots.acquire(blocking=False) for _ in range(ACTIVITY_POOL_SLOTS)]
    assert all(taken) and not slots.acquire(blocking=False)
    for _ in taken:
        slots.release()


@pytest.mark.parametrize(
    "name, extra",
    [
        ("big-table", f"(table {_POOL_TABLE_ELEMENTS + 1} funcref)"),
        # more memories than a slot's share: it would fit an empty pool, not a busy one
        ("three-memories", "(memory $a 1) (memory $b 1)"),
    ],
)
def test_a_component_too_big_for_a_pooled_slot_runs_on_demand(name: str, extra: str) -> None:
    """Pooled compilation or instantiation fails, on-demand works: the component is
    loaded on the fallback engine."""
    wit = """\
package testing:big;
interface activity { go: func() -> result; }
world w { export activity; }
"""
    wat = f"""\
(module
  (memory (export "cm32p2_memory") 1)
  {extra}
  (func (export "cm32p2|testing:big/activity|go") (result i32) (i32.const 0)))
"""
    path = fx.build_component(name, {"w.wit": wit}, wat)
    with pytest.raises(ComponentLoadError):
        WasmEngine.activity_pool().verify_instantiable(
            WasmEngine.activity_pool().load_component(path)
        )
    fallback = WasmEngine()
    component = load_activity(path, None, fallback)
    runner = WasmActivityRunner(component, inspect_exports(component))
    assert runner.engine is fallback and not fallback.pooled
    outcome = runner.call(
        "testing:big/activity.go", [], {}, time.monotonic() + 5, threading.Event(), print
    )
    assert outcome == RunOk(None)


def test_a_pooled_slot_starts_every_run_from_fresh_memory() -> None:
    """A slot is reused (its first MiB zeroed rather than decommitted): a run never sees
    what the previous one wrote."""
    wit = """\
package testing:fresh;
interface activity { bump: func() -> result<u64, string>; }
world w { export activity; }
"""
    wat = """\
(module
  (memory (export "cm32p2_memory") 1)
  (func (export "cm32p2|testing:fresh/activity|bump") (result i32)
    (i64.store (i32.const 200) (i64.add (i64.load (i32.const 200)) (i64.const 1)))
    (i32.store8 (i32.const 16) (i32.const 0))
    (i64.store (i32.const 24) (i64.load (i32.const 200)))
    (i32.const 16)))
"""
    path = fx.build_component("fresh-memory", {"w.wit": wit}, wat)
    component = load_activity(path, None, WasmEngine())
    runner = WasmActivityRunner(component, inspect_exports(component))
    assert runner.engine.pooled
    outcomes = [
        runner.call(
            "testing:fresh/activity.bump", [], {}, time.monotonic() + 5, threading.Event(), print
        )
        for _ in range(5)
    ]
    assert outcomes == [RunOk(1)] * 5


def test_a_run_waits_for_a_free_slot() -> None:
    """With every slot taken, a run waits (here: until its deadline) instead of failing
    to instantiate; once one is free it runs."""
    engine = WasmEngine(pool_slots=1)
    assert engine.pooled
    component = engine.load_component(fx.activity_component())
    runner = WasmActivityRunner(component, inspect_exports(component))
    done: list[RunOutcome] = []
    spinning = threading.Thread(target=lambda: done.append(run(runner, "spin", [], timeout=0.5)))
    spinning.start()
    slots = engine.slots
    assert slots is not None
    while slots.acquire(blocking=False):  # until the spinning run holds the slot
        slots.release()
        time.sleep(0.001)
    assert run(runner, "echo", ["w"], timeout=0.1) == RunTimedOut()
    assert run(runner, "echo", ["w"], timeout=5) == RunOk("w")  # after the spin timed out
    spinning.join()
    assert done == [RunTimedOut()]


def test_versioned_interface_ffqn() -> None:
    wit = """\
package testing:versioned@1.2.0;
interface activity { answer: func(question: string) -> result<u32, string>; }
world w { export activity; }
"""
    wat = """\
(module
  (memory (export "cm32p2_memory") 1)
  (func (export "cm32p2_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
  (func (export "cm32p2|testing:versioned/activity@1|answer") (param i32 i32) (result i32)
    (i32.store8 (i32.const 16) (i32.const 0))
    (i32.store (i32.const 20) (i32.const 42))
    (i32.const 16)))
"""
    component = WasmEngine.shared().load_component(
        fx.build_component("versioned", {"w.wit": wit}, wat)
    )
    sigs = inspect_exports(component)
    ffqn = "testing:versioned/activity@1.2.0.answer"
    assert sigs == {ffqn: FunctionSignature([("question", STRING)], WitResult(U32, STRING))}
    runner = WasmActivityRunner(component, sigs)
    assert runner.call(ffqn, ["?"], {}, time.monotonic() + 5, threading.Event(), print) == RunOk(42)
