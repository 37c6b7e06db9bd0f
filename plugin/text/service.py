"""The text surfaces of one instance, beside the realtime sessions and on the
same vLLM engine: stateless generations, application sessions, resumable
streams, and the registry of running requests that ``abort`` addresses.

Every running generation (stateless, a session turn, a streaming-input one)
is registered under (API key, request id) while it runs, so ``abort`` and
``DELETE /v1/streams/{id}`` reach it from another connection, and a deadline
stops it. A generation opted in with a ``stream_id`` runs in a task of its
own that writes into the stream, so a client can disconnect and resume;
without one, the generation lives exactly as long as its HTTP response (a
disconnect aborts the engine request).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import contextmanager
from typing import Any, Protocol

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.text.app_sessions import CONTINUATION_MODES, AppSessions
from vllm_duplex.text.events import ControlEvent, ErrorEvent, TextEvent
from vllm_duplex.text.requests import MUTABLE_FIELDS, OPTION_NAMES, GenerationControl
from vllm_duplex.text.stateless import THINK_CLOSE, THINK_OPEN, TextGenerator
from vllm_duplex.text.streams import ResumableStream, StreamStore

log = logging.getLogger(__name__)


class Stoppable(Protocol):
    finished: bool

    async def stop(self, reason: str = "cancelled") -> None: ...


class TextService:
    """``stage``: the deployment's ``VllmLlmStage``; its engine host runs every
    text surface (stateless steps on it, session turns through its ports)."""

    def __init__(self, stage: Any, *, model: str, instance_id: str, limits: Any, clock: Clock,
                 metrics: Metrics) -> None:
        self.model = model
        self.clock = clock
        self.limits = limits
        self.max_tokens_cap = min(limits.max_output_tokens, stage.max_model_len)
        self.generator = TextGenerator(stage)
        self.sessions = AppSessions(
            stage, model=model, instance_id=instance_id, max_sessions=limits.max_app_sessions,
            max_sessions_per_key=limits.max_sessions_per_key, default_ttl_s=limits.session_ttl_s,
            max_ttl_s=limits.max_session_ttl_s, max_resident=limits.max_resident_sessions,
            clock=clock)
        self.streams = StreamStore(max_streams=limits.max_streams,
                                   max_events_per_stream=limits.stream_max_events,
                                   max_bytes_per_stream=limits.stream_max_bytes,
                                   max_total_bytes=limits.streams_max_total_bytes,
                                   ttl_s=limits.stream_ttl_s, clock=clock)
        self._running: dict[tuple[str | None, str], Stoppable] = {}
        self._controls: dict[str, GenerationControl] = {}  # stream id -> its generation's control
        self._publishers: set[asyncio.Task[None]] = set()
        gauge = metrics.gauge
        gauge("duplex_app_sessions_live", "Application sessions", lambda: len(self.sessions.manager))
        gauge("duplex_app_sessions_resident", "Application sessions holding a live vLLM request",
              lambda: self.sessions.resident())
        gauge("duplex_app_session_evictions", "Live requests released by the resident cap",
              lambda: self.sessions.evictions)
        gauge("duplex_generations_running", "Running generations (stateless, turns, streaming input)",
              lambda: len(self._running))
        gauge("duplex_generate_requests_active", "Stateless generate requests in the engine",
              lambda: self.generator.active_requests)
        gauge("duplex_generate_requests_aborted", "Stateless generate requests aborted",
              lambda: self.generator.aborted_requests)
        gauge("duplex_streams_live", "Resumable streams retained", lambda: len(self.streams))
        gauge("duplex_streams_retained_bytes", "Bytes of events the resumable streams retain",
              lambda: self.streams.stats["retained_bytes"])

    def key_id(self, api_key: str | None) -> str | None:
        return self.sessions.manager.key_id(api_key)

    async def start(self) -> None:
        await self.sessions.manager.start()
        await self.streams.start()

    async def stop(self) -> None:
        for run in list(self._running.values()):
            await run.stop("cancelled")
        if self._publishers:
            await asyncio.gather(*self._publishers, return_exceptions=True)
        await self.streams.stop()
        await self.sessions.manager.stop()

    # ---- running generations ---------------------------------------------

    @contextmanager
    def track(self, key_id: str | None, request_id: str, run: Stoppable):
        slot = (key_id, request_id)
        if slot in self._running:
            raise DuplexError("duplicate_id", f"request_id {request_id!r} is already running",
                              param="request_id")
        self._running[slot] = run
        try:
            yield
        finally:
            if self._running.get(slot) is run:
                del self._running[slot]

    async def abort(self, key_id: str | None, request_id: str) -> None:
        run = self._running.get((key_id, request_id))
        if run is None:
            raise DuplexError("request_not_found", f"no running request {request_id!r}",
                              param="request_id")
        await run.stop("cancelled")

    def reserve(self, key_id: str | None, request_id: str) -> None:
        """Fail early (before a response starts) when the id is in use."""
        if (key_id, request_id) in self._running:
            raise DuplexError("duplicate_id", f"request_id {request_id!r} is already running",
                              param="request_id")

    async def run(self, key_id: str | None, request_id: str, run: Stoppable,
                  events: AsyncIterator[TextEvent], deadline_ms: int | None) -> AsyncIterator[TextEvent]:
        """``events`` while registered for abort, stopped at the deadline."""
        timer = None
        if deadline_ms is not None:
            loop = asyncio.get_running_loop()
            timer = loop.call_later(deadline_ms / 1000,
                                    lambda: loop.create_task(run.stop("deadline")))
        try:
            with self.track(key_id, request_id, run):
                async for ev in events:
                    yield ev
        finally:
            if timer is not None:
                timer.cancel()
            await events.aclose()  # type: ignore[attr-defined]

    def generate(self, spec: Any, key_id: str | None) -> AsyncIterator[TextEvent]:
        """A stateless generation's events, registered for abort, stopped at
        its deadline; closing the iterator (a client gone) aborts the engine request."""
        run = self.generator.start(spec, spec.control())
        self.reserve(key_id, spec.request_id)
        return self.run(key_id, spec.request_id, run, run.events(), spec.deadline_ms)

    # ---- resumable streams -----------------------------------------------

    async def open_stream(self, stream_id: str, key_id: str | None, request_id: str,
                          api_key: str | None = None) -> ResumableStream:
        """A new stream (with a durable store: its id claimed across the store,
        the stream mirrored there from now on: ``StreamStore.open``)."""
        self.reserve(key_id, request_id)
        return await self.streams.open(stream_id, key_id, api_key)

    def publish(self, stream: ResumableStream, run: Stoppable, events: AsyncIterator[TextEvent],
                control: GenerationControl | None,
                on_done: Callable[[], Awaitable[None]] | None = None) -> None:
        """Run ``events`` into ``stream`` in a task of its own (the client may
        come and go); ``DELETE`` of the stream stops the run."""
        stream.on_stop = lambda: run.stop("cancelled")
        if control is not None:
            self._controls[stream.stream_id] = control

        async def pump() -> None:
            try:
                async for ev in events:
                    if stream.status.value != "active":
                        break
                    appended = stream.append(ev.type, ev.data())
                    if isinstance(ev, ControlEvent):
                        for fut in ev.waiters:
                            if not fut.done():
                                fut.set_result(appended.seq)
            except Exception:
                log.exception("stream %s failed", stream.stream_id)
                if stream.status.value == "active":
                    failed = ErrorEvent(DuplexError("internal_error", "the generation failed"))
                    stream.append(failed.type, failed.data())
            finally:
                await events.aclose()  # type: ignore[attr-defined]
                self._controls.pop(stream.stream_id, None)
                stream.complete()
                if on_done is not None:
                    await on_done()

        task = asyncio.create_task(pump(), name=f"duplex-stream-{stream.stream_id}")
        self._publishers.add(task)
        task.add_done_callback(self._publishers.discard)

    async def control(self, stream_id: str, key_id: str | None, changes: dict[str, Any],
                      timeout_s: float = 30.0) -> int:
        """Apply ``changes`` at the next event boundary; the seq of the
        ``control`` event that reports it."""
        stream = self.streams.get(stream_id, key_id)
        control = self._controls.get(stream_id)
        if stream.status.value != "active":
            raise DuplexError("generation_finished", f"stream {stream_id!r} has finished")
        if control is None:
            raise DuplexError("capability_unsupported", "this generation has no mutable fields "
                              "(only stateless generations take /control)", param="stream_id")
        fut = control.request(changes)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            if not control.withdraw(fut):  # applied just now after all
                return fut.result()
            raise DuplexError("deadline_exceeded", f"no event boundary within {timeout_s:.0f} s "
                              "(the generation is still prefilling); nothing was applied") from None

    def capabilities(self) -> dict[str, Any]:
        limits = self.limits
        return {
            "generate": {
                "path": "/v1/generate", "transport": "sse",
                "events": ["text-delta", "reasoning-delta", "tool-call-delta", "tool-call",
                           "control", "finish", "error"],
                "tool_choice": ["auto", "none", "required", "function"],
                "parallel_tool_calls": True, "tool_calls_constrained": "vllm structured outputs",
                "reasoning": {"tags": [THINK_OPEN, THINK_CLOSE], "budget_forcing": True},
                "options": [*OPTION_NAMES, "stop"], "max_output_tokens": self.max_tokens_cap,
            },
            "application_sessions": {
                "path": "/v1/sessions", "continuation_modes": dict(CONTINUATION_MODES),
                "lease": {"default_ttl_s": limits.session_ttl_s,
                          "max_ttl_s": limits.max_session_ttl_s, "ttl_0": "server default"},
                "max_sessions": limits.max_app_sessions,
                "max_sessions_per_key": limits.max_sessions_per_key,
                "max_resident": limits.max_resident_sessions, "adapters": [],
            },
            "streaming_input": {
                "path": "/v1/generate/stream",
                "modalities": {"text": True, "audio": False, "image": False},  # audio: /v1/realtime
                "early_output": False, "first_seq": 1,
                "max_chunk_bytes": limits.max_input_chunk_bytes,
                "max_input_bytes": limits.max_input_bytes,
            },
            "streams": {
                "path": "/v1/streams", "max_streams": limits.max_streams,
                "max_events_per_stream": limits.stream_max_events,
                "max_bytes_per_stream": limits.stream_max_bytes,
                "max_total_bytes": limits.streams_max_total_bytes, "ttl_s": limits.stream_ttl_s,
                "mutable_fields": list(MUTABLE_FIELDS), "delete_stops_generation": True,
            },
            "owner_affinity": {"required": True, "instance_id": self.sessions.instance_id,
                               "header": "Duplex-Owner-Instance"},
            "max_request_bytes": limits.max_request_bytes,
        }
