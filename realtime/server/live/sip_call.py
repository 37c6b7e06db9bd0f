"""A SIP call answered as a GPT-Live session (``POST /v1/live/sessions/{id}/accept``):
``telephony/sip_call.py``'s ``SipCall`` -- the same RTP, player, DTMF and
hang-up -- whose session speaks the GPT-Live codec to its sidebands.

A phone has no event channel, so everything the session says goes to the
sidebands (``lines.py``): each event rendered once by the live codec, the
caller's audio reflected before the mute, ``transport.dtmf.received`` for
each key the caller presses, and a sideband's ``transport.dtmf.send``
pressed on the line (``SipCall.send_dtmf``). Mute is the codec's gate, as on
a socket: while muted the session hears silence in the call's law.
"""

from __future__ import annotations

from typing import Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat
from vllm_duplex.realtime.server.live.lines import LiveLine
from vllm_duplex.realtime.server.telephony.sip_call import RATE, SipCall
from vllm_duplex.realtime.wire.live.codec import LiveCodec

_SILENCE = {AudioEncoding.PCMU: b"\xff", AudioEncoding.PCMA: b"\xd5"}


class LiveSipCall(SipCall):
    task_prefix = "live-sip"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        codec = self.port.codec
        assert isinstance(codec, LiveCodec)
        codec.silence = _SILENCE[self._law]
        self.line = LiveLine(codec, self.port, transport="sip", dtmf=self.send_dtmf)
        self._law_format = AudioFormat(self._law, RATE)

    async def _follow(self, item: Envelope) -> None:
        await super()._follow(item)  # what the phone plays
        audio = isinstance(item.event, ev.OutputAudioDelta)  # reflected as the sideband's own
        if audio or isinstance(item.event, ev.OutputAudioBackchannel):  # the phone plays
            self.line.share(item, None)
            if audio and (said := self.line.codec.said(item)) is not None:
                self.line.share(item, said)  # the words it says, as it plays
            return
        for text in self.line.codec.frames(item) or [None]:
            self.line.share(item, text)

    def _notify(self, kind: str, **fields: Any) -> None:
        # Realtime's call notices: only a key the caller pressed has a
        # GPT-Live event (the output buffer's have none: the phone plays).
        if kind == "input_audio_buffer.dtmf_event_received":
            self.line.to_sidebands(self.line.codec.render_dtmf("transport.dtmf.received",
                                                               fields["event"]))

    def _append(self, payload: bytes) -> None:
        self.line.reflect(payload, self._law_format)
        if self.line.codec.muted:
            payload = self.line.codec.silence * len(payload)
        super()._append(payload)

    async def _after_stop(self, reason: Any) -> None:
        await super()._after_stop(reason)
        self.line.end()
