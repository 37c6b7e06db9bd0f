"""A stored GPT-Live session (``store: true``), the shell's side of it: what
its transport heard and played goes into its recording
(``media/recording.py``), and ``keep`` saves it -- its start config, its
conversation (``realtime/wire/live/forks.py``'s ``stored_items``) and the
recording so far -- through ``RealtimeSessions.keep_live``
(``durable/live_sessions.py``). The socket and the WebRTC call both own one
when their session is stored, and save at the start, after each reply and
at the end.

What is recorded: the caller's audio as the session got it (after the mute
gate: muted is silence), and what the client was sent to play -- replies,
backchannels and a socket's audio fixtures, paced as they play -- on the
session's clock.
"""

from __future__ import annotations

import asyncio
import logging

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.media.recording import Recording
from vllm_duplex.realtime.server.port.session_port import SessionPort
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.forks import stored_items

log = logging.getLogger(__name__)


class StoredSession:
    def __init__(self, sessions: RealtimeSessions, port: SessionPort, codec: LiveCodec,
                 api_key: str | None) -> None:
        self.sessions = sessions
        self.port = port
        self.codec = codec
        self.api_key = api_key
        config = port.config
        self.recording = Recording(config.input_format, config.output_format,
                                   started_at=sessions.now())
        # One save at a time, each of the state when it began: a later save
        # never lands before an earlier one (a reply's and the last may overlap).
        self._saving = asyncio.Lock()

    def heard(self, audio: bytes) -> None:
        """The caller's audio as the session got it (input format)."""
        self.recording.heard(audio, self.sessions.now())

    def played(self, event: ev.ServerEvent) -> None:
        """A session event on its way to the client: its voice, if it is any."""
        if isinstance(event, ev.OutputAudioDelta):
            self.played_audio(event.delta)
        elif isinstance(event, ev.OutputAudioBackchannel):
            self.played_audio(event.audio)

    def played_audio(self, audio: bytes) -> None:
        """Audio sent to the client now (output format): a reply's, a fixture's."""
        self.recording.played(audio, self.sessions.now())

    async def keep(self) -> DuplexError | None:
        """Save now; the store's typed error if it could not (the session goes on)."""
        # The id its client knows: a call's (``rtc_…``), else the session's.
        session_id = self.codec.session_id or self.port.session.session_id
        async with self._saving:
            items = stored_items(self.port.session.snapshot()["items"])
            # Minutes of audio take tens of ms to lay out: a thread's work, not the loop's.
            wav = await asyncio.to_thread(self.recording.snapshot().wav)
            try:
                await self.sessions.keep_live(session_id, config=self.codec.started_with,
                                              items=items, api_key=self.api_key, recording=wav)
            except DuplexError as err:
                log.warning("live session %s not stored: %s", session_id, err)
                return err
        return None
