"""The vLLM omni stage (type ``vllm_omni``): one engine (``EngineHost``)
serving a native audio+video model (Qwen2.5-Omni's thinker, MiniCPM-o 2.6), one
live streaming-input request per session (``stages/vllm/live.py``) -- the GPU
path of ``models/omni``.

Each ``OmniUnit`` becomes one chunk of the session's live request: its text
holds the dialect's placeholders (``prompt``) and its ``multi_modal_data`` the
unit's audio (``(float32 array, 16000)``) and frames (PIL images), so the audio
and vision encoders run and the KV cache fills while the user is still
speaking. At end of turn the ``GenerateRequest`` appends only the assistant
prefix, with the real sampling parameters. The reply's tokens stay in the KV;
the next turn appends to the same request.

Chunks are rendered (tokenized, audio features and image patches computed)
by the engine's renderer in its worker threads, on vLLM's input task for the
request -- never on the session's task. When the live request is lost (a
barge-in must abort a running reply; a new system prompt; a dead engine), the
session's chunks are replayed into a new request one by one. That is a
re-prefill of the whole context: vLLM 0.32 looks its prefix cache up only for
a streaming request's first chunk (measured on the tiny MiniCPM-o: a replayed
request reports 0 cached tokens), though its renderer's multimodal cache
spares processing the items again. What the user
said survives an epoch bump (it is input, not output); only an incarnation
bump voids it.

What the request holds is counted from what the renderer made of each chunk
(``Rendered``: its tokens, placeholders expanded, and its multimodal items),
and a reply's ``input_tokens`` are the tokens its request held when it
started. A context that outgrows ``max_model_len`` is truncated as the
session's ``truncation`` says (``domain/truncation.py``, as the cascade's LLM
stage does): at a reply, and at a user's unit or words when the context is
nearly full, the oldest messages after the system block leave the history
(their audio and images with them) and the rest is replayed into a new
request. A chunk that would still take the context to ``max_model_len``
(``disabled``, or one message alone too big) fails its turn with
``stage_failed`` before it reaches the engine: vLLM refuses a prompt of
``max_model_len`` tokens (``_validate_prompt_len``) but does not check a
streaming request's running total at all. A reply's ``max_tokens`` is
clamped to what the context leaves (vLLM would end it there too).

Text out only: speech comes from a ``tts`` stage after this one (vLLM serves
neither Qwen2.5-Omni's talker nor MiniCPM-o's TTS head).
"""

from __future__ import annotations

import os

# As the LLM stage (``stages/vllm/llm.py``), before vLLM reads its environment
# (an operator's own values win): 1 GiB of CPU KV cache instead of vLLM's 4+
# GiB default (the GPU ignores it), no AOT compilation in eager mode.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_USE_AOT_COMPILE", "0")

# ruff: noqa: E402  (the imports below must follow the environment defaults)
import asyncio
import dataclasses
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm import SamplingParams
from vllm.engine.protocol import EngineClient, StreamingInput
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.omni import OmniInstructions, OmniUnit
from vllm_duplex.domain.payloads import ContextMessage, GenerateRequest, StageInput, TextIn
from vllm_duplex.domain.truncation import Truncation, fit
from vllm_duplex.stages.omni.prompt import Chunk, OmniPrompt
from vllm_duplex.stages.omni.prompt import dialect as get_dialect
from vllm_duplex.stages.vllm.chat import sampling_options
from vllm_duplex.stages.vllm.decode import ReplyDecoder
from vllm_duplex.stages.vllm.host import EngineHost, EngineSettings, HostedStage
from vllm_duplex.stages.vllm.live import LivePort, LiveRequest, Reply


