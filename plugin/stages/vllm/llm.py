"""The vLLM LLM stage: one ``AsyncLLM`` for every session, one live
streaming-input request per session.

Each session's conversation lives in ONE vLLM request fed by an async
generator of ``StreamingInput`` chunks, so its KV cache persists across
chunks and turns:

* ``TextIn`` (user words while they speak) -> a prefill chunk with
  ``max_tokens=1``. vLLM samples one token and then drops it when the next
  chunk arrives (``Scheduler._update_request_as_session`` keeps only
  *computed* tokens; the last sampled one never is), so the KV holds exactly
  the prompt tokens. Verified: streaming-prefill replies equal one-shot ones.
* ``GenerateRequest`` (end of turn): when the text the live request holds is a
  prefix of the rendered prompt, only the remainder (the end-of-user and
  assistant prefix, a few tokens) is appended with the real sampling params:
  the first token follows end of speech by one decode step. Otherwise the
  live request is aborted and a fresh one is started with the whole prompt
  (``rebuilds``; prefix caching keeps that cheap).
* After a reply the live request stays open: its reply tokens stay in the KV
  except the last sampled one (the end-of-turn token when it stopped on
  EOS), for the same reason as above; the next turn appends to it.
* ``ResetContext`` -> abort, and a new live request prefilled with the context.

Streaming input rejects ``stop`` strings, so the stage enforces them itself
(and aborts the live request when one matches: generation cannot be stopped
early without abort). All model work runs in vLLM's engine process; the
port's tasks only await.
"""

from __future__ import annotations

import os

# Defaults that must be in place before vLLM reads its environment (setdefault:
# an operator's own values win). 1 GiB of CPU KV cache is ~23k tokens for the
# 135M default, far more than it needs (vLLM's default would take 4+ GiB);
# AOT compilation is pointless in eager mode; model hubs are unreachable.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402  (the imports below must follow the environment defaults)
import asyncio
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from vllm import SamplingParams
from vllm.engine.protocol import EngineClient, StreamingInput
from vllm.inputs import tokens_input
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.exceptions import EngineDeadError
from vllm_duplex.core.clock import Clock, MonotonicClock
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.fence import Fence
from vllm_duplex.core.payloads import (
    ContextMessage,
    GenerateRequest,
    ResetContext,
    StageFailed,
    StageInput,
    StageOutput,
    TextIn,
)
from vllm_duplex.stages.lifecycle import Lifecycle, Metered, StageCounter
from vllm_duplex.stages.vllm.chat import (
    ChatTemplate,
    Reply,
    sampling_options,
    tool_call_schema,
)
from vllm_duplex.stages.vllm.chat import (
    parse_tool_call as parse_tool_call,  # re-exported: tests import it from here
)
from vllm_duplex.stages.vllm.supervisor import EngineSupervisor, build_in_thread

log = logging.getLogger(__name__)

OUTPUT_QUEUE_SIZE = 256  # backpressure: the consumer task waits when the session lags
_CLOSED: Any = object()
_PREFILL: Any = object()  # a pending prefill chunk: one sampled token that vLLM drops


def _prefill_params() -> SamplingParams:
    # detokenize=False: the port decodes reply ids itself (vLLM's detokenizer
    # state spans the dropped tokens of earlier chunks).
    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                          output_kind=RequestOutputKind.DELTA)


# ---- the shared stage --------------------------------------------------------


