"""PocketSphinx as a streaming ASR stage (the CPU default of the cascade).

One ``pocketsphinx.Decoder`` per *utterance in progress*, not per session: a
decoder with the bundled en-US model costs about 90 MB and 0.3 s to build, and
most sessions are silent most of the time. Decoders live in a stage-wide
pool; a session checks one out when an utterance starts and returns it at
the end. Decoders are not thread-safe, so each is used by one session's
serial worker at a time, on the stage's worker threads (never on the loop).

Utterance boundaries:
- ``VadSpeechStarted(onset)`` opens one and decodes from ``onset``. The
  event reaches us after the audio it describes (prefix padding + the VAD's
  minimum speech + its queueing lag), so the port keeps the last
  ``prebuffer_ms`` of audio (2 s = 64 KB: generous, because a VAD running
  behind must not cost the first words); ``VadSpeechStopped`` ends it.
- Without a VAD, ``AudioIn`` opens one and ``EndOfUtterance`` ends it.
``vad_gated`` picks the rule: True = only VAD events open utterances; False =
audio does too; None (default) = audio does until the first VAD event, from
then on only the VAD (so the same stage works with and without turn
detection; the utterance opened before the first VAD event is discarded,
since the VAD's onset says where speech really began).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from typing import Any

import numpy as np
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.payloads import (
    INTERNAL_RATE,
    AsrConfig,
    AudioIn,
    EndOfUtterance,
    TranscriptFinal,
    TranscriptPartial,
    UserPaused,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.stages.listening.base import ListeningPort, ListeningStage
from vllm_duplex.stages.port import StagePort

log = logging.getLogger(__name__)

SPMS = INTERNAL_RATE // 1000  # samples per ms
# Fillers and noise tokens PocketSphinx may put in a hypothesis, and the
# alternate-pronunciation suffix of dictionary words ("the(2)").
_FILLER = re.compile(r"^(<.*>|\[.*\]|\+\+.*\+\+)$")
_ALT = re.compile(r"\(\d+\)$")


def clean_hypothesis(hyp: str) -> str:
    words = (_ALT.sub("", w) for w in hyp.split())
    return " ".join(w.lower() for w in words if w and not _FILLER.match(w))


class DecoderPool:
    """Thread-safe pool of decoders with the bundled en-US model; grows on
    demand (one decoder per concurrent utterance), keeps at most ``max_idle``."""

    def __init__(self, options: dict[str, Any] | None = None, *, max_idle: int = 4) -> None:
        # fwdflat off: the second search pass made end_utt cost 60-130 ms per
        # utterance (measured, same hypotheses on our test phrases without it:
        # 5-25 ms). PocketSphinx holds the GIL while it decodes, so that time
        # stalled every session's event loop, not just this one's thread.
        self.options = {"loglevel": "FATAL", "fwdflat": False, **(options or {})}
        self.max_idle = max_idle
        self.created = 0
        self._idle: list[Any] = []
        self._lock = threading.Lock()

    def acquire(self) -> Any:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        import pocketsphinx  # deferred: a stage that never decodes never loads it

        decoder = pocketsphinx.Decoder(**self.options)  # slow (~0.3 s): outside the lock
        with self._lock:
            self.created += 1
        return decoder

    def release(self, decoder: Any) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(decoder)

    def prewarm(self, n: int) -> None:
        for decoder in [self.acquire() for _ in range(n)]:
            self.release(decoder)

    @property
    def idle(self) -> int:
        return len(self._idle)


class Recognizer:
    """One session's utterance state; synchronous, called from one thread at
    a time (the port's serial worker holds ``lock``). Positions are sample
    indexes on the session's input timeline (``start_ms`` based)."""

    def __init__(self, pool: DecoderPool, *, partial_interval_ms: int, prebuffer_ms: int,
                 vad_gated: bool | None) -> None:
        self.pool = pool
        self.lock = threading.Lock()
        self._partial_every = partial_interval_ms * SPMS
        self._prebuffer = prebuffer_ms * SPMS
        self._gated = vad_gated
        self._recent: deque[tuple[int, np.ndarray]] = deque()  # (start sample, pcm)
        self._recent_samples = 0
        self._end: int | None = None  # end sample of the newest audio received
        self._decoder: Any = None  # checked out while an utterance is open
        self._opened_by_vad = False
        self._fed_until = 0
        self._since_partial = 0
        self._last_partial = ""
        self._cmn = ""  # the decoder's cepstral mean when the open utterance began

    @property
    def in_utterance(self) -> bool:
        return self._decoder is not None

    # ---- inputs ------------------------------------------------------------

    def audio(self, pcm: np.ndarray, start_ms: int) -> list[Any]:
        pcm = np.asarray(pcm, dtype=np.int16).ravel()
        start = start_ms * SPMS
        if self._end is not None and self._end - SPMS < start <= self._end:
            # Contiguous: start_ms is whole ms, so it trails the true sample
            # position by up to a ms. Taking it literally would skip those
            # samples as "already fed" -- a few samples lost every chunk,
            # which is enough to make PocketSphinx mishear.
            start = self._end
        elif self._end is not None and start <= self._end - SPMS:
            self._recent.clear()  # rewound: a new audio stream, old audio is not before it
            self._recent_samples = 0
            self._fed_until = start
        self._remember(start, pcm)
        if self._decoder is None:
            if self._gated:
                return []
            self._open(start, by_vad=False)
        return self._feed(start, pcm)

    def speech_started(self, onset_ms: int) -> list[Any]:
        first_vad_event = self._gated is None
        self._gated = True if self._gated is None else self._gated
        if self._decoder is not None:
            if not (first_vad_event and not self._opened_by_vad):
                return []  # already decoding this speech
            self._close()  # audio-opened before we knew a VAD was there: restart at onset
        onset = onset_ms * SPMS
        self._open(onset, by_vad=True)
        out: list[Any] = []
        for start, pcm in list(self._recent):
            out += self._feed(start, pcm)
        return out

    def speech_stopped(self) -> list[Any]:
        if self._gated is None:
            self._gated = True
        return [self._finish()] if self._decoder is not None else []

    def pause(self) -> list[Any]:
        """``semantic_vad`` judges a pause: every word heard so far (the
        decoder has been fed all the audio before it), sent even if unchanged."""
        if self._decoder is None:
            return [TranscriptPartial("", at_pause=True)]
        hyp = self._decoder.hyp()
        self._last_partial = clean_hypothesis(hyp.hypstr) if hyp is not None else ""
        return [TranscriptPartial(self._last_partial, at_pause=True)]

    def end_of_utterance(self) -> list[Any]:
        return [self._finish() if self._decoder is not None else TranscriptFinal("")]

    def close(self) -> None:
        """Give the decoder back (the port is closing mid-utterance)."""
        if self._decoder is not None:
            self._close()

    # ---- internals ---------------------------------------------------------

    def _remember(self, start: int, pcm: np.ndarray) -> None:
        self._recent.append((start, pcm))
        self._recent_samples += len(pcm)
        self._end = start + len(pcm)
        while self._recent and self._recent_samples - len(self._recent[0][1]) >= self._prebuffer:
            self._recent_samples -= len(self._recent.popleft()[1])

    def _open(self, start: int, *, by_vad: bool) -> None:
        self._decoder = self.pool.acquire()
        # Live CMN learns from every utterance at end_utt; one we throw away
        # (mostly silence, opened before the VAD spoke) must not teach it, or
        # the real utterance starts with a mean fit to silence and is misheard.
        self._cmn = self._decoder.get_cmn()
        self._decoder.start_utt()
        self._opened_by_vad = by_vad
        self._fed_until = start
        self._since_partial = 0
        self._last_partial = ""

    def _feed(self, start: int, pcm: np.ndarray) -> list[Any]:
        skip = max(0, self._fed_until - start)  # audio before the onset, or fed already
        if skip >= len(pcm):
            return []
        pcm = pcm[skip:]
        self._decoder.process_raw(pcm.tobytes(), False, False)
        self._fed_until = start + skip + len(pcm)
        self._since_partial += len(pcm)
        if self._since_partial < self._partial_every:
            return []
        # Partials on the audio grid (every partial_interval_ms of audio),
        # not on wall time: the cadence does not depend on decoding speed.
        self._since_partial %= self._partial_every
        hyp = self._decoder.hyp()
        text = clean_hypothesis(hyp.hypstr) if hyp is not None else ""
        if text == self._last_partial:
            return []
        self._last_partial = text
        return [TranscriptPartial(text)]

    def _finish(self) -> TranscriptFinal:
        decoder = self._decoder
        decoder.end_utt()
        hyp = decoder.hyp()
        self._decoder = None
        self.pool.release(decoder)
        return TranscriptFinal(clean_hypothesis(hyp.hypstr) if hyp is not None else "")

    def _close(self) -> None:
        """Abandon the open utterance, leaving the decoder as it was before it."""
        decoder, self._decoder = self._decoder, None
        try:
            decoder.end_utt()
            decoder.set_cmn(self._cmn)
        finally:
            self.pool.release(decoder)


class PocketSphinxAsrStage(ListeningStage):
    """``AudioIn`` / ``EndOfUtterance`` / ``VadSpeechStarted`` /
    ``VadSpeechStopped`` / ``UserPaused`` in; ``TranscriptPartial`` /
    ``TranscriptFinal`` out.

    ``prewarm`` decoders are built on a worker thread at construction so the
    first utterance does not wait for one. ``close()`` stops the workers.
    """

    accepted = (AudioIn, AsrConfig, EndOfUtterance, VadSpeechStarted, VadSpeechStopped, UserPaused)

    def __init__(
        self,
        name: str = "asr",
        *,
        clock: Clock,
        partial_interval_ms: int = 200,
        prebuffer_ms: int = 2000,
        vad_gated: bool | None = None,
        prewarm: int = 1,
        max_idle_decoders: int = 4,
        workers: int | None = None,
        decoder_options: dict[str, Any] | None = None,
    ) -> None:
        if partial_interval_ms <= 0 or prebuffer_ms < 0:
            raise ValueError("partial_interval_ms must be > 0 and prebuffer_ms >= 0")
        super().__init__(name, clock, workers=workers)
        self.partial_interval_ms = partial_interval_ms
        self.prebuffer_ms = prebuffer_ms
        self.vad_gated = vad_gated
        self.pool = DecoderPool(decoder_options, max_idle=max_idle_decoders)
        if prewarm > 0:
            self.run_later(lambda: self.pool.prewarm(prewarm))

    def languages(self) -> frozenset[str]:
        """Its acoustic and language models are US English's."""
        return frozenset({"en"})

    def port(self, session_id: str) -> StagePort:
        return _AsrPort(self, session_id)


class _AsrPort(ListeningPort):
    _stage: PocketSphinxAsrStage

    def __init__(self, stage: PocketSphinxAsrStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self.recognizer = Recognizer(
            stage.pool, partial_interval_ms=stage.partial_interval_ms,
            prebuffer_ms=stage.prebuffer_ms, vad_gated=stage.vad_gated,
        )

    def _work(self, payload: Any) -> list[Any]:
        rec = self.recognizer
        if isinstance(payload, AsrConfig):
            return []  # English only, and its language model takes no prompt: Whisper's does
        with rec.lock:  # close() may hand the decoder back from another thread
            if isinstance(payload, AudioIn):
                return rec.audio(payload.pcm, payload.start_ms)
            if isinstance(payload, VadSpeechStarted):
                return rec.speech_started(payload.audio_ms)
            if isinstance(payload, VadSpeechStopped):
                return rec.speech_stopped()
            if isinstance(payload, UserPaused):
                return rec.pause()
            return rec.end_of_utterance()

    def _release(self) -> None:
        with self.recognizer.lock:
            self.recognizer.close()

    def _completed(self, payload: Any, outputs: list[Any]) -> int:
        return sum(isinstance(out, TranscriptFinal) for out in outputs)  # utterances

    async def close(self) -> None:
        await super().close()
        # The worker is gone, but a thread may still be inside the decoder:
        # hand it back from a worker thread, behind the recognizer's lock.
        self._stage.run_later(self._release)
