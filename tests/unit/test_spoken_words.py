"""A reply's words travel with the audio that says them
(``OutputAudioDelta.spoken``, made by ``ResponseRecord.on_audio``): GPT-Live's
output transcript follows the voice, so words a barge-in kept from being
said never reach the client, while the Realtime wire is unchanged (its
transcript deltas are the text as the LLM writes it; no field, no event, no
gap in its ``seq``)."""

from __future__ import annotations

import json

import numpy as np
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import AudioOut
from vllm_duplex.domain.conversation import Response, ResponseStatus
from vllm_duplex.realtime.wire.codec import RealtimeCodec
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.session.latency import ResponseTimes
from vllm_duplex.session.responses import ResponseRecord

from support.live_shapes import live_event

SESSION_DOC = {"id": "sess_1", "model": "smollm2", "expires_at": 1_800_000_000,
               "audio": {"output": {"format": {"type": "audio/pcm", "rate": 24000},
                                    "voice": "marin"}}}


def live_codec() -> LiveCodec:
    c = LiveCodec(max_event_bytes=1 << 20, model_aliases={"smollm2": "smollm2"},
                  clock=lambda: 100.0, default_instructions="")
    c.parse(json.dumps({"type": "session.start", "session": {"model": "gpt-live-1"}}))
    c.frames(Envelope(0, Fence("sess_1"), ev.SessionCreated(session=SESSION_DOC,
                                                            resume_token="r")))
    return c


class HoldingEncoder:
    """Holds its first chunk (as a resampler holds a few ms), then sends."""

    def __init__(self) -> None:
        self.held = b""

    def encode(self, pcm: np.ndarray) -> bytes:
        data = self.held + pcm.astype("<i2").tobytes()
        if not self.held:
            self.held = data
            return b""
        self.held = b""
        return data

    def flush(self) -> bytes:
        out, self.held = self.held, b""
        return out


def record(encoder=None) -> ResponseRecord:
    response = Response(id="r1", conversation_id="conv_1", output_modalities=("audio",),
                        output_format={"type": "audio/pcm", "rate": 24000}, voice="marin")
    return ResponseRecord(response, "item_r1", in_conversation=True, previous_item_id=None,
                          encoder_factory=lambda rate: encoder or HoldingEncoder())


def pcm(ms: int) -> np.ndarray:
    return np.ones(24 * ms, np.int16)


def spoken(events: list[ev.ServerEvent]) -> list[str]:
    return [e.spoken for e in events if isinstance(e, ev.OutputAudioDelta) and e.spoken]


def test_words_come_with_the_first_audio_sent_that_speaks_them():
    r = record()
    out = r.on_text("Paris is ") + r.on_text("the capital.")
    assert spoken(out) == []  # written, not yet said
    held = r.on_audio(AudioOut("r1", pcm(20), 24000, "Paris is"))
    assert not any(isinstance(e, ev.OutputAudioDelta) for e in held) and spoken(held) == []
    sent = r.on_audio(AudioOut("r1", pcm(20), 24000, ""))
    assert spoken(sent) == ["Paris is"]  # with the audio the encoder let go
    more = r.on_audio(AudioOut("r1", pcm(0), 24000, " ..."))  # no sound: said with the next
    more += r.on_audio(AudioOut("r1", pcm(20), 24000, " the capital."))
    more += r.on_audio(AudioOut("r1", pcm(20), 24000, ""))
    done = r.finish(ResponseStatus.COMPLETED, ResponseTimes(created_at=0.0, turn_end_at=None))
    assert "".join(spoken(sent + more + done)) == "Paris is ... the capital."


def test_a_reply_cut_short_never_says_the_words_it_did_not_play():
    r = record()
    r.on_text("Paris is the capital. It has ")
    said = r.on_audio(AudioOut("r1", pcm(20), 24000, "Paris is the capital."))
    said += r.on_audio(AudioOut("r1", pcm(20), 24000, ""))
    r.cut_to_heard(40)  # a barge-in: "It has ..." was written, never played
    cut = r.finish(ResponseStatus.CANCELLED, ResponseTimes(created_at=0.0, turn_end_at=None))
    assert "".join(spoken(said + cut)) == "Paris is the capital."


def test_gpt_live_shows_the_voices_words_and_the_realtime_wire_is_unchanged():
    c = live_codec()
    r = record()
    events = r.on_text("Rome.") + r.on_audio(AudioOut("r1", pcm(20), 24000, "Rome."))
    events += r.on_audio(AudioOut("r1", pcm(20), 24000, ""))
    frames = [live_event(f) for i, e in enumerate(events)
              for f in c.frames(Envelope(i + 1, Fence("sess_1"), e))]
    said = [f.delta for f in frames if f.type == "session.output_transcript.delta"]
    assert said == ["Rome."]  # once: from the voice, not the LLM's text too
    audio = json.loads(RealtimeCodec().render(Envelope(2, Fence("s"), ev.OutputAudioDelta(
        "r1", "i", 0, 0, b"\0\0", spoken="Rome."))))
    assert audio["type"] == "response.output_audio.delta" and "spoken" not in audio
    assert "Rome" not in json.dumps(audio)
