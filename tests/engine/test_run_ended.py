"""`RunEnded`: an activity run's end, told from any thread, awaitable by the executor's stop."""

from __future__ import annotations

import threading

from engine.executors.base import RunEnded


def test_a_future_asked_for_before_the_end_is_done_at_the_end() -> None:
    ended = RunEnded()
    waiter = ended.future()
    assert not ended.done() and not waiter.done()
    thread = threading.Thread(target=ended.set_result, args=(None,))
    thread.start()
    assert waiter.result(timeout=10) is None
    thread.join()
    assert ended.done()


def test_a_future_asked_for_after_the_end_is_done_at_once() -> None:
    ended = RunEnded()
    ended.set_result(None)
    ended.set_result(None)  # (a second end changes nothing)
    assert ended.done()
    assert ended.future().done()
    assert ended.future() is ended.future()
