"""The vLLM omni stage (type ``vllm_omni``): one ``AsyncLLM`` serving a native
audio+video model (Qwen2.5-Omni's thinker, MiniCPM-o 2.6), one live
streaming-input request per session -- the GPU path of ``models/omni``.

Each ``OmniUnit`` becomes one ``StreamingInput`` chunk of the session's live
request: its text holds the dialect's placeholders (``prompt``) and its
``multi_modal_data`` the unit's audio (``(float32 array, 16000)``) and frames
(PIL images), so the audio and vision encoders run and the KV cache fills
while the user is still speaking. Intermediate chunks use ``max_tokens=1``,
whose token vLLM drops when the next chunk arrives (see ``stages.vllm.llm``); at end
of turn the ``GenerateRequest`` appends only the assistant prefix, with the
real sampling parameters. The reply's tokens stay in the KV; the next turn
appends to the same request.

Chunks are rendered (tokenized, audio features and image patches computed)
by the engine's renderer in its worker threads, on vLLM's input task for the
request -- never on the session's task. When the live request is lost (a
barge-in must abort a running reply; a new system prompt; a dead engine), the
session's chunks are replayed into a new request one by one; vLLM's prefix
cache, which hashes multimodal items by content, makes that cheap.

Text out only: speech comes from a ``tts`` stage after this one (vLLM serves
neither Qwen2.5-Omni's talker nor MiniCPM-o's TTS head).

Not handled yet: a context that outgrows ``max_model_len`` fails its turn
(``stage_failed``); nothing is evicted.
"""

from __future__ import annotations

import os

# An operator's own values win; model hubs are unreachable at run time (the
# model is a local path or already in the local Hugging Face cache).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402  (the imports below must follow the environment defaults)
import asyncio
import dataclasses
import inspect
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm import SamplingParams
from vllm.engine.protocol import EngineClient, StreamingInput
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.exceptions import EngineDeadError
from vllm_duplex.core.clock import Clock, MonotonicClock
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.fence import Fence
from vllm_duplex.core.omni import OmniInstructions, OmniUnit
from vllm_duplex.core.payloads import (
    GenerateRequest,
    StageFailed,
    StageInput,
    StageOutput,
    TextIn,
)
from vllm_duplex.stages.lifecycle import Lifecycle, Metered, StageCounter
from vllm_duplex.stages.omni.prompt import Chunk, OmniPrompt
from vllm_duplex.stages.omni.prompt import dialect as get_dialect
from vllm_duplex.stages.vllm.chat import Reply, sampling_options
from vllm_duplex.stages.vllm.supervisor import EngineSupervisor, build_in_thread

log = logging.getLogger(__name__)

OUTPUT_QUEUE_SIZE = 256  # backpressure: the consumer task waits when the session lags
_CLOSED: Any = object()
_PREFILL: Any = object()  # a pending prefill chunk: one sampled token that vLLM drops


def _prefill_params() -> SamplingParams:
    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                          output_kind=RequestOutputKind.DELTA)


