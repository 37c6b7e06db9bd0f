"""A session's live streaming-input vLLM request, and ``LivePort``, the port
base of both vLLM ports (the realtime LLM port, which application-session turns
use too, and the omni port).

A session's conversation lives in ONE vLLM request fed by an async generator
of ``StreamingInput`` chunks, so its KV cache persists across chunks and turns:

* A prefill chunk asks for ``max_tokens=1``: vLLM samples one token and drops
  it when the next chunk arrives (``Scheduler._update_request_as_session``
  keeps only *computed* tokens; the last sampled one never is), so the KV holds
  exactly the prompt. Verified: streaming-prefill replies equal one-shot ones.
* A reply is a chunk with the real sampling params. After it the request stays
  open, holding the reply's tokens but the last sampled one (same reason); the
  next turn appends to it.
* Outputs of several chunks may arrive merged (vLLM's collector merges DELTA
  outputs when the consumer lags), so tokens are routed by count: a prefill
  chunk has exactly one (dropped) token; nothing follows a reply until it ends.
* Streaming input rejects ``stop`` strings and cannot end a chunk early, so a
  stop string (found by the reply's ``ReplyDecoder``) ends the reply by
  aborting the request; the next turn starts a new one (the prefix cache keeps
  that cheap).

``LivePort`` is what a session's port does around that request: submissions
are dispatched one at a time, in order (``_pump``); input that arrives while a
reply streams waits until the reply ends or is cancelled; ``cancel`` aborts the
requests of an older fence and waits until the engine dropped them; a request
that fails reports it once. A subclass says what a payload does (``_handle``),
what a reply leaves in its context (``_keep_reply``) and which work a fence
bump voids (``_outlived``). All model work runs in vLLM's engine process; the
port's tasks only await.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from vllm import SamplingParams
from vllm.engine.protocol import StreamingInput
from vllm.outputs import RequestOutput
from vllm.v1.engine.exceptions import EngineDeadError
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    GenerateRequest,
    GenerationDone,
    StageFailed,
    StageInput,
    TextDelta,
    ToolCall,
    TurnEndProbability,
)
from vllm_duplex.stages.port import PortBase
from vllm_duplex.stages.vllm.decode import Call, Piece, ReplyDecoder, Text
from vllm_duplex.stages.vllm.host import HostedStage, prefill_params

log = logging.getLogger(__name__)

_PREFILL: Any = object()  # a pending prefill chunk: one sampled token that vLLM drops


@dataclass(eq=False)
class Probe:
    """A pending prefill chunk of user words whose dropped token is read: the
    probability mass of ``end_ids`` (the chat template's end of turn, and
    sentence-final punctuation) in its distribution is P(the user's turn ends
    after ``text``), sent as ``TurnEndProbability`` under ``item``'s fence."""

    item: StageInput
    text: str
    end_ids: frozenset[int]

    def probability(self, logprobs: Any) -> TurnEndProbability | None:
        if not logprobs:
            return None
        p = sum(math.exp(lp.logprob) for tid, lp in logprobs.items() if tid in self.end_ids)
        return TurnEndProbability(min(1.0, p), self.text)


@dataclass(eq=False)
class Reply:
    """One reply in flight; its outputs go out under ``item``'s fence and id."""

    item: StageInput
    request: GenerateRequest
    decoder: ReplyDecoder
    base_len: int = 0  # tokens the request holds once the prompt is in
    done: bool = False

    @property
    def ids(self) -> list[int]:
        return self.decoder.ids

    def feed(self, ids: list[int]) -> list[TextDelta | ToolCall]:
        return self._payloads(self.decoder.feed(ids))

    def finish(self) -> list[TextDelta | ToolCall]:
        return self._payloads(self.decoder.finish())

    def ended(self, reason: str) -> GenerationDone:
        return GenerationDone(self.request.response_id, reason, input_tokens=self.base_len,
                              output_tokens=len(self.ids))

    def _payloads(self, pieces: list[Piece]) -> list[TextDelta | ToolCall]:
        rid = self.request.response_id
        out: list[TextDelta | ToolCall] = []
        for p in pieces:
            if isinstance(p, Text):
                out.append(TextDelta(rid, p.text))
            elif isinstance(p, Call):
                out.append(ToolCall(rid, f"call_{uuid.uuid4().hex[:24]}", p.name, p.arguments))
        return out


