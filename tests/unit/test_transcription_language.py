"""``audio.input.transcription.language``: honoured where the deployment's ASR
hears it, refused by name where it does not -- never accepted and ignored."""

from __future__ import annotations

import json

import pytest
from support.session_core import make_core, types
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import AsrConfig
from vllm_duplex.domain.session_config import SessionPatch, Transcription
from vllm_duplex.models.cascade import CascadePolicy
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.session.effects import Emit, Submit

CASCADE = ("vad", "asr", "llm", "tts")
PARAM = "session.audio.input.transcription.language"


def update(core, **transcription):
    return core.handle(cmd.SessionUpdate(patch=SessionPatch(
        transcription=Transcription(**transcription)), event_id="u"), 0.0)


def test_a_language_the_asr_hears_reaches_it_with_the_prompt():
    core = make_core(CascadePolicy(), stages=CASCADE, turn_detection=None,
                     asr_languages=frozenset({"en", "fr", "de"}))
    core.start("tok", 0.0)
    effects = update(core, language="fr", prompt="Siobhan")
    assert types(effects) == ["Submit", "session.updated"]
    assert (effects[0].stage, effects[0].payload) == ("asr", AsrConfig("Siobhan", "fr"))
    transcription = effects[1].envelope.event.session["audio"]["input"]["transcription"]
    assert transcription["language"] == "fr"
    assert types(update(core, language="fr", prompt="Siobhan")) == ["session.updated"]  # unchanged
    assert update(core, prompt="Siobhan")[0].payload == AsrConfig("Siobhan", None)


def test_a_language_the_asr_does_not_hear_is_refused_and_the_session_keeps_its_config():
    core = make_core(CascadePolicy(), stages=CASCADE, turn_detection=None,
                     asr_languages=frozenset({"en"}))  # whisper-tiny.en
    core.start("tok", 0.0)
    assert update(core, language="en")[-1].envelope.event.type == "session.updated"
    [refusal] = update(core, language="fr", prompt="Aoife")
    error = refusal.envelope.event.error
    assert (error.code, error.param, error.event_id) == ("unsupported_option", PARAM, "u")
    assert "'fr'" in error.message and "en" in error.message
    assert core.config.transcription.language == "en" and core.config.transcription.prompt is None


def test_a_session_that_starts_with_a_language_its_asr_does_not_hear_is_not_admitted():
    core = make_core(CascadePolicy(), stages=CASCADE, turn_detection=None,
                     asr_languages=frozenset({"en"}), transcription=Transcription(language="ja"))
    with pytest.raises(DuplexError) as refused:
        core.start("tok", 0.0)
    assert (refused.value.code, refused.value.param) == ("unsupported_option", PARAM)


def test_a_pipeline_without_an_asr_stage_refuses_a_language():
    core = make_core(turn_detection=None)  # the scripted policy routes no AsrConfig
    core.start("tok", 0.0)
    [refusal] = update(core, language="en")
    assert isinstance(refusal, Emit) and refusal.envelope.event.error.code == "unsupported_option"
    assert not [e for e in update(core, prompt="x") if isinstance(e, Submit)]


@pytest.mark.parametrize("language", ["EN", "english", "e", "en-US", 7])
def test_a_language_that_is_not_an_iso_code_is_invalid(language):
    with pytest.raises(DuplexError) as bad:
        RealtimeCodec().parse(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"transcription": {
                "model": "whisper-1", "language": language}}}}}))
    assert (bad.value.code, bad.value.param) == ("invalid_value", PARAM)
