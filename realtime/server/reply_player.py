"""The reply player of a call, sans-I/O: what a WebSocket client's player
does, at the call's rate -- a WebRTC call's reply track at Opus's 48 kHz
(``webrtc/media.py``), a phone call's RTP at G.711's 8 kHz
(``telephony/sip_call.py``).

The session's audio deltas (in the response's output format) are decoded
to the call's rate and queued; the call's sender ``pull``s one 20 ms frame
at a time, at real time; when nothing is queued the frame is silence. The
player knows what the caller has been sent of each item, so a clear cuts
exactly there (``clear`` returns the heard position for
``conversation.item.truncate``), and it reports ``output_audio_buffer.
started`` / ``.stopped`` / ``.cleared`` through ``on_buffer``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat, SessionConfig
from vllm_duplex.media.audio import AudioDecoder

def wire_format(raw: dict[str, Any] | None, default: AudioFormat) -> AudioFormat:
    """The ``AudioFormat`` of a response's ``audio.output.format`` object."""
    if not isinstance(raw, dict):
        return default
    encoding = AudioEncoding(raw.get("type", default.encoding.value))
    rate = int(raw.get("rate", 8000 if encoding is not AudioEncoding.PCM16 else default.rate))
    return AudioFormat(encoding, rate)


@dataclass
class _Chunk:
    response_id: str
    item_id: str
    start_ms: float  # the item position of its first sample
    pcm: np.ndarray
    offset: int = 0  # samples already pulled


class ReplyPlayer:
    def __init__(self, on_buffer: Callable[[str, str], None], rate: int) -> None:
        self.rate = rate
        self.frame = rate // 50  # samples in 20 ms
        self._on_buffer = on_buffer  # (event type, response_id)
        self._queue: deque[_Chunk] = deque()
        self._decoders: dict[str, tuple[AudioFormat, AudioDecoder, str]] = {}  # + its item
        self._position: dict[str, float] = {}  # item -> position of the next audio it gets
        self._playing: str | None = None
        self._finished: set[str] = set()
        self._cut: set[str] = set()  # responses cleared: their later audio is dropped
        self._sent: tuple[str, str, float] | None = None  # (response, item, position) sent up to
        self._formats: dict[str, AudioFormat] = {}  # response id -> its output format

    @property
    def playing(self) -> str | None:
        return self._playing

    @property
    def queued_ms(self) -> float:
        return sum(c.pcm.size - c.offset for c in self._queue) * 1000 / self.rate

    def follow(self, event: ev.ServerEvent, config: SessionConfig) -> bool:
        """What one of the session's events means for the caller's ear: reply
        audio is queued (True: the call plays it, and sends no event for
        it), a reply's end, speech over it (the caller stops hearing it at
        once when turn detection interrupts) and a resumed reply move the
        player; every other event is the call's to send."""
        if isinstance(event, ev.OutputAudioDelta):
            fmt = self._formats.get(event.response_id, config.output_format)
            self.push(event.response_id, event.item_id, event.delta, fmt)
            return True
        if isinstance(event, ev.ResponseCreated):
            raw = (event.response.get("audio") or {}).get("output") or {}
            self._formats[event.response["id"]] = wire_format(raw.get("format"),
                                                              config.output_format)
        elif isinstance(event, ev.ResponseDone):
            self._formats.pop(event.response["id"], None)
            self.finish(event.response["id"])
        elif isinstance(event, ev.SpeechStarted):
            td = config.turn_detection
            if td is None or td.interrupt_response:
                self.interrupted()
        elif isinstance(event, ev.OutputAudioResumed):
            self.seek(event.item_id, event.audio_start_ms)
        return False

    def push(self, response_id: str, item_id: str, data: bytes, fmt: AudioFormat) -> None:
        if response_id in self._cut:
            return
        known = self._decoders.get(response_id)
        if known is None or known[0] != fmt or known[2] != item_id:
            if known is not None:
                self._tail(response_id)
            known = self._decoders[response_id] = (fmt, AudioDecoder(fmt, out_rate=self.rate),
                                                    item_id)
        self._append(response_id, item_id, known[1].decode(data))

    def _tail(self, response_id: str) -> None:
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
        self._position[item_id] = start + pcm.size * 1000 / self.rate
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
        """Drop what is queued; ``(response_id, item_id, heard_ms)`` of the
        item cut, or None when nothing was playing."""
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
        """Speech over the reply: stop sending it at once (the session cuts
        the reply and its item; a resumed reply is pushed again)."""
        playing = self._playing
        self._queue.clear()
        if playing is not None:
            self._playing = None
            self._on_buffer("output_audio_buffer.cleared", playing)

    def pull(self) -> tuple[np.ndarray, bool]:
        """The next 20 ms frame (int16 at the call's rate) and whether it
        holds reply audio."""
        frame = self.frame
        out = np.zeros(frame, dtype=np.int16)
        filled = 0
        while filled < frame and self._queue:
            head = self._queue[0]
            if self._playing != head.response_id:
                self._playing = head.response_id
                self._on_buffer("output_audio_buffer.started", head.response_id)
            take = min(frame - filled, head.pcm.size - head.offset)
            out[filled:filled + take] = head.pcm[head.offset:head.offset + take]
            head.offset += take
            filled += take
            self._sent = (head.response_id, head.item_id,
                          head.start_ms + head.offset * 1000 / self.rate)
            if head.offset >= head.pcm.size:
                self._queue.popleft()
        if not self._queue and self._playing in self._finished:
            self._stopped()
        return out, filled > 0

    def _stopped(self) -> None:
        playing, self._playing = self._playing, None
        if playing is not None:
            self._finished.discard(playing)
            self._on_buffer("output_audio_buffer.stopped", playing)
