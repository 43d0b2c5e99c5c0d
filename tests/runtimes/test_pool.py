"""RunPool: the activity thread pool (few threads for short jobs, more when they block)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from engine.executors.pool import RunPool


async def test_results_and_exceptions_reach_the_loop() -> None:
    pool = RunPool(8, core=2, thread_name_prefix="t")
    try:
        assert await pool.run_async(lambda: 42) == 42
        with pytest.raises(ZeroDivisionError):
            await pool.run_async(lambda: 1 / 0)
        results = await asyncio.gather(*(pool.run_async(lambda i=i: i * 2) for i in range(1000)))
        assert results == [i * 2 for i in range(1000)]
    finally:
        pool.shutdown(wait=False)


async def test_short_jobs_stay_on_the_core_threads() -> None:
    # (A long `stall`: a loaded test machine may pause the core threads for a while.)
    pool = RunPool(64, core=2, stall=2.0, thread_name_prefix="t")
    try:
        await asyncio.gather(*(pool.run_async(lambda: None) for _ in range(2000)))
        assert pool._threads == 2
    finally:
        pool.shutdown(wait=False)


async def test_blocked_threads_make_the_pool_grow_up_to_max_workers() -> None:
    pool = RunPool(10, core=2, stall=0.01, thread_name_prefix="t")
    release = threading.Event()
    try:
        started = time.monotonic()
        jobs = [pool.run_async(lambda: release.wait(10)) for _ in range(12)]
        while pool._threads < 10 and time.monotonic() - started < 5:
            await asyncio.sleep(0.01)
        assert pool._threads == 10  # never more than max_workers
        release.set()
        assert await asyncio.wait_for(asyncio.gather(*jobs), 10) == [True] * 12
    finally:
        release.set()
        pool.shutdown(wait=False)


async def test_sleeping_jobs_run_concurrently() -> None:
    pool = RunPool(64, core=2, thread_name_prefix="t")
    try:
        started = time.monotonic()
        await asyncio.gather(*(pool.run_async(lambda: time.sleep(0.3)) for _ in range(20)))
        assert time.monotonic() - started < 2.0  # not 20 × 0.3 s / 2 threads = 3 s
    finally:
        pool.shutdown(wait=False)


async def test_extra_threads_exit_when_idle() -> None:
    pool = RunPool(8, core=1, stall=0.01, idle_timeout=0.1, thread_name_prefix="t")
    try:
        await asyncio.gather(*(pool.run_async(lambda: time.sleep(0.1)) for _ in range(4)))
        assert pool._threads > 1
        deadline = time.monotonic() + 5
        while pool._threads > 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert pool._threads == 1
    finally:
        pool.shutdown(wait=False)


async def test_executor_interface_and_shutdown() -> None:
    pool = RunPool(1, thread_name_prefix="t")  # one thread: `queued` waits behind `busy`
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(pool, lambda: "x") == "x"
    assert pool.submit(lambda a, b: a + b, 1, b=2).result(5) == 3
    release = threading.Event()
    busy = pool.run_async(lambda: release.wait(10))
    queued = pool.submit(lambda: "never")
    await asyncio.sleep(0.05)
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled()
    release.set()
    assert await busy is True
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


async def test_cancelled_waiter_does_not_break_delivery() -> None:
    pool = RunPool(4, core=1, thread_name_prefix="t")
    try:
        fut = pool.run_async(lambda: time.sleep(0.05))
        fut.cancel()
        await asyncio.sleep(0.1)
        assert await pool.run_async(lambda: 1) == 1
    finally:
        pool.shutdown(wait=False)


def test_detached_jobs_run_and_a_failing_one_is_only_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = RunPool(4, core=1)
    done = threading.Event()
    ran: list[str] = []

    def boom() -> None:
        raise ValueError("boom")

    def record() -> None:
        ran.append(threading.current_thread().name)
        done.set()

    pool.run_detached(boom)
    pool.run_detached(record)  # the same (only) core thread goes on
    assert done.wait(5)
    assert ran and ran[0].startswith("pool_")
    assert any("pool job failed" in r.message for r in caplog.records)
    pool.shutdown(wait=True, cancel_futures=True)
