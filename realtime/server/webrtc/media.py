"""A call's audio: the microphone track in, the reply track out.

In: aiortc decodes the caller's Opus into 48 kHz frames; each becomes the
``input_audio_buffer.append`` a WebSocket client would have sent, in the
session's input format (soxr resamples, as for any client), so the session
cannot tell a call from a socket.

Out: ``ReplyTrack`` is the player a WebSocket client runs itself. The
session's audio deltas (decoded from the response's output format, resampled
to 48 kHz) queue in it; aiortc pulls one 20 ms frame at a time and encodes it
as Opus; when nothing is queued the frame is silence. It knows what the
caller has been sent of each item, so a clear cuts exactly there, and it
reports the WebRTC-only facts ``output_audio_buffer.started`` / ``.stopped``
/ ``.cleared`` through ``on_buffer``. The session's paced output keeps it
shallow (its lead, 300 ms by default).
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.session_config import AudioEncoding, AudioFormat
from vllm_duplex.media.audio import AudioDecoder, AudioEncoder

RATE = 48000  # Opus's clock: what aiortc decodes to and encodes from
FRAME = RATE // 50  # 20 ms
_TIME_BASE = fractions.Fraction(1, RATE)


def wire_format(raw: dict[str, Any] | None, default: AudioFormat) -> AudioFormat:
    """The ``AudioFormat`` of a response's ``audio.output.format`` object."""
    if not isinstance(raw, dict):
        return default
    encoding = AudioEncoding(raw.get("type", default.encoding.value))
    rate = int(raw.get("rate", 8000 if encoding is not AudioEncoding.PCM16 else default.rate))
    return AudioFormat(encoding, rate)


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


@dataclass
class _Chunk:
    response_id: str
    item_id: str
    start_ms: float  # the item position of its first sample
    pcm: np.ndarray
    offset: int = 0  # samples already sent


class ReplyTrack(MediaStreamTrack):
    """The outgoing audio track of a call (see the module docstring)."""

    kind = "audio"

    def __init__(self, on_buffer: Callable[[str, str], None]) -> None:
        super().__init__()
        self._on_buffer = on_buffer  # (event type, response_id)
        self._queue: deque[_Chunk] = deque()
        self._decoders: dict[str, tuple[AudioFormat, AudioDecoder, str]] = {}  # + its item
        self._position: dict[str, float] = {}  # item -> position of the next audio it gets
        self._playing: str | None = None  # the response whose audio is going out
        self._finished: set[str] = set()  # responses whose audio is all in
        self._cut: set[str] = set()  # responses cleared by the caller: later audio is dropped
        self._start: float | None = None
        self._pts = 0
        self._sent: tuple[str, str, float] | None = None  # (response, item, position) sent up to

    # ---- from the call's writer (the session's events) -----------------------

    def push(self, response_id: str, item_id: str, data: bytes, fmt: AudioFormat) -> None:
        if response_id in self._cut:
            return
        known = self._decoders.get(response_id)
        if known is None or known[0] != fmt or known[2] != item_id:
            if known is not None:
                self._tail(response_id)
            known = self._decoders[response_id] = (fmt, AudioDecoder(fmt, out_rate=RATE), item_id)
        self._append(response_id, item_id, known[1].decode(data))

    def _tail(self, response_id: str) -> None:
        """What the resampler still holds of a response (its last milliseconds)."""
        known = self._decoders.pop(response_id, None)
        if known is not None:
            try:
                self._append(response_id, known[2], known[1].flush())
            except DuplexError:
                pass  # a dangling byte of odd PCM16: the rest was played

    def _append(self, response_id: str, item_id: str, pcm: np.ndarray) -> None:
        if pcm.size == 0:
            return
        start = self._position.get(item_id, 0.0)
        self._position[item_id] = start + pcm.size * 1000 / RATE
        self._queue.append(_Chunk(response_id, item_id, start, pcm))

    def seek(self, item_id: str, position_ms: int) -> None:
        """The next audio of ``item_id`` starts at ``position_ms`` (a resumed reply)."""
        self._position[item_id] = float(position_ms)

    def finish(self, response_id: str) -> None:
        """No more audio of ``response_id`` is coming (its ``response.done``)."""
        self._finished.add(response_id)
        if response_id not in self._cut:
            self._tail(response_id)
        self._decoders.pop(response_id, None)
        if self._playing == response_id and not self._queue:
            self._stopped()

    def clear(self) -> tuple[str, str, int] | None:
        """Drop what is queued. Returns ``(response_id, item_id, heard_ms)``
        of the item that was cut, or None when nothing was playing."""
        playing, sent = self._playing, self._sent
        self._queue.clear()
        if playing is None:
            return None
        self._cut.add(playing)
        self._playing = None
        self._on_buffer("output_audio_buffer.cleared", playing)
        if sent is None or sent[0] != playing:
            return None
        return sent[0], sent[1], int(sent[2])

    def interrupted(self) -> None:
        """Speech over the reply: the caller's playback stops, as a client's
        does at ``speech_started`` (a resumed reply is sent again)."""
        playing = self._playing
        self._queue.clear()
        if playing is not None:
            self._playing = None
            self._on_buffer("output_audio_buffer.cleared", playing)

    @property
    def playing(self) -> str | None:
        return self._playing

    # ---- to aiortc: one 20 ms frame at a time, at real time --------------------

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            wait = self._start + self._pts / RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        out = np.zeros(FRAME, dtype=np.int16)
        filled = 0
        while filled < FRAME and self._queue:
            head = self._queue[0]
            if self._playing != head.response_id:
                self._playing = head.response_id
                self._on_buffer("output_audio_buffer.started", head.response_id)
            take = min(FRAME - filled, head.pcm.size - head.offset)
            out[filled:filled + take] = head.pcm[head.offset:head.offset + take]
            head.offset += take
            filled += take
            self._sent = (head.response_id, head.item_id, head.start_ms + head.offset * 1000 / RATE)
            if head.offset >= head.pcm.size:
                self._queue.popleft()
        if not self._queue and self._playing in self._finished:
            self._stopped()
        frame = av.AudioFrame.from_ndarray(out.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = _TIME_BASE
        self._pts += FRAME
        return frame

    def _stopped(self) -> None:
        playing, self._playing = self._playing, None
        if playing is not None:
            self._finished.discard(playing)
            self._on_buffer("output_audio_buffer.stopped", playing)