class VllmOmniStage(HostedStage):
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
        stop_loops: bool = True,
    ) -> None:
        if model is None and engine is None:
            raise ValueError(f"stage {name!r} needs a model (a local path or a cached hub name)")
        if model is not None and model.startswith("~"):
            model = os.path.expanduser(model)
        settings = EngineSettings(model, dtype, enforce_eager, max_model_len,
                                  enable_prefix_caching, dict(engine_kwargs or {}))
        self.host = EngineHost(name, settings, engine=engine, clock=clock,
                               restart_on_failure=restart_on_failure,
                               restart_backoff_s=restart_backoff_s)
        self.dialect = get_dialect(dialect)
        self.default_max_tokens = default_max_tokens
        self.stop_loops = stop_loops  # as the cascade's LLM stage (decode.py "loops")
        self.system_prompt = system_prompt
        # Each session's port while its session holds it: what its live request holds.
        self.ports: weakref.WeakValueDictionary[str, VllmOmniPort] = weakref.WeakValueDictionary()

    @property
    def engine_kwargs(self) -> dict[str, Any]:
        return dict(self.host.settings.engine_kwargs)

    def port(self, session_id: str) -> VllmOmniPort:
        port = VllmOmniPort(self, session_id)
        self.ports[session_id] = port
        return port


@dataclass(frozen=True)
class Rendered:
    """What vLLM's renderer made of one chunk: its token count (placeholders
    expanded into the items' embedding tokens), and per modality the number
    of items and the tokens they take; ``at``: when (the stage's clock)."""

    tokens: int
    items: Mapping[str, int]
    item_tokens: Mapping[str, int]
    at: float = 0.0

    @classmethod
    def of(cls, engine_input: Mapping[str, Any], at: float) -> Rendered:
        ranges = engine_input.get("mm_placeholders") or {}
        return cls(len(engine_input["prompt_token_ids"]),
                   {m: len(r) for m, r in ranges.items()},
                   {m: sum(p.length for p in r) for m, r in ranges.items()}, at)


@dataclass(eq=False)
class _Replayed(LiveRequest):
    """A live request holding a prefix (``sent`` chunks) of the session's
    ``OmniPrompt.history``. ``rendered``: each chunk it was sent, as the
    renderer made it (``at``: when); ``held``: the tokens it holds (rendered
    chunks and kept reply tokens); ``prompt_lens``: the prompt lengths the
    engine reported as it took the chunks in."""

    sent: int = 0
    limit: int = 0  # max_model_len
    counts: dict[Chunk, int] = field(default_factory=dict)  # the port's: tokens of each chunk rendered
    now: Callable[[], float] = time.monotonic  # the stage's clock
    held: int = 0
    rendered: list[Rendered] = field(default_factory=list)
    prompt_lens: list[int] = field(default_factory=list)
    cached_tokens: int | None = None  # prompt tokens vLLM's prefix cache served (first chunk only)
    replies: dict[int, Reply] = field(default_factory=dict)  # by the index of the chunk that asks
    pushed: int = 0
    progress: asyncio.Event = field(default_factory=asyncio.Event)  # set as each chunk is counted
    # Set while vLLM has taken every chunk queued (its input task came back
    # for the next one, so the last one went to the engine); cleared as more are queued.
    taken: asyncio.Event = field(default_factory=asyncio.Event)

    async def stream(self, render: Callable[[Any], Awaitable[Any]]) -> AsyncIterator[StreamingInput]:
        async def counted(chunk: Any) -> Any:
            engine_input = await render(chunk)
            r = Rendered.of(engine_input, self.now())
            if self.held + r.tokens >= self.limit:
                raise DuplexError("stage_failed", f"the omni context would exceed max_model_len "
                                                  f"({self.limit} tokens): {self.held} held, "
                                                  f"{r.tokens} more")
            self.held += r.tokens
            self.counts[chunk] = r.tokens
            self.progress.set()
            reply = self.replies.pop(len(self.rendered), None)
            self.rendered.append(r)
            if reply is not None:
                reply.base_len = self.held
            return engine_input

        async for chunk in super().stream(counted):
            yield chunk
            if self.inputs.empty():
                self.taken.set()


