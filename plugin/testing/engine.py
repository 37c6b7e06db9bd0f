"""A fake vLLM engine client that dies as vLLM's ``AsyncLLM`` does (vLLM
0.32), for tests of what the engine's owner does about a death.

When the EngineCore process exits, vLLM learns it in two places, not at once:

1. its monitor thread sets ``engine_dead`` (``errored`` turns True) and
   shuts the core client down;
2. later, on the event loop, the output handler task reads the dead output
   socket and fails every running request with ``EngineDeadError``
   (``OutputProcessor.propagate_error``); then it ends (``is_running``
   turns False).

``AsyncLLM.shutdown`` cancels that output handler. Called between 1 and 2,
it cancels the handler before it failed anyone: every running request then
waits forever for an output or an error that never comes.

``die()`` is step 1 and ``fan_out()`` step 2; ``shutdown()`` records the
thread it ran on and, before ``fan_out``, strands the running requests as
vLLM does. A request that is not a warm-up yields one output, then runs
until the engine's death reaches it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from vllm.v1.engine.exceptions import EngineDeadError


@dataclass(frozen=True)
class FakeOutput:
    request_id: str
    token_ids: tuple[int, ...]


class DyingEngine:
    """See the module doc. ``name`` tells engines apart in a test."""

    def __init__(self, name: str = "engine") -> None:
        self.name = name
        self.dead = False  # step 1: the monitor thread saw the process exit
        self.fanned_out = False  # step 2: the output handler failed every request
        self.handler_cancelled = False  # shutdown() came before step 2
        self.shutdown_threads: list[int] = []  # the thread of each shutdown() call
        self.aborted: list[str] = []
        self._running: dict[str, asyncio.Future[None]] = {}

    # ---- what vLLM's EngineClient reports --------------------------------

    @property
    def is_running(self) -> bool:
        return not (self.fanned_out or self.handler_cancelled)

    @property
    def errored(self) -> bool:
        return self.dead or not self.is_running

    @property
    def running(self) -> list[str]:
        """Requests that have not ended (output, error or abort)."""
        return list(self._running)

    def get_tokenizer(self) -> Any:
        return None

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[FakeOutput]:
        if self.errored:
            raise EngineDeadError()
        if request_id.startswith("duplex-warmup"):
            yield FakeOutput(request_id, (1,))
            return
        ends: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running[request_id] = ends
        try:
            yield FakeOutput(request_id, (1,))
            await ends  # the model goes on generating; only the engine's death ends it here
        finally:
            self._running.pop(request_id, None)

    async def abort(self, request_ids: Any) -> None:
        self.aborted += [request_ids] if isinstance(request_ids, str) else list(request_ids)

    def shutdown(self, timeout: float | None = None) -> None:
        self.shutdown_threads.append(threading.get_ident())
        self.dead = True
        if not self.fanned_out:
            self.handler_cancelled = True  # the running requests are stranded

    # ---- what a test does -------------------------------------------------

    def die(self) -> None:
        """The EngineCore process exited; vLLM's monitor thread noticed."""
        self.dead = True

    def fan_out(self) -> None:
        """vLLM's output handler fails every running request (unless
        ``shutdown`` cancelled it first). Call on the event loop."""
        if self.handler_cancelled:
            return
        self.fanned_out = True
        for ends in self._running.values():
            if not ends.done():
                ends.set_exception(EngineDeadError())
