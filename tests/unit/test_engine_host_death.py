"""``EngineHost`` when its engine dies, with engines that die as vLLM's do
(``vllm_duplex.testing.engine``) and a virtual clock: a request running on
the dead engine gets its ``EngineDeadError`` even when the supervisor
notices the death before vLLM told the requests (the restart's shutdown of
the dead engine must not cancel vLLM's fan-out, as it did in a flaky run of
``tests/integration/test_engine_faults.py``), the dead engine is shut down
off the event loop, and the next one serves."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("vllm")
from vllm.v1.engine.exceptions import EngineDeadError  # noqa: E402
from vllm_duplex.stages.vllm.host import FAN_OUT_GRACE_S, EngineHost, EngineSettings  # noqa: E402
from vllm_duplex.testing.clock import VirtualClock  # noqa: E402
from vllm_duplex.testing.engine import DyingEngine  # noqa: E402

POLL_S = 0.25  # the supervisor's default


def host_of(clock: VirtualClock, engines: Iterator[DyingEngine]) -> EngineHost:
    return EngineHost("llm", EngineSettings(), clock=clock, build_engine=lambda _: next(engines))


async def ask(host: EngineHost, request_id: str) -> asyncio.Task[Any]:
    """A request that has produced its first output and goes on running."""
    first = asyncio.Event()

    async def run() -> None:
        stream: AsyncIterator[Any] = host.generate({"prompt": "a long story"}, None, request_id)  # type: ignore[arg-type]
        async for _ in stream:
            first.set()

    task = asyncio.create_task(run(), name=f"test-{request_id}")
    async with asyncio.timeout(5):
        await first.wait()
    return task


async def until_healthy(host: EngineHost, clock: VirtualClock) -> None:
    """Virtual time goes on (the shutdown and the build run in real threads)."""
    async with asyncio.timeout(10):
        while not host.healthy:
            await clock.advance(POLL_S)
            await asyncio.sleep(0.005)


async def test_a_request_on_a_dead_engine_fails_even_when_the_restart_notices_first() -> None:
    clock = VirtualClock()
    first, second = DyingEngine("first"), DyingEngine("second")
    host = host_of(clock, iter([first, second]))
    await host.start()
    try:
        running = await ask(host, "story")
        first.die()  # vLLM's monitor thread: errored, the requests not told yet
        await clock.advance(POLL_S)  # the supervisor polls in that instant
        first.fan_out()  # vLLM's output handler runs: it still can
        with pytest.raises(EngineDeadError):
            async with asyncio.timeout(5):
                await running
        await until_healthy(host, clock)
        assert host.engine is second and host.supervisor.restarts == 1
        loop_thread = threading.get_ident()
        assert first.shutdown_threads and loop_thread not in first.shutdown_threads
        running = await ask(host, "after")  # the next engine serves
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    finally:
        await host.close()


async def test_a_dead_engine_whose_requests_are_never_told_is_still_replaced() -> None:
    """vLLM's fan-out never comes (its loop task cannot run, say): the restart
    waits for it no longer than ``FAN_OUT_GRACE_S``."""
    clock = VirtualClock()
    first, second = DyingEngine("first"), DyingEngine("second")
    host = host_of(clock, iter([first, second]))
    await host.start()
    try:
        running = await ask(host, "story")
        first.die()
        await clock.advance(POLL_S)
        await clock.advance(FAN_OUT_GRACE_S - POLL_S)
        assert not first.shutdown_threads  # still waiting for the fan-out
        await until_healthy(host, clock)
        assert host.engine is second and first.shutdown_threads
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
    finally:
        await host.close()
