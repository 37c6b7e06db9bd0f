"""One SIP dialog (realtime/server/telephony/sip_dialog.py) with its peer as a
list of what was sent, on short timers: a UDP 200 is resent until its ACK,
and a caller that never ACKs ends the call; repeats of the INVITE are
answered with the latest response; our requests are resent until answered."""

from __future__ import annotations

import asyncio

import pytest
from vllm_duplex.realtime.server.telephony import sip_message as sm
from vllm_duplex.realtime.server.telephony.sdp import parse_offer
from vllm_duplex.realtime.server.telephony.sip_dialog import DialogState, SipDialog

INVITE = sm.parse(
    b"INVITE sip:agent@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2;branch=z9hG4bK1\r\n"
    b"From: <sip:alice@x>;tag=a\r\nTo: <sip:agent@127.0.0.1>\r\nCall-ID: c1\r\nCSeq: 1 INVITE\r\n"
    b"Contact: <sip:alice@10.0.0.2:5062>\r\nContent-Length: 0\r\n\r\n")
OFFER = parse_offer("v=0\r\nc=IN IP4 10.0.0.2\r\nm=audio 4000 RTP/AVP 0\r\n")
FAST = (0.01, 0.04, 0.2)


def dialog(sent: list[bytes], reliable: bool = False) -> SipDialog:
    assert isinstance(INVITE, sm.SipRequest)
    return SipDialog("sip_x.w1", INVITE, OFFER, send=sent.append, reliable=reliable,
                     local_uri="sip:duplex@127.0.0.1:5060", via_host="127.0.0.1:5060",
                     transport="udp", timers=FAST)


async def until(condition, timeout: float = 5.0) -> None:
    """Wait for ``condition`` (the timers are short, the machine may be slow)."""
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


def statuses(sent: list[bytes]) -> list[int]:
    return [m.status for m in map(sm.parse, sent) if isinstance(m, sm.SipResponse)]


async def test_a_200_is_resent_until_its_ack_and_then_never():
    sent: list[bytes] = []
    d = dialog(sent)
    d.respond(200, body=b"v=0\r\n")
    await until(lambda: len(sent) >= 3)
    d.acked()
    resent = len(sent)
    await asyncio.sleep(0.1)  # several retransmission intervals
    assert len(sent) == resent and set(statuses(sent)) == {200}
    assert d.state is DialogState.CONFIRMED


async def test_a_200_never_acked_ends_the_call():
    sent: list[bytes] = []
    ended: list[bool] = []
    d = dialog(sent)
    d.on_no_ack = lambda: ended.append(True)
    d.respond(200, body=b"v=0\r\n")
    await until(lambda: ended)
    assert ended == [True] and len(sent) > 3


async def test_over_tcp_nothing_is_resent():
    sent: list[bytes] = []
    d = dialog(sent, reliable=True)
    d.respond(486)
    await asyncio.sleep(0.1)
    assert statuses(sent) == [486]


def test_a_repeated_invite_gets_the_latest_answer_again():
    sent: list[bytes] = []
    d = dialog(sent, reliable=True)
    d.respond(100)
    d.respond(180)
    d.repeat()
    assert statuses(sent) == [100, 180, 180]
    resp = sm.parse(sent[1])
    assert sm.tag_of(resp.get("to") or "") == d.local_tag  # 180 carries our tag, 100 none
    assert sm.tag_of(sm.parse(sent[0]).get("to") or "") is None


async def test_our_bye_goes_to_the_callers_contact_and_is_resent_until_answered():
    sent: list[bytes] = []
    d = dialog(sent)
    d.respond(200, body=b"v=0\r\n")
    d.acked()
    bye = asyncio.ensure_future(d.bye())
    await until(lambda: len(sent) >= 3)  # the 200, the BYE, the BYE again
    requests = [m for m in map(sm.parse, sent) if isinstance(m, sm.SipRequest)]
    assert len(requests) >= 2 and {r.method for r in requests} == {"BYE"}  # resent
    req = requests[0]
    assert req.uri == "sip:alice@10.0.0.2:5062" and sm.tag_of(req.get("from") or "") == d.local_tag
    assert sm.tag_of(req.get("to") or "") == "a" and req.call_id == "c1"
    d.answered(sm.response(req, 200))
    await asyncio.wait_for(bye, 1)
    assert d.state is DialogState.ENDED


async def test_a_request_nobody_answers_times_out():
    d = dialog([], reliable=True)
    d.respond(200, body=b"v=0\r\n")
    with pytest.raises(asyncio.TimeoutError):
        await d.transact("REFER", [("Refer-To", "<tel:+1>")], timeout_s=0.05)
