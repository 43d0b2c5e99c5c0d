"""Demo traffic: a steady mix of executions of the demo deployment, so that every state
shows up within seconds (`obelisk-tui --demo`, `obelisk-tui --serve`).

It uses only the console facade, like a person at the keyboard would: submissions, stub
answers (approvals), a pause and unpause now and then, a cancellation now and then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from typing import Any

from engine.client import ApiError
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


class DemoTraffic:
    def __init__(
        self, backend: ConsoleBackend, *, rate: float = 2.0, seed: int | None = None
    ) -> None:
        self.backend = backend
        self.rate = rate
        self.random = random.Random(seed)
        self._task: asyncio.Task[None] | None = None
        self._known: set[str] = set()

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
                await self.backend.submit(ffqn, params(self.random))
                if tick % 3 == 0:
                    await self._steer()
            except ApiError as e:  # the demo goes on; the console shows what happened
                log.info("demo traffic: %s", e.message)
            await asyncio.sleep(1 / self.rate)

    async def _steer(self) -> None:
        """Answer some approvals, pause/unpause or cancel a waiting order now and then."""
        from obelisk_tui.model import ExecutionQuery

        waiting = await self.backend.list_executions(
            ExecutionQuery(ffqn_prefix="myapp:demo/approval.approve", states=("pending_at",)), 0, 20
        )
        for info in waiting:
            age = self.random.random()
            if age < 0.35:
                await self._try(
                    self.backend.stub(info["execution_id"], {"ok": self.random.random() < 0.8})
                )
        orders = await self.backend.list_executions(
            ExecutionQuery(ffqn_prefix="myapp:demo/workflow.order-cancellable"), 0, 20
        )
        for info in orders:
            kind = info["state"]["type"]
            roll = self.random.random()
            if kind == "blocked_by_join_set" and roll < 0.15:
                await self._try(self.backend.pause(info["execution_id"]))
            elif kind == "paused" and roll < 0.4:
                await self._try(self.backend.unpause(info["execution_id"]))
            elif kind == "blocked_by_join_set" and roll > 0.95:
                await self._try(self.backend.cancel(info["execution_id"]))

    @staticmethod
    async def _try(call: Any) -> None:
        try:
            await call
        except ApiError as e:
            log.info("demo traffic: %s", e.message)
