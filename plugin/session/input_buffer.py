"""The session's input audio buffer (sans-I/O).

Decodes wire audio into internal PCM (without the echo of the reply when the
session asks: ``session/echo.py``; then noise-reduced when it asks:
``media/noise.py``), keeps the uncommitted turn, stamps each chunk with its
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
from vllm_duplex.media.echo import EchoCanceller
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
        pcm = self._clean(self._captured(self._decoder.decode(data)))
        if pcm.size == 0:
            return None
        if self.samples + pcm.size > self._max_samples:
            raise DuplexError("resource_exhausted",
                              f"the input audio buffer is full ({self.max_ms} ms); "
                              "commit or clear it", param="audio")
        return self._keep(pcm)

    def _captured(self, pcm: np.ndarray) -> np.ndarray:
        if self._echo is not None:
            self._echo.captured(pcm.size, self._clock())
        return pcm

    def _clean(self, pcm: np.ndarray) -> np.ndarray:
        """``pcm`` through the echo canceller and the noise suppressor: whole
        10 ms frames now, the rest held for the next chunk (at most 10 ms of
        delay)."""
        if self._held.size:
            pcm = np.concatenate([self._held, pcm])
            self._held = _NO_PCM
        if self._noise is None and self._echo is None:
            return pcm
        whole = pcm.size - pcm.size % FRAME
        self._held = pcm[whole:]
        return self._frames(pcm[:whole])

    def _frames(self, pcm: np.ndarray) -> np.ndarray:
        if self._echo is not None:
            pcm = self._echo.process(pcm)
        return self._noise.process(pcm) if self._noise is not None else pcm

    def _finish(self, pcm: np.ndarray) -> np.ndarray:
        if self._echo is not None:
            pcm = self._echo.finish(pcm)
        return self._noise.finish(pcm) if self._noise is not None else pcm

    def _keep(self, pcm: np.ndarray) -> AudioIn:
        self._chunks.append(pcm)
        self.samples += pcm.size
        # Derived from a sample count, not summed per chunk: rounding must not drift.
        chunk = AudioIn(pcm=pcm, start_ms=self._timeline * 1000 // INTERNAL_RATE)
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
        tail = self._clean(self._captured(tail))
        if self._held.size:  # the turn's last partial frame
            tail = np.concatenate([tail, self._finish(self._held)])
            self._held = _NO_PCM
        if tail.size:
            self._keep(tail)
        self._decoder = AudioDecoder(self._fmt)
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, np.int16)
        self.clear()
        return audio, errors
