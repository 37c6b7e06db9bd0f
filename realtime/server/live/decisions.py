"""Evaluates a GPT-Live socket's Decisions (``DecisionRun``s from the codec:
``realtime/wire/live/decisions.py``) on a ``Chooser`` and sends each
``decision.event``, or the typed ``error`` of a run that failed.

One worker per socket takes the runs in order, one at a time: a decision's
questions are evaluated in order, on the same engine the voice speaks with,
so running them side by side would only slow the voice. The queue is
bounded: a ``decision.create`` that finds it full is refused
(``resource_exhausted``); a trigger firing that does is skipped (the next
turn fires again). A run that takes longer than ``timeout_s`` is stopped
(its engine request aborted) and answered ``deadline_exceeded``; a backend
failure is its typed error. Either way the conversation goes on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from vllm_duplex.domain.decisions import Chooser
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.decisions import DecisionRun

log = logging.getLogger(__name__)

DECISION_TIMEOUT_S = 30.0  # a whole decision, every question of it
MAX_QUEUED = 8


class DecisionRunner:
    def __init__(self, pick: Callable[[], Chooser], codec: LiveCodec,
                 send: Callable[[str], Awaitable[bool]], *, timeout_s: float = DECISION_TIMEOUT_S,
                 max_queued: int = MAX_QUEUED) -> None:
        self.pick = pick  # the chooser for the session's decisions config now (or its typed error)
        self.codec = codec
        self._send = send  # False once the socket is gone
        self.timeout_s = timeout_s
        self._queue: asyncio.Queue[DecisionRun] = asyncio.Queue(max_queued)
        self._task = asyncio.create_task(self._work(), name="duplex-live-decisions")
        self.skipped = 0  # trigger firings the full queue turned away

    def submit(self, run: DecisionRun) -> None:
        """A ``decision.create``'s run; ``resource_exhausted`` when full."""
        try:
            self._queue.put_nowait(run)
        except asyncio.QueueFull:
            raise DuplexError("resource_exhausted", f"{self._queue.maxsize} decisions are "
                              "waiting already; retry when one is answered", param="type",
                              event_id=run.event_id) from None

    def offer(self, run: DecisionRun) -> None:
        """A trigger firing: queued, or skipped when the queue is full."""
        try:
            self._queue.put_nowait(run)
        except asyncio.QueueFull:
            self.skipped += 1
            log.info("decision trigger %s skipped: %d decisions waiting", run.trigger_id,
                     self._queue.maxsize)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            run = await self._queue.get()
            if not await self._send(await self._evaluate(run)):
                return  # the socket is gone: nobody to tell

    async def _evaluate(self, run: DecisionRun) -> str:
        try:
            chooser = self.pick()
            chosen = await asyncio.wait_for(self._answers(run, chooser), self.timeout_s)
            return self.codec.render_decision(run, chooser.model, chosen)
        except TimeoutError:
            err = DuplexError("deadline_exceeded", f"the decision took longer than "
                              f"{self.timeout_s:g} s; stopped")
        except DuplexError as exc:
            err = exc
        except Exception as exc:  # noqa: BLE001 - one decision's bug must not end the session
            log.exception("decision %s failed", run.event_id or run.trigger_id)
            err = DuplexError("internal_error", f"the decision failed: {exc!r}")
        return self.codec.render_error(err.with_event_id(run.event_id))

    @staticmethod
    async def _answers(run: DecisionRun, chooser: Chooser) -> list:
        return [await chooser.choose(ask) for ask in run.asks]
