"""What an admitted stage output shows the client, by payload type.

The session core calls ``render`` for an output the fence gate admitted and
the policy chose to emit (or for the payload the policy rendered instead).
Listening payloads (VAD, transcripts, scenes) belong to the user's turn;
reply payloads (text, audio, tool calls, the end of generation) belong to
the active response and are ignored once it is gone or when they name
another response. A stage failure is an error event, and fails the reply.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm_duplex.core import events as ev
from vllm_duplex.core.conversation import ResponseStatus
from vllm_duplex.core.payloads import (
    AudioOut,
    GenerationDone,
    SceneDescription,
    StageFailed,
    TextDelta,
    ToolCall,
    TranscriptDelta,
    TranscriptFinal,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.session.responses import ActiveResponse

if TYPE_CHECKING:
    from vllm_duplex.session.core import SessionCore


def render(core: SessionCore, payload: Any) -> None:
    renderer = _RENDERERS.get(type(payload))
    if renderer is not None:  # SpeechDone, TranscriptPartial: nothing to show
        renderer(core, payload)


def _reply(core: SessionCore, response_id: str) -> ActiveResponse | None:
    active = core.response
    return active if active is not None and active.id == response_id else None


def _speech_started(core: SessionCore, p: VadSpeechStarted) -> None:
    core.latency.speech_started(p.audio_ms, core.now)
    core.emit(core.user.speech_started(p.audio_ms))


def _speech_stopped(core: SessionCore, p: VadSpeechStopped) -> None:
    core.latency.speech_stopped(p.audio_ms)
    core.emit(core.user.speech_stopped(p.audio_ms))


def _transcript_delta(core: SessionCore, p: TranscriptDelta) -> None:
    item_id = core.user.transcript_item(core.conversation)
    core.emit(ev.InputTranscriptionDelta(item_id=item_id, content_index=0, delta=p.text))


def _transcript_final(core: SessionCore, p: TranscriptFinal) -> None:
    core.latency.transcript_final(core.now)
    item_id = core.user.transcript_item(core.conversation)
    audio_ms = 0
    for item in core.conversation:
        if item.id == item_id and item.content:
            item.content[0].transcript = p.text
            audio_ms = item.content[0].audio_ms
            break
    else:  # not committed yet: the commit takes it (and its audio length)
        core.user.early_transcript = (item_id, p.text)
        audio_ms = core.user.spoken_ms
    core.emit(ev.InputTranscriptionCompleted(
        item_id=item_id, content_index=0, transcript=p.text,
        usage={"type": "duration", "seconds": round(audio_ms / 1000, 3)}))


def _text(core: SessionCore, p: TextDelta) -> None:
    if (active := _reply(core, p.response_id)) is not None:
        if p.text:
            core.latency.first_words(active.times, core.now)
        core.emit_all(active.on_text(p.text))


def _audio(core: SessionCore, p: AudioOut) -> None:
    if (active := _reply(core, p.response_id)) is not None:
        audio_going_out(core, active, p)
        core.emit_all(active.on_audio(p))


def audio_going_out(core: SessionCore, active: ActiveResponse, p: AudioOut) -> None:
    """Reply audio is sent now (unpaced here, or a paced frame): the first
    of it is the response's first audio and a latency figure."""
    if active.first_audio_at is None:
        active.first_audio_at = core.now
    if active.audio and p.pcm.size:
        core.latency.first_audio(active.times, core.now)


def _generation_done(core: SessionCore, p: GenerationDone) -> None:
    if (active := _reply(core, p.response_id)) is not None:
        active.on_generation_done(p)


def _tool_call(core: SessionCore, p: ToolCall) -> None:
    if (active := _reply(core, p.response_id)) is not None:
        core.latency.first_words(active.times, core.now)
        item, events = active.on_tool_call(p)
        if active.in_conversation:
            core.conversation.append(item)
        core.emit_all(events)


def _failed(core: SessionCore, p: StageFailed) -> None:
    core.error(p.error)
    active = core.response
    if active is not None:
        core.response = None
        core.emit_all(active.finish(ResponseStatus.FAILED,
                                    {"type": "failed", "error": p.error.to_wire()}))


def _scene(core: SessionCore, p: SceneDescription) -> None:
    core.emit(ev.VideoSceneUpdated(text=p.text, timestamp_ms=p.timestamp_ms,
                                   texts=list(p.texts), faces=p.faces))


_RENDERERS: dict[type, Callable[[SessionCore, Any], None]] = {
    VadSpeechStarted: _speech_started,
    VadSpeechStopped: _speech_stopped,
    TranscriptDelta: _transcript_delta,
    TranscriptFinal: _transcript_final,
    TextDelta: _text,
    AudioOut: _audio,
    GenerationDone: _generation_done,
    ToolCall: _tool_call,
    StageFailed: _failed,
    SceneDescription: _scene,
}
