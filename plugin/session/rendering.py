"""What an admitted stage output shows the client, by payload type.

The session core calls ``render`` for a payload the policy chose to emit,
with the few parts of the session a payload can touch (``Scope``): the
user's turn, the conversation, the turn's latency figures and the active
response. It returns the events to send. Listening payloads (VAD,
transcripts, scenes) belong to the user's turn; reply payloads (text, audio,
tool calls, the end of generation) belong to the active response and are
ignored once it is gone or when they name another response. (Paced audio and
stage failures are the core's: they start timers and end responses.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vllm_duplex.core import events as ev
from vllm_duplex.core.payloads import (
    AudioOut,
    GenerationDone,
    SceneDescription,
    TextDelta,
    ToolCall,
    TranscriptDelta,
    TranscriptFinal,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.latency import TurnLatency
from vllm_duplex.session.responses import ActiveResponse
from vllm_duplex.session.user_turn import UserTurn

Events = list[ev.ServerEvent]


@dataclass
class Scope:
    """The parts of a session that showing an output may change."""

    now: float
    user: UserTurn
    conversation: ItemStore
    latency: TurnLatency
    response: ActiveResponse | None

    def reply(self, response_id: str) -> ActiveResponse | None:
        active = self.response
        return active if active is not None and active.id == response_id else None


def render(payload: Any, scope: Scope) -> Events:
    renderer = _RENDERERS.get(type(payload))
    # SpeechDone, TranscriptPartial, UserPaused...: nothing to show
    return renderer(scope, payload) if renderer is not None else []


def audio_going_out(scope: Scope, active: ActiveResponse, p: AudioOut) -> Events:
    """Reply audio is sent now (unpaced, or a paced frame): the first of it is
    the response's first audio and a latency figure."""
    if active.first_audio_at is None:
        active.first_audio_at = scope.now
    if active.audio and p.pcm.size:
        scope.latency.first_audio(active.times, scope.now)
    return active.on_audio(p)


def _speech_started(s: Scope, p: VadSpeechStarted) -> Events:
    s.latency.speech_started(p.audio_ms, s.now)
    return [s.user.speech_started(p.audio_ms)]


def _speech_stopped(s: Scope, p: VadSpeechStopped) -> Events:
    s.latency.speech_stopped(p.audio_ms, s.now)
    return [s.user.speech_stopped(p.audio_ms)]


def _transcript_delta(s: Scope, p: TranscriptDelta) -> Events:
    item_id = s.user.transcript_item(s.conversation)
    return [ev.InputTranscriptionDelta(item_id=item_id, content_index=0, delta=p.text)]


def _transcript_final(s: Scope, p: TranscriptFinal) -> Events:
    s.latency.transcript_final(s.now)
    item_id = s.user.transcript_item(s.conversation)
    audio_ms = 0
    for item in s.conversation:
        if item.id == item_id and item.content:
            item.content[0].transcript = p.text
            audio_ms = item.content[0].audio_ms
            break
    else:  # not committed yet: the commit takes it (and its audio length)
        s.user.early_transcript = (item_id, p.text)
        audio_ms = s.user.spoken_ms
    return [ev.InputTranscriptionCompleted(
        item_id=item_id, content_index=0, transcript=p.text,
        usage={"type": "duration", "seconds": round(audio_ms / 1000, 3)})]


def _text(s: Scope, p: TextDelta) -> Events:
    if (active := s.reply(p.response_id)) is None:
        return []
    if p.text:
        s.latency.first_words(active.times, s.now)
    return active.on_text(p.text)


def _audio(s: Scope, p: AudioOut) -> Events:
    active = s.reply(p.response_id)
    return audio_going_out(s, active, p) if active is not None else []


def _generation_done(s: Scope, p: GenerationDone) -> Events:
    if (active := s.reply(p.response_id)) is not None:
        active.on_generation_done(p)
    return []


def _tool_call(s: Scope, p: ToolCall) -> Events:
    if (active := s.reply(p.response_id)) is None:
        return []
    s.latency.first_words(active.times, s.now)
    item, events = active.on_tool_call(p)
    if active.in_conversation:
        s.conversation.append(item)
    return events


def _scene(s: Scope, p: SceneDescription) -> Events:
    return [ev.VideoSceneUpdated(text=p.text, timestamp_ms=p.timestamp_ms,
                                 texts=list(p.texts), faces=p.faces)]


_RENDERERS: dict[type, Callable[[Scope, Any], Events]] = {
    VadSpeechStarted: _speech_started,
    VadSpeechStopped: _speech_stopped,
    TranscriptDelta: _transcript_delta,
    TranscriptFinal: _transcript_final,
    TextDelta: _text,
    AudioOut: _audio,
    GenerationDone: _generation_done,
    ToolCall: _tool_call,
    SceneDescription: _scene,
}
