"""The monkey: thousands of random keys on a live console, seeded and replayable.

An embedded engine runs the test deployment while a background task submits a mix of
executions (steps, fan-outs, spins, orders waiting for approval); the console gets random
keys drawn from every key any of its screens, widgets or the app binds, bursts of
`enter` / `esc` at 0–300 ms intervals, and terminal resizes between 60×20 and 200×50.
Afterwards: no exception was survived (`app.screen_errors == []`), the app and the engine
still run, and every execution finishes once what legitimately waits on the operator is
answered (paused ones unpaused, stubs and approvals stubbed).

`OBELISK_MONKEY_KEYS` sets the number of keys (default 2,000: ~45 s here, a fresh seed
every run, so CI runs add up; `OBELISK_MONKEY_KEYS=20000` for a long session),
`OBELISK_MONKEY_SEED` replays a run (the seed is printed when it fails).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import pkgutil
import random
import time
import unicodedata

from textual import events
from textual.app import App
from textual.binding import Binding
from textual.keys import _get_unicode_name_from_key
from textual.pilot import Pilot

import obelisk_tui.screens
import obelisk_tui.widgets
from engine.core.events import accepts_stub
from engine.engine import Engine
from obelisk_tui import model
from obelisk_tui.app import ObeliskApp
from obelisk_tui.list_query import ExecutionQuery
from tests.console.conftest import APPROVE, FANOUT, ORDER, SPIN, STEP, open_console, until

KEYS = int(os.environ.get("OBELISK_MONKEY_KEYS", "2000"))
SEED = int(os.environ.get("OBELISK_MONKEY_SEED", str(random.SystemRandom().randrange(2**32))))

#: Keys the monkey never presses: `q` / `ctrl+q` quit; the palette (`ctrl+p`) offers
#: Textual's system commands, among them "Quit" and "Save screenshot" (a file written
#: to the working directory) that random `enter`s would pick.
FORBIDDEN = frozenset({"q", "ctrl+q", "ctrl+p"})


def _binding_keys(bindings: object) -> set[str]:
    keys: set[str] = set()
    for b in bindings if isinstance(bindings, list) else []:
        spec = b.key if isinstance(b, Binding) else b[0]
        keys.update(k.strip() for k in spec.split(","))
    return keys


def bound_keys() -> list[str]:
    """Every key bound by the app or by any screen or widget class of the console."""
    classes: list[type] = [ObeliskApp, App]
    for package in (obelisk_tui.screens, obelisk_tui.widgets):
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            classes += [
                c
                for _, c in inspect.getmembers(module, inspect.isclass)
                if c.__module__ == module.__name__
            ]
    keys: set[str] = set()
    for cls in classes:
        for klass in cls.__mro__:
            keys |= _binding_keys(klass.__dict__.get("BINDINGS"))
    return sorted(keys - FORBIDDEN)


async def _traffic(engine: Engine, rng: random.Random, submitted: list[str]) -> None:
    """A steady mix of executions, as the demo's traffic makes them."""
    n = 0
    while True:
        n += 1
        kind = rng.random()
        if kind < 0.45:
            eid = await engine.submit(STEP, [rng.randrange(100)])
        elif kind < 0.7:
            eid = await engine.submit(FANOUT, [rng.randrange(1, 6)])
        elif kind < 0.8:
            eid = await engine.submit(SPIN, [rng.randrange(10, 200)])
        else:
            eid = await engine.submit(ORDER, [f"o-{n}"])
        submitted.append(eid)
        await asyncio.sleep(rng.uniform(0.05, 0.4))


async def _press(app: ObeliskApp, pilot: Pilot[None], key: str) -> None:
    """A key as `Pilot.press` sends it, without its waits for the whole process to go
    idle (with an engine at work in the same process, ~0.2 s a key): the next key comes
    once the screen has handled this one, as from a fast typist."""
    char: str | None
    try:
        char = unicodedata.lookup(_get_unicode_name_from_key(key))
    except KeyError:
        char = key if len(key) == 1 else None
    event = events.Key(key, char)
    event.set_sender(app)
    assert app._driver is not None
    app._driver.send_message(event)
    await pilot._wait_for_screen()


async def _monkey(app: ObeliskApp, pilot: Pilot[None], rng: random.Random, keys: list[str]) -> int:
    pressed = 0
    while pressed < KEYS and app.is_running:
        roll = rng.random()
        if roll < 0.004:
            await pilot.resize_terminal(rng.randint(60, 200), rng.randint(20, 50))
        elif roll < 0.008:
            for _ in range(rng.randint(2, 8)):
                await _press(app, pilot, rng.choice(("enter", "escape")))
                pressed += 1
                await asyncio.sleep(rng.uniform(0.0, 0.3))
        else:
            await _press(app, pilot, rng.choice(keys))
            pressed += 1
    return pressed


async def _settle(app: ObeliskApp, engine: Engine, pilot: Pilot[None]) -> None:
    """Answer what waits on the operator (paused, stubs, approvals) until all finished."""
    backend = app.backend

    async def all_finished() -> bool:
        unfinished = await backend.list_executions(
            ExecutionQuery(states=tuple(s for s in model.STATE_TITLES if s != "finished")), 0, 1000
        )
        for info in unfinished:
            eid = info["execution_id"]
            if "paused" in model.overlays(info["state"]):
                await engine.unpause(eid)
            elif accepts_stub(info["component_type"]) and "cancelling" not in model.overlays(
                info["state"]
            ):
                ok: object = True if info["ffqn"] == APPROVE else None
                try:
                    await engine.stub(eid, {"ok": ok})
                except Exception:
                    await engine.cancel(eid)
        return not unfinished

    await until(pilot, all_finished, timeout=90, what="every execution finished")


async def test_monkey(console_engine: Engine) -> None:
    engine = console_engine
    rng = random.Random(SEED)
    keys = bound_keys()
    submitted: list[str] = []
    started = time.monotonic()
    try:
        async with open_console(engine, size=(80, 24)) as (app, pilot):
            traffic = asyncio.create_task(_traffic(engine, random.Random(SEED + 1), submitted))
            try:
                pressed = await _monkey(app, pilot, rng, keys)
            finally:
                traffic.cancel()
            print(f"\nmonkey: keys done at {time.monotonic() - started:.1f}s")
            assert app.is_running, f"the console quit after {pressed} keys"
            assert app.screen_errors == [], app.screen_errors
            assert pressed >= KEYS
            # The engine runs: a new execution finishes.
            eid = await engine.submit(STEP, [7])
            assert (await engine.result(eid, timeout=30)) is not None
            await _settle(app, engine, pilot)
            print(f"monkey: settled at {time.monotonic() - started:.1f}s")
            for eid in submitted:
                assert await engine.result(eid, timeout=30) is not None
    except BaseException:
        print(f"\nmonkey: replay with OBELISK_MONKEY_SEED={SEED} OBELISK_MONKEY_KEYS={KEYS}")
        raise
    print(f"\nmonkey: {KEYS} keys, seed {SEED}, {time.monotonic() - started:.0f}s")
