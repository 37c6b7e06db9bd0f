"""The clock protocol and the real monotonic clock.

Timing logic takes a ``Clock`` so tests advance time explicitly with the
virtual one (``vllm_duplex.testing.clock``) instead of sleeping and hoping.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
