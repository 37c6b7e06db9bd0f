"""The Twilio Media Streams codec, mark bookkeeping and stream tokens, with
no sockets: the messages exactly as Twilio's reference shows them
(twilio.com/docs/voice/media-streams/websocket-messages), every malformed
frame's typed error, what the marks say was heard, and the tokens that bind
a stream to its webhook."""

from __future__ import annotations

import base64
import json

import pytest
from twilio.request_validator import RequestValidator
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.server.telephony import twilio_codec as tw
from vllm_duplex.realtime.server.telephony.twilio_auth import TOKEN_TTL_S, TwilioAuth
from vllm_duplex.realtime.server.telephony.twilio_playout import Cut, Playout

SID = "MZ18ad3ab5a668481ce02b83e7395059f0"
CALL = "CA362c6a2ea7b4cd0e15f8e1c8e1234567"

# The reference's own examples (their values, our JSON).
CONNECTED = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
START = {"event": "start", "sequenceNumber": "1", "streamSid": SID, "start": {
    "accountSid": "AC123", "streamSid": SID, "callSid": CALL, "tracks": ["inbound"],
    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
    "customParameters": {"FirstName": "Jane", "LastName": "Doe"}}}
MEDIA = {"event": "media", "sequenceNumber": "3", "streamSid": SID, "media": {
    "track": "inbound", "chunk": "1", "timestamp": "5", "payload": "no+JhoaJjpzSHxAKBgYJDhtEopM="}}
DTMF = {"event": "dtmf", "streamSid": SID, "sequenceNumber": "5",
        "dtmf": {"track": "inbound_track", "digit": "1"}}
MARK = {"event": "mark", "sequenceNumber": "4", "streamSid": SID, "mark": {"name": "my label"}}
STOP = {"event": "stop", "sequenceNumber": "5", "streamSid": SID,
        "stop": {"accountSid": "AC123", "callSid": CALL}}


def parse(raw: dict) -> tw.Inbound:
    return tw.parse(json.dumps(raw))


def test_twilios_messages_parse_to_their_values():
    assert parse(CONNECTED) == tw.Connected("Call", "1.0.0")
    start = parse(START)
    assert isinstance(start, tw.Start)
    assert (start.stream_sid, start.call_sid, start.account_sid) == (SID, CALL, "AC123")
    assert start.media_format.is_mulaw_8k and start.tracks == ("inbound",)
    assert start.custom_parameters == {"FirstName": "Jane", "LastName": "Doe"}
    media = parse(MEDIA)
    assert media == tw.Media(SID, base64.b64decode(MEDIA["media"]["payload"]), "inbound", 1, 5)
    assert parse(DTMF) == tw.Dtmf(SID, "1", "inbound_track")
    assert parse(MARK) == tw.Mark(SID, "my label")
    assert parse(STOP) == tw.Stop(SID, CALL)


def test_bytes_frames_and_fields_we_do_not_use_are_fine():
    raw = {**MEDIA, "somethingNew": {"x": 1}}
    assert isinstance(tw.parse(json.dumps(raw).encode()), tw.Media)
    # Pipecat's serializer writes media with the payload only
    bare = tw.parse(json.dumps({"event": "media", "streamSid": SID, "media": {"payload": "AAE="}}))
    assert bare == tw.Media(SID, b"\x00\x01")


def test_a_start_in_another_format_is_read_and_says_so():
    raw = json.loads(json.dumps(START))
    raw["start"]["mediaFormat"] = {"encoding": "audio/x-l16", "sampleRate": "16000", "channels": 1}
    start = parse(raw)
    assert not start.media_format.is_mulaw_8k and start.media_format.sample_rate == 16000


def _with(raw: dict, path: str, value) -> dict:
    out = json.loads(json.dumps(raw))
    *parents, last = path.split(".")
    target = out
    for p in parents:
        target = target[p]
    if value is _DROP:
        del target[last]
    else:
        target[last] = value
    return out


_DROP = object()


@pytest.mark.parametrize("frame, code, param", [
    ("not json", "invalid_json", None),
    ("[1, 2]", "invalid_json", None),
    (json.dumps({"event": "clear", "streamSid": SID}), "unknown_event", "event"),  # ours, echoed
    (json.dumps({"event": "hello"}), "unknown_event", "event"),
    (json.dumps({"no": "event"}), "unknown_event", "event"),
    (json.dumps(_with(MEDIA, "media.payload", "%%% not base64 %%%")), "invalid_audio", "media.payload"),
    (json.dumps(_with(MEDIA, "media.payload", 12)), "invalid_event", "media.payload"),
    (json.dumps(_with(MEDIA, "media.chunk", "one")), "invalid_event", "media.chunk"),
    (json.dumps(_with(MEDIA, "media", "x")), "invalid_event", "media"),
    (json.dumps(_with(START, "start.callSid", _DROP)), "invalid_event", "start.callSid"),
    (json.dumps(_with(START, "start.mediaFormat", None)), "invalid_event", "start.mediaFormat"),
    (json.dumps(_with(START, "start.customParameters", {"a": 1})), "invalid_event",
     "start.customParameters"),
    (json.dumps(_with(DTMF, "dtmf.digit", "x")), "invalid_event", "dtmf.digit"),
    (json.dumps(_with(MARK, "mark.name", "")), "invalid_event", "mark.name"),
    ("{" + " " * tw.MAX_FRAME_BYTES + "}", "event_too_large", None),
])
def test_a_malformed_frame_is_a_typed_error(frame, code, param):
    with pytest.raises(DuplexError) as err:
        tw.parse(frame)
    assert err.value.code == code and err.value.param == param


