"""Typed server events: what a session produces and the wire codec renders.

Field names are the wire names of OpenAI Realtime GA; ``type`` is the GA event
name (beta aliases are a rendering concern of ``vllm_duplex.realtime.wire``).
Documents (items, responses, the session object) are snapshotted as wire dicts
at the moment the event is made, so later mutation never changes history.
``bytes`` fields are base64-encoded by the codec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence


# A field's metadata for what the engine carries and no wire renders.
ENGINE_ONLY = {"wire": False}


@dataclass(frozen=True)
class ServerEvent:
    type: ClassVar[str]


@dataclass(frozen=True)
class SessionCreated(ServerEvent):
    type: ClassVar[str] = "session.created"
    session: dict[str, Any]
    resume_token: str


@dataclass(frozen=True)
class SessionUpdated(ServerEvent):
    type: ClassVar[str] = "session.updated"
    session: dict[str, Any]


@dataclass(frozen=True)
class ErrorEvent(ServerEvent):
    type: ClassVar[str] = "error"
    error: DuplexError


@dataclass(frozen=True)
class InputAudioBufferCommitted(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None


@dataclass(frozen=True)
class InputAudioBufferCleared(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.cleared"


@dataclass(frozen=True)
class InputAudioBufferTimeoutTriggered(ServerEvent):
    """server_vad's idle timeout passed: the silent segment of the input
    audio, committed next as ``item_id`` (session/idle.py)."""

    type: ClassVar[str] = "input_audio_buffer.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True)
class SpeechStarted(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


@dataclass(frozen=True)
class SpeechStopped(ServerEvent):
    type: ClassVar[str] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


@dataclass(frozen=True)
class ConversationItemAdded(ServerEvent):
    type: ClassVar[str] = "conversation.item.added"
    item: dict[str, Any]
    previous_item_id: str | None


@dataclass(frozen=True)
class ConversationItemDone(ServerEvent):
    type: ClassVar[str] = "conversation.item.done"
    item: dict[str, Any]
    previous_item_id: str | None


@dataclass(frozen=True)
class ConversationItemRetrieved(ServerEvent):
    type: ClassVar[str] = "conversation.item.retrieved"
    item: dict[str, Any]


@dataclass(frozen=True)
class ConversationItemDeleted(ServerEvent):
    type: ClassVar[str] = "conversation.item.deleted"
    item_id: str


@dataclass(frozen=True)
class ConversationItemTruncated(ServerEvent):
    type: ClassVar[str] = "conversation.item.truncated"
    item_id: str
    content_index: int
    audio_end_ms: int


@dataclass(frozen=True)
class InputTranscriptionDelta(ServerEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.delta"
    item_id: str
    content_index: int
    delta: str


@dataclass(frozen=True)
class InputTranscriptionCompleted(ServerEvent):
    type: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    item_id: str
    content_index: int
    transcript: str
    # GA requires it: {"type": "duration", "seconds": S} for audio-priced
    # transcription (strict validators such as the Agents SDK drop the event without it).
    usage: dict[str, Any] = field(default_factory=lambda: {"type": "duration", "seconds": 0.0})


@dataclass(frozen=True)
class ResponseCreated(ServerEvent):
    type: ClassVar[str] = "response.created"
    response: dict[str, Any]


@dataclass(frozen=True)
class ResponseDone(ServerEvent):
    type: ClassVar[str] = "response.done"
    response: dict[str, Any]


@dataclass(frozen=True)
class OutputItemAdded(ServerEvent):
    type: ClassVar[str] = "response.output_item.added"
    response_id: str
    output_index: int
    item: dict[str, Any]


@dataclass(frozen=True)
class OutputItemDone(ServerEvent):
    type: ClassVar[str] = "response.output_item.done"
    response_id: str
    output_index: int
    item: dict[str, Any]


@dataclass(frozen=True)
class _PartEvent(ServerEvent):
    response_id: str
    item_id: str
    output_index: int
    content_index: int


@dataclass(frozen=True)
class ContentPartAdded(_PartEvent):
    type: ClassVar[str] = "response.content_part.added"
    part: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ContentPartDone(_PartEvent):
    type: ClassVar[str] = "response.content_part.done"
    part: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OutputAudioDelta(_PartEvent):
    type: ClassVar[str] = "response.output_audio.delta"
    delta: bytes = b""  # encoded in the session's output format
    # The words this audio is the first to say (``AudioOut.text``). Not on the
    # Realtime wire, whose transcript deltas are the text as generated (a
    # client cuts it with ``conversation.item.truncate``); a dialect whose
    # transcript follows the voice shows them (GPT-Live: a barge-in stops the
    # words with the audio, and no event takes words back).
    spoken: str = field(default="", metadata=ENGINE_ONLY)


@dataclass(frozen=True)
class OutputAudioDone(_PartEvent):
    type: ClassVar[str] = "response.output_audio.done"


@dataclass(frozen=True)
class OutputAudioTranscriptDelta(_PartEvent):
    type: ClassVar[str] = "response.output_audio_transcript.delta"
    delta: str = ""


@dataclass(frozen=True)
class OutputAudioTranscriptDone(_PartEvent):
    type: ClassVar[str] = "response.output_audio_transcript.done"
    transcript: str = ""


@dataclass(frozen=True)
class OutputTextDelta(_PartEvent):
    type: ClassVar[str] = "response.output_text.delta"
    delta: str = ""


@dataclass(frozen=True)
class OutputTextDone(_PartEvent):
    type: ClassVar[str] = "response.output_text.done"
    text: str = ""


@dataclass(frozen=True)
class FunctionCallArgumentsDelta(ServerEvent):
    type: ClassVar[str] = "response.function_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    delta: str


@dataclass(frozen=True)
class FunctionCallArgumentsDone(ServerEvent):
    type: ClassVar[str] = "response.function_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    call_id: str
    name: str
    arguments: str


# ---- remote MCP tools (session/mcp_calls.py) ----------------------------------


@dataclass(frozen=True)
class McpListToolsInProgress(ServerEvent):
    type: ClassVar[str] = "mcp_list_tools.in_progress"
    item_id: str


@dataclass(frozen=True)
class McpListToolsCompleted(ServerEvent):
    type: ClassVar[str] = "mcp_list_tools.completed"
    item_id: str


@dataclass(frozen=True)
class McpListToolsFailed(ServerEvent):
    type: ClassVar[str] = "mcp_list_tools.failed"
    item_id: str


@dataclass(frozen=True)
class McpCallArgumentsDelta(ServerEvent):
    type: ClassVar[str] = "response.mcp_call_arguments.delta"
    response_id: str
    item_id: str
    output_index: int
    delta: str


@dataclass(frozen=True)
class McpCallArgumentsDone(ServerEvent):
    type: ClassVar[str] = "response.mcp_call_arguments.done"
    response_id: str
    item_id: str
    output_index: int
    arguments: str


@dataclass(frozen=True)
class McpCallInProgress(ServerEvent):
    type: ClassVar[str] = "response.mcp_call.in_progress"
    item_id: str
    output_index: int


@dataclass(frozen=True)
class McpCallCompleted(ServerEvent):
    type: ClassVar[str] = "response.mcp_call.completed"
    item_id: str
    output_index: int


@dataclass(frozen=True)
class McpCallFailed(ServerEvent):
    type: ClassVar[str] = "response.mcp_call.failed"
    item_id: str
    output_index: int


@dataclass(frozen=True)
class VideoSceneUpdated(ServerEvent):
    """Extension: what the vision stage sees now (the model's camera context)."""

    type: ClassVar[str] = "duplex.video.scene"
    text: str
    timestamp_ms: int
    texts: list[str]
    faces: int


@dataclass(frozen=True)
class SessionExpiring(ServerEvent):
    """Extension: the session reaches its maximum length in ``seconds_left``
    (``limits.max_session_s``; its ``expires_at`` is in the session object)."""

    type: ClassVar[str] = "duplex.session.expiring"
    seconds_left: int


@dataclass(frozen=True)
class SessionClosed(ServerEvent):
    """Extension: the session ended (client close, expiry, engine failure)."""

    type: ClassVar[str] = "session.closed"
    reason: str


@dataclass(frozen=True)
class Envelope:
    """A journaled event: ``seq`` is strictly +1 per session; ``fence`` is the
    session's fence when the event was made (rendered as metadata.fence)."""

    seq: int
    fence: Fence
    event: ServerEvent


@dataclass(frozen=True)
class OutputAudioBackchannel(ServerEvent):
    """Extension (``session.audio.output.backchannels``): the engine says a
    short acknowledgement while the user holds the floor -- ``audio`` (the
    whole clip, in the session's output format) to play now, ``transcript``
    its words. It is no response and no conversation item: the user's turn
    goes on. ``audio_start_ms``: where in the input audio the pause it fills
    began (session/backchannel.py); ``duration_ms``: how long the clip plays."""

    type: ClassVar[str] = "duplex.output_audio.backchannel"
    backchannel_id: str
    audio: bytes
    transcript: str
    audio_start_ms: int
    duration_ms: int  # of the clip


@dataclass(frozen=True)
class OutputAudioResumed(ServerEvent):
    """Extension (adaptive interruptions): the speech that paused the reply
    was a backchannel or noise, so the reply goes on. The audio deltas after
    this event start at ``audio_start_ms`` of the item (what was heard when
    it paused): a client that stopped playback at ``speech_started`` plays
    them; one that kept its buffer drops what it holds past that point."""

    type: ClassVar[str] = "duplex.output_audio.resumed"
    response_id: str
    item_id: str
    audio_start_ms: int
    reason: str  # "backchannel" | "noise"
    transcript: str  # what the dismissed speech said ("" for noise)