# Room kept for the assistant prefix when a user's chunk is fitted (ChatML's
# "<|im_end|>\n<|im_start|>assistant\n" is a few tokens; counted exactly at the reply).
GENERATION_TOKENS = 16


class VllmOmniPort(LivePort):
    """One session's port. Its context is ``prompt.history``; a live request
    holds a prefix of it, and a new one replays it."""

    _live: _Replayed | None

    def __init__(self, stage: VllmOmniStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._omni = stage
        self.prompt = OmniPrompt(stage.dialect, stage.system_prompt)
        self._held = 0  # most chunks any live request of this port held
        self._cut = False  # the last reply was cut off: kept as released, not yet as heard
        # Live requests replaced because a cut reply was heard shorter than
        # released (each is one more rebuild of the context).
        self.heard_replays = 0
        self._tokens: dict[Chunk, int] = {}  # each chunk's tokens, as the renderer made it
        self._truncation = Truncation()  # the last reply's (the session's)
        self._reply_tokens = stage.default_max_tokens  # the last reply's max_tokens
        self._largest = 0  # most tokens one user chunk took yet
        self.truncations = 0  # times the oldest messages were left out

    @property
    def live(self) -> _Replayed | None:
        """The session's live request (what it holds: ``rendered``, ``held``)."""
        return self._live

    def _new_live(self, vllm_id: str, item: StageInput, streaming: bool) -> _Replayed:
        if self._held:
            self._host.counters.rebuilds += 1  # replays a context an earlier request held
        return _Replayed(vllm_id, item.request_id, item.fence, streaming,
                         limit=self._host.max_model_len, counts=self._tokens, now=self._host.clock.now)

    async def _on_output(self, live: LiveRequest, out: RequestOutput) -> None:
        assert isinstance(live, _Replayed)
        n = len(getattr(out, "prompt_token_ids", None) or ())  # (a fake engine may not say)
        if n and (not live.prompt_lens or live.prompt_lens[-1] != n):
            live.prompt_lens.append(n)
        if live.cached_tokens is None:
            live.cached_tokens = getattr(out, "num_cached_tokens", None)
        await super()._on_output(live, out)

    def _outlived(self, work: Fence, fence: Fence, *, output: bool) -> bool:
        """Units and text are input: an epoch bump does not void them."""
        return work.incarnation < fence.incarnation or (output and work.is_stale_against(fence))

    async def _render(self, chunk: Chunk) -> Any:
        return await self._host.render(chunk.prompt())

    async def _handle(self, item: StageInput) -> None:
        p = item.payload
        if isinstance(p, OmniInstructions):
            await self._set_system(p.text)
        elif isinstance(p, OmniUnit):
            self.prompt.unit(p)
            await self._make_room()
            if not self._closed:
                self._sync(item)
        elif isinstance(p, TextIn):
            if p.text.strip():
                self.prompt.text(p.text)
                await self._make_room()
                if not self._closed:
                    self._sync(item)
        else:
            await self._generate(item, p)

    def _sync(self, item: StageInput, reply: Reply | None = None,
              params: SamplingParams | None = None) -> None:
        """Send the chunks of the history the live request lacks (all of
        them to a new request); the last one asks for ``reply``."""
        live = self._live or self._start(item)
        assert isinstance(live, _Replayed)
        history = self.prompt.history
        for i in range(live.sent, len(history)):
            last = reply is not None and i == len(history) - 1
            if last:
                live.replies[live.pushed] = reply  # type: ignore[assignment]
            live.pushed += 1
            self._push(live, item, history[i], reply if last else None, params if last else None)
        if live.sent < len(history):
            live.taken.clear()
        live.sent = len(history)
        self._held = max(self._held, live.sent)

    def _keep_reply(self, live: LiveRequest, reply: Reply, *, continuing: bool) -> None:
        """Record the reply in the history. A request that goes on holds
        every reply token but the last sampled one; a lost one is replayed
        with the text the client got."""
        if continuing:
            assert isinstance(live, _Replayed)
            kept = reply.ids[:-1]
            self.prompt.reply(self._host.chat.decode(kept, skip_special_tokens=False))
            live.sent = len(self.prompt.history)
            live.held += len(kept)
            if kept:
                live.pushed += 1  # the reply chunk: in the request, never rendered
                live.rendered.append(Rendered(len(kept), {}, {}, self._host.clock.now()))
                self._tokens[self.prompt.history[-1]] = len(kept)
        else:
            # What was released may be more than the client got (deltas on
            # their way when the cut came): the next reply's context says.
            self.prompt.reply(reply.decoder.answer.released)
            self._cut = True

    async def _keep_heard(self, context: tuple[ContextMessage, ...]) -> None:
        """After a cut, the model holds the cut reply as the client got it:
        the session's conversation (``context``'s last assistant message)
        wins over what this port released; when they differ, the live
        request (which replayed the released text) is replaced."""
        cut, self._cut = self._cut, False
        heard = next((m.text for m in reversed(context) if m.role == "assistant"), None)
        if cut and heard is not None and self.prompt.cut_reply(heard) and self._live is not None:
            self.heard_replays += 1
            await self._replace(self._live)

    async def _replace(self, live: LiveRequest) -> None:
        """Abort ``live`` (its context is replayed into a new request) once
        vLLM has taken every chunk queued on it. The renderer marks a chunk's
        audio and images as held by the engine when it makes them; an abort
        that cancels the request's input before that chunk reached the engine
        leaves the mark without the items, and the replayed chunk then fails
        with vLLM's "Multi-modal cache miss" (no token: the unit is lost to
        the model, and the next reply's first token is taken for that chunk's)."""
        assert isinstance(live, _Replayed)
        if not live.taken.is_set() and live.task is not None and not live.task.done():
            # taken, or the request ended on its own (its input task is gone)
            taken = asyncio.ensure_future(live.taken.wait())
            try:
                await asyncio.wait((taken, live.task), return_when=asyncio.FIRST_COMPLETED)
            finally:
                taken.cancel()
        if live is self._live:
            await self._abort([live])

    async def _set_system(self, text: str) -> None:
        if self.prompt.set_system(text) and self._live is not None:
            await self._replace(self._live)  # the next chunk replays under the new prompt

    async def _generate(self, item: StageInput, req: GenerateRequest) -> None:
        system = next((m.text for m in req.context if m.role == "system"), None)
        if system is not None:
            await self._set_system(system)
        await self._keep_heard(req.context)
        # A spoken reply: no tool calls (the policy advertises none).
        req = dataclasses.replace(req, tools=())
        reply = Reply(item, req, ReplyDecoder(self._host.chat.tokenizer, stops=req.sampling.stop,
                                                 stop_loops=self._omni.stop_loops))
        params = SamplingParams(detokenize=False, output_kind=RequestOutputKind.DELTA,
                                **sampling_options(req.sampling, self._omni.default_max_tokens))
        self._truncation = req.truncation
        self._reply_tokens = params.max_tokens or self._omni.default_max_tokens
        self.prompt.generation()
        total = await self._fit(self._room(self._reply_tokens), asking=True)
        if total is None or self._voided(item):
            return  # the port closed, or a cancel voided the reply meanwhile
        limit = self._host.max_model_len
        if total >= limit:
            raise DuplexError("stage_failed", f"the omni context would exceed max_model_len "
                                              f"({limit} tokens): {total} tokens to answer")
        if params.max_tokens is None or params.max_tokens > limit - total:
            params.max_tokens = limit - total  # where vLLM would end the reply anyway
        self._sync(item, reply, params)

    # ---- the context against max_model_len (the session's truncation) -------

    def _room(self, reply_tokens: int) -> int:
        """What the context may hold beside a reply of ``reply_tokens`` (at
        most half the context is kept for it, as the cascade's LLM stage)."""
        limit = self._host.max_model_len
        return limit - min(reply_tokens, limit // 2)

    async def _count(self) -> int | None:
        """The tokens the history holds, each chunk as the renderer made it.
        Chunks the live request was sent are waited for (the renderer is
        seconds behind at most); words no request rendered are rendered here.
        Audio and images never are: vLLM's renderer would then take their
        items as cached in the engine, which never got them ("Expected a
        cached item for mm_hash"); a lost request's are counted as the
        largest user chunk yet until a replay renders them. None: the port
        closed meanwhile."""
        live = self._live
        while isinstance(live, _Replayed) and live is self._live and not live.dropped and any(
                c not in self._tokens for c in self.prompt.history[:live.sent]):
            if live.task is not None and live.task.done():
                break
            live.progress.clear()
            try:
                await asyncio.wait_for(live.progress.wait(), 0.1)
            except TimeoutError:
                pass
        if self._closed:
            return None
        self._largest = max([self._largest, *(n for c, n in self._tokens.items()
                                              if c.kind in ("unit", "text"))])
        for chunk in list(self.prompt.history):
            if chunk not in self._tokens and not (chunk.audios or chunk.images):
                engine_input = await self._render(chunk)
                if self._closed:
                    return None
                self._tokens[chunk] = Rendered.of(engine_input, 0.0).tokens
        held = {id(c) for c in self.prompt.history}  # forget chunks the history no longer holds
        self._tokens = {c: n for c, n in self._tokens.items() if id(c) in held}
        if self._live is not None:
            assert isinstance(self._live, _Replayed)
            self._live.counts = self._tokens
        return sum(self._tokens.get(c, self._largest) for c in self.prompt.history)

    async def _fit(self, room: int, *, asking: bool) -> int | None:
        """Leave the oldest messages out when the history outgrew ``room``
        (``asking``: its last chunk is the assistant prefix, counted but not a
        message to keep or drop); the live request is replaced by one that
        replays what is kept. Returns the tokens the history holds then."""
        total = await self._count()
        if total is None or self._truncation.type == "disabled":
            return total
        history = self.prompt.history
        spans = self.prompt.messages()[: -1 if asking else None]

        def tokens(span: tuple[int, int]) -> int:
            return sum(self._tokens.get(c, self._largest) for c in history[span[0]:span[1]])

        tail = tokens((spans[-1][1], len(history))) if spans else 0
        head: tuple[int, int] = (0, 1)
        fitted = fit([head, *spans], tokens, room - tail, self._truncation,
                     is_instructions=lambda m: m is head)
        if not fitted.dropped:
            return total
        first = history[spans[fitted.dropped][0]]
        removed = self.prompt.drop(fitted.dropped)
        if first in self._tokens:  # it lost a closing tag: its count is a little high until rendered
            self._tokens[history[1]] = self._tokens[first]
        for chunk in removed:
            self._tokens.pop(chunk, None)
        self.truncations += 1
        if self._live is not None:
            await self._replace(self._live)  # the next chunk replays what is kept
        return tokens((0, len(history)))

    async def _make_room(self) -> None:
        """Before a user's unit or words go out: when the context is nearly
        full (what it holds, and room for a chunk or two more like the
        largest yet), fit it to the room a reply will need.

        That reply's size is only a guess here (the session may ask the next
        one for fewer tokens: a ``session.update``, a ``response.create``),
        and what is dropped on a guess is lost although that reply would have
        kept it: the guess is the last reply's ``max_tokens``, at most the
        stage's default. A larger reply makes its own room when it is asked
        for (``_generate``), as the cascade's LLM stage does."""
        if self._truncation.type == "disabled":
            return
        history = self.prompt.history
        known = unknown = 0
        for c in history:
            n = self._tokens.get(c)
            if n is None:
                unknown += 1
            else:
                known += n
                if c.kind in ("unit", "text"):
                    self._largest = max(self._largest, n)
        room = self._room(min(self._reply_tokens, self._omni.default_max_tokens)) - GENERATION_TOKENS
        if known + (unknown + 1) * self._largest >= room:
            await self._fit(room, asking=False)
