"""A GPT-Live WebRTC session (``POST /v1/live/sessions``, the SDK's
``live.create``): ``webrtc/call.py``'s ``RtcCall`` -- the same peer
connection, Opus tracks, paced reply and hang-up -- whose ``oai-events``
data channel speaks GPT-Live.

- The data channel gets ``session.started`` first (the SDK: "wait for
  session.started on the data channel before sending commands"), then the
  session's GPT-Live events -- but the reply's audio, which is on the track.
- The microphone is the track: ``session.input_audio.append`` on the channel
  is refused (the SDK: "WebRTC and SIP sessions send audio over their media
  transport"). Mute is the codec's gate, as on a socket.
- ``session.client.data_channel`` (``DataChannelPolicy``) limits what an
  untrusted frontend may send and receive on the channel; sidebands are
  trusted and get everything (``lines.py``), the reply's audio included.
- No ``output_audio_buffer.*``: GPT-Live has no such events.
- A stored session (``store: true``; a fork inherits it) is recorded -- the
  microphone after the mute gate, the reply as the track plays it -- and
  saved at the start, after each reply and at the end (``stored.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain.commands import AudioAppend
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.events import Envelope
from vllm_duplex.realtime.server.live.lines import LiveLine
from vllm_duplex.realtime.server.live.stored import StoredSession
from vllm_duplex.realtime.server.webrtc.call import RtcCall
from vllm_duplex.realtime.wire.live.client_events import HANDLED, REFUSED
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.commands import LiveAck, LiveDtmf, LiveStart
from vllm_duplex.realtime.wire.live.decisions import DecisionRun, ItemReply
from vllm_duplex.realtime.wire.live.delegated import each_command

_P = "session.client.data_channel"


@dataclass(frozen=True)
class DataChannelPolicy:
    """``ClientConfig.data_channel``: the client events a frontend may send
    and the server events it may get; None: all (the SDK's default)."""

    client_events: frozenset[str] | None = None
    server_events: frozenset[str] | None = None

    @classmethod
    def parse(cls, raw: Any) -> DataChannelPolicy:
        if raw is None:
            return cls()
        channel = raw.get("data_channel") if isinstance(raw, dict) else None
        if not isinstance(channel, dict):
            raise DuplexError("invalid_value", "session.client is {data_channel: {…}}",
                              param="session.client")
        return cls(_events(channel.get("allowed_client_events"), "allowed_client_events"),
                   _events(channel.get("allowed_server_events"), "allowed_server_events"))

    def may_send(self, kind: str) -> bool:
        return self.client_events is None or kind in self.client_events

    def may_get(self, text: str) -> bool:
        if self.server_events is None:
            return True
        kind = text[9:text.index('"', 9)]  # frames start {"type":"…"
        return kind in self.server_events


def _events(raw: Any, name: str) -> frozenset[str] | None:
    if raw is None or raw == "all":
        return None
    if not isinstance(raw, list):
        raise DuplexError("invalid_value", f"{name} is 'all' or a list", param=f"{_P}.{name}")
    out = set()
    for item in raw:
        kind = item.get("type") if isinstance(item, dict) else item
        if not isinstance(kind, str):
            raise DuplexError("invalid_value", f"{name} lists event types", param=f"{_P}.{name}")
        if name == "allowed_client_events" and kind not in HANDLED and kind not in REFUSED:
            raise DuplexError("invalid_value", f"{kind!r} is no GPT-Live client event",
                              param=f"{_P}.{name}")
        out.add(kind)
    return frozenset(out)


class LiveRtcCall(RtcCall):
    task_prefix = "live-rtc"
    policy = DataChannelPolicy()
    stored: StoredSession | None = None  # its recording and saves, when store: true

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        codec = self.port.codec
        assert isinstance(codec, LiveCodec)
        self.line = LiveLine(codec, self.port, transport="webrtc")
        self.line.primary = self._to_channel

    # ---- the data channel, in ----------------------------------------------------

    def _on_message(self, message: str | bytes) -> None:
        codec = self.line.codec
        try:
            if len(message) <= codec.max_event_bytes:
                kind = _kind(message)
                if kind is not None and not self.policy.may_send(kind):
                    raise DuplexError("invalid_event", f"this data channel may not send {kind} "
                                      f"({_P}.allowed_client_events)", param="type")
            command = codec.parse(message)
            if isinstance(command, LiveStart):
                raise DuplexError("invalid_event", "the session started with its call: "
                                  "no session.start", param="type", event_id=command.event_id)
            if isinstance(command, AudioAppend):
                raise DuplexError("invalid_event", "a WebRTC session's audio is its "
                                  "microphone track", param="type", event_id=command.event_id)
            if isinstance(command, LiveDtmf):
                raise DuplexError("capability_unsupported", "transport.dtmf.send is a sideband "
                                  "command for SIP calls", param="type",
                                  event_id=command.event_id)
            if isinstance(command, (LiveAck, ItemReply)):
                self.line.publish(codec.render_ack(command))
                return
            if isinstance(command, DecisionRun):  # not available: no chooser on a call's codec
                raise DuplexError("capability_unsupported", "Decisions on a WebRTC session are "
                                  "not supported yet", param="type", event_id=command.event_id)
            for one in each_command(command):
                self.port.deliver(one)
        except DuplexError as err:
            self.port.sessions.count_error(err.code)
            self._send_now(self.port.error(err))

    def _heard(self, audio: bytes) -> bytes:
        codec = self.line.codec
        self.line.reflect(audio, self.port.config.input_format)
        heard = codec.silence * len(audio) if codec.muted else audio
        if self.stored is not None:
            self.stored.heard(heard)
        return heard

    # ---- a stored session ----------------------------------------------------------

    async def store(self, api_key: str | None) -> None:
        """Keep this session (``store: true``): recorded from now, saved now,
        after each reply and at the end. Before the peer connects."""
        self.stored = StoredSession(self.port.sessions, self.port, self.line.codec, api_key)
        await self._keep()

    async def _keep(self) -> None:
        if self.stored is not None and (err := await self.stored.keep()) is not None:
            self._send_now(self.port.error(err))  # the session goes on

    # ---- the session's events, out -------------------------------------------------

    def _to_channel(self, text: str | None) -> None:
        if text is not None and self.policy.may_get(text):
            self._send_now(text)

    async def _follow(self, item: Envelope) -> None:
        if self.stored is not None:
            self.stored.played(item.event)
            if isinstance(item.event, ev.ResponseDone):
                await self._keep()
        if self.track.player.follow(item.event, self.port.config):
            self.line.share(item, None)  # the reply's audio: the track's; reflected to sidebands
            said = self.line.codec.said(item)  # the words it says, as it plays
            if said is not None:
                if self.policy.may_get(said):
                    await self._send(said)
                self.line.share(item, said)
            return
        if isinstance(item.event, ev.OutputAudioBackchannel):
            return  # its clip is no track audio yet (the track plays replies only)
        texts = self.line.codec.frames(item)  # the delegation's events, then the event's own
        for text in texts:
            if self.policy.may_get(text):
                await self._send(text)
        for text in texts or [None]:
            self.line.share(item, text)

    def _buffer_event(self, kind: str, response_id: str) -> None:
        """The track's ``output_audio_buffer.*``: GPT-Live has no such events."""

    async def _after_stop(self, reason: Any) -> None:
        await super()._after_stop(reason)
        await self._keep()  # a stored session's last save
        self.line.end()


def _kind(frame: str | bytes) -> str | None:
    """A frame's event type, read before the codec parses it (parsing acts:
    a mute gates at once); None where the codec will answer the frame itself."""
    try:
        obj = json.loads(frame)
    except (ValueError, RecursionError):
        return None
    kind = obj.get("type") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) else None
