"""The engine supervisor's loop with fakes and a virtual clock (no vLLM): it
notices death by polling, restarts, backs off between failed restarts, and
``close`` cancels it cleanly, a rebuild in progress included. The real
kill-and-restart is ``tests/integration/test_engine_faults.py``."""

from __future__ import annotations

import asyncio
import threading

import pytest
from vllm_duplex.stages.vllm.supervisor import EngineSupervisor, build_in_thread
from vllm_duplex.testing.clock import VirtualClock


class FakeEngine:
    def __init__(self, clock: VirtualClock, failures: int = 0) -> None:
        self.clock = clock
        self.dead = False
        self.failures = failures  # restarts that fail before one succeeds
        self.attempts: list[float] = []  # virtual times of the restart attempts
        self.gate: asyncio.Event | None = None  # set: restarts wait for it

    async def restart(self) -> None:
        self.attempts.append(self.clock.now())
        if self.gate is not None:
            await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise RuntimeError("no engine today")
        self.dead = False


def supervisor(engine: FakeEngine, clock: VirtualClock, **kw) -> EngineSupervisor:
    return EngineSupervisor("test", is_dead=lambda: engine.dead, restart=engine.restart,
                            clock=clock, poll_s=0.5, **kw)


async def test_death_is_noticed_within_one_poll_and_restarted() -> None:
    clock = VirtualClock()
    engine = FakeEngine(clock)
    sup = supervisor(engine, clock)
    sup.start()
    try:
        await clock.advance(10)
        assert engine.attempts == [] and sup.restarts == 0
        engine.dead = True
        await clock.advance(0.5)
        assert engine.attempts == [10.5] and not engine.dead
        assert sup.restarts == 1 and not sup.restarting
        engine.dead = True  # it dies again later: restarted again
        await clock.advance(0.5)
        assert engine.attempts == [10.5, 11.0] and sup.restarts == 2
    finally:
        await sup.close()


async def test_failed_restarts_are_retried_with_a_doubling_backoff() -> None:
    clock = VirtualClock()
    engine = FakeEngine(clock, failures=3)
    sup = supervisor(engine, clock, backoff_s=1.0, max_backoff_s=3.0)
    sup.start()
    try:
        engine.dead = True
        await clock.advance(0.5)
        assert sup.restarting and engine.attempts == [0.5]
        await clock.advance(20)
        assert engine.attempts == [0.5, 1.5, 3.5, 6.5]  # +1, +2, +3 (capped)
        assert (sup.restarts, sup.failed_restarts) == (1, 3) and not sup.restarting
    finally:
        await sup.close()


async def test_close_cancels_a_restart_in_progress() -> None:
    clock = VirtualClock()
    engine = FakeEngine(clock)
    engine.gate = asyncio.Event()
    sup = supervisor(engine, clock)
    sup.start()
    engine.dead = True
    await clock.advance(0.5)
    assert sup.restarting and engine.attempts == [0.5]
    await sup.close()  # the conftest fixture fails the test if a task is left
    assert sup.restarts == 0 and not sup.restarting
    await sup.close()  # idempotent


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        EngineSupervisor("x", is_dead=lambda: False, restart=None, clock=VirtualClock(),  # type: ignore[arg-type]
                         poll_s=0)


class Builds:
    """A build and a dispose that each wait for the test (vLLM's take
    seconds: the build loads a model, the dispose joins processes)."""

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()
        self.dispose_release = threading.Event()
        self.disposed: list[tuple[str, int]] = []  # (what, on which thread)

    def build(self) -> str:
        self.started.set()
        self.release.wait(10)
        return "engine"

    def dispose(self, made: str) -> None:
        self.dispose_release.wait(10)
        self.disposed.append((made, threading.get_ident()))

    async def building(self) -> asyncio.Task[str]:
        task = asyncio.create_task(build_in_thread(self.build, self.dispose))
        async with asyncio.timeout(10):
            while not self.started.is_set():  # the thread is building
                await asyncio.sleep(0.001)
        return task


async def test_a_build_cancelled_midway_is_disposed_of_off_the_loop() -> None:
    builds = Builds()
    task = await builds.building()
    task.cancel()
    builds.release.set()  # the build ends; its dispose now waits (a join)
    ticks = 0
    while ticks < 20:  # the loop runs meanwhile
        await asyncio.sleep(0.005)
        ticks += 1
    assert not task.done()  # the cancelled caller waits for the disposal
    builds.dispose_release.set()
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(10):
            await task
    assert [made for made, _ in builds.disposed] == ["engine"]  # what the thread built did not leak
    assert builds.disposed[0][1] != threading.get_ident()  # disposed of off the loop


async def test_a_caller_that_stops_waiting_still_has_the_build_disposed_of() -> None:
    builds = Builds()
    task = await builds.building()
    task.cancel()
    await asyncio.sleep(0)
    task.cancel()  # cancelled again: it stops waiting
    with pytest.raises(asyncio.CancelledError):
        await task
    builds.release.set()
    builds.dispose_release.set()
    async with asyncio.timeout(10):
        while not builds.disposed:
            await asyncio.sleep(0.005)
    assert builds.disposed[0][0] == "engine" and builds.disposed[0][1] != threading.get_ident()


async def test_a_build_that_ends_is_returned() -> None:
    assert await build_in_thread(lambda: 42, lambda _: pytest.fail("disposed")) == 42