def test_what_we_send_is_twilios_documented_shape():
    assert json.loads(tw.media(SID, b"\xff\x7f")) == {
        "event": "media", "streamSid": SID, "media": {"payload": "/38="}}
    assert json.loads(tw.mark(SID, "m1")) == {"event": "mark", "streamSid": SID,
                                              "mark": {"name": "m1"}}
    assert json.loads(tw.clear(SID)) == {"event": "clear", "streamSid": SID}


# ---- marks: what was heard -------------------------------------------------------


def test_marks_tell_what_was_heard_and_a_clear_cuts_there():
    p = Playout()
    names = [p.sent("r1", "i1", 100) for _ in range(5)]  # 0-500 ms of item i1
    assert p.playing == "r1" and p.unplayed_ms == 500
    assert p.echoed(names[1]).end_ms == 200  # marks 1 and 2 were played
    assert p.unplayed_ms == 300
    assert p.clear() == Cut("r1", "i1", 200)
    # Twilio echoes the dropped marks after a clear: they were not played
    assert [p.echoed(n) for n in names[2:]] == [None, None, None]
    assert p.playing is None and p.clear() is None


def test_nothing_heard_yet_cuts_at_the_start_and_a_resumed_item_goes_on_from_its_position():
    p = Playout()
    p.sent("r1", "i1", 100)
    assert p.clear() == Cut("r1", "i1", 0)
    p.seek("i1", 40)  # the session resumes the reply from 40 ms
    name = p.sent("r1", "i1", 100)
    assert p.clear() == Cut("r1", "i1", 40)
    assert p.echoed(name) is None and p.echoed("not ours") is None


def test_all_played_means_nothing_to_clear():
    p = Playout()
    p.sent("r1", "i1", 60)
    last = p.sent("r1", "i1", 60)
    p.echoed(last)
    assert p.playing is None and p.clear() is None


# ---- signatures and stream tokens ----------------------------------------------------


def test_the_webhook_signature_is_twilios():
    url, form = "https://voice.example.com/v1/telephony/twilio/voice", {"CallSid": CALL, "From": "+1555"}
    good = RequestValidator("secret").compute_signature(url, form)
    auth = TwilioAuth("secret", require_token=False)
    auth.check_signature(url, form, good)
    for bad_url, bad_form, signature in ((url, form, None), (url, form, "AAAA"),
                                         (url + "?x=1", form, good),
                                         (url, {**form, "From": "+1666"}, good)):
        with pytest.raises(DuplexError) as err:
            auth.check_signature(bad_url, bad_form, signature)
        assert err.value.code == "invalid_signature" and err.value.spec.http_status == 403
    TwilioAuth(None, require_token=False).check_signature(url, form, None)  # none configured


def test_a_stream_token_is_for_its_call_id_profile_and_time():
    auth = TwilioAuth("secret", require_token=False)
    token = auth.stream_token(CALL, "tw_1", "sales", now=1000.0)
    auth.check_stream_token(token, CALL, "tw_1", "sales", now=1000.0 + TOKEN_TTL_S - 1)
    # another worker with the same auth token accepts it
    TwilioAuth("secret", require_token=False).check_stream_token(token, CALL, "tw_1", "sales", 1001.0)
    for args in ((token, "CAother", "tw_1", "sales", 1001.0), (token, CALL, "tw_2", "sales", 1001.0),
                 (token, CALL, "tw_1", "", 1001.0), (token, CALL, "tw_1", "sales", 1000.0 + TOKEN_TTL_S + 1),
                 (None, CALL, "tw_1", "sales", 1001.0), ("garbage", CALL, "tw_1", "sales", 1001.0)):
        with pytest.raises(DuplexError) as err:
            auth.check_stream_token(*args)
        assert err.value.code == "unauthorized"
    with pytest.raises(DuplexError):  # another auth token's
        TwilioAuth("other", require_token=False).check_stream_token(token, CALL, "tw_1", "sales", 1001.0)


def test_an_open_server_takes_a_stream_without_a_token_and_a_keyed_one_does_not():
    TwilioAuth(None, require_token=False).check_stream_token(None, CALL, "", "", 0.0)
    with pytest.raises(DuplexError):
        TwilioAuth(None, require_token=True).check_stream_token(None, CALL, "", "", 0.0)
