"""Shared shape of the listening stages (VAD, ASR, vision): model work on
worker threads, one serial worker per session so chunks stay in order.

A ``ListeningStage`` owns a thread pool (its ``Lifecycle``: ``close`` stops
the threads); each ``ListeningPort`` queues its inputs and runs
``_work(payload)`` (synchronous, on a worker thread) for one item at a time.
The threads only carry the work: how much model work runs at once, and whose
first, is the process's CPU scheduler's (``stages/scheduler.py``), which the
work asks for a slot. A thread may wait there, so the pool is sized for
every session at once (threads start only when needed), and one session's
waiting partial never holds up another's final. Its outputs describe what the user said, so ``cancel``
aborts nothing (``ObservationPort``, the vision stage's port too): they are
``InputObservation``s that the fence gate never drops, and skipping queued
audio would break recurrent state and the timeline.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import StageFailed, StageInput
from vllm_duplex.stages.port import FencedPort, StageBase
from vllm_duplex.stages.scheduler import CARRIERS, cpu_scheduler

log = logging.getLogger(__name__)

T = TypeVar("T")
INBOX_SIZE = 64  # chunks queued per session before submit() waits (backpressure)


class ListeningStage(StageBase):
    def __init__(self, name: str, clock: Clock, *, workers: int | None = None) -> None:
        super().__init__(name, clock)
        self.scheduler = cpu_scheduler()
        self._executor = ThreadPoolExecutor(max_workers=workers or CARRIERS,
                                            thread_name_prefix=f"duplex-{name}")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def run_later(self, fn: Callable[[], object]) -> None:
        """Fire and forget on the workers; dropped if the stage is closed."""
        try:
            self._executor.submit(fn)
        except RuntimeError:
            pass

    def shutdown_workers(self) -> None:
        """Stop the worker threads (idempotent; ports must be closed first).
        Synchronous, for owners outside an event loop."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def close(self) -> None:
        self.shutdown_workers()


class ObservationPort(FencedPort):
    """A port whose outputs are ``InputObservation``s (VAD, ASR, scenes):
    ``cancel`` aborts nothing (see the module docstring)."""

    async def cancel(self, fence: Fence) -> None:
        """Nothing to abort: only the session is checked."""
        self._check_session(fence, "cancelled")

    async def _failed(self, item: StageInput, exc: Exception) -> None:
        """One chunk the model failed on: a typed ``StageFailed``; listening
        goes on (one bad chunk must not stop it)."""
        log.exception("stage %s failed on %s", self.name, item.request_id)
        self._stage.failed_requests += 1
        error = DuplexError("stage_failed", f"stage {self.name!r} failed: {exc!r}")
        await self._emit(item.fence, item.request_id, StageFailed(error))


class ListeningPort(ObservationPort):
    _stage: ListeningStage

    def __init__(self, stage: ListeningStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._inbox: asyncio.Queue[StageInput] = asyncio.Queue(maxsize=INBOX_SIZE)
        self._worker: asyncio.Task[None] | None = None

    def _work(self, payload: Any) -> list[Any]:
        """One input -> its outputs; runs on a worker thread."""
        raise NotImplementedError

    def _completed(self, payload: Any, outputs: list[Any]) -> int:
        """How many requests ``payload`` completed (for the stage's counters)."""
        return 1

    async def _handle(self, item: StageInput) -> None:
        if self._worker is None:
            self._worker = self._spawn(item, self._drain)
        await self._inbox.put(item)

    async def _drain(self) -> None:
        """The session's one worker: items in submission order, model work in a thread."""
        while True:
            item = await self._inbox.get()
            try:
                await self._process(item)
            finally:
                self._inbox.task_done()

    async def _process(self, item: StageInput) -> None:
        try:
            outputs = await self._stage.run(self._work, item.payload)
        except Exception as exc:
            await self._failed(item, exc)
            return
        self._stage.completed_requests += self._completed(item.payload, outputs)
        for out in outputs:
            await self._emit(item.fence, item.request_id, out)

    async def drained(self) -> None:
        """Wait until everything submitted so far has been processed and its
        outputs queued (for tests and benchmarks; not part of ``StagePort``)."""
        await self._inbox.join()
