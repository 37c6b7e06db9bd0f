"""What an admitted stage output shows the client, by payload type.

The session core calls ``render`` for a payload the policy chose to emit,
with the few parts of the session a payload can touch (``Scope``): the
user's turn, the conversation, the turn's latency figures and the reply
shown. It returns the events to send. Listening payloads (VAD,
transcripts, scenes) belong to the user's turn; reply payloads (text, audio,
tool calls, the end of generation) go to the shown ``Reply`` (which owns
what the client received of it) and are ignored once it is gone or when they
name another reply. (Paced audio and stage failures are the core's: they
start timers and end replies.)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.payloads import (
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
from vllm_duplex.session.mcp_render import McpItemShown, render_item
from vllm_duplex.session.latency import TurnLatency
from vllm_duplex.session.user_turn import UserTurn

if TYPE_CHECKING:
    from vllm_duplex.session.reply import Reply

Events = list[ev.ServerEvent]


@dataclass
class Scope:
    """The parts of a session that showing an output may change."""

    now: float
    user: UserTurn
    conversation: ItemStore
    latency: TurnLatency
    shown: Reply | None  # the reply the client sees, if any

    def reply(self, response_id: str) -> Reply | None:
        shown = self.shown
        return shown if shown is not None and shown.id == response_id else None


def render(payload: Any, scope: Scope) -> Events:
    renderer = _RENDERERS.get(type(payload))
    # SpeechDone, TranscriptPartial, UserPaused...: nothing to show
    return renderer(scope, payload) if renderer is not None else []


def audio_going_out(scope: Scope, reply: Reply, p: AudioOut) -> Events:
    """Reply audio is sent now (unpaced, or a paced frame): the first of it is
    the response's first audio and a latency figure."""
    assert reply.record is not None
    if reply.record.audio and p.pcm.size:
        scope.latency.first_audio(reply.times, scope.now)
    return reply.audio_sent(p, scope.now)


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
    item_id = s.user.transcript_item(s.conversation, p.onset_ms)
    audio_ms = s.conversation.transcribed(item_id, p.text)
    if audio_ms is None:  # not committed yet: the commit takes it (and its audio length)
        s.user.early_transcript = (item_id, p.text)
        audio_ms = s.user.spoken_ms
    else:
        s.user.transcribed(item_id)
    return [ev.InputTranscriptionCompleted(
        item_id=item_id, content_index=0, transcript=p.text,
        usage={"type": "duration", "seconds": round(audio_ms / 1000, 3)})]


def _text(s: Scope, p: TextDelta) -> Events:
    if (reply := s.reply(p.response_id)) is None or reply.record is None:
        return []
    if p.text:
        s.latency.first_words(reply.times, s.now)
    return reply.record.on_text(p.text)


def _audio(s: Scope, p: AudioOut) -> Events:
    reply = s.reply(p.response_id)
    return audio_going_out(s, reply, p) if reply is not None else []


def _generation_done(s: Scope, p: GenerationDone) -> Events:
    if (reply := s.reply(p.response_id)) is not None and reply.record is not None:
        reply.record.on_generation_done(p)
    return []


def _tool_call(s: Scope, p: ToolCall) -> Events:
    if (reply := s.reply(p.response_id)) is None or reply.record is None:
        return []
    s.latency.first_words(reply.times, s.now)
    item, events = reply.record.on_tool_call(p)
    if reply.record.in_conversation:
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
    McpItemShown: render_item,  # an MCP call or approval request of the reply (mcp_render.py)
}
