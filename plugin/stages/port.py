"""Stage ports: the protocol of one session's port into one shared stage;
``PortBase``, the skeleton every port shares (the vLLM ports' ``LivePort``
included); and ``StageBase`` / ``FencedPort``, the base that every
task-running stage builds on.

Stages never decide staleness (the session's fence gate does); they only
abort work when ``cancel`` tells them the fence moved on: work tracked under
an older fence is cancelled and awaited, so nothing keeps producing for nobody.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, ClassVar, Protocol, runtime_checkable

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    StageFailed,
    StageInput,
    StageOutput,
)
from vllm_duplex.stages.lifecycle import AlwaysReady, Metered, StageCounter

log = logging.getLogger(__name__)

OUTPUT_QUEUE_SIZE = 256  # backpressure: a producer waits when the session lags this far

_CLOSED: Any = object()  # end-of-outputs sentinel


@runtime_checkable
class StagePort(Protocol):
    """One session's port into one stage.

    ``open`` is called once before any submission; ``outputs`` is an async
    iterator that ends after ``close``; ``cancel(fence)`` aborts every piece
    of work whose fence is older than ``fence`` (stale work must stop, not
    merely be ignored, so that no engine keeps generating for nobody).
    """

    name: str

    def accepts(self, payload: Any) -> bool: ...

    async def open(self, fence: Fence) -> None: ...

    async def submit(self, item: StageInput) -> None: ...

    def outputs(self) -> AsyncIterator[StageOutput]: ...

    async def cancel(self, fence: Fence) -> None: ...

    async def close(self) -> None: ...


class Stage(Protocol):
    """A shared stage (one engine for all sessions) that opens per-session ports."""

    name: str

    def port(self, session_id: str) -> StagePort: ...


# ---- shared machinery ------------------------------------------------------


class StageBase(AlwaysReady, Metered):
    """Base of the task-running stages (listening, speech, the scripted fakes):
    one shared object, one ``FencedPort`` per session.

    The counters are shared by all ports of the stage so ``/metrics`` can show
    them per stage. A stage with threads, processes or engines overrides the
    ``Lifecycle`` methods.
    """

    accepted: ClassVar[tuple[type, ...]] = ()

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self.clock = clock
        self.active_requests = 0
        self.aborted_requests = 0
        self.completed_requests = 0
        self.failed_requests = 0

    def port(self, session_id: str) -> StagePort:
        raise NotImplementedError

    def counters(self) -> dict[StageCounter, float]:
        return {StageCounter.ABORTED_REQUESTS: self.aborted_requests,
                StageCounter.ACTIVE_REQUESTS: self.active_requests}


class PortBase:
    """The skeleton every port shares: the accepted payload types, ``open``
    once under the session's fence, the guards every ``submit`` passes, the
    bounded output queue (backpressure: a producer waits when the session
    lags), and ``outputs`` ending after close. Subclasses keep their work."""

    def __init__(self, stage: Any, session_id: str) -> None:
        self.name = stage.name
        self.session_id = session_id
        self._stage = stage
        self._clock = stage.clock
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=OUTPUT_QUEUE_SIZE)
        self._floor: Fence | None = None  # newest fence seen by open/cancel
        self._closed = False

    def accepts(self, payload: Any) -> bool:
        return isinstance(payload, self._stage.accepted)

    async def open(self, fence: Fence) -> None:
        self._check_session(fence, "opened")
        if self._floor is not None:
            raise RuntimeError(f"port {self.name} is already open")
        self._floor = fence

    def _admit(self, item: StageInput) -> bool:
        """The guards of ``submit``: False for work of an already-cancelled
        fence (it would only generate for nobody: refused here rather than
        started and aborted)."""
        if self._closed:
            raise RuntimeError(f"port {self.name} is closed")
        if self._floor is None:
            raise RuntimeError(f"port {self.name} is not open")
        if not self.accepts(item.payload):
            raise TypeError(f"stage {self.name!r} does not accept {type(item.payload).__name__}")
        if item.fence.is_stale_against(self._floor):
            log.debug("stage %s ignores stale submission %s", self.name, item.request_id)
            return False
        return True

    def _check_session(self, fence: Fence, verb: str) -> None:
        if fence.session_id != self.session_id:
            raise ValueError(f"port of session {self.session_id!r} {verb} with {fence}")

    def _raise_floor(self, fence: Fence) -> None:
        if self._floor is None or self._floor.is_stale_against(fence):
            self._floor = fence

    def outputs(self) -> AsyncIterator[StageOutput]:
        return self._outputs()

    async def _outputs(self) -> AsyncIterator[StageOutput]:
        while True:
            out = await self._queue.get()
            if out is _CLOSED:
                self._queue.put_nowait(_CLOSED)  # so any other reader ends too
                return
            yield out

    async def _emit(self, fence: Fence, request_id: str, payload: Any) -> None:
        await self._queue.put(
            StageOutput(fence, request_id, self.name, payload, created_at=self._clock.now())
        )

    def _end_outputs(self) -> None:
        # Make room for the sentinel: outputs nobody read are moot after close.
        while True:
            try:
                self._queue.put_nowait(_CLOSED)
                return
            except asyncio.QueueFull:
                self._queue.get_nowait()


class FencedPort(PortBase):
    """Queue-backed port; work runs as tasks owned by the port, tracked by fence."""

    def __init__(self, stage: StageBase, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._tasks: dict[asyncio.Task[None], Fence] = {}

    async def submit(self, item: StageInput) -> None:
        if self._admit(item):
            await self._handle(item)

    async def _handle(self, item: StageInput) -> None:
        raise NotImplementedError

    async def cancel(self, fence: Fence) -> None:
        """Cancel (and await) every task whose fence is stale against ``fence``;
        when this returns, no aborted task produces anything any more."""
        self._check_session(fence, "cancelled")
        self._raise_floor(fence)
        stale = [t for t, f in self._tasks.items() if f.is_stale_against(fence) and not t.done()]
        for task in stale:
            task.cancel()
        self._stage.aborted_requests += len(stale)
        if stale:
            await asyncio.gather(*stale, return_exceptions=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._end_outputs()

    # ---- helpers for subclasses --------------------------------------------

    def _spawn(
        self, item: StageInput, work: Callable[[], Coroutine[Any, Any, None]]
    ) -> asyncio.Task[None]:
        """Run ``work()`` as a task tracked under ``item.fence``.

        ``work`` is a factory, not a coroutine, so a task cancelled before it
        starts leaves no never-awaited coroutine behind; bookkeeping is in a
        done callback for the same reason (a never-started task runs no
        ``finally``)."""
        task = asyncio.create_task(self._run(item, work), name=f"duplex-{self.name}-{item.request_id}")
        self._tasks[task] = item.fence
        self._stage.active_requests += 1

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.pop(t, None)
            self._stage.active_requests -= 1

        task.add_done_callback(done)
        return task

    async def _run(self, item: StageInput, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("stage %s failed on %s", self.name, item.request_id)
            self._stage.failed_requests += 1
            error = DuplexError("stage_failed", f"stage {self.name!r} failed: {exc!r}")
            await self._emit(item.fence, item.request_id, StageFailed(error))
        else:
            self._stage.completed_requests += 1
