"""Demo traffic: a steady mix of executions of the demo deployment, so that every state
shows up within seconds (`obelisk-tui --demo`, `obelisk-tui --serve`).

It uses only the console facade, like a person at the keyboard would: submissions, stub
answers (approvals), a pause and unpause now and then, a cancellation now and then.

It steers only what it submitted itself: an order or an approval the person at the
console submits is theirs to answer, pause or cancel. And every `CANCEL_EVERY` steering
rounds it cancels one of its long steps while it runs, so that `cancelling` (the run is
interrupted while it sleeps in a host call) shows up within the first minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

from engine.client import ApiError
from engine.views import ExecutionInfo
from obelisk_tui.backend import ConsoleBackend

log = logging.getLogger("obelisk.demo")

#: (weight, ffqn, params factory)
MIX: list[tuple[int, str, Any]] = [
    (6, "myapp:demo/activity.step", lambda r: [r.randint(0, 99), r.choice([0, 200, 1500, 3000])]),
    (3, "myapp:demo/greeter.greet", lambda r: [r.choice(["Ann", "Bob", "Cleo", "Dan"])]),
    (3, "myapp:demo/greeter.flaky", lambda r: [r.choice([30, 60, 90])]),
    (2, "myapp:demo/wat.add", lambda r: [r.randint(0, 1000), r.randint(0, 1000)]),
    (2, "myapp:demo/workflow.serial", lambda r: []),
    (2, "myapp:demo/workflow.parallel", lambda r: []),
    (2, "myapp:demo/workflow.fanout", lambda r: [r.randint(5, 15)]),
    (1, "myapp:demo/workflow.sleepy", lambda r: [2, r.choice([2, 5, 10])]),
    (1, "myapp:demo/workflow.welcome", lambda r: [r.choice(["ann@example.com", "not-an-address"])]),
    (2, "myapp:demo/workflow.order-cancellable", lambda r: [f"order-{r.randint(100, 999)}"]),
    (1, "myapp:demo/workflow.batch", lambda r: [r.randint(2, 3)]),
    (1, "myapp:demo-py/workflow.parallel", lambda r: []),
]


#: Every this many steering rounds (one every 3 submissions), a long step is cancelled.
CANCEL_EVERY = 6


def root_id(execution_id: str) -> str:
    """The top-level execution an execution belongs to (`E_…` of `E_….o:1-approve_1`)."""
    return execution_id.split(".", 1)[0]


class DemoTraffic:
    def __init__(
        self, backend: ConsoleBackend, *, rate: float = 2.0, seed: int | None = None
    ) -> None:
        self.backend = backend
        self.rate = rate
        self.random = random.Random(seed)
        self._task: asyncio.Task[None] | None = None
        #: The top-level executions this generator submitted: the only ones it steers.
        self.submitted: set[str] = set()
        self._rounds = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="demo-traffic")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        known = {
            f["ffqn"] for c in (await self.backend.deployment())["components"] for f in c["exports"]
        }
        mix = [m for m in MIX if m[1] in known]
        weights = [w for w, _, _ in mix]
        tick = 0
        while True:
            tick += 1
            try:
                _, ffqn, params = self.random.choices(mix, weights)[0]
                self.submitted.add(await self.backend.submit(ffqn, params(self.random)))
                if tick % 3 == 0:
                    await self._steer()
            except ApiError as e:  # the demo goes on; the console shows what happened
                log.info("demo traffic: %s", e.message)
            await asyncio.sleep(1 / self.rate)

    async def _steer(self) -> None:
        """Answer some approvals, pause/unpause or cancel a waiting order now and then."""
        from obelisk_tui.list_query import ExecutionQuery

        self._rounds += 1
        if self._rounds % CANCEL_EVERY == 0:
            await self._cancel_a_long_step()
        waiting = await self.backend.list_executions(
            ExecutionQuery(ffqn_prefix="myapp:demo/approval.approve", states=("pending_at",)), 0, 20
        )
        for info in self._own(waiting):
            age = self.random.random()
            if age < 0.35:
                await self._try(
                    self.backend.stub(info["execution_id"], {"ok": self.random.random() < 0.8})
                )
        orders = await self.backend.list_executions(
            ExecutionQuery(ffqn_prefix="myapp:demo/workflow.order-cancellable"), 0, 20
        )
        for info in self._own(orders):
            kind = info["state"]["type"]
            roll = self.random.random()
            if kind == "blocked_by_join_set" and roll < 0.15:
                await self._try(self.backend.pause(info["execution_id"]))
            elif kind == "paused" and roll < 0.4:
                await self._try(self.backend.unpause(info["execution_id"]))
            elif kind == "blocked_by_join_set" and roll > 0.95:
                await self._try(self.backend.cancel(info["execution_id"]))

    def _own(self, infos: list[ExecutionInfo]) -> list[ExecutionInfo]:
        return [i for i in infos if root_id(i["execution_id"]) in self.submitted]

    async def _cancel_a_long_step(self) -> None:
        """Cancel a running step of this generator's that sleeps long enough for the
        interruption to be seen (`cancelling`, then finished `cancelled`)."""
        from obelisk_tui.list_query import ExecutionQuery

        running = await self.backend.list_executions(
            ExecutionQuery(ffqn_prefix="myapp:demo/activity.step", states=("locked",)), 0, 20
        )
        for info in self._own(running):
            if info["execution_id"] == root_id(info["execution_id"]):  # not a child
                await self._try(self.backend.cancel(info["execution_id"]))
                return

    @staticmethod
    async def _try(call: Any) -> None:
        try:
            await call
        except ApiError as e:
            log.info("demo traffic: %s", e.message)
