"""``StageFeed``: a session's submissions, forwards and cancels, carried out
by one task of their own so that the session never waits on a stage.

Why: a port's ``submit`` may wait -- on its input queue, or on its *output*
queue when it produces inline (the energy VAD does) -- and that queue is
emptied by the port's pump, which hands outputs to the session's mailbox.
If the session awaited ``submit`` while the mailbox's STAGE lane was full,
the three would wait on each other for ever. So the runner only *enqueues*
here (no await), and this task awaits the pipeline, in exactly the order the
session core made the effects: a cancel reaches a stage after the
submissions made before it, as when the session awaited each in turn.

Backpressure instead of an unbounded backlog: above ``HIGH_WATER`` pending
operations the feed asks the session to pause reading client data (its
DATA lane), and below ``LOW_WATER`` to resume -- python-websockets'
watermarks. Control commands and stage outputs keep flowing meanwhile; that
is what lets a stage that waits on its own outputs make progress.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import StageOutput
from vllm_duplex.stages.pipeline import Pipeline

log = logging.getLogger(__name__)

HIGH_WATER = 64  # pending operations above which client data waits
LOW_WATER = 16  # ... and below which it flows again

_Op = tuple[Callable[..., Awaitable[Any]], tuple[Any, ...]]


class StageFeed:
    def __init__(
        self,
        pipeline: Pipeline,
        *,
        pause: Callable[[], None],
        resume: Callable[[], None],
        failed: Callable[[Exception], None],
        name: str = "duplex-feed",
    ) -> None:
        self._pipeline = pipeline
        self._pause = pause
        self._resume = resume
        self._failed = failed  # an operation raised: the session reports it
        self._name = name
        self._ops: deque[_Op] = deque()
        self._wake: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.paused = False
        self.peak = 0  # the most operations ever pending

    @property
    def pending(self) -> int:
        return len(self._ops)

    def start(self) -> None:
        self._task = asyncio.create_task(self._drain(), name=self._name)

    # ---- what the runner enqueues (never blocks) -----------------------------

    def submit(self, stage: str, fence: Fence, role: str, payload: Any) -> None:
        self._pipeline.port(stage)  # an unknown stage fails here, in the plan's batch
        self._push(self._pipeline.submit, (stage, fence, role, payload))

    def forward(self, output: StageOutput, to: str) -> None:
        self._push(self._pipeline.forward, (output, to))

    def cancel(self, fence: Fence) -> None:
        self._push(self._pipeline.cancel, (fence,))

    def _push(self, fn: Callable[..., Awaitable[Any]], args: tuple[Any, ...]) -> None:
        ops = self._ops
        ops.append((fn, args))
        n = len(ops)
        if n > self.peak:
            self.peak = n
        if n > HIGH_WATER and not self.paused:
            self.paused = True
            self._pause()
        wake = self._wake
        if wake is not None:
            self._wake = None
            if not wake.done():
                wake.set_result(None)

    # ---- the task -------------------------------------------------------------

    async def _drain(self) -> None:
        ops = self._ops
        loop = asyncio.get_running_loop()
        while True:
            while not ops:
                self._wake = loop.create_future()
                await self._wake
            fn, args = ops.popleft()
            try:
                await fn(*args)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # one bad submission must not stop the feed
                log.exception("stage operation %s failed", getattr(fn, "__name__", fn))
                self._failed(exc)
            if self.paused and len(ops) <= LOW_WATER:
                self.paused = False
                self._resume()

    async def close(self) -> None:
        """Drop what is pending and stop (the pipeline is closed next)."""
        self._ops.clear()
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
