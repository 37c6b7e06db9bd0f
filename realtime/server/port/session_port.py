"""``SessionPort``: one realtime session as every transport holds it.

The shape each transport used to write for itself -- open a session, feed it
what the client sends, deliver its events, truncate what the listener did not
hear, end it -- is written here once. A transport (the realtime socket,
a WebRTC call, a SIP call, a Twilio stream) keeps only its wire: how frames
and audio arrive, how events leave, how it closes.

A dialect is a codec plus its ``Rules``. The codec turns a frame into a typed
command and an event into a frame (``Codec``: ``realtime/wire/codec.py``'s
``RealtimeCodec`` is one); the rules say what the dialect does with the two
client events that are about the transport rather than the session
(``session.resume`` mid-stream, ``output_audio_buffer.clear``).

Everything here but ``open``, ``resume``, ``events``, ``end`` and ``release``
is synchronous: feeding and truncating put a command on the session's
mailbox and never wait, so a shell calls them from a socket's reader, a
data-channel callback or a UDP datagram alike.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.commands import AudioAppend, ItemTruncate, OutputAudioClear, SessionResume
from vllm_duplex.domain.errors import Closed, DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import SessionConfig, SessionPatch
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.wire.codec import Dialect, RealtimeCodec
from vllm_duplex.replay.journal import Replay
from vllm_duplex.replay.outbox import Attachment, Notice
from vllm_duplex.session.runner import DuplexSession


class Codec(Protocol):
    """A dialect's sans-I/O codec (``RealtimeCodec`` is one)."""

    def parse(self, frame: str | bytes) -> Any: ...

    def render(self, item: Envelope) -> str | None: ...

    def render_error(self, err: DuplexError, fence: Fence | None = None) -> str: ...

    def render_notice(self, kind: str, fence: Fence | None = None, **fields: Any) -> str: ...


def realtime_codec(sessions: RealtimeSessions, dialect: Dialect = Dialect.GA) -> RealtimeCodec:
    """The OpenAI Realtime codec of this server (its event size limit, its
    model names): the one every transport speaks to its clients and parses a
    route's session config with."""
    return RealtimeCodec(max_event_bytes=sessions.max_event_bytes, dialect=dialect,
                         model_aliases=sessions.model_aliases)


@dataclass(frozen=True)
class Rules:
    """What a dialect does with the client events about its transport.

    ``no_resume``: why ``session.resume`` is refused on a running stream (a
    socket resumes only as its first event; a call has no resume).
    ``clear``: what ``output_audio_buffer.clear`` does -- cut what this
    transport plays -- or None where nothing here plays (``no_clear`` says why).
    """

    no_resume: str
    clear: Callable[[], None] | None = None
    no_clear: str = "output_audio_buffer.clear is for calls whose audio the server plays"


class SessionPort:
    """One session, as a transport holds it (see the module docstring)."""

    def __init__(self, sessions: RealtimeSessions, session: DuplexSession,
                 attachment: Attachment | None, codec: Codec) -> None:
        self.sessions = sessions
        self.session = session
        self.attachment = attachment  # where this transport reads the session's events
        self.codec = codec
        self.ended_by: Notice | None = None  # why ``events`` stopped: a notice, or None (closed)

    # ---- open --------------------------------------------------------------------------

    @classmethod
    async def open(cls, sessions: RealtimeSessions, codec: Codec, key: str | None,
                   patch: SessionPatch | None = None, *,
                   transport: SessionPatch | None = None) -> SessionPort:
        """Admit and start a new session, attached to this transport (the
        typed error of what refused it: key, room, config)."""
        session = await sessions.open(key, patch, transport=transport)
        return cls(sessions, session, session.attachment, codec)

    @classmethod
    async def resume(cls, sessions: RealtimeSessions, codec: Codec, key: str | None,
                     command: SessionResume) -> tuple[SessionPort, Replay, dict[str, Any]]:
        """Attach to a live (or adoptable) session (``session.resume``)."""
        session, att, replay, resumed = await sessions.resume(key, command)
        return cls(sessions, session, att, codec), replay, resumed

    @classmethod
    def watch(cls, sessions: RealtimeSessions, codec: Codec,
              session: DuplexSession) -> SessionPort:
        """Follow a session another transport holds (a call's sideband
        socket): every event from now on, without owning it. ``unwatch``
        when done."""
        return cls(sessions, session, session.watch(), codec)

    def unwatch(self) -> None:
        assert self.attachment is not None
        self.session.unwatch(self.attachment)

    @property
    def fence(self) -> Fence:
        return self.session.fence

    @property
    def config(self) -> SessionConfig:
        return self.session.config

    # ---- feed --------------------------------------------------------------------------

    def feed(self, frame: str | bytes, rules: Rules) -> None:
        """One client frame: parsed by the codec, the dialect's rules applied,
        the command delivered. Refused input raises its typed error, counted
        in ``duplex_errors_total`` (the shell answers it on its wire)."""
        received_at = self.sessions.now()
        try:
            command = self.codec.parse(frame)
            if isinstance(command, SessionResume):
                raise DuplexError("invalid_event", rules.no_resume, param="type",
                                  event_id=command.event_id)
            if isinstance(command, OutputAudioClear):
                if rules.clear is None:
                    raise DuplexError("capability_unsupported", rules.no_clear, param="type",
                                      event_id=command.event_id)
                rules.clear()
                return
            self.session.deliver(command, received_at)
        except DuplexError as err:
            self.sessions.count_error(err.code)
            raise

    def deliver(self, command: Any) -> None:
        """A command the transport made itself (not parsed from a frame)."""
        self.session.deliver(command, self.sessions.now())

    def append_audio(self, audio: bytes) -> None:
        """Audio the transport received (a microphone track, RTP, Twilio's
        media). ``Closed`` when the session ended under it (not counted: the
        caller did nothing wrong); any other refusal (e.g. the session lags:
        ``resource_exhausted``) is counted and raised."""
        try:
            self.deliver(AudioAppend(audio=audio))
        except Closed:
            raise
        except DuplexError as err:
            self.sessions.count_error(err.code)
            raise

    def truncate(self, item_id: str, heard_ms: int) -> None:
        """Keep only what the listener heard of ``item_id`` (what a client's
        ``conversation.item.truncate`` does, with its played milliseconds).
        Nothing when the session is closing or the item is gone."""
        try:
            self.deliver(ItemTruncate(item_id=item_id, content_index=0, audio_end_ms=heard_ms))
        except DuplexError:
            pass

    def error(self, err: DuplexError) -> str:
        """``err`` as this dialect's error frame, under the session's fence."""
        return self.codec.render_error(err, self.session.fence)

    # ---- deliver -----------------------------------------------------------------------

    async def events(self) -> AsyncIterator[Envelope]:
        """The session's events for this transport, in order, until its
        attachment ends (``ended_by``: the notice, or None when the session
        closed). Nothing when no attachment was given."""
        att = self.attachment
        if att is None:
            return
        while True:
            item = await att.get()
            if item is None or isinstance(item, Notice):
                self.ended_by = item
                return
            yield item

    # ---- end ---------------------------------------------------------------------------

    async def end(self, reason: CloseReason) -> CloseReason:
        """End the session (with its own reason when it already closed with
        one); the reason it ended with."""
        session = self.session
        await self.sessions.end(session, session.close_reason or reason)
        return session.close_reason or reason

    async def release(self, *, client_closed: bool) -> None:
        """This transport let go of a session it may come back to (a socket):
        ``client_closed`` ends it, a lost one waits for its resume."""
        assert self.attachment is not None
        await self.sessions.release(self.session, self.attachment, client_closed=client_closed)
