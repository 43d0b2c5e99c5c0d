"""Response inboxes and the commit confirmations of responses posted before their COMMIT
(`engine.storage.notify`), with real threads."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from engine.core import events as ev
from engine.storage.notify import Commits, Notifier

AT = datetime(2026, 1, 15, tzinfo=UTC)


def response(cursor: int) -> ev.StoredResponse:
    return ev.StoredResponse(cursor, AT, ev.DelayFinished(f"Delay_x{cursor}", "g:1", "ok"))


def test_a_response_posted_before_its_commit_is_confirmed_once_it_commits() -> None:
    notifier = Notifier()
    inbox = notifier.open_inbox("E_1")
    seq = notifier.commits.begin()
    notifier.post_responses("E_1", [response(1)], seq)
    assert inbox.take(0) == ([response(1)], False)
    done: list[bool] = []
    waiter = threading.Thread(target=lambda: done.append(inbox.wait_committed()))
    waiter.start()
    time.sleep(0.05)
    assert done == []  # still being committed: the run may not write yet
    notifier.commits.settle(seq, True)
    waiter.join(5)
    assert done == [True]
    assert inbox.wait_committed()  # and nothing is pending any more


def test_a_response_whose_commit_failed_is_never_confirmed() -> None:
    notifier = Notifier()
    inbox = notifier.open_inbox("E_1")
    committed, failed = notifier.commits.begin(), notifier.commits.begin()
    notifier.post_responses("E_1", [response(1)], committed)
    notifier.commits.settle(committed, True)
    notifier.post_responses("E_1", [response(2)], failed)
    notifier.commits.settle(failed, False)
    assert inbox.take(0)[0] == [response(1), response(2)]
    assert not inbox.wait_committed()
    assert not inbox.wait_committed()  # for good: the run must stop


def test_a_failed_commit_counts_even_when_a_later_one_succeeded() -> None:
    """A run given responses of two transactions, the earlier of which failed, must not
    go on (nor may its writes: `uncommitted` is the range the storage checks)."""
    notifier = Notifier()
    inbox = notifier.open_inbox("E_1")
    failed, committed = notifier.commits.begin(), notifier.commits.begin()
    notifier.post_responses("E_1", [response(1)], failed)
    notifier.post_responses("E_1", [response(2)], committed)
    notifier.commits.settle(failed, False)
    notifier.commits.settle(committed, True)
    assert inbox.take(0)[0] == [response(1), response(2)]
    assert inbox.uncommitted == (failed, committed)
    assert notifier.commits.failed_between(*inbox.uncommitted)
    assert not inbox.wait_committed()


def test_committed_responses_need_no_confirmation() -> None:
    notifier = Notifier()
    inbox = notifier.open_inbox("E_1")
    notifier.commits.begin()  # someone else's, never settled
    notifier.post_responses("E_1", [response(1)])
    assert inbox.take(0)[0] == [response(1)]
    assert inbox.wait_committed()


def test_closed_commits_fail_what_was_not_settled() -> None:
    commits = Commits()
    a, b = commits.begin(), commits.begin()
    commits.settle(a, True)
    commits.close()  # the writer stopped before b's COMMIT returned
    assert commits.wait(a)
    assert not commits.wait(b)
