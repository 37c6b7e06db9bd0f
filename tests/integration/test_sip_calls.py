"""SIP calls with a real phone: Debian's baresip calls the server's SIP agent
on loopback (the scripted pipeline answers), and the application answers the
``realtime.call.incoming`` webhook -- its signature checked by the
``standardwebhooks`` package -- through the call control routes. The phone
plays its microphone from a WAV, records what it hears, sends RFC 4733
DTMF and hangs up; a sideband socket follows the call. Every test ends with
nothing left behind: no call, session, dialog, UDP socket or task.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl

import httpx
import numpy as np
import psutil
import pytest
import pytest_asyncio
import websockets
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError
from support.baresip import RATE, Baresip
from support.realtime_fixtures import LONG_REPLY, no_leaked_tasks, scripted_config, serve  # noqa: F401
from support.sip_fixtures import (
    SECRET,
    WebhookReceiver,
    raw_request,
    rms,
    silence8k,
    sip_exchange,
    tone8k,
    with_sip,
)

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.skipif(shutil.which("baresip") is None, reason="needs baresip")]

KEY, OTHER_KEY = "sk-phone-owner", "sk-someone-else"
QUESTION = np.concatenate([silence8k(0.5), tone8k(0.8), silence8k(12.0)])  # one turn, then quiet


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def receiver():
    async with WebhookReceiver() as hooks:
        yield hooks


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(receiver):
    config = with_sip(scripted_config(reply=LONG_REPLY, api_keys=(KEY, OTHER_KEY)),
                      webhook_url=receiver.url, webhook_secret=SECRET)
    async with serve(config) as srv:
        yield srv


def agent_of(server):
    return server._server.config.app.state.sip


def calls_of(server):
    return server._server.config.app.state.calls


def udp_sockets() -> int:
    return len(psutil.Process().net_connections(kind="udp"))


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def nothing_left(server, receiver):
    before = udp_sockets()
    yield
    agent = agent_of(server)
    for _ in range(300):  # a hang-up finishes on the server's loop: wait for it
        if not (len(calls_of(server)) or len(server.runtime.manager) or agent.ringing
                or agent._dialogs or udp_sockets() > before):
            break
        await asyncio.sleep(0.01)
    assert len(calls_of(server)) == 0, "a call outlived its test"
    assert len(server.runtime.manager) == 0, "a session outlived its call"
    assert not agent.ringing and not agent._dialogs, "a SIP dialog outlived its call"
    assert udp_sockets() <= before, "a call's RTP socket stayed open"
    while not receiver.deliveries.empty():  # webhooks of calls a test did not answer
        receiver.deliveries.get_nowait()


def loud_frames(pcm: np.ndarray, level: float) -> list[int]:
    """The 20 ms frames of ``pcm`` louder than ``level`` (RMS)."""
    frames = pcm[:pcm.size // 160 * 160].reshape(-1, 160)
    return [i for i, f in enumerate(frames) if rms(f) > level]


def first_loud(pcm: np.ndarray, level: int, start: int = 0) -> int:
    """The first sample at or after ``start`` louder than ``level``."""
    return start + int(np.argmax(np.abs(pcm[start:].astype(np.int32)) > level))


def uri(server, user: str = "agent", transport: str = "udp") -> str:
    return f"sip:{user}@127.0.0.1:{agent_of(server).port};transport={transport}"


async def post(server, path: str, body: dict | None = None, *, key: str | None = KEY):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        return await http.post(path, json=body, headers=headers)


async def ring(server, receiver, phone: Baresip, user: str = "agent") -> str:
    """Dial; the webhook's call id (its signature verified)."""
    await phone.dial(uri(server, user, phone.transport))
    headers, body, _ = await receiver.next()
    event = Webhook(SECRET).verify(body, headers)
    return event["data"]["call_id"]


def sideband(server, call_id: str, key: str = KEY):
    return websockets.connect(f"{server.ws_url}?call_id={call_id}",
                              additional_headers={"Authorization": f"Bearer {key}"})


async def until(ws, kind: str, timeout: float = 20.0) -> dict:
    async def read() -> dict:
        while True:
            event = json.loads(await ws.recv())
            if event["type"] == kind:
                return event
    return await asyncio.wait_for(read(), timeout)


