"""An energy VAD: speech is a frame louder than a threshold (dBFS).

Deterministic and model-free (the scripted pipeline's VAD). Its onset/offset
state machine on the audio timeline is shared with Silero (``silero_vad``):
events are computed from ``start_ms`` and sample counts, never from a clock.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.payloads import (
    INTERNAL_RATE,
    AudioIn,
    StageInput,
    VadConfig,
    VadPaused,
    VadResumed,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.stages.port import FencedPort, StageBase, StagePort

log = logging.getLogger(__name__)


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
        self._paused = False  # a VadPaused went out for the silence in progress

    def feed(self, pcm: np.ndarray, start_ms: int) -> list[VadSpeechStarted | VadSpeechStopped]:
        events: list[VadSpeechStarted | VadSpeechStopped] = []
        data = self._take(pcm, start_ms, events)
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

    def _take(self, pcm: np.ndarray, start_ms: int, events: list[Any]) -> np.ndarray:
        """Place a chunk on the audio timeline: a skip ahead is a gap
        (``_gap``), a step back a new stream (``reset``). Returns the samples
        not yet analysed -- the partial frame kept from before, then the
        chunk -- starting at ``_pending_start``. Every VAD of this timeline
        (Silero's too) begins its ``feed`` here."""
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
        return np.concatenate([self._pending, pcm]) if len(self._pending) else pcm

    def _frame_done(self, voiced: bool, begin_ms: int, events: list[Any], *,
                    sure: bool = False) -> None:
        """One frame judged. ``sure``: voiced beyond doubt, an onset without
        waiting for ``min_speech_ms`` (a detector with a confidence says so)."""
        end_ms = begin_ms + self.frame_ms
        if not self.speaking:
            if not voiced:
                self._run_frames = 0
                return
            if self._run_frames == 0:
                self._run_start_ms = begin_ms
            self._run_frames += 1
            if sure or self._run_frames * self.frame_ms >= self.min_speech_ms:
                self._start_speech(self._run_start_ms, end_ms, events)
        elif voiced:
            if self._paused:
                self._paused = False
                events.append(VadResumed(audio_ms=begin_ms))
            self._silence_ms = 0
            self._last_voiced_end_ms = end_ms
        else:
            self._unvoiced(self.frame_ms, events)

    def _start_speech(self, run_start_ms: int, end_ms: int, events: list[Any]) -> None:
        """Speech began at ``run_start_ms``; the frame that decided it ends at ``end_ms``."""
        self.speaking = True
        self._run_frames = 0
        self._silence_ms = 0
        self._last_voiced_end_ms = end_ms
        onset = max(0, run_start_ms - self.config.prefix_padding_ms)
        events.append(VadSpeechStarted(audio_ms=onset))

    def _unvoiced(self, ms: int, events: list[Any]) -> None:
        self._run_frames = 0
        if self.speaking:
            self._silence_ms += ms
            if self._silence_ms >= self.config.silence_duration_ms:
                self.speaking = self._paused = False
                events.append(VadSpeechStopped(audio_ms=self._last_voiced_end_ms))
            elif (not self._paused and self.config.pause_ms
                    and self._silence_ms >= self.config.pause_ms):
                self._paused = True
                events.append(VadPaused(audio_ms=self._last_voiced_end_ms))

    def _gap(self, start: int, events: list[Any]) -> None:
        """Audio skipped ahead: the missing stretch counts as unvoiced time
        (computed, not synthesized, so a long gap costs nothing)."""
        assert self._pending_start is not None
        # The unfinished partial frame is lost with the gap: count it as unvoiced too.
        self._unvoiced((start - self._pending_start) // self._spms, events)
        self._pending = np.zeros(0, dtype=np.int16)
        self._pending_start = start  # the frame grid restarts at the new chunk


class EnergyVadStage(StageBase):
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


class _VadPort(FencedPort):
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
