"""Typed client commands: what the wire codec produces and a session consumes.

Every command keeps the client's ``event_id`` so errors can echo it.
``urgent`` commands ride the session mailbox's control lane and overtake
queued ``media`` (a cancel never waits behind audio decoding), but never an
earlier command of another kind: a socket's commands take effect in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.contracts import InputMode
from vllm_duplex.domain.conversation import ConversationItem
from vllm_duplex.domain.session_config import AudioFormat, SessionPatch


@dataclass(frozen=True)
class Command:
    event_id: str | None = field(default=None, kw_only=True)
    # Urgent commands overtake queued media in the session's mailbox (a
    # cancel never waits behind audio decoding).
    urgent: ClassVar[bool] = False
    # Raw input media (audio, video) that an urgent command may overtake;
    # every other command keeps its place before a later urgent one.
    media: ClassVar[bool] = False


@dataclass(frozen=True)
class SessionUpdate(Command):
    patch: SessionPatch


@dataclass(frozen=True)
class AudioAppend(Command):
    audio: bytes  # raw bytes in the session's input format
    seq: int | None = None
    media: ClassVar[bool] = True


@dataclass(frozen=True)
class AudioCommit(Command):
    pass


@dataclass(frozen=True)
class AudioClear(Command):
    pass


@dataclass(frozen=True)
class ItemCreate(Command):
    item: ConversationItem  # id may be empty: the session mints one
    previous_item_id: str | None = None


@dataclass(frozen=True)
class ItemRetrieve(Command):
    item_id: str


@dataclass(frozen=True)
class ItemDelete(Command):
    item_id: str


@dataclass(frozen=True)
class ItemTruncate(Command):
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True)
class ResponseOptions:
    output_modalities: tuple[str, ...] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, Any] | None = None
    conversation: str = "auto"  # "auto" or "none" (out-of-band)
    # None: the session's. Given, they hold for this response only.
    tools: tuple[dict[str, Any], ...] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None  # accepted; the models make one call per response
    output_format: AudioFormat | None = None
    voice: str | None = None
    # The model's context instead of the conversation: new items, or the id
    # (a ``str``) of a conversation item (GA ``item_reference``).
    input: tuple[ConversationItem | str, ...] | None = None


@dataclass(frozen=True)
class ResponseCreate(Command):
    options: ResponseOptions = ResponseOptions()


@dataclass(frozen=True)
class ResponseCancel(Command):
    response_id: str | None = None
    urgent: ClassVar[bool] = True


@dataclass(frozen=True)
class DuplexInput(Command):
    """Extension ``duplex.input``: input with an explicit mode."""

    mode: InputMode
    text: str | None = None
    audio: bytes | None = None
    checkpoint: str | None = None


@dataclass(frozen=True)
class SessionClose(Command):
    """Extension ``session.close`` (also sent by the transport on disconnect)."""

    reason: CloseReason = CloseReason.CLIENT
    urgent: ClassVar[bool] = True


@dataclass(frozen=True)
class SessionResume(Command):
    """Extension ``session.resume``: attach this socket to a detached (or
    another socket's) session and replay what came after ``last_seq``. The
    transport handles it; it never reaches a session's mailbox."""

    session_id: str
    resume_token: str
    last_seq: int
    generation: int | None = None  # lease generation: compare-and-swap when given
    urgent: ClassVar[bool] = True


@dataclass(frozen=True)
class OutputAudioClear(Command):
    """``output_audio_buffer.clear`` (WebRTC calls): cut off the audio the
    call's outgoing track still holds. The call's transport carries it out
    (the buffer is its own); it never reaches a session."""

    urgent: ClassVar[bool] = True


@dataclass(frozen=True)
class EventAck(Command):
    """Extension ``session.event_ack``: the client has every event up to ``seq``;
    the journal may forget them."""

    seq: int
    urgent: ClassVar[bool] = True


@dataclass(frozen=True)
class VideoFrameIn(Command):
    """Extension ``duplex.video.frame``: one encoded camera frame (JPEG/PNG)."""

    image: bytes
    timestamp_ms: int | None = None  # the client's camera clock; default: arrival time
    media: ClassVar[bool] = True


@dataclass(frozen=True)
class VideoChunkIn(Command):
    """Extension ``duplex.video.chunk``: a WebM/MP4 fragment (the first one
    carries the header); frames come out as they decode."""

    data: bytes
    container: str  # "webm" | "mp4"
    media: ClassVar[bool] = True


@dataclass(frozen=True)
class VideoDecoded(Command):
    """Internal (never on the wire): the session's video decoder has frames."""

    media: ClassVar[bool] = True
