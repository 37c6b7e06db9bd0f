"""Deterministic stages for control-plane tests and benchmarks.

They follow the ``StagePort`` contract to the letter (fenced work, real
aborts, outputs that end on close) but compute nothing expensive: an energy
VAD over the audio timeline, an LLM that always says the same words, and a
TTS that speaks each sentence as a sine tone. All waiting goes through the
injected ``Clock`` so tests can drive them with ``VirtualClock``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    AudioOut,
    EndOfText,
    GenerateRequest,
    GenerationDone,
    SpeechDone,
    StageInput,
    TextDelta,
    ToolCall,
)
from vllm_duplex.stages.port import FencedPort, StageBase, StagePort

log = logging.getLogger(__name__)

DEFAULT_REPLY = "Hello from the scripted duplex engine. Every turn gets this same answer."


# ---- LLM -------------------------------------------------------------------


def split_tokens(text: str) -> list[str]:
    """Words with their whitespace attached; ``"".join`` gives ``text`` back."""
    return re.findall(r"\s*\S+\s*", text)


class ScriptedLlmStage(StageBase):
    """``GenerateRequest`` in; the same reply, word by word, out.

    ``fail_on`` injects a fault: a request whose last user message contains
    it raises after the reply's first word (the port reports ``stage_failed``).
    With ``call_tools``, a request that may call a tool calls the first one
    (arguments ``tool_arguments``) unless the conversation ends with a tool's
    output, which gets the reply: a tool round trip for client tests.
    ``slow_on``: a request whose last user message contains it gets its
    tokens ``slow_interval_s`` apart (a reply still going out when a test
    kills its worker). With ``recall``, the reply ends with the user's turn before the last one
    ("You said before: ..."): a follow-up that is answered right only when
    the context holds the earlier turn (the adoption tests).
    """

    accepted = (GenerateRequest,)

    def __init__(
        self,
        name: str = "llm",
        *,
        clock: Clock,
        reply: str = DEFAULT_REPLY,
        token_interval_s: float = 0.02,
        fail_on: str | None = None,
        call_tools: bool = False,
        tool_arguments: str = "{}",
        recall: bool = False,
        slow_on: str | None = None,
        slow_interval_s: float = 0.5,
    ) -> None:
        super().__init__(name, clock)
        self.reply = reply
        self.recall = recall
        self.slow_on = slow_on
        self.slow_interval_s = slow_interval_s
        self.token_interval_s = token_interval_s
        self.fail_on = fail_on
        self.call_tools = call_tools
        self.tool_arguments = tool_arguments

    def port(self, session_id: str) -> StagePort:
        return _LlmPort(self, session_id)


class _LlmPort(FencedPort):
    _stage: ScriptedLlmStage

    async def _handle(self, item: StageInput) -> None:
        self._spawn(item, lambda: self._generate(item))

    async def _generate(self, item: StageInput) -> None:
        req: GenerateRequest = item.payload
        tools = req.callable_tools() if self._stage.call_tools else ()
        answered = bool(req.context) and req.context[-1].role == "tool"
        if tools and (req.must_call or not answered):
            tool = tools[0]
            name = tool.get("name") or (tool.get("function") or {}).get("name", "")
            call_id = f"call_{req.response_id.removeprefix('resp_')}"
            await self._emit(item.fence, item.request_id,
                             ToolCall(req.response_id, call_id, name, self._stage.tool_arguments))
            await self._emit(item.fence, item.request_id,
                             GenerationDone(req.response_id, "tool_calls", output_tokens=1))
            return
        reply = self._stage.reply
        if self._stage.recall:
            users = [m.text for m in req.context if m.role == "user"]
            reply += f" You said before: {users[-2] if len(users) > 1 else 'nothing'}."
        tokens = split_tokens(reply)
        limit = req.sampling.max_tokens
        finish = "stop"
        if limit is not None and limit < len(tokens):
            tokens, finish = tokens[: max(0, limit)], "length"
        said = next((m.text for m in reversed(req.context) if m.role == "user"), "")
        fail = self._stage.fail_on is not None and self._stage.fail_on in said
        slow = self._stage.slow_on is not None and self._stage.slow_on in said
        interval = self._stage.slow_interval_s if slow else self._stage.token_interval_s
        for i, token in enumerate(tokens):
            if i:
                if fail:
                    raise RuntimeError(f"scripted fault on {self._stage.fail_on!r}")
                await self._clock.sleep(interval)
            await self._emit(item.fence, item.request_id, TextDelta(req.response_id, token))
        words_in = sum(len(m.text.split()) for m in req.context)
        done = GenerationDone(req.response_id, finish, input_tokens=words_in, output_tokens=len(tokens))
        await self._emit(item.fence, item.request_id, done)


# ---- TTS -------------------------------------------------------------------

# Terminal punctuation (and closing quotes/brackets), then whitespace or the
# end of what has arrived so far.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*(?:\s+|$)")
_TONE_AMPLITUDE = 32767.0 * 10.0 ** (-12.0 / 20.0)  # -12 dBFS peak
_FLUSH: Any = object()  # "no more text" marker in a speech's work queue


@dataclass
class _Speech:
    """The text of one response that TTS is turning into audio."""

    response_id: str
    buffer: str = ""
    finished: bool = False  # GenerationDone / EndOfText received
    work: asyncio.Queue[tuple[Fence, str, Any]] = field(default_factory=asyncio.Queue)


class ToneTtsStage(StageBase):
    """``TextDelta`` / ``GenerationDone`` / ``EndOfText`` in; ``AudioOut``
    chunks (one sine tone per sentence) and ``SpeechDone`` out."""

    accepted = (TextDelta, GenerationDone, EndOfText)

    def __init__(
        self,
        name: str = "tts",
        *,
        clock: Clock,
        rate: int = 24000,
        ms_per_word: int = 120,
        chunk_ms: int = 40,
        freq_hz: float = 440.0,
    ) -> None:
        super().__init__(name, clock)
        self.rate = rate
        self.ms_per_word = ms_per_word
        self.chunk_ms = chunk_ms
        self.freq_hz = freq_hz

    def port(self, session_id: str) -> StagePort:
        return _TtsPort(self, session_id)

    def tone(self, words: int) -> np.ndarray:
        n = self.rate * words * self.ms_per_word // 1000
        t = np.arange(n, dtype=np.float64) / self.rate
        return np.round(_TONE_AMPLITUDE * np.sin(2.0 * math.pi * self.freq_hz * t)).astype(np.int16)


class _TtsPort(FencedPort):
    _stage: ToneTtsStage

    def __init__(self, stage: ToneTtsStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._speeches: dict[str, _Speech] = {}
        # Recently finished responses: a late EndOfText after GenerationDone
        # must not start a second, empty speech (and a second SpeechDone).
        self._finished: deque[str] = deque(maxlen=64)

    async def _handle(self, item: StageInput) -> None:
        payload = item.payload
        rid: str = payload.response_id
        speech = self._speeches.get(rid)
        if speech is None and rid in self._finished:
            log.debug("stage %s: input after the end of %s ignored", self.name, rid)
            return
        if speech is None:
            speech = self._speeches[rid] = _Speech(rid)
            # One worker per response keeps its sentences in order; the task
            # is tracked under the fence of the response's first text.
            task = self._spawn(item, lambda: self._speak(speech))
            task.add_done_callback(lambda _t: self._forget(rid, speech))
        if speech.finished:
            log.debug("stage %s: text after the end of %s ignored", self.name, rid)
            return
        if isinstance(payload, TextDelta):
            speech.buffer += payload.text
            while (m := _SENTENCE_END.search(speech.buffer)) is not None:
                sentence, speech.buffer = speech.buffer[: m.end()], speech.buffer[m.end() :]
                speech.work.put_nowait((item.fence, item.request_id, sentence))
            return
        # GenerationDone / EndOfText: whatever is left is the last sentence.
        speech.finished = True
        self._finished.append(rid)
        if speech.buffer.strip():
            speech.work.put_nowait((item.fence, item.request_id, speech.buffer))
        speech.buffer = ""
        speech.work.put_nowait((item.fence, item.request_id, _FLUSH))

    def _forget(self, rid: str, speech: _Speech) -> None:
        if self._speeches.get(rid) is speech:
            del self._speeches[rid]

    async def _speak(self, speech: _Speech) -> None:
        stage = self._stage
        chunk = stage.rate * stage.chunk_ms // 1000
        while True:
            fence, request_id, sentence = await speech.work.get()
            rid = speech.response_id
            if sentence is _FLUSH:
                await self._emit(fence, request_id, SpeechDone(rid))
                return
            pcm = stage.tone(len(sentence.split()))
            for i, begin in enumerate(range(0, len(pcm), chunk)):
                if i:
                    await self._clock.sleep(0)  # a cancel can land between chunks
                text = sentence if i == 0 else ""
                out = AudioOut(rid, pcm[begin : begin + chunk], rate=stage.rate, text=text)
                await self._emit(fence, request_id, out)