# ---- the call ---------------------------------------------------------------------------


async def test_a_call_rings_a_signed_webhook_and_the_accepted_session_answers(server, receiver):
    async with Baresip(QUESTION) as phone:
        await phone.dial(uri(server))
        headers, body, raw = await receiver.next()
        event = Webhook(SECRET).verify(body, headers)  # the standardwebhooks package agrees
        with pytest.raises(WebhookVerificationError):  # and the signature covers the body
            Webhook(SECRET).verify(body.replace(b"caller", b"callee"), headers)
        assert event["type"] == "realtime.call.incoming" and raw["object"] == "event"
        call_id = event["data"]["call_id"]
        assert call_id.startswith("sip_")
        sip_headers = {h["name"].lower(): h["value"] for h in event["data"]["sip_headers"]}
        assert "sip:caller@127.0.0.1" in sip_headers["from"]
        assert "sip:agent@127.0.0.1" in sip_headers["to"] and sip_headers["call-id"]

        accepted = await post(server, f"/v1/realtime/calls/{call_id}/accept",
                              {"type": "realtime", "instructions": "You answer the phone."})
        assert accepted.status_code == 200, accepted.text
        await phone.event("CALL_ESTABLISHED")
        async with sideband(server, call_id) as side:
            await side.send(json.dumps({"type": "session.update", "session": {"type": "realtime"}}))
            session = (await until(side, "session.updated"))["session"]
            assert session["instructions"] == "You answer the phone."
            assert session["audio"]["input"]["format"]["type"] == "audio/pcmu"  # the call's law
            assert session["audio"]["output"]["format"]["type"] == "audio/pcmu"
            done = await until(side, "response.done")  # the reply to the phone's turn
            assert done["response"]["status"] == "completed"
            await phone.send_digits("19#*")
            digits = [(await until(side, "input_audio_buffer.dtmf_event_received"))["event"]
                      for _ in range(4)]
            assert digits == ["1", "9", "#", "*"]
            await phone.hangup()
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(side.recv(), 10)
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1000, "hangup")
        heard = phone.heard()
    # The phone heard the reply: the tone TTS, well above the silence around it.
    frames = heard[:heard.size // 160 * 160].reshape(-1, 160)
    loud = [rms(f) for f in frames]
    assert max(loud) > 1000 and sum(v > 1000 for v in loud) >= 25, "no reply audio reached the phone"


async def test_reject_answers_the_caller_with_its_status(server, receiver):
    async with Baresip(QUESTION) as phone:
        call_id = await ring(server, receiver, phone)
        refused = await post(server, f"/v1/realtime/calls/{call_id}/reject", {"status_code": 486})
        assert refused.status_code == 200
        closed = await phone.event("CALL_CLOSED")
        assert "486" in closed.get("param", ""), closed
        again = await post(server, f"/v1/realtime/calls/{call_id}/accept", {})
        assert again.status_code == 404 and again.json()["error"]["code"] == "call_not_found"
    async with Baresip(QUESTION) as phone:  # no body: 603 Decline
        call_id = await ring(server, receiver, phone)
        assert (await post(server, f"/v1/realtime/calls/{call_id}/reject")).status_code == 200
        assert "603" in (await phone.event("CALL_CLOSED")).get("param", "")


async def test_a_caller_who_gives_up_while_it_rings_cancels_the_call(server, receiver):
    async with Baresip(QUESTION) as phone:
        call_id = await ring(server, receiver, phone)
        await phone.hangup()  # before anyone answered: CANCEL
        await phone.event("CALL_CLOSED")
        for _ in range(300):
            if call_id not in agent_of(server).ringing:
                break
            await asyncio.sleep(0.01)
        late = await post(server, f"/v1/realtime/calls/{call_id}/accept", {})
        assert late.status_code == 404 and late.json()["error"]["code"] == "call_not_found"


class RawPhone(asyncio.DatagramProtocol):
    """A SIP phone written by hand, for what baresip does not send (SIP INFO)."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[bytes] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr) -> None:
        self.messages.put_nowait(data)

    async def answer(self, status: bytes, timeout: float = 10.0) -> bytes:
        while True:
            data = await asyncio.wait_for(self.messages.get(), timeout)
            if data.startswith(b"SIP/2.0 " + status):
                return data


async def test_dtmf_as_sip_info_reaches_the_sideband_too(server, receiver):
    loop = asyncio.get_running_loop()
    transport, phone = await loop.create_datagram_endpoint(RawPhone, local_addr=("127.0.0.1", 0))
    try:
        me = transport.get_extra_info("sockname")[1]
        port = agent_of(server).port
        offer = ("v=0\r\no=raw 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
                 f"m=audio {me} RTP/AVP 0\r\n")
        invite = raw_request("INVITE", port, call_id="info-1@raw", body=offer,
                             extra=f"Contact: <sip:raw@127.0.0.1:{me}>\r\n"
                                   "Content-Type: application/sdp\r\n")
        transport.sendto(invite, ("127.0.0.1", port))
        headers, body, _ = await receiver.next()
        call_id = Webhook(SECRET).verify(body, headers)["data"]["call_id"]
        assert (await post(server, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
        ok = await phone.answer(b"200")
        to = next(line for line in ok.decode().split("\r\n") if line.startswith("To:"))

        def in_dialog(method: str, cseq: int, extra: str = "", body: str = "") -> bytes:
            """A request of this call: the To with the server's tag, the next CSeq."""
            return raw_request(method, port, call_id="info-1@raw", extra=extra, body=body).replace(
                b"To: <sip:agent@127.0.0.1>", to.encode()).replace(
                f"CSeq: 1 {method}".encode(), f"CSeq: {cseq} {method}".encode())

        transport.sendto(in_dialog("ACK", 1), ("127.0.0.1", port))
        async with sideband(server, call_id) as side:
            transport.sendto(in_dialog("INFO", 2, "Content-Type: application/dtmf-relay\r\n",
                                       "Signal=7\r\nDuration=160\r\n"), ("127.0.0.1", port))
            await phone.answer(b"200")
            assert (await until(side, "input_audio_buffer.dtmf_event_received"))["event"] == "7"
            transport.sendto(in_dialog("BYE", 3), ("127.0.0.1", port))
            await phone.answer(b"200")
    finally:
        transport.close()


async def test_the_hangup_route_says_bye_over_tcp(server, receiver):
    async with Baresip(QUESTION, transport="tcp") as phone:
        call_id = await ring(server, receiver, phone)
        assert (await post(server, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
        await phone.event("CALL_ESTABLISHED")
        other = await post(server, f"/v1/realtime/calls/{call_id}/hangup", key=OTHER_KEY)
        assert other.status_code == 404  # another key's call does not exist for it
        assert (await post(server, f"/v1/realtime/calls/{call_id}/hangup")).status_code == 200
        await phone.event("CALL_CLOSED")
        gone = await post(server, f"/v1/realtime/calls/{call_id}/hangup")
        assert gone.status_code == 404


async def test_the_session_closing_hangs_up_the_phone(server, receiver):
    async with Baresip(QUESTION) as phone:
        call_id = await ring(server, receiver, phone)
        assert (await post(server, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
        await phone.event("CALL_ESTABLISHED")
        async with sideband(server, call_id) as side:
            await side.send(json.dumps({"type": "session.close"}))
            closed = await phone.event("CALL_CLOSED")
        assert closed["param"] == "Connection reset by peer"  # baresip's words for a BYE it got


async def test_a_call_nobody_answers_stops_ringing_with_480():
    async with WebhookReceiver() as hooks:
        config = with_sip(scripted_config(), webhook_url=hooks.url, ring_timeout_s=0.5)
        async with serve(config) as srv:
            async with Baresip(QUESTION) as phone:
                await phone.dial(uri(srv))
                await hooks.next()
                closed = await phone.event("CALL_CLOSED")
                assert "480" in closed.get("param", ""), closed
            assert not agent_of(srv).ringing


async def test_refer_transfers_the_caller_and_the_call_ends(server, receiver):
    async with Baresip(QUESTION) as phone:
        call_id = await ring(server, receiver, phone)
        assert (await post(server, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
        await phone.event("CALL_ESTABLISHED")
        target = uri(server, "frontdesk")
        moved = await post(server, f"/v1/realtime/calls/{call_id}/refer", {"target_uri": target})
        assert moved.status_code == 200, moved.text
        # The phone calls the target (here: this server again, so its webhook rings) ...
        headers, body, _ = await receiver.next()
        second = Webhook(SECRET).verify(body, headers)["data"]
        to = next(h["value"] for h in second["sip_headers"] if h["name"].lower() == "to")
        assert "frontdesk" in to and second["call_id"] != call_id
        # ... and once the new call is up, the transferred one ends.
        accepted = await post(server, f"/v1/realtime/calls/{second['call_id']}/accept", {})
        assert accepted.status_code == 200
        for _ in range(500):
            if not any(c.call_id == call_id for c in calls_of(server)._calls.values()):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the transferred call did not end")
        assert (await post(server, f"/v1/realtime/calls/{second['call_id']}/hangup")).status_code == 200
        await phone.event("CALL_CLOSED")


async def test_speech_over_the_reply_silences_the_outgoing_audio(server, receiver):
    """The phone speaks again while the reply plays: what it hears goes
    silent while it is still speaking, and the reply is cancelled."""
    onset_s = 0.5 + 0.8 + 2.2
    mic = np.concatenate([silence8k(0.5), tone8k(0.8), silence8k(2.2), tone8k(0.8, 330),
                          silence8k(10.0)])
    async with Baresip(mic) as phone:
        call_id = await ring(server, receiver, phone)
        assert (await post(server, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
        async with sideband(server, call_id) as side:  # the reply comes ~2 s after: in time
            started = await until(side, "output_audio_buffer.started")
            done = await until(side, "response.done")
            assert done["response"]["id"] == started["response_id"]
            assert done["response"]["status"] == "cancelled"
            await phone.hangup()
            await phone.event("CALL_CLOSED")
        sent, heard = phone.said(), phone.heard()
    # The two recordings run at real time to the call's end: aligned by their
    # ends, a sample of one is about the same moment in the other (to within
    # a few packets: the bound below leaves room for that, and the reply would
    # otherwise play on for seconds).
    shift = sent.size - heard.size
    onset = first_loud(sent, 1000, start=int((onset_s - 0.2) * RATE))
    reply = loud_frames(heard, 300)
    before = [f for f in reply if (f + 1) * 160 + shift <= onset]
    assert before, "the reply was not playing when the phone spoke over it"
    tail = [f for f in reply if onset < f * 160 + shift < onset + int(0.8 * RATE)]
    silent_after_ms = ((max(tail) + 1) * 160 + shift - onset) / 8 if tail else 0.0
    print(f"\nbarge-in: the phone heard the reply for about {silent_after_ms:.0f} ms after it spoke")
    assert silent_after_ms < 800, "the reply played on over the whole interruption"


async def test_a_sidebands_clear_cuts_the_reply_where_the_caller_is(server, receiver):
    async with Baresip(QUESTION) as phone:
        call_id = await ring(server, receiver, phone)
        assert (await post(server, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
        async with sideband(server, call_id) as side:
            started = await until(side, "output_audio_buffer.started")
            await asyncio.sleep(0.5)  # half a second of the reply reaches the phone
            await side.send(json.dumps({"type": "output_audio_buffer.clear"}))
            cleared = await until(side, "output_audio_buffer.cleared")
            truncated = await until(side, "conversation.item.truncated")
            assert cleared["response_id"] == started["response_id"]
            # what was sent of it (about the half second), not the reply's seconds
            assert 100 <= truncated["audio_end_ms"] <= 1500
            await phone.hangup()
            await phone.event("CALL_CLOSED")


# ---- what goes wrong ---------------------------------------------------------------------


async def test_malformed_sip_and_rtp_are_answered_or_dropped_and_the_call_goes_on(server, receiver):
    agent = agent_of(server)
    port = agent.port
    async with Baresip(QUESTION) as phone:
        call_id = await ring(server, receiver, phone)
        assert (await post(server, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
        await phone.event("CALL_ESTABLISHED")
        call = calls_of(server)._calls[call_id]
        no_cseq = raw_request("INVITE", port).replace(b"CSeq: 1 INVITE\r\n", b"")
        bad_version = raw_request("OPTIONS", port).replace(b"SIP/2.0\r\nVia", b"SIP/3.0\r\nVia", 1)
        garbage = b"\x00\xffnot sip at all\r\n\r\n"
        answers = [await asyncio.to_thread(sip_exchange, port, m) for m in (no_cseq, bad_version)]
        assert answers[0].startswith(b"SIP/2.0 400 ") and b"Call-ID: raw-1@test" in answers[0]
        assert answers[1].startswith(b"SIP/2.0 505 ")
        tcp = await asyncio.to_thread(sip_exchange, port, garbage, tcp=True)
        assert tcp.startswith(b"SIP/2.0 400 ")
        with pytest.raises(TimeoutError):  # a UDP datagram that is no request: not answered
            await asyncio.to_thread(sip_exchange, port, garbage, timeout=0.5)
        # RTP that is no RTP, and RTP of a payload type nobody offered: dropped, counted.
        dropped = call.dropped
        rtp = call.rtp_port
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"\x01\x02", ("127.0.0.1", rtp))
            s.sendto(bytes([0x80, 96, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2]) + b"x" * 160, ("127.0.0.1", rtp))
        for _ in range(200):
            if call.dropped >= dropped + 2:
                break
            await asyncio.sleep(0.01)
        assert call.dropped >= dropped + 2
        assert agent.malformed[400] >= 2 and agent.malformed[505] >= 1
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            metrics = (await http.get("/metrics")).text
        assert 'duplex_sip_malformed_total{status="505"}' in metrics
        assert 'duplex_rtp_dropped_total{reason="malformed"}' in metrics
        assert 'duplex_rtp_dropped_total{reason="payload_type"}' in metrics
        # The call still works: its digits still arrive, its session still answers.
        async with sideband(server, call_id) as side:
            await phone.send_digits("5")
            assert (await until(side, "input_audio_buffer.dtmf_event_received"))["event"] == "5"
        await phone.hangup()
        await phone.event("CALL_CLOSED")


async def test_requests_outside_a_call_get_sip_answers(server):
    port = agent_of(server).port
    options = await asyncio.to_thread(sip_exchange, port, raw_request("OPTIONS", port))
    assert options.startswith(b"SIP/2.0 200 ") and b"Allow: INVITE" in options
    bye = await asyncio.to_thread(sip_exchange, port, raw_request("BYE", port, call_id="nope@x"))
    assert bye.startswith(b"SIP/2.0 481 ")
    message = await asyncio.to_thread(sip_exchange, port, raw_request("MESSAGE", port))
    assert message.startswith(b"SIP/2.0 405 ")
    no_offer = await asyncio.to_thread(sip_exchange, port, raw_request("INVITE", port))
    assert no_offer.startswith(b"SIP/2.0 488 ")
    srtp = ("v=0\r\no=x 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            "m=audio 4000 RTP/SAVP 0\r\n")
    secure = await asyncio.to_thread(sip_exchange, port, raw_request(
        "INVITE", port, call_id="srtp@x", extra="Content-Type: application/sdp\r\n", body=srtp))
    # 100 Trying never comes for an offer we cannot take: the first answer is final.
    assert secure.startswith(b"SIP/2.0 488 ") and b"SRTP" in secure


async def test_call_control_routes_refuse_what_they_cannot_do(server, receiver):
    assert (await post(server, "/v1/realtime/calls/sip_unknown/accept", {})).status_code == 404
    assert (await post(server, "/v1/realtime/calls/sip_unknown/accept", {}, key=None)).status_code == 401
    async with Baresip(QUESTION) as phone:
        call_id = await ring(server, receiver, phone)
        bad = await post(server, f"/v1/realtime/calls/{call_id}/reject", {"status_code": 200})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "status_code"
        bad = await post(server, f"/v1/realtime/calls/{call_id}/accept", {"voice": 7})
        assert bad.status_code == 400  # the session is checked as any session.update's
        ringing = await post(server, f"/v1/realtime/calls/{call_id}/refer",
                             {"target_uri": "tel:+14155550123"})
        assert ringing.status_code == 404  # a call that is not up cannot be transferred
        assert (await post(server, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
        await phone.event("CALL_ESTABLISHED")
        bad = await post(server, f"/v1/realtime/calls/{call_id}/refer", {"target_uri": "http://x"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "target_uri"
        await phone.hangup()
        await phone.event("CALL_CLOSED")


async def test_twenty_calls_leave_nothing_behind(server, receiver):
    """Each call rings, is accepted, is up and hung up by the phone; the
    fixture then finds no call, session, dialog, RTP socket or task."""
    async with Baresip(QUESTION) as phone:
        for _ in range(20):
            phone.events.clear()
            call_id = await ring(server, receiver, phone)
            assert (await post(server, f"/v1/realtime/calls/{call_id}/accept", {})).status_code == 200
            await phone.event("CALL_ESTABLISHED")
            await phone.hangup()
            await phone.event("CALL_CLOSED")


async def test_a_call_can_be_accepted_at_once_without_a_webhook():
    config = with_sip(scripted_config(api_keys=(KEY,)), accept={"instructions": "At once."})
    async with serve(config) as srv:
        async with Baresip(QUESTION) as phone:
            await phone.dial(uri(srv))
            await phone.event("CALL_ESTABLISHED")
            (call,) = srv._server.config.app.state.calls._calls.values()
            assert call.session.config.instructions == "At once."
            await phone.hangup()
            await phone.event("CALL_CLOSED")
        for _ in range(300):
            if len(srv.runtime.manager) == 0:
                break
            await asyncio.sleep(0.01)
        assert len(srv.runtime.manager) == 0


async def test_calls_count_against_the_capacity_ceiling():
    """One voice session allowed: the second caller hears 486 Busy Here."""
    config = with_sip(scripted_config(api_keys=(KEY,), max_voice_sessions=1), accept={})
    async with serve(config) as srv:
        async with Baresip(QUESTION) as first, Baresip(QUESTION) as second:
            await first.dial(uri(srv))
            await first.event("CALL_ESTABLISHED")
            await second.dial(uri(srv))
            closed = await second.event("CALL_CLOSED")
            assert "486" in closed.get("param", ""), closed
            await first.hangup()
            await first.event("CALL_CLOSED")
        for _ in range(300):
            if len(srv.runtime.manager) == 0:
                break
            await asyncio.sleep(0.01)
        assert len(srv.runtime.manager) == 0


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for a certificate")
def tls_options(port: int, cafile: str) -> bytes:
    """OPTIONS over TLS from a client that checks the server's certificate."""
    context = ssl.create_default_context(cafile=cafile)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(raw_request("OPTIONS", port))
            return tls.recv(65536)


async def test_sip_over_tls(tmp_path):
    """The TLS port presents the configured certificate (a client that checks
    it gets its OPTIONS answered), and baresip calls and is hung up over it."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    made = await asyncio.create_subprocess_exec(
        "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
        "-addext", "subjectAltName=IP:127.0.0.1",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    assert await made.wait() == 0
    config = with_sip(scripted_config(api_keys=(KEY,)), accept={}, tls_port=0,
                      tls_certfile=str(cert), tls_keyfile=str(key))
    async with serve(config) as srv:
        port = agent_of(srv).tls_port
        answer = await asyncio.to_thread(tls_options, port, str(cert))
        assert answer.startswith(b"SIP/2.0 200 ")
        async with Baresip(QUESTION, transport="tls") as phone:
            await phone.dial(f"sip:agent@127.0.0.1:{port};transport=tls")
            await phone.event("CALL_ESTABLISHED")
            (call_id,) = srv._server.config.app.state.calls._calls
            async with httpx.AsyncClient(base_url=srv.http_url) as http:
                hung = await http.post(f"/v1/realtime/calls/{call_id}/hangup",
                                       headers={"Authorization": f"Bearer {KEY}"})
            assert hung.status_code == 200
            closed = await phone.event("CALL_CLOSED")  # our BYE, on the TLS connection
            assert closed["param"] == "Connection reset by peer"
        for _ in range(300):
            if len(srv.runtime.manager) == 0 and not agent_of(srv)._dialogs:
                break
            await asyncio.sleep(0.01)
        assert len(srv.runtime.manager) == 0 and not agent_of(srv)._dialogs