@dataclass(eq=False)
class LiveRequest:
    """One vLLM request of a session and the chunks it was sent. ``streaming``
    False: a one-shot request (one prompt, one reply: a constrained tool call,
    whose grammar does not follow streaming-input chunks)."""

    vllm_id: str
    request_id: str  # the StageInput that started it (failures are reported under it)
    fence: Fence  # newest fence of the work appended to it
    streaming: bool = True
    inputs: asyncio.Queue[tuple[Any, SamplingParams] | None] = field(default_factory=asyncio.Queue)
    one_shot: tuple[Any, SamplingParams] | None = None
    pending: deque[Any] = field(default_factory=deque)  # _PREFILL | Probe | Reply, in order
    reply: Reply | None = None
    dropped: bool = False
    abort_sent: bool = False
    task: asyncio.Task[None] | None = None

    async def stream(self, render: Callable[[Any], Awaitable[Any]]) -> AsyncIterator[StreamingInput]:
        # The input queue only holds chunks vLLM has not pulled yet (its input
        # task pulls them at once), so it stays a few chunks long.
        while (entry := await self.inputs.get()) is not None:
            chunk, params = entry
            yield StreamingInput(await render(chunk), params)


class LivePort(PortBase):
    """One session's port onto a ``HostedStage``'s engine (see the module doc)."""

    def __init__(self, stage: HostedStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._host = stage.host
        self._counts = stage.host.counters.live
        self._live: LiveRequest | None = None
        self._lives: set[LiveRequest] = set()  # every request whose task has not ended
        self._deferred: deque[StageInput] = deque()
        self._pumping = False
        self._pump_task: asyncio.Task[None] | None = None

    # ---- what a subclass defines -----------------------------------------

    async def _handle(self, item: StageInput) -> None:
        raise NotImplementedError

    def _keep_reply(self, live: LiveRequest, reply: Reply, *, continuing: bool) -> None:
        """The reply ended (``continuing``: its request goes on, holding it) or
        was cut off with its request (it keeps what the client got)."""

    def _outlived(self, work: Fence, fence: Fence, *, output: bool) -> bool:
        """Whether work under ``work`` is void once the session is at ``fence``
        (``output``: the work is a reply). Default: everything older."""
        return work.is_stale_against(fence)

    def _new_live(self, vllm_id: str, item: StageInput, streaming: bool) -> LiveRequest:
        return LiveRequest(vllm_id, item.request_id, item.fence, streaming)

    async def _render(self, chunk: Any) -> Any:
        """A queued chunk as an engine prompt (default: it already is one)."""
        return chunk

    # ---- the port --------------------------------------------------------

    async def open(self, fence: Fence) -> None:
        await super().open(fence)
        await self._host.start()

    async def submit(self, item: StageInput) -> None:
        if not self._admit(item):
            return
        if not self._host.healthy:
            await self._emit_for(item, StageFailed(DuplexError("engine_dead", "the vLLM engine is dead")))
            return
        self._deferred.append(item)
        await self._pump()

    async def cancel(self, fence: Fence) -> None:
        """Abort every request ``fence`` voids; when this returns, none of
        them produces anything any more (the engine dropped them)."""
        self._check_session(fence, "cancelled")
        self._raise_floor(fence)
        self._deferred = deque(i for i in self._deferred if not self._outlived(
            i.fence, fence, output=isinstance(i.payload, GenerateRequest)))
        await self._abort([lv for lv in self._lives if lv.dropped or self._doomed(lv, fence)])
        await self._pump()  # input of the new fence that waited for the aborted reply

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._deferred.clear()
        pump, self._pump_task = self._pump_task, None
        if pump is not None and not pump.done():
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        await self._abort(list(self._lives))
        self._end_outputs()

    def _doomed(self, live: LiveRequest, fence: Fence) -> bool:
        reply = live.reply
        return self._outlived(live.fence, fence, output=False) or (
            reply is not None and self._outlived(reply.item.fence, fence, output=True))

    # ---- dispatch, in order, one at a time ---------------------------------

    @property
    def _replying(self) -> bool:
        return self._live is not None and self._live.reply is not None

    async def _pump(self) -> None:
        if not self._pumping:
            self._pumping = True
            await self._pump_loop()

    async def _pump_loop(self) -> None:
        try:
            while self._deferred and not self._closed and not self._replying:
                await self._dispatch(self._deferred.popleft())
        finally:
            self._pumping = False

    def _resume(self) -> None:
        """A reply ended: dispatch what waited for it, in a task of its own (a
        request's task must stay free to read its outputs)."""
        if self._deferred and not self._pumping and not self._closed and not self._replying:
            self._pumping = True
            self._pump_task = asyncio.create_task(self._pump_loop(), name=f"duplex-{self.name}-pump")

    def _voided(self, item: StageInput) -> bool:
        """After an await inside ``_handle``: the port closed or a cancel voided ``item``."""
        return self._closed or (self._floor is not None and self._outlived(
            item.fence, self._floor, output=isinstance(item.payload, GenerateRequest)))

    async def _dispatch(self, item: StageInput) -> None:
        try:
            await self._handle(item)
        except Exception as exc:
            log.exception("stage %s failed on %s", self.name, item.request_id)
            self._counts.failed += 1
            if self._live is not None:
                self._drop(self._live)
            err = exc if isinstance(exc, DuplexError) else DuplexError(
                "stage_failed", f"stage {self.name!r} failed: {exc!r}")
            await self._emit_for(item, StageFailed(err))

    # ---- requests ----------------------------------------------------------

    def _start(self, item: StageInput, *, streaming: bool = True) -> LiveRequest:
        if self._live is not None:
            self._drop(self._live)
        live = self._new_live(self._host.request_id(item.request_id), item, streaming)
        self._live = live
        return live

    def _push(self, live: LiveRequest, item: StageInput, chunk: Any,
              reply: Reply | None = None, params: SamplingParams | None = None,
              probe: Probe | None = None) -> None:
        """Send ``chunk`` on ``live``: a prefill (``probe``: one whose dropped
        token is read), or (with ``reply``) the chunk that asks for the reply
        with ``params``."""
        if item.fence > live.fence:
            live.fence = item.fence
        if reply is None:
            live.pending.append(_PREFILL if probe is None else probe)
            params = prefill_params(self._host.probe_logprobs)
        else:
            live.pending.append(reply)
            live.reply = reply
        assert params is not None
        if live.streaming:
            live.inputs.put_nowait((chunk, params))
        else:
            live.one_shot = (chunk, params)
        if live.task is None:
            live.task = asyncio.create_task(self._consume(live), name=f"duplex-{self.name}-{live.vllm_id}")
            self._lives.add(live)
            self._counts.active += 1

    def _drop(self, live: LiveRequest, *, aborted: bool = True) -> None:
        """Forget ``live`` (a reply it was writing keeps what it got to). Its
        task is cancelled, and vLLM's ``generate`` aborts the request when its
        consumer is cancelled; from inside that task, the task itself sends the
        abort (see ``_consume``). cancel and close also abort explicitly and wait."""
        reply = live.reply
        if reply is not None and not reply.done and self._live is live:
            reply.done = True
            live.reply = None
            self._keep_reply(live, reply, continuing=False)
        if self._live is live:
            self._live = None
        if live.dropped:
            return
        live.dropped = True
        if live.task is None:
            return  # never reached the engine
        if not aborted:
            live.abort_sent = True  # it ended by itself
            return
        self._counts.aborted += 1
        if live.task is not asyncio.current_task():
            live.task.cancel()

    async def _abort(self, lives: list[LiveRequest]) -> None:
        for live in lives:
            self._drop(live)
        await self._host.abort([lv.vllm_id for lv in lives if lv.task is not None])
        tasks = [lv.task for lv in lives if lv.task is not None and lv.task is not asyncio.current_task()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---- outputs -----------------------------------------------------------

    async def _consume(self, live: LiveRequest) -> None:
        if live.streaming:
            source, params = live.stream(self._render), prefill_params(self._host.probe_logprobs)
        else:
            assert live.one_shot is not None
            source, params = live.one_shot
        try:
            async for out in self._host.generate(source, params, live.vllm_id):
                if not live.dropped:
                    await self._on_output(live, out)
                if live.dropped and not live.abort_sent:
                    # Dropped from inside this task (a stop string, a new live
                    # request started by the pump...): abort; the abort output ends the loop.
                    live.abort_sent = True
                    await self._host.abort([live.vllm_id])
        except asyncio.CancelledError:
            raise
        except EngineDeadError:
            await self._fail(live, DuplexError("engine_dead", "the vLLM engine died"))
        except DuplexError as exc:  # raised by a subclass while rendering a chunk (vLLM re-raises it)
            await self._fail(live, exc)
        except Exception as exc:
            log.exception("vLLM request %s failed", live.vllm_id)
            await self._fail(live, DuplexError("stage_failed", f"vLLM request failed: {exc!r}"))
        finally:
            self._lives.discard(live)
            self._counts.active -= 1
            if self._live is live:
                self._live = None

    async def _on_output(self, live: LiveRequest, out: RequestOutput) -> None:
        comp = out.outputs[0]
        ids = list(comp.token_ids)
        logprobs = getattr(comp, "logprobs", None)  # (a fake engine may not have them)
        n = 0
        while ids and live.pending and not isinstance(live.pending[0], Reply):
            entry = live.pending.popleft()
            ids.pop(0)
            if isinstance(entry, Probe) and logprobs is not None and n < len(logprobs):
                p = entry.probability(logprobs[n])
                if p is not None:
                    await self._emit_for(entry.item, p)
            n += 1
        reply = live.reply
        if reply is None or reply.done:
            return
        if ids:
            for payload in reply.feed(ids):
                await self._emit_for(reply.item, payload)
            if reply.decoder.stopped:
                if reply.decoder.looped:
                    log.info("stage %s: reply %s ended in a loop after %d tokens: %r", self.name,
                             live.vllm_id, len(reply.decoder.ids), reply.decoder.text[-80:])
                await self._finish(live, reply, "stop", stopped=True)
                return
        # A finish reason with no reply token in this output was a prefill's.
        if (ids and comp.finish_reason is not None) or out.finished:
            await self._finish(live, reply, comp.finish_reason or "abort")

    async def _finish(self, live: LiveRequest, reply: Reply, reason: str, *,
                      stopped: bool = False) -> None:
        reply.done = True
        live.reply = None
        if live.pending and live.pending[0] is reply:
            live.pending.popleft()
        if not stopped:
            for payload in reply.finish():
                await self._emit_for(reply.item, payload)
        continuing = not stopped and reason != "abort" and live.streaming and self._live is live
        self._keep_reply(live, reply, continuing=continuing)
        self._counts.completed += 1
        await self._emit_for(reply.item, reply.ended(reason))
        if stopped:
            self._drop(live)  # a stop string cannot end a streaming chunk early: abort
        elif not continuing:
            self._drop(live, aborted=False)  # the request is over anyway
        self._resume()

    async def _fail(self, live: LiveRequest, error: DuplexError) -> None:
        self._counts.failed += 1
        reply = live.reply
        self._drop(live, aborted=False)
        self._deferred.clear()
        target = reply.item if reply is not None else None
        fence, rid = (target.fence, target.request_id) if target else (live.fence, live.request_id)
        await self._emit(fence, rid, StageFailed(error))

    async def _emit_for(self, item: StageInput, payload: Any) -> None:
        await self._emit(item.fence, item.request_id, payload)
