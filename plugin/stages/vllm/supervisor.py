"""Restarting a dead vLLM engine that a stage built itself.

vLLM's engine client reports death in two ways: ``errored`` (its monitor
thread sets it the moment the EngineCore process exits) and
``EngineDeadError`` in the requests that were running, moments later. Those
requests fail on their own (each session gets its terminal error from vLLM,
not from here; the restart must not stop that: ``EngineHost._retire``); what
is left is to bring the engine back for the work that comes after. There is
no awaitable "died" signal in vLLM's public API, so the supervisor reads
``errored`` every ``poll_s`` (one attribute read), then calls ``restart``
until it succeeds, with a growing backoff between failed attempts. All
waiting goes through the injected ``Clock``.

No vLLM import here: the loop is tested with fakes and a ``VirtualClock``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from vllm_duplex.domain.clock import Clock

log = logging.getLogger(__name__)

T = TypeVar("T")


class EngineSupervisor:
    """Watches one engine through ``is_dead`` and runs ``restart`` when it
    dies. ``start`` launches the watch task; ``close`` cancels it (a restart
    in progress included) and waits for it."""

    def __init__(self, name: str, *, is_dead: Callable[[], bool],
                 restart: Callable[[], Awaitable[None]], clock: Clock, poll_s: float = 0.25,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0) -> None:
        if poll_s <= 0 or backoff_s < 0 or max_backoff_s < backoff_s:
            raise ValueError("need poll_s > 0 and 0 <= backoff_s <= max_backoff_s")
        self.name = name
        self.poll_s = poll_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._is_dead = is_dead
        self._restart = restart
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        self.restarting = False
        self.restarts = 0  # engines brought back
        self.failed_restarts = 0  # attempts that failed (each is retried after a backoff)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._watch(), name=f"duplex-{self.name}-supervisor")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            while not self._is_dead():
                await self._clock.sleep(self.poll_s)
            await self._recover()

    async def _recover(self) -> None:
        delay = self.backoff_s
        self.restarting = True
        try:
            while True:
                try:
                    await self._restart()
                except Exception:  # (a cancel from close() passes through)
                    self.failed_restarts += 1
                    log.exception("%s: engine restart failed; next try in %.1f s", self.name, delay)
                    await self._clock.sleep(delay)
                    delay = min(max(delay, 0.1) * 2, self.max_backoff_s)
                else:
                    self.restarts += 1
                    return
        finally:
            self.restarting = False


async def build_in_thread(build: Callable[[], T], dispose: Callable[[T], Any]) -> T:
    """``build()`` in a worker thread. A thread cannot be interrupted: when
    the caller is cancelled meanwhile, what the build makes is ``dispose``d
    once it is made (an engine process must not outlive its owner), in a
    worker thread too (vLLM's shutdown joins the engine's processes: the
    loop must not wait on that). The cancelled caller waits for the
    disposal; cancelled again, it stops waiting and the disposal goes on."""
    loop = asyncio.get_running_loop()
    built = loop.run_in_executor(None, build)
    try:
        return await asyncio.shield(built)
    except asyncio.CancelledError:
        disposed = _dispose_when_built(built, dispose)
        with contextlib.suppress(BaseException):
            await asyncio.shield(disposed)
        raise


def _dispose_when_built(built: asyncio.Future[T], dispose: Callable[[T], Any]) -> asyncio.Future[None]:
    """A future that resolves once what ``built`` made (if it made anything)
    was disposed of in a worker thread. Callbacks and executor jobs only, no
    task: nothing is left on the loop when nobody waits for it."""
    loop = asyncio.get_running_loop()
    disposed: asyncio.Future[None] = loop.create_future()

    def resolve(_: object) -> None:
        if not disposed.done():
            disposed.set_result(None)

    def dispose_logged(made: T) -> None:
        try:
            dispose(made)
        except Exception:  # nobody may be waiting to hear it
            log.exception("disposing of %r failed", made)

    def on_built(f: asyncio.Future[T]) -> None:
        if f.cancelled() or f.exception() is not None:
            resolve(f)
        else:
            loop.run_in_executor(None, dispose_logged, f.result()).add_done_callback(resolve)

    built.add_done_callback(on_built)
    return disposed