class VllmOmniStage(Lifecycle, Metered):
    """Owns (or borrows, ``engine``) the engine; ``port(session_id)`` gives a
    session's port. ``dialect``: ``qwen_omni`` or ``minicpmo`` (the model's
    placeholders); ``system_prompt``: the default system prompt (else the
    dialect's; the policy's ``OmniInstructions`` replace it per session).
    ``engine_kwargs`` go to ``AsyncEngineArgs`` (``limit_mm_per_prompt``,
    ``trust_remote_code`` for MiniCPM-o, ``gpu_memory_utilization`` ...)."""

    accepted: ClassVar[tuple[type, ...]] = (OmniUnit, OmniInstructions, TextIn, GenerateRequest)

    def __init__(
        self,
        name: str = "omni",
        *,
        model: str | None = None,
        dialect: str = "qwen_omni",
        engine: EngineClient | None = None,
        dtype: str | None = None,
        enforce_eager: bool | None = None,
        max_model_len: int = 8192,
        enable_prefix_caching: bool = True,
        default_max_tokens: int = 256,
        system_prompt: str | None = None,
        clock: Clock | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        restart_on_failure: bool = True,
        restart_backoff_s: float = 1.0,
    ) -> None:
        if model is None and engine is None:
            raise ValueError(f"stage {name!r} needs a model (a local path or a cached hub name)")
        self.name = name
        self.clock = clock or MonotonicClock()
        self.model = model
        self.dialect = get_dialect(dialect)
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        self.default_max_tokens = default_max_tokens
        self.system_prompt = system_prompt
        self.engine_kwargs = dict(engine_kwargs or {})
        self._engine = engine
        self._owns_engine = engine is None
        self._tokenizer: Any = None
        self._start_lock = asyncio.Lock()
        self._ids = itertools.count()
        self.engine_start_s: float | None = None
        # Counters (shared by all ports; /metrics reads them).
        self.active_requests = 0
        self.aborted_requests = 0
        self.completed_requests = 0
        self.failed_requests = 0
        self.rebuilds = 0  # live requests that replayed a context an earlier one held
        self.restart_on_failure = restart_on_failure and self._owns_engine
        self.supervisor = EngineSupervisor(
            f"stage {name}", is_dead=lambda: self._engine is not None and self._engine.errored,
            restart=self._restart, clock=self.clock, backoff_s=restart_backoff_s)

    @property
    def engine_restarts(self) -> int:  # /metrics
        return self.supervisor.restarts

    def counters(self) -> dict[StageCounter, float]:  # Metered: /metrics
        return {StageCounter.ABORTED_REQUESTS: self.aborted_requests,
                StageCounter.ACTIVE_REQUESTS: self.active_requests,
                StageCounter.ENGINE_RESTARTS: self.engine_restarts}

    # ---- engine lifecycle ------------------------------------------------

    @property
    def engine(self) -> EngineClient:
        if self._engine is None:
            raise RuntimeError(f"stage {self.name!r} is not started")
        return self._engine

    @property
    def healthy(self) -> bool:
        return self._engine is not None and not self._engine.errored

    async def start(self) -> None:
        """Build the engine in a worker thread and warm it up; idempotent."""
        async with self._start_lock:
            if self._tokenizer is not None:
                return
            started = time.monotonic()
            if self._engine is None:
                self._engine = await build_in_thread(self._build_engine, lambda e: e.shutdown())
            tok = self._engine.get_tokenizer()
            self._tokenizer = await tok if inspect.isawaitable(tok) else tok
            await self._warm_up(self._engine)
            self.engine_start_s = time.monotonic() - started
            log.info("stage %s: engine ready in %.1f s", self.name, self.engine_start_s)
            if self.restart_on_failure:
                self.supervisor.start()

    async def _warm_up(self, engine: EngineClient) -> None:
        # One token: starts the engine's output handler on this loop.
        async for _ in engine.generate({"prompt": "Hi"}, _prefill_params(),
                                       f"duplex-warmup.{uuid.uuid4().hex}"):
            pass

    async def _restart(self) -> None:
        started = time.monotonic()
        log.warning("stage %s: the vLLM engine died; restarting it", self.name)
        if self._engine is not None:
            self._engine.shutdown()
        engine = await build_in_thread(self._build_engine, lambda e: e.shutdown())
        try:
            await self._warm_up(engine)
        except BaseException:
            engine.shutdown()
            raise
        self._engine = engine
        self.engine_start_s = time.monotonic() - started

    def _build_engine(self) -> EngineClient:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=self.model,
            dtype=self.dtype or "auto",
            enforce_eager=bool(self.enforce_eager),
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching,
            **self.engine_kwargs,
        )
        return AsyncLLM.from_engine_args(args)

    async def close(self) -> None:
        """What ``Runtime.stop`` calls on every stage."""
        await self.supervisor.close()
        if self._owns_engine and self._engine is not None:
            engine, self._engine = self._engine, None
            engine.shutdown()

    def port(self, session_id: str) -> VllmOmniPort:
        return VllmOmniPort(self, session_id)

    def next_request_id(self, request_id: str) -> str:
        return f"{request_id}.{next(self._ids)}"

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    async def render(self, chunk: Chunk) -> Any:
        """``chunk`` as a streaming-input prompt: rendered by the engine's
        renderer (its tokenizer and multimodal processor run in worker
        threads), or the plain prompt dict for an engine without one."""
        prompt = chunk.prompt()
        renderer = getattr(self.engine, "renderer", None)
        render = getattr(renderer, "render_cmpl_async", None)
        if render is None:
            return prompt
        # Chunks continue a context: no BOS or other special tokens are added.
        params = renderer.default_cmpl_tok_params.with_kwargs(add_special_tokens=False)
        (engine_input,) = await render([prompt], params)
        return engine_input


