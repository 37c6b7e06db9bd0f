"""A session's recording: the caller and the assistant on one timeline, as
a stereo WAV a user can open (sans-I/O: audio and the time it was heard or
played in, bytes out).

- 24 kHz, 16-bit PCM, two channels: left the caller's input as the session
  heard it (what a mute gated is silence there), right the engine's output
  as it was played.
- One timeline, the session's clock from its start: each chunk is laid where
  it was heard or played -- a caller's chunk ends when it arrived (a
  microphone's 20 ms arrive as they end), an output chunk starts when it was
  sent (the session is paced: it is sent as it plays) -- but never over the
  track's own last chunk, so audio sent ahead of time (a burst, the pacing's
  lead) is laid end to end, never mixed into itself.
- Bounded: ``max_s`` seconds of timeline (``MAX_RECORDING_S``, 5 minutes:
  about 28.8 MB of WAV). What falls past it is dropped and ``truncated``
  says so: the recording is the session's first ``max_s`` seconds.
"""

from __future__ import annotations

import io
import wave

import numpy as np
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.audio import AudioDecoder

RECORDING_RATE = 24000
MAX_RECORDING_S = 300.0
CALLER, ASSISTANT = 0, 1  # the WAV's channels: left, right


class _Track:
    """One channel: its chunks where they lie, and where the last one ends."""

    __slots__ = ("decoder", "chunks", "end")

    def __init__(self, fmt: AudioFormat) -> None:
        self.decoder = AudioDecoder(fmt, RECORDING_RATE)
        self.chunks: list[tuple[int, np.ndarray]] = []
        self.end = 0  # in samples from the session's start


class Recording:
    """Two tracks from ``started_at`` (seconds, the session's clock) on."""

    def __init__(self, input_format: AudioFormat, output_format: AudioFormat, *,
                 started_at: float, max_s: float = MAX_RECORDING_S) -> None:
        self.started_at = started_at
        self.limit = int(max_s * RECORDING_RATE)
        self.truncated = False
        self._tracks = (_Track(input_format), _Track(output_format))

    def heard(self, audio: bytes, at: float) -> None:
        """The caller's ``audio`` (the session's input format) as the session
        got it, arrived at ``at``: it ends there."""
        self._lay(CALLER, audio, at, ends_at=True)

    def played(self, audio: bytes, at: float) -> None:
        """The engine's ``audio`` (the session's output format), sent at ``at``:
        it starts there."""
        self._lay(ASSISTANT, audio, at, ends_at=False)

    @property
    def duration_s(self) -> float:
        return min(self.limit, max(t.end for t in self._tracks)) / RECORDING_RATE

    def _lay(self, channel: int, audio: bytes, at: float, *, ends_at: bool) -> None:
        track = self._tracks[channel]
        pcm = track.decoder.decode(audio)
        if pcm.size == 0:
            return
        here = round((at - self.started_at) * RECORDING_RATE) - (pcm.size if ends_at else 0)
        start = max(here, track.end)
        room = self.limit - start
        if room < pcm.size:
            self.truncated = True
            if room <= 0:
                return
            pcm = pcm[:room]
        track.chunks.append((start, pcm))
        track.end = start + pcm.size

    def snapshot(self) -> Snapshot:
        """The recording so far, frozen (chunks are never changed once laid):
        its WAV may be built on another thread while this one goes on."""
        frames = min(self.limit, max(t.end for t in self._tracks))
        return Snapshot(frames, tuple(tuple(t.chunks) for t in self._tracks))

    def wav(self) -> bytes:
        return self.snapshot().wav()


class Snapshot:
    """A recording as it was: builds its WAV (tens of ms for minutes of audio:
    off the event loop, ``StoredSession.keep``)."""

    def __init__(self, frames: int, tracks: tuple[tuple[tuple[int, np.ndarray], ...], ...]) -> None:
        self.frames = frames
        self.tracks = tracks

    def wav(self) -> bytes:
        """A stereo WAV, left caller, right assistant."""
        stereo = np.zeros((self.frames, 2), dtype="<i2")
        for channel, chunks in enumerate(self.tracks):
            for start, pcm in chunks:
                stereo[start:start + pcm.size, channel] = pcm
        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(2)
            w.setsampwidth(2)
            w.setframerate(RECORDING_RATE)
            w.writeframes(stereo.tobytes())
        return out.getvalue()
