"""A call's audio: the microphone track in, the reply track out.

In: aiortc decodes the caller's Opus into 48 kHz frames; each becomes the
``input_audio_buffer.append`` a WebSocket client would have sent, in the
session's input format (soxr resamples, as for any client), so the session
cannot tell a call from a socket.

Out: ``ReplyTrack`` plays what a WebSocket client's player would, through
the call's ``ReplyPlayer`` (``realtime/server/reply_player.py``, shared with
phone calls): the session's audio deltas (decoded from the response's output
format, resampled to 48 kHz) queue in it; aiortc pulls one 20 ms frame at a
time and encodes it as Opus; when nothing is queued the frame is silence.
The player knows what the caller has been sent of each item, so a clear cuts
exactly there, and it reports the WebRTC-only facts
``output_audio_buffer.started`` / ``.stopped`` / ``.cleared`` through
``on_buffer``. The session's paced output keeps it shallow (its lead, 300 ms
by default).
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.audio import AudioEncoder
from vllm_duplex.realtime.server.reply_player import ReplyPlayer

RATE = 48000  # Opus's clock: what aiortc decodes to and encodes from
FRAME = RATE // 50  # 20 ms
_TIME_BASE = fractions.Fraction(1, RATE)


def mono_int16(frame: av.AudioFrame) -> np.ndarray:
    """One decoded frame as mono int16 (channels averaged)."""
    data = frame.to_ndarray()
    channels = len(frame.layout.channels)
    if frame.format.is_planar:
        pcm = data.reshape(channels, -1)
    else:
        pcm = data.reshape(-1, channels).T
    if pcm.dtype != np.int16:  # e.g. fltp from another decoder
        pcm = np.clip(pcm * 32767.0, -32768, 32767)
    return pcm.astype(np.int32).mean(axis=0).astype(np.int16) if channels > 1 else pcm[0].astype(np.int16)


class MicrophoneEncoder:
    """48 kHz mono PCM -> the bytes of an ``input_audio_buffer.append`` in
    the session's input format (rebuilt when the session changes it)."""

    def __init__(self) -> None:
        self._fmt: AudioFormat | None = None
        self._encoder: AudioEncoder | None = None

    def encode(self, pcm: np.ndarray, fmt: AudioFormat) -> bytes:
        if fmt != self._fmt or self._encoder is None:
            self._fmt, self._encoder = fmt, AudioEncoder(fmt, in_rate=RATE)
        return self._encoder.encode(pcm)


class ReplyTrack(MediaStreamTrack):
    """The outgoing audio track of a call (see the module docstring): aiortc
    pulls a 20 ms frame at a time, at real time, from the call's
    ``ReplyPlayer`` (``player``: the session's deltas go in there)."""

    kind = "audio"

    def __init__(self, on_buffer: Callable[[str, str], None]) -> None:
        super().__init__()
        self.player = ReplyPlayer(on_buffer, RATE)
        self._start: float | None = None
        self._pts = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            wait = self._start + self._pts / RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        out, _ = self.player.pull()
        frame = av.AudioFrame.from_ndarray(out.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = _TIME_BASE
        self._pts += FRAME
        return frame
