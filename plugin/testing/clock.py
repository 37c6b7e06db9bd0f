"""A virtual clock for timing tests: time moves only when a test says so."""

from __future__ import annotations

import asyncio
import heapq
import itertools


class VirtualClock:
    """Time moves only when ``advance`` is called; sleepers wake in order."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._counter), fut))
        await fut

    async def advance(self, seconds: float) -> None:
        """Move time forward, waking every sleeper that is due, in order, and
        letting each run until it blocks again."""
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            when, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, when)
            if not fut.done():
                fut.set_result(None)
            for _ in range(5):  # let the woken task run to its next await
                await asyncio.sleep(0)
        self._now = target
        for _ in range(5):
            await asyncio.sleep(0)