class VllmLlmStage(ChatTemplate, Lifecycle, Metered):
    """Owns (or borrows) the engine; ``port(session_id)`` gives a session's port.

    ``engine`` may be an already running engine client (e.g. the one ``vllm
    serve`` built), which the stage then never shuts down nor restarts (its
    owner does). Otherwise ``start`` builds an ``AsyncLLM`` from ``model``
    (default: the prepared SmolLM2), and with ``restart_on_failure`` a
    supervisor rebuilds it when it dies (``restart_backoff_s`` between failed
    attempts, doubling); requests running on the dead engine fail
    (``engine_dead``) and ports prefill afresh on the new one.
    """

    accepted: ClassVar[tuple[type, ...]] = (TextIn, GenerateRequest, ResetContext)
    serves_text: ClassVar[bool] = True  # the engine's HTTP text surfaces run on this stage

    def __init__(
        self,
        name: str = "llm",
        *,
        model: str | Path | None = None,
        engine: EngineClient | None = None,
        dtype: str | None = None,
        enforce_eager: bool | None = None,
        max_model_len: int = 2048,
        enable_prefix_caching: bool = True,
        default_max_tokens: int = 512,
        constrain_tools: bool = False,
        clock: Clock | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        restart_on_failure: bool = True,
        restart_backoff_s: float = 1.0,
    ) -> None:
        self.name = name
        self.clock = clock or MonotonicClock()
        self.model = str(model) if model is not None else None
        self.dtype = dtype
        self.enforce_eager = enforce_eager
        self.max_model_len = max_model_len
        self.enable_prefix_caching = enable_prefix_caching
        self.default_max_tokens = default_max_tokens
        # Tools + last message from the user -> a grammar-constrained call (a
        # one-shot request: grammars do not follow streaming-input chunks).
        self.constrain_tools = constrain_tools
        self.engine_kwargs = dict(engine_kwargs or {})
        self._engine = engine
        self._owns_engine = engine is None
        self._tokenizer: Any = None
        self._start_lock = asyncio.Lock()
        self._ids = itertools.count()  # makes vLLM request ids unique per live request
        self.engine_start_s: float | None = None
        # Counters (shared by all ports; /metrics reads them).
        self.active_requests = 0  # live vLLM requests
        self.aborted_requests = 0
        self.completed_requests = 0  # generations that finished
        self.failed_requests = 0
        self.fast_paths = 0  # GenerateRequests that appended to the live request
        self.rebuilds = 0  # ... that had to abort a diverged live request
        self.fresh_prefills = 0  # ... that found no live request
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
        """For ``/health``: False once the engine died (until a restart
        replaced it) or before it started."""
        return self._engine is not None and not self._engine.errored

    async def start(self) -> None:
        """Build the engine (in a worker thread: it takes tens of seconds and
        must not stall the event loop) and warm it up; idempotent."""
        async with self._start_lock:
            if self._tokenizer is not None:
                return
            started = time.monotonic()
            if self._engine is None:
                self._engine = await build_in_thread(self._build_engine, lambda e: e.shutdown())
            await self._load_tokenizer(self._engine)
            await self._warm_up(self._engine)
            self.engine_start_s = time.monotonic() - started
            log.info("stage %s: engine ready in %.1f s", self.name, self.engine_start_s)
            if self.restart_on_failure:
                self.supervisor.start()

    async def _warm_up(self, engine: EngineClient) -> None:
        # One token through the engine: starts its output handler on this
        # loop (it must exist before sessions) and proves the engine works.
        warm = self._prefill_ids(self.render((ContextMessage("user", "Hi"),), True))
        async for _ in engine.generate(tokens_input(warm), _prefill_params(),
                                       f"duplex-warmup.{uuid.uuid4().hex}"):
            pass

    async def _restart(self) -> None:
        """The supervisor's: replace the dead engine with a new, warm one. The
        dead one stays ``_engine`` (unhealthy; new work fails at once with
        ``engine_dead``) until the swap."""
        started = time.monotonic()
        log.warning("stage %s: the vLLM engine died; restarting it", self.name)
        if self._engine is not None:
            self._engine.shutdown()  # its process is gone: frees the client side
        engine = await build_in_thread(self._build_engine, lambda e: e.shutdown())
        try:
            await self._warm_up(engine)
        except BaseException:
            engine.shutdown()
            raise
        self._engine = engine
        self.engine_start_s = time.monotonic() - started
        log.warning("stage %s: engine restarted in %.1f s", self.name, self.engine_start_s)

    def _build_engine(self) -> EngineClient:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        model = self.model
        if model is None:
            from vllm_duplex.assets.prepare import prepared_model_dir

            model = str(prepared_model_dir())
        cpu = current_platform.is_cpu()
        # float32 + eager on CPU: deterministic greedy answers (bf16 answers
        # differently) and no compile time; GPUs keep vLLM's own defaults.
        args = AsyncEngineArgs(
            model=model,
            dtype=self.dtype or ("float32" if cpu else "auto"),
            enforce_eager=cpu if self.enforce_eager is None else self.enforce_eager,
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching,
            **self.engine_kwargs,
        )
        return AsyncLLM.from_engine_args(args)

    async def shutdown(self) -> None:
        """Stop the engine if the stage built it. Synchronous on purpose: from
        a worker thread the output handler would see the engine die first and
        log a spurious EngineDeadError; this runs once, at process end."""
        await self.supervisor.close()  # first: no restart after this
        if self._owns_engine and self._engine is not None:
            engine, self._engine = self._engine, None
            engine.shutdown()

    async def close(self) -> None:
        """What ``Runtime.stop`` calls on every stage."""
        await self.shutdown()

    def port(self, session_id: str) -> VllmLlmPort:
        return VllmLlmPort(self, session_id)

    def next_request_id(self, request_id: str) -> str:
        return f"{request_id}.{next(self._ids)}"


