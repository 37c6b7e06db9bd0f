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
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..clock import Clock
from ..errors import DuplexError
from ..fence import Fence
from .base import (
    INTERNAL_RATE,
    AudioIn,
    AudioOut,
    EndOfText,
    GenerateRequest,
    GenerationDone,
    SpeechDone,
    StageFailed,
    StageInput,
    StageOutput,
    StagePort,
    TextDelta,
    VadConfig,
    VadSpeechStarted,
    VadSpeechStopped,
)

log = logging.getLogger(__name__)

DEFAULT_REPLY = "Hello from the scripted duplex engine. Every turn gets this same answer."
OUTPUT_QUEUE_SIZE = 256  # backpressure: a producer waits when the session lags this far

_CLOSED: Any = object()  # end-of-outputs sentinel


# ---- shared machinery ------------------------------------------------------


class ScriptedStage:
    """Base of the scripted stages: one shared object, one port per session.

    The counters are shared by all ports of the stage so ``/metrics`` can show
    them per stage.
    """

    accepted: ClassVar[tuple[type, ...]] = ()

    def __init__(self, name: str, clock: Clock) -> None:
        self.name = name
        self.clock = clock
        self.active_requests = 0
        self.aborted_requests = 0
        self.completed_requests = 0
        self.failed_requests = 0

    def port(self, session_id: str) -> StagePort:
        raise NotImplementedError


