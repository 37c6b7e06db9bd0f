"""A GPT-Live session as its sidebands reach it: ``LiveLine``, and
``LiveLines``, this process's live sessions by id.

GPT-Live's sideband (``WS /v1/live/sessions/{id}/attach``, ``sideband.py``)
is a trusted server's view of a session another transport holds -- the
primary WebSocket (``socket.py``) or a SIP call (``sip_call.py``): it gets
the session's server events, the caller's audio reflected, the telephony
events, and may send commands. A session has **one** codec, the primary
transport's: it holds the session's GPT-Live state (the mute gate, the
timeline, the ``client_event_id`` each answer owes, the delegation as
accepted), so a sideband's ``mute`` gates the primary's microphone and a
sideband's ``session.update`` is answered with its own event id. Each event
is rendered once, by the transport that reads the session's events, and the
same frame -- the same ``event_id`` -- goes to the primary and to every
sideband (``publish``), as one server event delivered to each.

A sideband's frames wait in its own bounded queue (``Offer``), so a slow
sideband never holds up the primary or the session: one that falls
``MAX_QUEUED`` frames behind is dropped (closed 1008), the session goes on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.media.audio import AudioDecoder
from vllm_duplex.realtime.server.port.session_port import SessionPort
from vllm_duplex.realtime.wire.live.audio_frames import (
    input_reflection,
    is_audio_delta,
    output_reflection,
)
from vllm_duplex.realtime.wire.live.codec import LiveCodec

Offer = Callable[[str | None], None]  # a listener's queue: one frame (None: the end); never waits
REFLECT_RATE = 24000  # GPT-Live reflects input audio as PCM16 at 24 kHz
MAX_QUEUED = 4096  # frames a sideband may fall behind (about 80 s of 20 ms audio)


class LiveLine:
    """One live session's shared codec and the fan-out of its frames (see
    the module docstring). ``dtmf`` presses a key for a SIP caller; None
    where the transport has no telephone line."""

    def __init__(self, codec: LiveCodec, port: SessionPort, *, transport: str,
                 dtmf: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.codec = codec
        self.port = port
        self.transport = transport  # "websocket" or "sip": what a refusal names
        self.dtmf = dtmf
        self.primary: Offer | None = None  # the primary's event channel (a SIP call has none)
        self.sidebands: set[Offer] = set()
        self.ended = asyncio.Event()
        # Set once the session's ``session.started`` went out: a sideband that
        # attaches waits for it, so its own first event is the whole session.
        self.started = asyncio.Event()
        self._reflector: AudioDecoder | None = None
        self._replayer: AudioDecoder | None = None  # the reply's audio, for the sidebands
        self._reply_end_ms = 0  # where the last reflected reply audio ended
        self._closed_sent = False
        self._on_end: Callable[[LiveLine], None] | None = None

    @property
    def session_id(self) -> str:
        return self.port.session.session_id

    def publish(self, text: str | None) -> None:
        """One server event to the primary and every sideband."""
        if text is None:
            return
        if self.primary is not None:
            self.primary(text)
        self.to_sidebands(text)

    def to_sidebands(self, text: str | None) -> None:
        """An event for the sidebands only: the transport.* events, reflected
        audio, and what the primary's own writer sent it already."""
        if text is None:
            return
        if text.startswith('{"type":"session.closed"'):
            self._closed_sent = True
        elif text.startswith('{"type":"session.started"'):
            self.started.set()
        for offer in list(self.sidebands):
            offer(text)

    def share(self, item: Envelope, text: str | None) -> None:
        """What the transport that reads the session's events rendered of
        ``item`` (``text``), for the sidebands -- but the reply's audio, which
        a sideband gets as GPT-Live reflects it: PCM16 at 24 kHz with its
        range on the session timeline, whatever the primary's format."""
        if isinstance(item.event, ev.OutputAudioDelta) and (
                text is None or is_audio_delta(text)):
            if self.sidebands and item.event.delta:
                self._reflect_output(item.event.delta, self.port.config.output_format)
            return
        self.to_sidebands(text)  # an audio delta's other frame: the words it says

    def _reflect_output(self, audio: bytes, fmt: AudioFormat) -> None:
        if self._replayer is None or self._replayer.fmt != fmt:
            self._replayer = AudioDecoder(fmt, out_rate=REFLECT_RATE)
        pcm = self._replayer.decode(audio)
        if not pcm.size:
            return
        # Contiguous within a reply (the server paces it); a pause leaves a gap.
        start = max(self._reply_end_ms, self.codec.now_ms())
        self._reply_end_ms = start + pcm.size * 1000 // REFLECT_RATE
        self.to_sidebands(output_reflection(pcm.astype("<i2").tobytes(), start,
                                                              self._reply_end_ms))

    def reflect(self, audio: bytes, fmt: AudioFormat) -> None:
        """Input audio as the primary transport received it (before the mute)
        to the sidebands: ``session.input_audio.append``, PCM16 at 24 kHz."""
        if not self.sidebands or not audio:
            return
        if self._reflector is None or self._reflector.fmt != fmt:
            self._reflector = AudioDecoder(fmt, out_rate=REFLECT_RATE)
        pcm = self._reflector.decode(audio)
        if pcm.size:
            self.to_sidebands(input_reflection(pcm.astype("<i2").tobytes()))

    async def running(self) -> bool:
        """Wait until the session started (True) or ended first (False)."""
        if not self.started.is_set() and not self.ended.is_set():
            waits = [asyncio.ensure_future(e.wait()) for e in (self.started, self.ended)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
        return self.started.is_set() and not self.ended.is_set()

    async def press(self, digit: str) -> None:
        """``transport.dtmf.send``: the key, on a SIP call's line."""
        if self.dtmf is None:
            raise DuplexError("capability_unsupported", "transport.dtmf.send is for SIP calls; "
                              f"this session's transport is a {self.transport}", param="type")
        await self.dtmf(digit)

    def end(self) -> None:
        """The session is over: ``session.closed`` if the sidebands have not
        had it (a call's tasks stop as it ends), then their end."""
        if self.ended.is_set():
            return
        if not self._closed_sent:
            session = self.port.session
            self.to_sidebands(self.codec.closed(session.close_reason.value
                                                if session.close_reason else "disconnect"))
        for offer in list(self.sidebands):
            offer(None)
        self.ended.set()
        if self._on_end is not None:
            self._on_end(self)


class LiveLines:
    """This process's live sessions that a sideband may attach to, by id
    (a WebSocket session's id, a SIP call's id)."""

    def __init__(self, sessions: RealtimeSessions) -> None:
        self.sessions = sessions
        self._lines: dict[str, LiveLine] = {}

    def __len__(self) -> int:
        return len(self._lines)

    def add(self, line_id: str, line: LiveLine) -> None:
        self._lines[line_id] = line
        line._on_end = lambda ended: self._remove(line_id, ended)

    def _remove(self, line_id: str, line: LiveLine) -> None:
        if self._lines.get(line_id) is line:
            del self._lines[line_id]

    def get(self, line_id: str, api_key: str | None) -> LiveLine:
        """The session, for the key that owns it; any other key, an unknown
        or ended session: ``session_not_found`` (no existence leak)."""
        line = self._lines.get(line_id)
        try:
            if line is None or line.ended.is_set():
                raise DuplexError("session_not_found", "no such session")
            self.sessions.check_owner(line.session_id, api_key)
        except DuplexError:
            raise DuplexError("session_not_found", f"no live session {line_id!r} for this key",
                              param="session_id") from None
        return line