# ---- per-session state -------------------------------------------------------


@dataclass(eq=False)
class _Live:
    """A session's live vLLM request: a prefix (``sent`` chunks) of its
    ``OmniPrompt.history``."""

    vllm_id: str
    request_id: str  # the StageInput that started it (failures are reported under it)
    fence: Fence  # newest fence of the work appended to it
    inputs: asyncio.Queue[tuple[Chunk, SamplingParams | None] | None] = field(
        default_factory=asyncio.Queue)
    sent: int = 0
    pending: deque[Any] = field(default_factory=deque)  # _PREFILL | Reply, in order
    generation: Reply | None = None
    dropped: bool = False
    abort_sent: bool = False
    task: asyncio.Task[None] | None = None

    async def stream(self, render: Callable[[Chunk], Awaitable[Any]]) -> AsyncIterator[StreamingInput]:
        while (entry := await self.inputs.get()) is not None:
            chunk, params = entry
            yield StreamingInput(await render(chunk), params or _prefill_params())


class VllmOmniPort:
    """One session's port. Input that arrives while a reply streams waits (in
    order) until the reply ends or is cancelled."""

    def __init__(self, stage: VllmOmniStage, session_id: str) -> None:
        self.name = stage.name
        self.session_id = session_id
        self._stage = stage
        self.prompt = OmniPrompt(stage.dialect, stage.system_prompt)
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=OUTPUT_QUEUE_SIZE)
        self._live: _Live | None = None
        self._lives: set[_Live] = set()
        self._deferred: deque[StageInput] = deque()
        self._held = 0  # most chunks any live request of this port held
        self._floor: Fence | None = None
        self._closed = False

    def accepts(self, payload: Any) -> bool:
        return isinstance(payload, self._stage.accepted)

    async def open(self, fence: Fence) -> None:
        if fence.session_id != self.session_id:
            raise ValueError(f"port of session {self.session_id!r} opened with {fence}")
        if self._floor is not None:
            raise RuntimeError(f"port {self.name} is already open")
        self._floor = fence
        await self._stage.start()

    async def submit(self, item: StageInput) -> None:
        if self._closed:
            raise RuntimeError(f"port {self.name} is closed")
        if self._floor is None:
            raise RuntimeError(f"port {self.name} is not open")
        if not self.accepts(item.payload):
            raise TypeError(f"stage {self.name!r} does not accept {type(item.payload).__name__}")
        if item.fence.is_stale_against(self._floor):
            return
        if not self._stage.healthy:
            await self._emit(item, StageFailed(DuplexError("engine_dead", "the vLLM engine is dead")))
            return
        live = self._live
        if self._deferred or (live is not None and live.generation is not None):
            self._deferred.append(item)
            return
        await self._dispatch(item)

    def outputs(self) -> AsyncIterator[StageOutput]:
        return self._outputs()

    async def _outputs(self) -> AsyncIterator[StageOutput]:
        while (out := await self._queue.get()) is not _CLOSED:
            yield out
        self._queue.put_nowait(_CLOSED)

    async def cancel(self, fence: Fence) -> None:
        """Abort a reply of an older fence (and a request of an older
        incarnation). What the user said stays: units and text are input,
        not output, and an epoch bump does not void them."""
        if fence.session_id != self.session_id:
            raise ValueError(f"port of session {self.session_id!r} cancelled with {fence}")
        if self._floor is None or self._floor.is_stale_against(fence):
            self._floor = fence

        def stale(f: Fence, reply: bool) -> bool:
            return f.incarnation < fence.incarnation or (reply and f.is_stale_against(fence))

        self._deferred = deque(i for i in self._deferred
                               if not stale(i.fence, isinstance(i.payload, GenerateRequest)))
        doomed = [lv for lv in self._lives if lv.dropped or stale(lv.fence, False)
                  or (lv.generation is not None and stale(lv.generation.item.fence, True))]
        await self._abort(doomed)
        await self._drain()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._deferred.clear()
        await self._abort(list(self._lives))
        while self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(_CLOSED)

    # ---- requests ----------------------------------------------------------

    def _start(self, item: StageInput) -> _Live:
        if self._live is not None:
            self._drop(self._live)
        if self._held:
            self._stage.rebuilds += 1
        live = _Live(self._stage.next_request_id(item.request_id), item.request_id, item.fence)
        self._live = live
        return live

    def _run(self, live: _Live) -> None:
        if live.task is not None:
            return
        live.task = asyncio.create_task(self._consume(live), name=f"duplex-omni-{live.vllm_id}")
        self._lives.add(live)
        self._stage.active_requests += 1

    def _drop(self, live: _Live, *, aborted: bool = True) -> None:
        """Forget ``live`` (a reply it was writing is kept as far as it got)."""
        gen = live.generation
        if gen is not None and not gen.done and self._live is live:
            gen.done = True
            live.generation = None
            self._keep_reply(live, gen, continuing=False)
        if self._live is live:
            self._live = None
        if live.dropped:
            return
        live.dropped = True
        if live.task is None:
            return
        if not aborted:
            live.abort_sent = True
            return
        self._stage.aborted_requests += 1
        if live.task is not asyncio.current_task():
            live.task.cancel()

    async def _abort(self, lives: list[_Live]) -> None:
        for live in lives:
            self._drop(live)
        if not lives:
            return
        ids = [lv.vllm_id for lv in lives if lv.task is not None]
        try:
            await self._stage.engine.abort(ids)
        except Exception:
            log.debug("abort of %s failed", ids, exc_info=True)
        tasks = [lv.task for lv in lives if lv.task is not None and lv.task is not asyncio.current_task()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _sync(self, item: StageInput, gen: Reply | None = None,
              params: SamplingParams | None = None) -> None:
        """Queue the chunks of the history the live request lacks (all of
        them into a new request); the last one asks for ``gen``."""
        live = self._live or self._start(item)
        live.fence = max(live.fence, item.fence)
        history = self.prompt.history
        for i in range(live.sent, len(history)):
            last = gen is not None and i == len(history) - 1
            live.pending.append(gen if last else _PREFILL)
            live.inputs.put_nowait((history[i], params if last else None))
        live.sent = len(history)
        self._held = max(self._held, live.sent)
        if gen is not None:
            live.generation = gen
        self._run(live)

    def _keep_reply(self, live: _Live, gen: Reply, *, continuing: bool) -> None:
        """Record the reply in the history. A request that goes on holds
        every reply token but the last sampled one; a lost one is replayed
        with the text the client got."""
        if continuing:
            self.prompt.reply(self._stage.decode(gen.ids[:-1], skip_special_tokens=False))
            live.sent = len(self.prompt.history)
        else:
            self.prompt.reply(self._stage.decode(gen.ids)[: gen.sent])

    # ---- submissions -----------------------------------------------------

    async def _dispatch(self, item: StageInput) -> None:
        try:
            p = item.payload
            if isinstance(p, OmniInstructions):
                await self._set_system(p.text)
            elif isinstance(p, OmniUnit):
                self.prompt.unit(p)
                self._sync(item)
            elif isinstance(p, TextIn):
                if p.text.strip():
                    self.prompt.text(p.text)
                    self._sync(item)
            else:
                await self._generate(item, p)
        except Exception as exc:
            log.exception("stage %s failed on %s", self.name, item.request_id)
            self._stage.failed_requests += 1
            if self._live is not None:
                self._drop(self._live)
            err = exc if isinstance(exc, DuplexError) else DuplexError(
                "stage_failed", f"stage {self.name!r} failed: {exc!r}")
            await self._emit(item, StageFailed(err))

    async def _set_system(self, text: str) -> None:
        if self.prompt.set_system(text) and self._live is not None:
            await self._abort([self._live])  # the next chunk replays under the new prompt

    async def _generate(self, item: StageInput, req: GenerateRequest) -> None:
        system = next((m.text for m in req.context if m.role == "system"), None)
        if system is not None:
            await self._set_system(system)
        # A spoken reply: no tool calls (the policy advertises none).
        req = dataclasses.replace(req, tools=())
        gen = Reply(item, req, "", 0)
        self.prompt.generation()
        params = SamplingParams(detokenize=False, output_kind=RequestOutputKind.DELTA,
                                **sampling_options(req.sampling, self._stage.default_max_tokens))
        self._sync(item, gen, params)

    # ---- outputs ---------------------------------------------------------

    async def _consume(self, live: _Live) -> None:
        engine = self._stage.engine
        try:
            async for out in engine.generate(live.stream(self._stage.render), _prefill_params(),
                                             live.vllm_id):
                if not live.dropped:
                    await self._on_output(live, out)
                if live.dropped and not live.abort_sent:
                    live.abort_sent = True
                    await engine.abort(live.vllm_id)
        except asyncio.CancelledError:
            raise
        except EngineDeadError:
            await self._fail(live, DuplexError("engine_dead", "the vLLM engine died"))
        except Exception as exc:
            log.exception("vLLM request %s failed", live.vllm_id)
            await self._fail(live, DuplexError("stage_failed", f"vLLM request failed: {exc!r}"))
        finally:
            self._lives.discard(live)
            self._stage.active_requests -= 1
            if self._live is live:
                self._live = None

    async def _on_output(self, live: _Live, out: RequestOutput) -> None:
        comp = out.outputs[0]
        ids = list(comp.token_ids)
        # Each prefill chunk has exactly one (dropped) token; outputs of
        # several chunks may arrive merged.
        while ids and live.pending and live.pending[0] is _PREFILL:
            live.pending.popleft()
            ids.pop(0)
        gen = live.generation
        if gen is None or gen.done:
            return
        if ids:
            text_out, stopped = gen.update(ids, self._stage)
            if text_out is not None:
                await self._emit(gen.item, text_out)
            if stopped:
                await self._finish(live, gen, "stop", stopped=True)
                return
        if (ids and comp.finish_reason is not None) or out.finished:
            await self._finish(live, gen, comp.finish_reason or "abort")

    async def _finish(self, live: _Live, gen: Reply, reason: str, *, stopped: bool = False) -> None:
        gen.done = True
        live.generation = None
        if live.pending and live.pending[0] is gen:
            live.pending.popleft()
        if not stopped and (out := gen.send(self._stage.decode(gen.ids), final=True)) is not None:
            await self._emit(gen.item, out)
        continuing = not stopped and reason != "abort" and self._live is live
        self._keep_reply(live, gen, continuing=continuing)
        self._stage.completed_requests += 1
        await self._emit(gen.item, gen.ended(reason))
        if stopped:
            self._drop(live)  # a stop string cannot end a streaming chunk early: abort
        elif reason == "abort":
            self._drop(live, aborted=False)
        await self._drain()

    async def _drain(self) -> None:
        while self._deferred and not self._closed:
            live = self._live
            if live is not None and live.generation is not None:
                return
            await self._dispatch(self._deferred.popleft())

    async def _fail(self, live: _Live, error: DuplexError) -> None:
        self._stage.failed_requests += 1
        gen = live.generation
        self._drop(live, aborted=False)
        self._deferred.clear()
        fence, rid = (gen.item.fence, gen.item.request_id) if gen else (live.fence, live.request_id)
        await self._emit_at(fence, rid, StageFailed(error))

    async def _emit(self, item: StageInput, payload: Any) -> None:
        await self._emit_at(item.fence, item.request_id, payload)

    async def _emit_at(self, fence: Fence, request_id: str, payload: Any) -> None:
        await self._queue.put(StageOutput(fence, request_id, self.name, payload,
                                          created_at=self._stage.clock.now()))
