"""The engine's backchannels on GPT-Live (``realtime/wire/live/codec.py``):
asked for with the duplex extension ``session.audio.output.backchannels``
(GPT-Live's ``SessionConfig`` has no field for it), said as a reply's audio
is -- ``session.output_audio.delta`` and an output transcript fragment on the
session timeline -- each frame validated by the SDK's own models."""

from __future__ import annotations

import base64
import json

import pytest
from support.live_shapes import live_event
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.backchanneling import Backchanneling
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.commands import LiveStart


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def start(c: LiveCodec, output: dict) -> LiveStart:
    frame = {"type": "session.start", "event_id": "start_1",
             "session": {"model": "gpt-live-1", "audio": {"output": output}}}
    cmd = c.parse(json.dumps(frame))
    assert isinstance(cmd, LiveStart)
    return cmd


def codec(clock: Clock) -> LiveCodec:
    return LiveCodec(max_event_bytes=1 << 20, model_aliases={"smollm2": "smollm2"}, clock=clock)


def test_the_extension_turns_them_on_and_they_are_off_without_it():
    c = codec(Clock())
    assert start(c, {"voice": "marin"}).patch.get("backchannels") is None
    patch = start(codec(Clock()), {"backchannels": {"phrases": ["Uh-huh."]}}).patch
    assert patch.backchannels == Backchanneling(phrases=("Uh-huh.",))
    with pytest.raises(DuplexError) as err:
        start(codec(Clock()), {"backchannels": {"pause_ms": 10}})
    assert (err.value.code, err.value.param) == (
        "invalid_value", "session.audio.output.backchannels.pause_ms")


def test_a_backchannel_is_output_audio_and_its_transcript_on_the_timeline():
    clock = Clock()
    c = codec(clock)
    start(c, {})
    c.frames(Envelope(1, Fence("s"), ev.SessionCreated(session={"id": "s", "model": "smollm2"},
                                                        resume_token="r")))
    clock.t += 5.9
    pcm = b"\x01\x02" * 12_000
    said = ev.OutputAudioBackchannel(backchannel_id="bc_1", audio=pcm, transcript="Mm-hmm.",
                                     audio_start_ms=5500, duration_ms=500)
    audio, words = [live_event(f) for f in c.frames(Envelope(2, Fence("s"), said))]
    assert audio.type == "session.output_audio.delta" and base64.b64decode(audio.delta) == pcm
    assert words.type == "session.output_transcript.delta"
    assert (words.delta, words.start_ms, words.end_ms) == ("Mm-hmm.", 5900, 6400)
    # A single-frame event is rendered as before.
    assert c.frames(Envelope(3, Fence("s"), ev.InputAudioBufferCleared())) == []
