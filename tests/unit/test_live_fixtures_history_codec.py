"""GPT-Live audio fixtures and initial history, without sockets.

Fixtures: the whole payload is checked before anything changes, one plays at
a time, input during playback is heard as silence, the model's voice is not
sent meanwhile and a reply it starts is cancelled; the playout is paced as
the session's own audio (a virtual clock), in the session's format, and its
events are the SDK's shapes. History: ``session.input`` is the conversation
``conversation.item.create`` would make, bad shapes refused by name."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from openai.types.live import OutputAudioFixturePlayEvent, SessionStartEvent
from openai.types.live.session_config import SessionConfig
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.commands import AudioAppend, ItemCreate, ResponseCancel
from vllm_duplex.domain.conversation import Role
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat
from vllm_duplex.realtime.server.live.fixture import FixturePlayer
from vllm_duplex.realtime.wire.live.audio_frames import audio_delta
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.commands import LiveStart
from vllm_duplex.realtime.wire.live.fixtures import FixturePlay

from support.live_shapes import live_event

FENCE = Fence("sess_1")


def codec(max_event_bytes: int = 1 << 20) -> LiveCodec:
    return LiveCodec(max_event_bytes=max_event_bytes, model_aliases={"smollm2": "smollm2"},
                     clock=lambda: 100.0)


def env(event: ev.ServerEvent, seq: int = 1) -> Envelope:
    return Envelope(seq=seq, fence=FENCE, event=event)


def fixture_frame(pcm: bytes, event_id: str | None = "f1") -> str:
    return OutputAudioFixturePlayEvent(
        type="session.output_audio.fixture.play", audio=base64.b64encode(pcm).decode(),
        event_id=event_id).to_json(use_api_names=True, exclude_unset=True)


def tone(seconds: float, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()


# ---- fixtures: validation --------------------------------------------------------------

def test_a_valid_fixture_parses_whole():
    pcm = tone(1.0)
    play = codec().parse(fixture_frame(pcm))
    assert play == FixturePlay(pcm=pcm, event_id="f1") and play.seconds == 1.0


@pytest.mark.parametrize("audio, code, why", [
    ("***", "invalid_audio", "base64"),
    (base64.b64encode(b"\x01\x02\x03").decode(), "invalid_audio", "even number"),
    ("", "invalid_audio", "needs audio"),
    (base64.b64encode(b"\x00" * (24000 * 2 * 30 + 2)).decode(), "invalid_audio", "30 s"),
    (7, "invalid_value", "base64 string"),
])
def test_a_bad_fixture_is_refused_typed_and_changes_nothing(audio, code, why):
    c = codec()
    raw = json.dumps({"type": "session.output_audio.fixture.play", "audio": audio,
                      "event_id": "f1"})
    with pytest.raises(DuplexError) as err:
        c.parse(raw)
    assert (err.value.code, err.value.param, err.value.event_id) == (code, "audio", "f1")
    assert why in err.value.message
    assert live_event(c.render_error(err.value)).error.code == code
    assert c.fixtures.playing is None  # nothing started: input is still heard
    heard = c.parse(json.dumps({"type": "session.input_audio.append",
                                "audio": base64.b64encode(b"\x10\x00").decode()}))
    assert heard.audio == b"\x10\x00"


def test_thirty_seconds_fit_though_over_the_usual_event_limit():
    c = codec()
    play = c.parse(fixture_frame(tone(30.0)))  # ~1.9 MB of base64 over a 1 MiB limit
    assert isinstance(play, FixturePlay) and play.seconds == 30.0
    big = json.dumps({"type": "session.input_audio.append", "audio": "A" * (1 << 20)})
    with pytest.raises(DuplexError) as err:  # only a fixture may be that large
        c.parse(big)
    assert err.value.code == "event_too_large"


def test_one_fixture_at_a_time():
    c = codec()
    c.fixtures.begin(c.parse(fixture_frame(tone(0.5))))
    with pytest.raises(DuplexError) as err:
        c.parse(fixture_frame(tone(0.5), "f2"))
    assert (err.value.code, err.value.event_id) == ("fixture_already_playing", "f2")
    assert live_event(c.render_error(err.value)).error.type == "invalid_request_error"
    c.fixtures.end()
    assert isinstance(c.parse(fixture_frame(tone(0.5), "f3")), FixturePlay)


# ---- fixtures: the session meanwhile ----------------------------------------------------

def test_while_a_fixture_plays_input_is_silence_and_the_model_is_not_heard():
    c = codec()
    created = ev.ResponseCreated(response={"id": "resp_1"})
    assert c.fixtures.on_event(created) is None  # no fixture: a reply is a reply
    c.render(env(created))
    cancel = c.fixtures.begin(c.parse(fixture_frame(tone(0.5))))
    assert cancel == ResponseCancel(response_id="resp_1", event_id=cancel.event_id)

    speech = c.parse(json.dumps({"type": "session.input_audio.append",
                                 "audio": base64.b64encode(b"\x10\x20" * 4).decode()}))
    assert isinstance(speech, AudioAppend) and speech.audio == b"\x00" * 8  # dropped, as silence

    voice = ev.OutputAudioDelta(response_id="resp_1", item_id="i", output_index=0,
                                content_index=0, delta=b"\x01\x02")
    assert c.render(env(voice)) is None
    # the cancel found the reply already done: not the client's error
    late = DuplexError("response_cancel_not_active", "none", event_id=cancel.event_id)
    assert c.render(env(ev.ErrorEvent(error=late))) is None
    c.fixtures.on_event(ev.ResponseDone(response={"id": "resp_1"}))
    # a reply the session starts while the fixture plays is cancelled too
    again = c.fixtures.on_event(ev.ResponseCreated(response={"id": "resp_2"}))
    assert again is not None and again.response_id == "resp_2"

    c.fixtures.end()
    assert live_event(c.render(env(voice))).type == "session.output_audio.delta"
    heard = c.parse(json.dumps({"type": "session.input_audio.append",
                                "audio": base64.b64encode(b"\x10\x20").decode()}))
    assert heard.audio == b"\x10\x20"


# ---- fixtures: the playout (virtual clock) ---------------------------------------------

def play_all(player: FixturePlayer, t: float = 0.0) -> tuple[list[tuple[float, bytes]], float]:
    sent = []
    while True:
        sent += [(t, chunk) for chunk in player.due(t)]
        wake = player.next_at(t)
        if wake is None:
            return sent, player.drained_at(t)
        t = wake


def test_the_playout_is_paced_with_the_sessions_lead_and_drains_at_the_end():
    sent, drained = play_all(FixturePlayer(tone(2.0), AudioFormat(), lead_ms=300))
    audio = b"".join(chunk for _, chunk in sent)
    assert len(audio) == 2 * 48000  # every sample, at 24 kHz as the session's output
    assert sent[0][0] == 0.0 and sent[-1][0] >= 2.0 - 0.3 - 1e-6  # never more than the lead ahead
    for t, _ in sent:
        played = sum(len(c) for s, c in sent if s <= t) / 48000
        assert played - t <= 0.3 + 0.1 + 1e-6  # what the client holds unplayed stays bounded
    assert drained == pytest.approx(2.0)  # played: when the client's player ran through it


def test_the_playout_is_in_the_sessions_format():
    sent, drained = play_all(FixturePlayer(tone(1.0), AudioFormat(AudioEncoding.PCMU, 8000),
                                           lead_ms=300))
    audio = b"".join(chunk for _, chunk in sent)
    assert len(audio) == 8000  # one byte a sample at 8 kHz: resampled and mu-law encoded
    assert drained == pytest.approx(1.0)
    sent16, _ = play_all(FixturePlayer(tone(1.0), AudioFormat(rate=16000), lead_ms=300))
    assert sum(len(c) for _, c in sent16) == 32000


def test_playing_and_played_are_the_sdk_shapes():
    c = codec()
    playing = live_event(c.render_notice("session.output_audio.fixture.playing",
                                         client_event_id="f1"))
    played = live_event(c.render_notice("session.output_audio.fixture.played",
                                        client_event_id="f1"))
    assert (playing.client_event_id, played.client_event_id) == ("f1", "f1")
    assert live_event(audio_delta(b"\x00\x01")).type == "session.output_audio.delta"


# ---- initial history --------------------------------------------------------------------

def start(c: LiveCodec, items) -> LiveStart:
    return c.parse(SessionStartEvent(type="session.start", session=SessionConfig(
        model="gpt-live-1", input=items)).to_json(use_api_names=True, exclude_unset=True))


def test_initial_history_is_the_conversation_item_create_items_in_order():
    cmd = start(codec(), [
        {"role": "developer", "content": [{"text": "The caller's name is Ana."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "My flight is BA 117."}],
         "id": "msg_client", "status": "completed", "type": "message"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Noted."}],
         "status": "incomplete"},
        {"role": "assistant", "content": [{"text": "Anything else?"}]},
    ])
    assert all(isinstance(i, ItemCreate) for i in cmd.history)
    got = [(i.item.role, i.item.content[0].type, i.item.content[0].text) for i in cmd.history]
    assert got == [(Role.SYSTEM, "input_text", "The caller's name is Ana."),
                   (Role.USER, "input_text", "My flight is BA 117."),
                   (Role.ASSISTANT, "output_text", "Noted."),
                   (Role.ASSISTANT, "output_text", "Anything else?")]
    assert all(i.item.id != "msg_client" for i in cmd.history)  # only role and text are used


def test_no_input_is_no_history():
    assert start(codec(), None).history == ()


@pytest.mark.parametrize("items, param", [
    ("hi", "session.input"),
    ([{"role": "system", "content": [{"text": "x"}]}], "session.input[0].role"),
    ([{"role": "user", "content": []}], "session.input[0].content"),
    ([{"role": "user", "content": [{"text": "a"}, {"text": "b"}]}], "session.input[0].content"),
    ([{"role": "user", "content": [{"type": "output_text", "text": "a"}]}],
     "session.input[0].content[0].type"),
    ([{"role": "assistant", "content": [{"type": "input_text", "text": "a"}]}],
     "session.input[0].content[0].type"),
    ([{"role": "user", "content": [{"text": 3}]}], "session.input[0].content[0].text"),
    ([{"role": "user", "content": [{"text": "a"}]}, {"role": "user", "type": "function_call",
                                                     "content": [{"text": "b"}]}],
     "session.input[1].type"),
    ([{"role": "user", "status": "in_progress", "content": [{"text": "a"}]}],
     "session.input[0].status"),
])
def test_a_history_we_cannot_honour_refuses_the_start_by_name(items, param):
    with pytest.raises(DuplexError) as err:
        codec().parse(json.dumps({"type": "session.start", "event_id": "s",
                                  "session": {"model": "gpt-live-1", "input": items}}))
    assert (err.value.code, err.value.param, err.value.event_id) == ("invalid_value", param, "s")
