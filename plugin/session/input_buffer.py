"""The session's input audio buffer (sans-I/O).

Decodes wire audio into internal PCM (without the echo of the reply when the
session asks: ``session/echo.py``; then noise-reduced when it asks:
``media/noise.py``), keeps the uncommitted turn (what the ASR hears; with echo
cancellation each chunk carries the VAD's own view as well, the residual echo
turned down: ``AudioIn.vad_pcm``), stamps each chunk with its
place on the session's audio timeline, and bounds memory: under
server VAD, silence between turns is trimmed to what a turn can still claim;
in all modes the buffer has a hard cap.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

import numpy as np
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import IDLE_SLACK_MS, INTERNAL_RATE, AudioIn
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.audio import AudioDecoder
from vllm_duplex.media.echo import Cancelled, EchoCanceller
from vllm_duplex.media.noise import FRAME, NoiseSuppressor
from vllm_duplex.session.echo import EchoPath

_NO_PCM = np.zeros(0, np.int16)

# Audio kept before a speech onset beyond prefix_padding_ms, for VAD latency.


class InputBuffer:
    def __init__(self, fmt: AudioFormat, *, max_ms: int,
                 clock: Callable[[], float] = lambda: 0.0) -> None:
        self._fmt = fmt
        self._decoder = AudioDecoder(fmt)
        self._max_samples = max_ms * INTERNAL_RATE // 1000
        self.max_ms = max_ms
        self._chunks: deque[np.ndarray] = deque()
        self.samples = 0  # uncommitted
        self._timeline = 0  # every sample ever appended: VAD timestamps come from here
        self._noise: NoiseSuppressor | None = None
        self._vad_noise: NoiseSuppressor | None = None  # the VAD's view's, with echo cancellation
        self._echo: EchoPath | None = None
        self._clock = clock  # when the audio being appended arrived (the echo's reference clock)
        self._held = _NO_PCM  # decoded, short of a whole 10 ms frame

    @property
    def written_ms(self) -> int:
        """Milliseconds of input audio appended since the session began."""
        return self._timeline * 1000 // INTERNAL_RATE

    def set_noise_reduction(self, kind: str | None) -> None:
        """Turn noise reduction on (``near_field`` / ``far_field``), change it
        or turn it off; audio held for a frame is kept either way."""
        if kind != (self._noise.kind if self._noise else None):
            self._noise = NoiseSuppressor(kind) if kind else None
            self._vad_noise = NoiseSuppressor(kind) if kind else None

    def set_echo_cancellation(self, kind: str | None, output_format: AudioFormat,
                              canceller: EchoCanceller | None = None) -> None:
        """Turn echo cancellation on (``server``) or off; ``output_format``:
        what the reply's audio deltas are encoded in (the reference);
        ``canceller``: the one to use when it turns on (a bench's variant;
        AEC3 and the residual suppressor by default)."""
        if kind is None:
            self._echo = None
        elif self._echo is None:
            self._echo = EchoPath(output_format, canceller)
            self._echo.captured_silence(self._held.size)  # held before: no reference
        else:
            self._echo.set_output_format(output_format)

    def sent(self, effects: Iterable[object], at: float) -> None:
        """What the session is sending at ``at`` (the echo canceller's
        reference: the reply's audio, its truncations)."""
        if self._echo is not None:
            self._echo.sent(effects, at)

    def set_format(self, fmt: AudioFormat) -> None:
        if fmt != self._fmt:
            self._fmt = fmt
            self._decoder = AudioDecoder(fmt)

    def append(self, data: bytes) -> AudioIn | None:
        """Decode and keep ``data``; None when it yields no sample yet."""
        pcm, vad_pcm = self._clean(self._captured(self._decoder.decode(data)))
        if pcm.size == 0:
            return None
        if self.samples + pcm.size > self._max_samples:
            raise DuplexError("resource_exhausted",
                              f"the input audio buffer is full ({self.max_ms} ms); "
                              "commit or clear it", param="audio")
        return self._keep(pcm, vad_pcm)

    def _captured(self, pcm: np.ndarray) -> np.ndarray:
        if self._echo is not None:
            self._echo.captured(pcm.size, self._clock())
        return pcm

    def _clean(self, pcm: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``pcm`` through the echo canceller and the noise suppressor: whole
        10 ms frames now, the rest held for the next chunk (at most 10 ms of
        delay). Returns what the ASR hears and, where it differs (the echo's
        residual turned down), what the VAD hears."""
        if self._held.size:
            pcm = np.concatenate([self._held, pcm])
            self._held = _NO_PCM
        if self._noise is None and self._echo is None:
            return pcm, None
        whole = pcm.size - pcm.size % FRAME
        self._held = pcm[whole:]
        if self._echo is None:
            return self._noise.process(pcm[:whole]) if self._noise is not None else pcm[:whole], None
        return self._denoise(self._echo.process(pcm[:whole]), last=False)

    def _finish(self, pcm: np.ndarray) -> np.ndarray:
        """The turn's last partial frame (what the ASR hears: the turn keeps it)."""
        if self._echo is not None:
            return self._denoise(self._echo.finish(pcm), last=True)[0]
        return self._noise.finish(pcm) if self._noise is not None else pcm

    def _denoise(self, out: Cancelled, *, last: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """The canceller's two views through a noise suppressor each (Speex
        adapts to what it hears: one state per stream)."""
        vad = None if out.speech is out.words else out.speech
        if self._noise is None or self._vad_noise is None:
            return out.words, vad
        step = NoiseSuppressor.finish if last else NoiseSuppressor.process
        return step(self._noise, out.words), None if vad is None else step(self._vad_noise, vad)

    def _keep(self, pcm: np.ndarray, vad_pcm: np.ndarray | None = None) -> AudioIn:
        self._chunks.append(pcm)
        self.samples += pcm.size
        # Derived from a sample count, not summed per chunk: rounding must not drift.
        chunk = AudioIn(pcm=pcm, start_ms=self._timeline * 1000 // INTERNAL_RATE, vad_pcm=vad_pcm)
        self._timeline += pcm.size
        return chunk

    def trim_idle(self, prefix_padding_ms: int) -> None:
        """Between turns, keep only prefix padding plus slack: silence must not
        grow memory."""
        keep = (prefix_padding_ms + IDLE_SLACK_MS) * INTERNAL_RATE // 1000
        while self._chunks and self.samples - self._chunks[0].size >= keep:
            self.samples -= self._chunks.popleft().size

    def clear(self) -> None:
        self._chunks.clear()
        self.samples = 0

    def commit(self) -> tuple[np.ndarray, list[DuplexError]]:
        """Take the turn's audio (the resampler's tail included) and start a
        new one. Errors found on the way (an odd PCM16 byte count) are
        returned, not raised: the turn is still good."""
        errors = []
        try:
            tail = self._decoder.flush()
        except DuplexError as err:
            errors.append(err)
            tail = self._decoder.flush()
        tail, _ = self._clean(self._captured(tail))  # the VAD hears no more of this turn
        if self._held.size:  # the turn's last partial frame
            tail = np.concatenate([tail, self._finish(self._held)])
            self._held = _NO_PCM
        if tail.size:
            self._keep(tail)
        self._decoder = AudioDecoder(self._fmt)
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        self.clear()
        return audio, errors
