"""SIP messages sans-I/O (realtime/server/telephony/sip_message.py): parsing
what phones send, answering it as RFC 3261 says, framing a TCP stream, and
refusing the malformed with the right status."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_duplex.realtime.server.telephony import sip_message as sm

INVITE = (b"INVITE sip:agent@127.0.0.1:5060 SIP/2.0\r\n"
          b"Via: SIP/2.0/UDP 10.0.0.2:5060;branch=z9hG4bK776asdhds;rport\r\n"
          b"Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bKproxy\r\n"
          b"Max-Forwards: 70\r\n"
          b"f: \"Alice\" <sip:alice@example.com>;tag=1928301774\r\n"
          b"To: <sip:agent@127.0.0.1>\r\n"
          b"i: a84b4c76e66710@pc33.example.com\r\n"
          b"CSeq: 314159 INVITE\r\n"
          b"Contact: <sip:alice@10.0.0.2:5060>\r\n"
          b"X-Customer: 42\r\n"
          b"Content-Type: application/sdp\r\n"
          b"Content-Length: 4\r\n\r\nv=0\nEXTRA")


def test_a_request_parses_with_compact_headers_and_the_body_cut_at_content_length():
    req = sm.parse(INVITE)
    assert isinstance(req, sm.SipRequest)
    assert (req.method, req.uri) == ("INVITE", "sip:agent@127.0.0.1:5060")
    assert req.call_id == "a84b4c76e66710@pc33.example.com"  # `i:` is Call-ID
    assert req.get("FROM") == '"Alice" <sip:alice@example.com>;tag=1928301774'
    assert req.cseq == (314159, "INVITE")
    assert len(req.get_all("via")) == 2 and req.get("x-customer") == "42"
    assert req.body == b"v=0\n"


def test_a_response_copies_vias_from_call_id_cseq_and_tags_the_to():
    req = sm.parse(INVITE)
    resp = sm.parse(sm.response(req, 180, to_tag="abc").encode())
    assert isinstance(resp, sm.SipResponse) and (resp.status, resp.reason) == (180, "Ringing")
    assert resp.get_all("via") == req.get_all("via")  # both, in order
    assert resp.get("from") == req.get("from") and resp.call_id == req.call_id
    assert resp.cseq == (314159, "INVITE")
    assert sm.tag_of(resp.get("to") or "") == "abc"
    assert resp.get("content-length") == "0"


def test_uri_and_tag_helpers_read_name_addr_forms():
    assert sm.uri_of('"Bob" <sip:bob@h;transport=tcp>;tag=9') == "sip:bob@h;transport=tcp"
    assert sm.uri_of("sip:bob@h;tag=9") == "sip:bob@h"
    assert sm.tag_of("<sip:bob@h;tag=notme>") is None  # a URI parameter is not the tag
    assert sm.tag_of("<sip:bob@h>;tag=me") == "me"


def test_an_in_dialog_request_round_trips():
    req = sm.request("BYE", "sip:alice@10.0.0.2", via="SIP/2.0/UDP 127.0.0.1:5060;branch=z9hG4bK1",
                     from_="<sip:agent@127.0.0.1>;tag=ours", to="<sip:alice@x>;tag=theirs",
                     call_id="c1", cseq=2)
    back = sm.parse(req.encode())
    assert isinstance(back, sm.SipRequest) and back.method == "BYE" and back.cseq == (2, "BYE")


@pytest.mark.parametrize("data, status", [
    (b"INVITE sip:a@b SIP/2.0\r\nVia: x\r\n\r\n", 400),  # From, To, Call-ID, CSeq missing
    (INVITE.replace(b"SIP/2.0\r\nVia", b"SIP/3.0\r\nVia", 1), 505),
    (INVITE.replace(b"CSeq: 314159 INVITE", b"CSeq: 314159 BYE"), 400),
    (INVITE.replace(b"CSeq: 314159 INVITE", b"CSeq: many INVITE"), 400),
    (INVITE.replace(b"Content-Length: 4", b"Content-Length: 400"), 400),
    (INVITE.replace(b"Max-Forwards: 70", b"Max Forwards 70"), 400),
    (b"\x00\xff\xfe garbage", 400),
    (b"INVITE sip:a@b SIP/2.0\r\n" + b"X-Pad: " + b"a" * (70 << 10) + b"\r\n\r\n", 413),
])
def test_malformed_messages_raise_with_the_status_to_answer(data, status):
    with pytest.raises(sm.SipParseError) as err:
        sm.parse(data)
    assert err.value.status == status


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_no_bytes_make_the_parser_fail_other_than_by_its_error(data):
    try:
        sm.parse(data)
    except sm.SipParseError:
        pass


@given(st.lists(st.integers(min_value=1, max_value=len(INVITE) * 2), max_size=10))
def test_a_tcp_stream_frames_the_same_whatever_its_chunks(cuts):
    whole = INVITE[:-len(b"EXTRA")]
    stream = b"\r\n" + whole + b"\r\n\r\n" + whole  # keep-alive CRLFs around
    framer = sm.StreamFramer()
    out: list[bytes] = []
    start = 0
    for cut in sorted(cuts) + [len(stream)]:
        out += framer.feed(stream[start:cut])
        start = max(start, cut)
    assert len(out) == 2 and all(sm.parse(m).call_id == "a84b4c76e66710@pc33.example.com" for m in out)


def test_a_stream_message_without_content_length_cannot_be_framed():
    with pytest.raises(sm.SipParseError):
        sm.StreamFramer().feed(b"OPTIONS sip:a@b SIP/2.0\r\nVia: x\r\n\r\n")
