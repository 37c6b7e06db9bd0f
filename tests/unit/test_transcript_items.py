"""A final transcript lands on the item that holds its speech (issue 42):
server VAD commits the spoken item, the client's own commit then makes a
second item of the little audio after it, and the ASR's final for the speech
comes after both -- LiveKit's realtime test saw it on the second item."""

from __future__ import annotations

from support.session_core import TEN_MS, make_core, output
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.payloads import TranscriptFinal, VadSpeechStarted, VadSpeechStopped
from vllm_duplex.domain.session_config import TurnDetection
from vllm_duplex.models.cascade import CascadePolicy


def cascade():
    return make_core(CascadePolicy(), stages=("vad", "asr", "llm", "tts"),
                     turn_detection=TurnDetection(create_response=False))


def committed(effects) -> str:
    [event] = [e for e in emitted_of(effects) if isinstance(e, ev.InputAudioBufferCommitted)]
    return event.item_id


def emitted_of(effects):
    return [e.envelope.event for e in effects if hasattr(e, "envelope")]


def completed(effects) -> list[ev.InputTranscriptionCompleted]:
    return [e for e in emitted_of(effects) if isinstance(e, ev.InputTranscriptionCompleted)]


def spoken_item_then_a_client_commit(core):
    core.handle(cmd.AudioAppend(audio=TEN_MS * 150), 0.0)  # 1.5 s
    output(core, VadSpeechStarted(audio_ms=200), stage="vad")
    spoken = committed(output(core, VadSpeechStopped(audio_ms=1000), stage="vad"))
    core.handle(cmd.AudioAppend(audio=TEN_MS * 6), 0.0)  # 60 ms after the VAD's commit
    client = committed(core.handle(cmd.AudioCommit(), 0.0))
    return spoken, client


def test_the_final_lands_on_the_spoken_item_not_the_later_client_commit():
    core = cascade()
    spoken, client = spoken_item_then_a_client_commit(core)
    assert spoken != client
    [done] = completed(output(core, TranscriptFinal("What is the weather in Paris?", 200),
                              stage="asr"))
    assert done.item_id == spoken and done.transcript == "What is the weather in Paris?"
    assert 0.7 <= done.usage["seconds"] <= 1.6  # the spoken item's audio, not 0.06 s
    [item] = [i for i in core.conversation if i.id == spoken]
    assert item.content[0].transcript == "What is the weather in Paris?"
    [other] = [i for i in core.conversation if i.id == client]
    assert other.content[0].transcript is None


def test_the_next_utterance_s_final_is_its_own():
    core = cascade()
    spoken, client = spoken_item_then_a_client_commit(core)
    output(core, TranscriptFinal("first", 200), stage="asr")
    core.handle(cmd.AudioAppend(audio=TEN_MS * 100), 0.0)
    started = [e for e in emitted_of(output(core, VadSpeechStarted(audio_ms=1700), stage="vad"))
               if isinstance(e, ev.SpeechStarted)]
    following = committed(output(core, VadSpeechStopped(audio_ms=2400), stage="vad"))
    assert started[0].item_id == following
    [done] = completed(output(core, TranscriptFinal("second", 1700), stage="asr"))
    assert done.item_id == following


def test_a_final_without_an_onset_keeps_the_old_rule():
    # an ASR that does not say where its utterance began: the last commit takes it
    core = cascade()
    spoken, client = spoken_item_then_a_client_commit(core)
    [done] = completed(output(core, TranscriptFinal("x"), stage="asr"))
    assert done.item_id == client
