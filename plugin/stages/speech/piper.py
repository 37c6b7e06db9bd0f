"""Piper as the TTS stage: a neural VITS voice on onnxruntime, on CPU.

The port is the sentence-streaming port of the subprocess synthesizers
(``subprocess_tts.py``: text deltas in, cut into pieces as they complete,
``AudioOut`` per piece and one ``SpeechDone`` per response out, a cancel stops
the piece being made). Piper is fast enough (real-time factor ~0.07 on one
core) to speak clause by clause, so pieces are cut at clause punctuation
from ``clause_words`` (4) words on, and the reply's first piece is its first
phrase (``first_words``, 2: a clause mark or its first two words), so the
first audio follows the reply's first words, not its first sentence
(``bench/first_phrase.py``: first audio 0.66x as late as with four words,
Whisper still hears the spoken reply whole).

Each piece: phonemes from the ``espeak-ng`` program (an asynchronous
subprocess, killed on cancel), then the ONNX graph on this stage's worker
threads (onnxruntime releases the GIL; a cancel terminates the run through
its ``RunOptions``), then soxr from the voice's 22.05 kHz to ``rate``.

``voice``: a pinned voice name (``en_US-joe-medium``, verified against its
hashes on first use) or a path to any Piper ``.onnx`` voice with its
``.onnx.json`` (``vllm_duplex.assets.locate``). Flite and eSpeak NG stay
available as the ``flite`` / ``espeak`` stage types.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import soxr
from vllm_duplex.assets.locate import piper_voice_files
from vllm_duplex.core.clock import Clock
from vllm_duplex.core.devices import CPU, Device
from vllm_duplex.core.payloads import INTERNAL_RATE
from vllm_duplex.stages.speech.piper_voice import (
    PiperVoice,
    espeak_argv,
    ipa_with_punctuation,
)
from vllm_duplex.stages.speech.subprocess_tts import SubprocessTtsStage, espeak_voice_ok

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


class PiperTtsStage(SubprocessTtsStage):
    """``TextDelta`` / ``GenerationDone`` / ``EndOfText`` in; ``AudioOut``
    chunks (``text`` = the piece they speak) and one ``SpeechDone`` per
    response out. ``length_scale`` > 1 speaks slower."""

    binary = "espeak-ng"  # the phonemizer; the voice itself is the ONNX graph

    def __init__(self, name: str = "tts", *, clock: Clock, voice: str | Path = "en_US-joe-medium",
                 rate: int = INTERNAL_RATE, clause_words: int = 4, first_words: int = 2,
                 threads: int = 1,
                 workers: int = 2, length_scale: float | None = None,
                 espeak_voice: str | None = None, warm_up: bool = True,
                 device: Device | str = CPU, **kwargs: Any) -> None:
        super().__init__(name, clock=clock, rate=rate, clause_words=clause_words,
                         first_words=first_words, **kwargs)
        if workers < 1 or threads < 1 or (length_scale is not None and length_scale <= 0):
            raise ValueError("workers and threads must be >= 1, length_scale > 0")
        onnx, config = piper_voice_files(voice)
        self.device = Device.parse(device)
        self.voice = load_voice(onnx, config, threads=threads, length_scale=length_scale,
                                device=self.device)
        self.espeak_voice = espeak_voice or self.voice.config.espeak_voice
        if self.espeak_voice.startswith("-") or not espeak_voice_ok(self.espeak_voice):
            raise ValueError(f"espeak-ng has no voice {self.espeak_voice!r} for the phonemes")
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"duplex-{name}")
        self.cancelled_runs = 0  # ONNX runs a cancel terminated
        if warm_up:
            self._executor.submit(self.voice.warm_up)

    async def phonemize(self, text: str) -> str:
        out = await self.run_binary(espeak_argv(self.espeak_voice), text.encode())
        return ipa_with_punctuation(text, out.decode("utf-8", errors="replace"))

    async def synthesize(self, text: str) -> np.ndarray:
        """``text`` (already sanitized) -> int16 PCM at ``self.rate``."""
        phonemes = await self.phonemize(text)
        run = self.voice.new_run()
        future = asyncio.get_running_loop().run_in_executor(self._executor, self.voice.synthesize,
                                                            phonemes, run)
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
        """Stop the worker threads (idempotent; ports must be closed first).
        Synchronous, for owners outside an event loop."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def close(self) -> None:  # Lifecycle: what Runtime.stop awaits
        self.shutdown_workers()