# ---- per-session state -------------------------------------------------------


@dataclass(eq=False)
class _Live:
    """A session's live vLLM request and the text its KV holds."""

    vllm_id: str
    request_id: str  # the StageInput that started it (failures are reported under it)
    fence: Fence  # newest fence of the work appended to it
    streaming: bool = True  # False: a one-shot request (constrained tool call)
    inputs: asyncio.Queue[StreamingInput | None] = field(default_factory=asyncio.Queue)
    held_text: str = ""
    held_len: int = 0
    messages: tuple[ContextMessage, ...] = ()  # the conversation held_text renders
    user_turn_open: bool = False  # a TextIn opened a user message nothing closed yet
    pending: deque[Any] = field(default_factory=deque)  # _PREFILL | Reply, in order
    generation: Reply | None = None
    dropped: bool = False
    abort_sent: bool = False
    task: asyncio.Task[None] | None = None

    async def stream(self) -> AsyncIterator[StreamingInput]:
        # The input queue only holds chunks vLLM has not pulled yet (its input
        # task pulls them at once), so it stays a few chunks long.
        while (chunk := await self.inputs.get()) is not None:
            yield chunk


class VllmLlmPort:
    """One session's port. Submissions are handled synchronously up to
    engine I/O; a reply's tokens are read by the live request's own task.
    Input that arrives while a reply streams waits (in order) until it ends."""

    def __init__(self, stage: VllmLlmStage, session_id: str) -> None:
        self.name = stage.name
        self.session_id = session_id
        self._stage = stage
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=OUTPUT_QUEUE_SIZE)
        self._live: _Live | None = None
        self._lives: set[_Live] = set()  # every request whose task has not ended
        self._deferred: deque[StageInput] = deque()
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
            return  # cancelled already: it would only generate for nobody
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
        self._queue.put_nowait(_CLOSED)  # so any other reader ends too

    async def cancel(self, fence: Fence) -> None:
        """Abort every request of an older fence; when this returns, none of
        them produces anything any more (the engine dropped them)."""
        if fence.session_id != self.session_id:
            raise ValueError(f"port of session {self.session_id!r} cancelled with {fence}")
        if self._floor is None or self._floor.is_stale_against(fence):
            self._floor = fence
        self._deferred = deque(i for i in self._deferred if not i.fence.is_stale_against(fence))
        stale = [lv for lv in self._lives if lv.dropped or lv.fence.is_stale_against(fence)
                 or (lv.generation is not None and lv.generation.item.fence.is_stale_against(fence))]
        await self._abort(stale)
        await self._drain()  # input of the new fence that waited for the aborted reply

    @property
    def resident(self) -> bool:
        """Whether a live request (and so KV cache) is held for this session."""
        return self._live is not None

    async def release(self) -> bool:
        """Free the live request and its KV between turns (eviction); the
        next turn prefills again (from the prefix cache when it survived).
        False when a reply is running or input waits."""
        live = self._live
        if live is None or live.generation is not None or self._deferred:
            return False
        await self._abort([live])
        return True

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._deferred.clear()
        await self._abort(list(self._lives))
        while self._queue.full():  # outputs nobody read are moot after close
            self._queue.get_nowait()
        self._queue.put_nowait(_CLOSED)

    # ---- request lifecycle -----------------------------------------------

    def _start(self, item: StageInput, *, streaming: bool = True) -> _Live:
        if self._live is not None:
            self._drop(self._live)
        live = _Live(self._stage.next_request_id(item.request_id), item.request_id, item.fence,
                     streaming)
        self._live = live
        return live

    def _run(self, live: _Live, prompt: Any) -> None:
        if live.task is not None:  # already reading its (streaming) request
            return
        live.task = asyncio.create_task(self._consume(live, prompt), name=f"duplex-llm-{live.vllm_id}")
        self._lives.add(live)
        self._stage.active_requests += 1

    def _drop(self, live: _Live, *, aborted: bool = True) -> None:
        """Forget ``live``. Its task is cancelled, and vLLM's ``generate``
        aborts the request when its consumer is cancelled; from inside that
        task, the task itself sends the abort (see ``_consume``). cancel and
        close also abort explicitly and wait."""
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
        except Exception:  # a dead engine has nothing left to abort
            log.debug("abort of %s failed", ids, exc_info=True)
        tasks = [lv.task for lv in lives if lv.task is not None and lv.task is not asyncio.current_task()]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def _append(self, live: _Live, item: StageInput, text: str, gen: Reply | None = None,
                params: SamplingParams | None = None) -> None:
        """Append ``text`` to ``live`` as one chunk (a prefill, or ``gen``'s prompt)."""
        ids = self._stage._prefill_ids(text)
        if not ids:
            return
        room = self._stage.max_model_len - live.held_len - len(ids)
        if room < 1:
            raise DuplexError("stage_failed", f"context exceeds max_model_len "
                              f"({self._stage.max_model_len} tokens)")
        if params is not None and params.max_tokens is not None and params.max_tokens > room:
            params.max_tokens = room
        if item.fence > live.fence:
            live.fence = item.fence
        live.held_text += text
        live.held_len += len(ids)
        if gen is None:
            live.pending.append(_PREFILL)
            params = _prefill_params()
        else:
            gen.base_text, gen.base_len = live.held_text, live.held_len
            live.pending.append(gen)
            live.generation = gen
        assert params is not None
        if live.streaming:
            live.inputs.put_nowait(StreamingInput(tokens_input(ids), params))
            self._run(live, live.stream())
        else:
            self._run(live, (tokens_input(ids), params))

    # ---- submissions -----------------------------------------------------

    async def _dispatch(self, item: StageInput) -> None:
        try:
            payload = item.payload
            if isinstance(payload, ResetContext):
                self._reset(item, payload)
            elif isinstance(payload, TextIn):
                self._text_in(item, payload.text)
            else:
                self._generate(item, payload)
        except Exception as exc:
            log.exception("stage %s failed on %s", self.name, item.request_id)
            self._stage.failed_requests += 1
            if self._live is not None:
                self._drop(self._live)
            err = exc if isinstance(exc, DuplexError) else DuplexError(
                "stage_failed", f"stage {self.name!r} failed: {exc!r}")
            await self._emit(item, StageFailed(err))

    def _reset(self, item: StageInput, payload: ResetContext) -> None:
        """Make the live request hold exactly ``payload.context``. When what it
        holds is already a prefix of that (the usual case at the start of a
        turn), only the rest is appended; otherwise it is rebuilt. A rollback
        comes after a fence bump whose cancel already dropped the live request,
        so it always rebuilds."""
        text = self._stage.render(payload.context, False)
        live = self._live
        if live is not None and not live.user_turn_open and text.startswith(live.held_text):
            self._stage.fast_paths += 1
            live.messages = payload.context
            if len(text) > len(live.held_text):
                self._append(live, item, text[len(live.held_text):])
            return
        if live is not None:
            self._stage.rebuilds += 1
        live = self._start(item)
        live.messages = payload.context
        self._append(live, item, text)

    def _text_in(self, item: StageInput, text: str) -> None:
        live = self._live
        if live is not None and live.user_turn_open:
            # Words joined by one space, as a transcript joins them; a leading
            # space also makes each word tokenize as it does in the whole text.
            self._append(live, item, text if text[:1].isspace() else " " + text)
            return
        text = text.lstrip()
        if not text:
            return
        opener = self._stage.user_opener(live.messages, live.held_text) if live else None
        if live is None or opener is None:
            messages = live.messages if live else ()
            if live is not None:  # the template cannot extend what it holds
                self._stage.rebuilds += 1
            live = self._start(item)
            live.messages = messages
            opener = self._stage.user_opener(messages, "")
            if opener is None:
                raise DuplexError("stage_failed", "the chat template has no user message prefix")
        live.user_turn_open = True
        self._append(live, item, opener + text)

    def _generate(self, item: StageInput, req: GenerateRequest) -> None:
        stage = self._stage
        tools = req.callable_tools()
        prompt = stage.render(req.context, True, tools)
        gen = Reply(item, req, "", 0)
        # A small model cannot be trusted to write a valid call: when one must
        # be made (tool_choice "required" or a named function, or the stage
        # always constrains), the grammar of vLLM's structured outputs writes it.
        if (tools and (req.must_call or stage.constrain_tools) and req.context
                and req.context[-1].role == "user"):
            params = self._sampling(req, StructuredOutputsParams(json=tool_call_schema(tools)))
            gen.tool_hold = True
            stage.fresh_prefills += 1
            # A one-shot request: the model may see the tools described.
            self._append(self._start(item, streaming=False), item,
                         stage.render_with_tools(req.context, tools), gen, params)
            return
        live = self._live
        if live is not None and len(prompt) > len(live.held_text) and prompt.startswith(live.held_text):
            stage.fast_paths += 1
            text = prompt[len(live.held_text):]
        else:
            if live is not None:
                stage.rebuilds += 1
            else:
                stage.fresh_prefills += 1
            live, text = self._start(item), prompt
        live.user_turn_open = False
        live.messages = req.context
        self._append(live, item, text, gen, self._sampling(req))

    def _sampling(self, req: GenerateRequest,
                  structured: StructuredOutputsParams | None = None) -> SamplingParams:
        # max_tokens is clamped to the room left in the context by _append.
        return SamplingParams(detokenize=False, structured_outputs=structured,
                              output_kind=RequestOutputKind.DELTA,
                              **sampling_options(req.sampling, self._stage.default_max_tokens))

    # ---- outputs ---------------------------------------------------------

    async def _consume(self, live: _Live, prompt: Any) -> None:
        engine = self._stage.engine
        source, params = (prompt, _prefill_params()) if live.streaming else prompt
        try:
            async for out in engine.generate(source, params, live.vllm_id):
                if not live.dropped:
                    await self._on_output(live, out)
                if live.dropped and not live.abort_sent:
                    # Dropped from inside this task (stop string, a waiting
                    # ResetContext...): abort; the abort output ends the loop.
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
        # Outputs of several chunks may arrive merged (vLLM's collector merges
        # deltas when we lag), so route tokens by count: a prefill chunk has
        # exactly one (dropped) token; nothing follows a reply until it ends.
        while ids and live.pending and live.pending[0] is _PREFILL:
            live.pending.popleft()
            ids.pop(0)
        gen = live.generation
        if gen is None or gen.done:
            return
        if ids:
            await self._feed(live, gen, ids)
        if gen.done:
            return
        # A finish reason with no reply token in this output was a prefill's.
        if (ids and comp.finish_reason is not None) or out.finished:
            await self._finish(live, gen, comp.finish_reason or "abort")

    async def _feed(self, live: _Live, gen: Reply, new_ids: list[int]) -> None:
        out, stopped = gen.update(new_ids, self._stage)
        if out is not None:
            await self._emit(gen.item, out)
        if stopped:
            await self._finish(live, gen, "stop", stopped=True)

    async def _finish(self, live: _Live, gen: Reply, reason: str, *,
                      stopped: bool = False) -> None:
        gen.done = True
        live.generation = None
        if live.pending and live.pending[0] is gen:
            live.pending.popleft()
        if not stopped and (out := gen.send(self._stage.decode(gen.ids), final=True)) is not None:
            await self._emit(gen.item, out)
        live.held_text, live.held_len, live.messages = gen.held(self._stage)
        self._stage.completed_requests += 1
        await self._emit(gen.item, gen.ended(reason))
        if stopped:
            # A stop string cannot end a streaming chunk early: abort the
            # request (``_consume`` sends it; the next turn rebuilds from the
            # prefix cache).
            self._drop(live)
        elif reason == "abort" or not live.streaming:
            self._drop(live, aborted=False)  # the request is over anyway
        await self._drain()

    async def _drain(self) -> None:
        """Submit what waited for the reply, until one starts another reply."""
        while self._deferred and not self._closed:
            live = self._live
            if live is not None and live.generation is not None:
                return
            await self._dispatch(self._deferred.popleft())

    async def _fail(self, live: _Live, error: DuplexError) -> None:
        self._stage.failed_requests += 1
        gen = live.generation
        if self._live is live:
            self._live = None
        live.dropped = True
        self._deferred.clear()
        fence, rid = (gen.item.fence, gen.item.request_id) if gen else (live.fence, live.request_id)
        await self._emit_at(fence, rid, StageFailed(error))

    async def _emit(self, item: StageInput, payload: Any) -> None:
        await self._emit_at(item.fence, item.request_id, payload)

    async def _emit_at(self, fence: Fence, request_id: str, payload: Any) -> None:
        await self._queue.put(StageOutput(fence, request_id, self.name, payload,
                                          created_at=self._stage.clock.now()))