class ScriptedPort:
    """Queue-backed port; work runs as tasks owned by the port, tracked by fence."""

    def __init__(self, stage: ScriptedStage, session_id: str) -> None:
        self.name = stage.name
        self.session_id = session_id
        self._stage = stage
        self._clock = stage.clock
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=OUTPUT_QUEUE_SIZE)
        self._tasks: dict[asyncio.Task[None], Fence] = {}
        self._floor: Fence | None = None  # newest fence seen by open/cancel
        self._closed = False

    def accepts(self, payload: Any) -> bool:
        return isinstance(payload, self._stage.accepted)

    async def open(self, fence: Fence) -> None:
        if fence.session_id != self.session_id:
            raise ValueError(f"port of session {self.session_id!r} opened with {fence}")
        if self._floor is not None:
            raise RuntimeError(f"port {self.name} is already open")
        self._floor = fence

    async def submit(self, item: StageInput) -> None:
        if self._closed:
            raise RuntimeError(f"port {self.name} is closed")
        if self._floor is None:
            raise RuntimeError(f"port {self.name} is not open")
        if not self.accepts(item.payload):
            raise TypeError(f"stage {self.name!r} does not accept {type(item.payload).__name__}")
        if item.fence.is_stale_against(self._floor):
            # Work for an already-cancelled fence would only generate for
            # nobody; refuse it here rather than start and abort it.
            log.debug("stage %s ignores stale submission %s", self.name, item.request_id)
            return
        await self._handle(item)

    async def _handle(self, item: StageInput) -> None:
        raise NotImplementedError

    def outputs(self) -> AsyncIterator[StageOutput]:
        return self._outputs()

    async def _outputs(self) -> AsyncIterator[StageOutput]:
        while True:
            out = await self._queue.get()
            if out is _CLOSED:
                self._queue.put_nowait(_CLOSED)  # so any other reader ends too
                return
            yield out

    async def cancel(self, fence: Fence) -> None:
        """Cancel (and await) every task whose fence is stale against ``fence``;
        when this returns, no aborted task produces anything any more."""
        if fence.session_id != self.session_id:
            raise ValueError(f"port of session {self.session_id!r} cancelled with {fence}")
        if self._floor is None or self._floor.is_stale_against(fence):
            self._floor = fence
        stale = [t for t, f in self._tasks.items() if f.is_stale_against(fence) and not t.done()]
        for task in stale:
            task.cancel()
        self._stage.aborted_requests += len(stale)
        if stale:
            await asyncio.gather(*stale, return_exceptions=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        # Make room for the sentinel: outputs nobody read are moot after close.
        while True:
            try:
                self._queue.put_nowait(_CLOSED)
                return
            except asyncio.QueueFull:
                self._queue.get_nowait()

    # ---- helpers for subclasses --------------------------------------------

    async def _emit(self, fence: Fence, request_id: str, payload: Any) -> None:
        await self._queue.put(
            StageOutput(fence, request_id, self.name, payload, created_at=self._clock.now())
        )

    def _spawn(
        self, item: StageInput, work: Callable[[], Coroutine[Any, Any, None]]
    ) -> asyncio.Task[None]:
        """Run ``work()`` as a task tracked under ``item.fence``.

        ``work`` is a factory, not a coroutine, so a task cancelled before it
        starts leaves no never-awaited coroutine behind; bookkeeping is in a
        done callback for the same reason (a never-started task runs no
        ``finally``)."""
        task = asyncio.create_task(self._run(item, work), name=f"duplex-{self.name}-{item.request_id}")
        self._tasks[task] = item.fence
        self._stage.active_requests += 1

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.pop(t, None)
            self._stage.active_requests -= 1

        task.add_done_callback(done)
        return task

    async def _run(self, item: StageInput, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("stage %s failed on %s", self.name, item.request_id)
            self._stage.failed_requests += 1
            error = DuplexError("stage_failed", f"stage {self.name!r} failed: {exc!r}")
            await self._emit(item.fence, item.request_id, StageFailed(error))
        else:
            self._stage.completed_requests += 1


# ---- VAD -------------------------------------------------------------------


def energy_threshold_dbfs(threshold: float) -> float:
    """Map ``VadConfig.threshold`` (0..1) onto a frame-RMS level in dBFS.

    Linear: 0 -> -70 dBFS, 0.5 -> -40 dBFS, 1 -> -10 dBFS. At the default
    0.5 a -20 dBFS sine (RMS about -23 dBFS) is speech, while digital silence
    and -60 dBFS noise are not.
    """
    return -70.0 + 60.0 * threshold


class EnergyVad:
    """Sans-I/O frame-energy VAD over the audio timeline.

    Timestamps come from ``start_ms`` and sample counts, never from a clock,
    so the events do not depend on how the audio was chunked or how fast it
    arrived ("streaming equals batch").
    """

    def __init__(
        self,
        *,
        rate: int = INTERNAL_RATE,
        frame_ms: int = 20,
        min_speech_ms: int = 60,
        config: VadConfig | None = None,
    ) -> None:
        if rate % 1000 or frame_ms <= 0:
            raise ValueError("rate must be a whole number of samples per ms, frame_ms > 0")
        self.rate = rate
        self.frame_ms = frame_ms
        self.min_speech_ms = min_speech_ms
        self._spms = rate // 1000
        self._frame = self._spms * frame_ms
        self.configure(config or VadConfig())
        self.reset()

    def configure(self, config: VadConfig) -> None:
        self.config = config
        rms = 32768.0 * 10.0 ** (energy_threshold_dbfs(config.threshold) / 20.0)
        self._min_mean_square = rms * rms

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.int16)
        self._pending_start: int | None = None  # sample index of _pending[0]
        self.speaking = False
        self._run_frames = 0  # consecutive voiced frames while not speaking
        self._run_start_ms = 0
        self._silence_ms = 0  # unvoiced time while speaking
        self._last_voiced_end_ms = 0

    def feed(self, pcm: np.ndarray, start_ms: int) -> list[VadSpeechStarted | VadSpeechStopped]:
        events: list[VadSpeechStarted | VadSpeechStopped] = []
        start = start_ms * self._spms
        if self._pending_start is None:
            self._pending_start = start
        else:
            expected = self._pending_start + len(self._pending)
            if start > expected:
                self._gap(start, events)
            elif start <= expected - self._spms:  # rewound: a new audio stream
                self.reset()
                self._pending_start = start
            # else: contiguous (start_ms is whole ms, so it may trail by < 1 ms)
        pcm = np.asarray(pcm, dtype=np.int16).ravel()
        data = np.concatenate([self._pending, pcm]) if len(self._pending) else pcm
        n = len(data) // self._frame
        if n:
            # Raw ufuncs, not np.mean: this runs per chunk per session, where
            # numpy's Python wrappers cost more than the arithmetic.
            frames = data[: n * self._frame].reshape(n, self._frame).astype(np.float64)
            energy = np.add.reduce(np.square(frames, out=frames), axis=1)
            voiced = energy >= self._min_mean_square * self._frame
            for k in range(n):
                begin = self._pending_start + k * self._frame
                self._frame_done(bool(voiced[k]), begin // self._spms, events)
        self._pending = data[n * self._frame :]
        self._pending_start += n * self._frame
        return events

    def _frame_done(self, voiced: bool, begin_ms: int, events: list[Any]) -> None:
        end_ms = begin_ms + self.frame_ms
        if not self.speaking:
            if not voiced:
                self._run_frames = 0
                return
            if self._run_frames == 0:
                self._run_start_ms = begin_ms
            self._run_frames += 1
            if self._run_frames * self.frame_ms >= self.min_speech_ms:
                self.speaking = True
                self._silence_ms = 0
                self._last_voiced_end_ms = end_ms
                onset = max(0, self._run_start_ms - self.config.prefix_padding_ms)
                events.append(VadSpeechStarted(audio_ms=onset))
        elif voiced:
            self._silence_ms = 0
            self._last_voiced_end_ms = end_ms
        else:
            self._unvoiced(self.frame_ms, events)

    def _unvoiced(self, ms: int, events: list[Any]) -> None:
        self._run_frames = 0
        if self.speaking:
            self._silence_ms += ms
            if self._silence_ms >= self.config.silence_duration_ms:
                self.speaking = False
                events.append(VadSpeechStopped(audio_ms=self._last_voiced_end_ms))

    def _gap(self, start: int, events: list[Any]) -> None:
        """Audio skipped ahead: the missing stretch counts as unvoiced time
        (computed, not synthesized, so a long gap costs nothing)."""
        assert self._pending_start is not None
        # The unfinished partial frame is lost with the gap: count it as unvoiced too.
        self._unvoiced((start - self._pending_start) // self._spms, events)
        self._pending = np.zeros(0, dtype=np.int16)
        self._pending_start = start  # the frame grid restarts at the new chunk


class EnergyVadStage(ScriptedStage):
    """``AudioIn`` / ``VadConfig`` in; ``VadSpeechStarted`` / ``VadSpeechStopped`` out."""

    accepted = (AudioIn, VadConfig)

    def __init__(
        self, name: str = "vad", *, clock: Clock, frame_ms: int = 20, min_speech_ms: int = 60
    ) -> None:
        super().__init__(name, clock)
        self.frame_ms = frame_ms
        self.min_speech_ms = min_speech_ms

    def port(self, session_id: str) -> StagePort:
        return _VadPort(self, session_id)


class _VadPort(ScriptedPort):
    def __init__(self, stage: EnergyVadStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self.vad = EnergyVad(frame_ms=stage.frame_ms, min_speech_ms=stage.min_speech_ms)

    async def _handle(self, item: StageInput) -> None:
        # A 20 ms frame costs microseconds: run inline, no task to track.
        if isinstance(item.payload, VadConfig):
            self.vad.configure(item.payload)
            return
        for event in self.vad.feed(item.payload.pcm, item.payload.start_ms):
            await self._emit(item.fence, item.request_id, event)


# ---- LLM -------------------------------------------------------------------


def split_tokens(text: str) -> list[str]:
    """Words with their whitespace attached; ``"".join`` gives ``text`` back."""
    return re.findall(r"\s*\S+\s*", text)


class ScriptedLlmStage(ScriptedStage):
    """``GenerateRequest`` in; the same reply, word by word, out.

    ``fail_on`` injects a fault: a request whose last user message contains
    it raises after the reply's first word (the port reports ``stage_failed``).
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
    ) -> None:
        super().__init__(name, clock)
        self.reply = reply
        self.token_interval_s = token_interval_s
        self.fail_on = fail_on

    def port(self, session_id: str) -> StagePort:
        return _LlmPort(self, session_id)


class _LlmPort(ScriptedPort):
    _stage: ScriptedLlmStage

    async def _handle(self, item: StageInput) -> None:
        self._spawn(item, lambda: self._generate(item))

    async def _generate(self, item: StageInput) -> None:
        req: GenerateRequest = item.payload
        tokens = split_tokens(self._stage.reply)
        limit = req.sampling.max_tokens
        finish = "stop"
        if limit is not None and limit < len(tokens):
            tokens, finish = tokens[: max(0, limit)], "length"
        said = next((m.text for m in reversed(req.context) if m.role == "user"), "")
        fail = self._stage.fail_on is not None and self._stage.fail_on in said
        for i, token in enumerate(tokens):
            if i:
                if fail:
                    raise RuntimeError(f"scripted fault on {self._stage.fail_on!r}")
                await self._clock.sleep(self._stage.token_interval_s)
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


class ToneTtsStage(ScriptedStage):
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


class _TtsPort(ScriptedPort):
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
