"""Piper as the TTS stage: a neural VITS voice on onnxruntime, on CPU.

The port is every TTS stage's (``streaming_tts.py``: text deltas in, cut into
pieces as they complete by ``pieces.py``, ``AudioOut`` per piece and one
``SpeechDone`` per response out, a cancel stops the piece being made). Piper
is fast enough (real-time factor ~0.07 on one core) to speak clause by
clause, so pieces are cut at clause punctuation
from ``clause_words`` (4) words on, and the reply's first piece is its first
phrase (``first_words``, 2: a clause mark or its first two words), so the
first audio follows the reply's first words, not its first sentence
(``bench/first_phrase.py``: first audio 0.66x as late as with four words,
Whisper still hears the spoken reply whole).

Each piece, on this stage's worker threads, holding a slot of the CPU
scheduler (``stages/scheduler.py``: a reply's first piece is what an ending
turn waits on, the next ones are due as the audio before them plays out):
phonemes from an ``espeak-ng`` process that stays up (``phonemizer.py``: one
per piece phonemized at once, reused; starting a process per piece forked
the whole server on the event loop), then the ONNX
graph (onnxruntime releases the GIL; a cancel terminates the run through its
``RunOptions``); then soxr from the voice's 22.05 kHz to ``rate``.

``voice``: a pinned voice name (``en_US-joe-medium``, verified against its
hashes on first use) or a path to any Piper ``.onnx`` voice with its
``.onnx.json`` (``vllm_duplex.assets.locate``). Flite and eSpeak NG stay
available as the ``flite`` / ``espeak`` stage types.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import soxr
from vllm_duplex.assets.locate import piper_voice_files
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.devices import CPU, Device
from vllm_duplex.domain.payloads import INTERNAL_RATE
from vllm_duplex.stages.speech.phonemizer import EspeakPhonemizer
from vllm_duplex.stages.speech.piper_voice import (
    PiperVoice,
    continued,
    espeak_argv,
    ipa_with_punctuation,
)
from vllm_duplex.stages.scheduler import CARRIERS, Urgency
from vllm_duplex.stages.speech.streaming_tts import StreamingTtsStage
from vllm_duplex.stages.speech.subprocess_tts import espeak_voice_ok

_loaded: dict[tuple[str, int, float | None, Device], PiperVoice] = {}
_load_lock = threading.Lock()


def load_voice(onnx: Path, config: Path, *, threads: int = 1,
               length_scale: float | None = None, device: Device = CPU) -> PiperVoice:
    """The process's one instance of a voice (loading takes ~1-2 s and ~100 MB)."""
    key = (str(onnx.resolve()), threads, length_scale, device)
    with _load_lock:
        voice = _loaded.get(key)
        if voice is None:
            voice = _loaded[key] = PiperVoice(onnx, config, threads=threads,
                                              length_scale=length_scale, device=device)
        return voice


class PiperTtsStage(StreamingTtsStage):
    """``TextDelta`` / ``GenerationDone`` / ``EndOfText`` in; ``AudioOut``
    chunks (``text`` = the piece they speak) and one ``SpeechDone`` per
    response out. ``length_scale`` > 1 speaks slower."""

    binary = "espeak-ng"  # the phonemizer; the voice itself is the ONNX graph

    def __init__(self, name: str = "tts", *, clock: Clock, voice: str | Path = "en_US-joe-medium",
                 rate: int = INTERNAL_RATE, clause_words: int = 4, first_words: int = 2,
                 threads: int = 1,
                 workers: int = CARRIERS, length_scale: float | None = None,
                 espeak_voice: str | None = None, warm_up: bool = True,
                 device: Device | str = CPU, **kwargs: Any) -> None:
        if workers < 1 or threads < 1 or (length_scale is not None and length_scale <= 0):
            raise ValueError("workers and threads must be >= 1, length_scale > 0")
        super().__init__(name, clock=clock, rate=rate, clause_words=clause_words,
                         first_words=first_words, workers=workers, **kwargs)
        onnx, config = piper_voice_files(voice)
        self.device = Device.parse(device)
        self.voice = load_voice(onnx, config, threads=threads, length_scale=length_scale,
                                device=self.device)
        self.espeak_voice = espeak_voice or self.voice.config.espeak_voice
        if self.espeak_voice.startswith("-") or not espeak_voice_ok(self.espeak_voice):
            raise ValueError(f"espeak-ng has no voice {self.espeak_voice!r} for the phonemes")
        self.cancelled_runs = 0  # ONNX runs a cancel terminated
        # espeak-ng processes that stay up; one per piece phonemized at once
        # (within a CPU slot: as many as the scheduler has slots), reused.
        self._phonemizers: list[EspeakPhonemizer] = []
        self._idle_phonemizers: list[EspeakPhonemizer] = []
        self._phonemizers_lock = threading.Lock()
        self._closed = False
        if warm_up:
            self._executor.submit(self._warm_up)

    def _warm_up(self) -> None:
        with self.scheduler.work(Urgency.BACKGROUND, self.name):
            self.voice.warm_up()

    def phonemize(self, text: str) -> str:
        """``text`` -> the voice's phoneme string. Synchronous: on a worker thread."""
        with self._phonemizers_lock:
            if self._closed:
                raise RuntimeError(f"stage {self.name!r} is closed")
            phonemizer = self._idle_phonemizers.pop() if self._idle_phonemizers else None
            if phonemizer is None:
                phonemizer = EspeakPhonemizer(espeak_argv(self.espeak_voice))
                self._phonemizers.append(phonemizer)
        try:
            return ipa_with_punctuation(continued(text), phonemizer.phonemize(text))
        finally:
            with self._phonemizers_lock:
                if not self._closed:
                    self._idle_phonemizers.append(phonemizer)

    def _speak(self, text: str, run: object, urgency: Urgency, due_in_s: float) -> np.ndarray:
        with self.scheduler.work(urgency, self.name, due_in_s=due_in_s):
            return self.voice.synthesize(self.phonemize(text), run)

    async def synthesize(self, text: str, *, urgency: Urgency = Urgency.TURN_END,
                         due_in_s: float = 0.0) -> np.ndarray:
        """``text`` (already sanitized) -> int16 PCM at ``self.rate``, made
        when the CPU scheduler says (``urgency``, ``due_in_s``)."""
        run = self.voice.new_run()
        future = asyncio.get_running_loop().run_in_executor(
            self._executor, self._speak, text, run, urgency, due_in_s)
        try:
            audio = await future
        except asyncio.CancelledError:
            self.voice.cancel(run)  # the graph stops at its next node
            self.cancelled_runs += 1
            raise
        self.synthesized += 1
        if self.voice.sample_rate != self.rate and audio.size:
            audio = soxr.resample(audio, self.voice.sample_rate, self.rate)
        return (np.clip(audio, -1.0, 1.0) * 32767.0).astype(np.int16)

    def shutdown_workers(self) -> None:
        """Stop the worker threads and their espeak-ng processes (idempotent;
        ports must be closed first). Synchronous, for owners outside an event
        loop: it may wait for a phonemization in progress."""
        super().shutdown_workers()
        with self._phonemizers_lock:
            self._closed = True
            phonemizers, self._phonemizers = self._phonemizers, []
            self._idle_phonemizers = []
        for phonemizer in phonemizers:
            phonemizer.close()

    async def close(self) -> None:  # Lifecycle: what Runtime.stop awaits
        await asyncio.to_thread(self.shutdown_workers)
