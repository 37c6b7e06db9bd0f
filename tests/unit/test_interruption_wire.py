"""The ``interruption`` and ``pacing`` duplex extensions of ``session.update``
on the wire: parsed into the session config, echoed, bad values refused with
``invalid_value`` naming the field."""

from __future__ import annotations

import json

import pytest
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.interruption import DEFAULT_BACKCHANNELS, Interruption, OutputPacing
from vllm_duplex.domain.session_config import SessionConfig, session_wire
from vllm_duplex.realtime.wire.codec import RealtimeCodec

codec = RealtimeCodec()


def patch(session):
    return codec.parse(json.dumps({"type": "session.update", "session": session})).patch


def refused(session) -> DuplexError:
    with pytest.raises(DuplexError) as ei:
        codec.parse(json.dumps({"type": "session.update", "event_id": "e", "session": session}))
    assert ei.value.code == "invalid_value"
    return ei.value


def test_interruption_and_pacing_parse_and_echo():
    p = patch({"interruption": {"mode": "immediate"},
               "audio": {"output": {"pacing": {"type": "none"}}}, "instructions": "x"})
    assert p.interruption == Interruption("immediate", 800, DEFAULT_BACKCHANNELS)
    assert p.pacing == OutputPacing("none") and p.instructions == "x"
    p = patch({"interruption": {"min_speech_ms": 500, "backchannels": ["Okay", "got it"]},
               "audio": {"output": {"pacing": {"lead_ms": 200}}}})
    assert p.interruption == Interruption("adaptive", 500, ("okay", "got it"))
    assert p.pacing == OutputPacing("realtime", 200)
    wire = session_wire(SessionConfig(model="m", policy="p").apply(p), session_id="s")
    assert wire["interruption"] == {"mode": "adaptive", "min_speech_ms": 500,
                                    "backchannels": ["okay", "got it"]}
    assert wire["audio"]["output"]["pacing"] == {"type": "realtime", "lead_ms": 200}


@pytest.mark.parametrize(("session", "param"), [
    ({"interruption": {"mode": "polite"}}, "session.interruption.mode"),
    ({"interruption": "adaptive"}, "session.interruption"),
    ({"interruption": {"min_speech_ms": -1}}, "session.interruption.min_speech_ms"),
    ({"interruption": {"min_speech_ms": 10 ** 9}}, "session.interruption.min_speech_ms"),
    ({"interruption": {"min_speech_ms": 1.5}}, "session.interruption.min_speech_ms"),
    ({"interruption": {"backchannels": "okay"}}, "session.interruption.backchannels"),
    ({"interruption": {"backchannels": ["ok"] * 65}}, "session.interruption.backchannels"),
    ({"interruption": {"backchannels": ["okay", 3]}}, "session.interruption.backchannels[1]"),
    ({"interruption": {"backchannels": ["x" * 33]}}, "session.interruption.backchannels[0]"),
    ({"interruption": {"backchannels": ["  "]}}, "session.interruption.backchannels[0]"),
    ({"interruption": {"backchannels": ["..."]}}, "session.interruption.backchannels[0]"),
    ({"audio": {"output": {"pacing": {"type": "fast"}}}}, "session.audio.output.pacing.type"),
    ({"audio": {"output": {"pacing": {"lead_ms": 0}}}}, "session.audio.output.pacing.lead_ms"),
    ({"audio": {"output": {"pacing": {"lead_ms": 60_000}}}}, "session.audio.output.pacing.lead_ms"),
])
def test_bad_values_name_their_field(session, param):
    assert refused(session).param == param
