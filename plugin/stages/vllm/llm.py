"""The vLLM LLM stage (type ``vllm``): one engine (``EngineHost``) for every
session, one live streaming-input request per session (``live.py``), fed with
the session's text:

* ``TextIn`` (user words while they speak) -> a prefill chunk; the first word
  of a user turn opens the user message (the template's opener, found by
  rendering a sentinel message).
* ``GenerateRequest`` (end of turn): when the text the live request holds is a
  prefix of the rendered prompt, only the remainder (the end-of-user and
  assistant prefix, a few tokens) is appended with the real sampling params:
  the first token follows end of speech by one decode step (``fast_paths``).
  Otherwise the live request is aborted and a fresh one is started with the
  whole prompt (``rebuilds``; prefix caching keeps that cheap).
* ``ResetContext`` -> the live request is made to hold exactly the context:
  extended when it holds a prefix of it, else rebuilt.
* A reply that must be a tool call (``tool_choice`` required or named, or the
  stage's ``constrain_tools``) is a one-shot request under vLLM structured
  outputs, the tools described to the model.

Chat templates are rendered in a worker thread (``EngineHost.off_loop``); the
chunk a submission appends is tokenized on the loop (words, a turn's suffix;
a whole context only when the live request is rebuilt).

Application sessions (``text/app_sessions.py``) drive this same port.
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
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from vllm import SamplingParams
from vllm.engine.protocol import EngineClient
from vllm.inputs import tokens_input
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import (
    ContextMessage,
    GenerateRequest,
    ResetContext,
    StageInput,
    TextIn,
)
from vllm_duplex.stages.vllm.chat import SENTINEL, ChatTemplate, sampling_options
from vllm_duplex.stages.vllm.decode import ReplyDecoder
from vllm_duplex.stages.vllm.host import EngineHost, EngineSettings, HostedStage
from vllm_duplex.stages.vllm.live import LivePort, LiveRequest, Probe, Reply
from vllm_duplex.stages.vllm.window import ContextWindow
from vllm_duplex.stages.vllm.tools import (
    parse_tool_call as parse_tool_call,  # re-exported: tests
)
from vllm_duplex.stages.vllm.tools import tool_call_schema

# Text up to this long is tokenized on the event loop (~0.3 ms); longer text
# (a rebuilt conversation: ~17 ms for 2k tokens) in a worker thread.
INLINE_TOKENIZE_CHARS = 512
# Kept free at the start of a voice turn (beside the reply's max tokens) when
# the conversation is truncated: the user's words still to come.
USER_TURN_TOKENS = 128


def _warm_prompt(chat: ChatTemplate) -> list[Any]:
    """A turn as a session's live request streams it: the instructions, then
    the user's words in chunks whose turn-end logprobs are read. A fresh
    engine's first prompt of this length and first logprobs cost seconds on
    CPU (2.4 s on 2 cores, measured); paid here, not by the first user."""
    system = ContextMessage("system", "You are a helpful voice assistant. Answer in one short sentence.")
    head = opener_after(chat.render((system, ContextMessage("user", SENTINEL)), False), "") or ""
    return [tokens_input(chat.encode(text)) for text in (head + "What is the", " capital of France")]


class VllmLlmStage(HostedStage):
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
        turn_end_logprobs: int | None = 20,
        stop_loops: bool = True,
    ) -> None:
        settings = EngineSettings(str(model) if model is not None else None, dtype, enforce_eager,
                                  max_model_len, enable_prefix_caching, dict(engine_kwargs or {}))
        self.host = EngineHost(name, settings, engine=engine, clock=clock,
                               restart_on_failure=restart_on_failure,
                               restart_backoff_s=restart_backoff_s, warm_prompt=_warm_prompt)
        # P(end of turn) is read from the top ``turn_end_logprobs`` of each
        # user-words chunk's dropped token (None: not read; semantic_vad then
        # ends turns on silence alone).
        self.host.probe_logprobs = turn_end_logprobs
        self.default_max_tokens = default_max_tokens
        self.end_ids: frozenset[int] | None = None  # found from the chat template, once
        # Tools + last message from the user -> a grammar-constrained call (a
        # one-shot request: grammars do not follow streaming-input chunks).
        self.constrain_tools = constrain_tools
        # A reply that repeats one short unit over and over ends there
        # (decode.py "loops"); off for a model whose replies are noise anyway.
        self.stop_loops = stop_loops

    async def shutdown(self) -> None:
        await self.host.close()

    def port(self, session_id: str) -> VllmLlmPort:
        return VllmLlmPort(self, session_id)


@dataclass(eq=False)
class _Held(LiveRequest):
    """A live request and the text its KV holds."""

    held_text: str = ""
    held_len: int = 0
    messages: tuple[ContextMessage, ...] = ()  # the conversation held_text renders
    user_turn_open: bool = False  # a TextIn opened a user message nothing closed yet
    user_text: str = ""  # the words of that open user message


def opener_after(probe: str, held_text: str) -> str | None:
    """The text that opens a user message after ``held_text``, cut from
    ``probe`` (the messages rendered with a ``SENTINEL`` user message after
    them); None when the template does not extend ``held_text`` that way."""
    cut = probe.find(SENTINEL)
    if cut < len(held_text) or not probe.startswith(held_text):
        return None
    return probe[len(held_text):cut]


class VllmLlmPort(LivePort):
    """One session's port (see the module doc)."""

    _live: _Held | None

    def __init__(self, stage: VllmLlmStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._llm = stage
        self._window = ContextWindow(lambda text: self._chat.encode(text), self._host.off_loop)

    def _room(self, reply_tokens: int) -> int:
        """The context a conversation may fill beside a reply of
        ``reply_tokens`` (at most half the context: a larger max_tokens is
        clamped to what is left, not paid for by dropping the conversation)."""
        limit = self._host.max_model_len
        return limit - min(reply_tokens, limit // 2)

    @property
    def _chat(self) -> ChatTemplate:
        return self._host.chat

    @property
    def resident(self) -> bool:
        """Whether a live request (and so KV cache) is held for this session."""
        return self._live is not None

    async def release(self) -> bool:
        """Free the live request and its KV between turns (eviction); the
        next turn prefills again (from the prefix cache when it survived).
        False when a reply is running or input waits."""
        live = self._live
        if live is None or live.reply is not None or self._deferred or self._pumping:
            return False
        await self._abort([live])
        return True

    def _new_live(self, vllm_id: str, item: StageInput, streaming: bool) -> _Held:
        return _Held(vllm_id, item.request_id, item.fence, streaming)

    async def _handle(self, item: StageInput) -> None:
        payload = item.payload
        if isinstance(payload, ResetContext):
            await self._reset(item, payload)
        elif isinstance(payload, TextIn):
            await self._text_in(item, payload.text)
        else:
            await self._generate(item, payload)

    def _learn_end_ids(self, probe: str) -> None:
        """The tokens that end a user's turn, once: the chat template's end of
        a user message (what follows the sentinel in ``probe``, a rendered
        user message), and sentence-final punctuation."""
        if self._llm.end_ids is not None:
            return
        chat = self._host.chat
        ids: set[int] = set()
        tail = probe[probe.find(SENTINEL) + len(SENTINEL):]
        if tail.strip():
            ids.add(chat.encode(tail)[0])
        for mark in ("?", ".", "!"):
            enc = chat.encode(mark)
            if len(enc) == 1:
                ids.add(enc[0])
        self._llm.end_ids = frozenset(ids)

    async def _append(self, live: _Held, item: StageInput, text: str, reply: Reply | None = None,
                      params: SamplingParams | None = None, probe: bool = False) -> None:
        """Append ``text`` to ``live`` as one chunk (a prefill, or ``reply``'s prompt).
        A long text (a whole conversation, when the request is rebuilt) is
        tokenized in a worker thread: ~17 ms for 2k tokens on this CPU, on the
        event loop of every session."""
        if len(text) <= INLINE_TOKENIZE_CHARS:  # a few words: ~0.1 ms
            ids = self._chat.encode(text)
        else:
            ids = await self._host.off_loop(self._chat.encode, text)
            if self._voided(item) or live.dropped:
                return
        if not ids:
            return
        limit = self._host.max_model_len
        room = limit - live.held_len - len(ids)
        if room < 1:
            raise DuplexError("stage_failed", f"context exceeds max_model_len ({limit} tokens)")
        if params is not None and params.max_tokens is not None and params.max_tokens > room:
            params.max_tokens = room
        live.held_text += text
        live.held_len += len(ids)
        if reply is not None:
            reply.base_len = live.held_len
        turn_end = None
        end_ids = self._llm.end_ids
        if probe and live.streaming and self._host.probe_logprobs and end_ids:
            turn_end = Probe(item, live.user_text, end_ids)
        self._push(live, item, tokens_input(ids), reply, params, turn_end)

    def _keep_reply(self, live: LiveRequest, reply: Reply, *, continuing: bool) -> None:
        """A request that goes on holds the prompt and every reply token but
        the last sampled one (vLLM drops it when the next chunk arrives)."""
        if not continuing:
            return
        assert isinstance(live, _Held)
        kept = reply.ids[:-1]
        live.held_text += self._chat.decode(kept, skip_special_tokens=False)
        live.held_len += len(kept)
        live.messages = (*reply.request.context, ContextMessage("assistant", reply.decoder.text))

    # ---- submissions -----------------------------------------------------

    async def _reset(self, item: StageInput, payload: ResetContext) -> None:
        """Make the live request hold exactly ``payload.context``. When what it
        holds is already a prefix of that (the usual case at the start of a
        turn), only the rest is appended; otherwise it is rebuilt. A rollback
        comes after a fence bump whose cancel already dropped the live request,
        so it always rebuilds."""
        # Room for the user's next words and the reply after them.
        room = self._room(self._llm.default_max_tokens) - USER_TURN_TOKENS
        context = await self._window.fit(payload.context, payload.truncation, room)
        text = await self._host.off_loop(self._chat.render, context, False)
        if self._voided(item):
            return
        counters, live = self._host.counters, self._live
        if live is not None and not live.user_turn_open and text.startswith(live.held_text):
            counters.fast_paths += 1
            live.messages = context
            if len(text) > len(live.held_text):
                await self._append(live, item, text[len(live.held_text):])
            return
        if live is not None:
            counters.rebuilds += 1
        live = self._start(item)
        live.messages = context
        await self._append(live, item, text)

    async def _text_in(self, item: StageInput, text: str) -> None:
        live = self._live
        if live is not None and live.user_turn_open:
            # Words joined by one space, as a transcript joins them; a leading
            # space also makes each word tokenize as it does in the whole text.
            live.user_text = f"{live.user_text} {text.strip()}".strip()
            await self._append(live, item, text if text[:1].isspace() else " " + text, probe=True)
            return
        words = text.lstrip()
        if not words:
            return
        messages = live.messages if live is not None else ()
        probe = await self._host.off_loop(
            self._chat.render, (*messages, ContextMessage("user", SENTINEL)), False)
        if self._voided(item):
            return
        self._learn_end_ids(probe)
        if self._live is not live:  # dropped meanwhile (a cancel, an eviction): start over
            await self._text_in(item, text)
            return
        opener = opener_after(probe, live.held_text) if live is not None else None
        if live is None or opener is None:
            if live is not None:  # the template cannot extend what it holds
                self._host.counters.rebuilds += 1
            live = self._start(item)
            live.messages = messages
            opener = opener_after(probe, "")
            if opener is None:
                raise DuplexError("stage_failed", "the chat template has no user message prefix")
        live.user_turn_open = True
        live.user_text = words.strip()
        await self._append(live, item, opener + words, probe=True)

    async def _generate(self, item: StageInput, req: GenerateRequest) -> None:
        counters, chat = self._host.counters, self._chat
        room = self._room(req.sampling.max_tokens or self._llm.default_max_tokens)
        kept = await self._window.fit(req.context, req.truncation, room)
        if self._voided(item):
            return
        if kept != req.context:  # the reply (and what the request holds after it) is of these
            req = dataclasses.replace(req, context=kept)
        tools = req.callable_tools()
        # A small model cannot be trusted to write a valid call: when one must
        # be made (tool_choice "required" or a named function, or the stage
        # always constrains), the grammar of vLLM's structured outputs writes it.
        constrained = bool(tools and (req.must_call or self._llm.constrain_tools) and req.context
                           and req.context[-1].role == "user")
        if constrained:  # a one-shot request: the model may see the tools described
            prompt = await self._host.off_loop(chat.render_with_tools, req.context, tools)
        else:
            prompt = await self._host.off_loop(chat.render, req.context, True, tools)
        if self._voided(item):
            return
        reply = Reply(item, req, ReplyDecoder(chat.tokenizer, stops=req.sampling.stop, tools=tools,
                                              hold_tools=constrained,
                                              stop_loops=self._llm.stop_loops))
        if constrained:
            counters.fresh_prefills += 1
            params = self._sampling(req, StructuredOutputsParams(json=tool_call_schema(tools)))
            await self._append(self._start(item, streaming=False), item, prompt, reply, params)
            return
        live = self._live
        if live is not None and len(prompt) > len(live.held_text) and prompt.startswith(live.held_text):
            counters.fast_paths += 1
            text = prompt[len(live.held_text):]
        else:
            if live is not None:
                counters.rebuilds += 1
            else:
                counters.fresh_prefills += 1
            live, text = self._start(item), prompt
        live.user_turn_open = False
        live.user_text = ""
        live.messages = req.context
        await self._append(live, item, text, reply, self._sampling(req, logprobs=self._host.probe_logprobs))

    def _sampling(self, req: GenerateRequest, structured: StructuredOutputsParams | None = None,
                  logprobs: int | None = None) -> SamplingParams:
        # max_tokens is clamped to the room left in the context by _append.
        return SamplingParams(detokenize=False, structured_outputs=structured, logprobs=logprobs,
                              output_kind=RequestOutputKind.DELTA,
                              **sampling_options(req.sampling, self._llm.default_max_tokens))
