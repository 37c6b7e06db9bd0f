"""``semantic_vad`` in the official ``openai`` SDK's own types, both ways: what
the SDK's ``SemanticVad`` param builds is parsed whole by our codec, and the
``session.updated`` we answer validates as the SDK's ``SessionUpdatedEvent``
with a ``SemanticVad`` turn detection (not the server VAD it used to say)."""

from __future__ import annotations

import json

import pytest
from openai.types.realtime import SessionUpdatedEvent
from openai.types.realtime.realtime_audio_input_turn_detection_param import SemanticVad
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.models.cascade import CascadePolicy
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.session.core import SessionCore


@pytest.mark.parametrize("eagerness", ["low", "medium", "high", "auto"])
def test_the_sdks_semantic_vad_is_honoured_and_reported_back_in_its_types(eagerness):
    td: SemanticVad = {"type": "semantic_vad", "eagerness": eagerness, "create_response": True,
                       "interrupt_response": False}
    codec = RealtimeCodec()
    update = codec.parse(json.dumps({"type": "session.update", "event_id": "u1", "session": {
        "type": "realtime", "instructions": "Be brief.", "audio": {"input": {"turn_detection": td}}}}))
    policy = CascadePolicy()
    core = SessionCore("s", config=SessionConfig(model="m", policy=policy.name), policy=policy,
                       stage_names=("vad", "asr", "llm", "tts"), metrics=Metrics(), now=0.0)
    effects = core.handle(update, 0.0)
    [updated] = [e.envelope for e in effects if hasattr(e, "envelope")]
    assert isinstance(updated.event, ev.SessionUpdated)
    frame = codec.render(updated)
    sdk = SessionUpdatedEvent.model_validate_json(frame)
    got = sdk.session.audio.input.turn_detection
    assert (got.type, got.eagerness, got.create_response, got.interrupt_response) == (
        "semantic_vad", eagerness, True, False)
    assert sdk.session.instructions == "Be brief."
    assert core.config.turn_detection.semantic


@pytest.mark.parametrize("bad", ["eager", "", 3, True])
def test_an_unknown_eagerness_is_invalid_value_naming_the_field(bad):
    codec = RealtimeCodec()
    with pytest.raises(DuplexError) as ei:
        codec.parse(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "turn_detection": {"type": "semantic_vad", "eagerness": bad}}}}}))
    assert (ei.value.code, ei.value.param) == ("invalid_value",
                                               "session.audio.input.turn_detection.eagerness")
