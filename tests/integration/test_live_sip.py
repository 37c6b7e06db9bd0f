"""SIP calls answered as GPT-Live sessions: Debian's baresip calls the
server's SIP agent on loopback (the scripted pipeline answers); the
application drives the call with the ``openai`` SDK's own calls --
``client.live.sessions.accept / reject / refer / hangup`` and
``client.live.sideband.connect`` -- and every frame the sideband gets is
validated against the SDK's model of its type. DTMF both ways: the phone's
keys reach the sideband (``transport.dtmf.received``), and a key the sideband
presses (``transport.dtmf.send``) reaches the phone as RFC 4733 telephone
events (baresip reports it: ``CALL_DTMF_START``). Every test ends with no
call, session, dialog or live line left."""

from __future__ import annotations

import asyncio
import base64
import shutil

import numpy as np
import openai
import pytest
import pytest_asyncio
import websockets
from openai import AsyncOpenAI
from standardwebhooks import Webhook
from support.baresip import Baresip
from support.live_shapes import live_event
from support.realtime_fixtures import LONG_REPLY, no_leaked_tasks, scripted_config, serve  # noqa: F401
from support.sip_fixtures import SECRET, WebhookReceiver, silence8k, tone8k, with_sip

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.skipif(shutil.which("baresip") is None, reason="needs baresip")]

KEY, OTHER_KEY = "sk-phone-owner", "sk-someone-else"
QUESTION = np.concatenate([silence8k(0.5), tone8k(0.8), silence8k(12.0)])  # one turn, then quiet
LIVE = {"type": "live", "model": "gpt-live-1", "instructions": "You answer the phone."}


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


def state(server):
    return server._server.config.app.state


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def nothing_left(server, receiver):
    yield
    app = state(server)
    for _ in range(300):  # a hang-up finishes on the server's loop: wait for it
        if not (len(app.calls) or len(app.live_lines) or len(server.runtime.manager)
                or app.sip.ringing or app.sip._dialogs):
            break
        await asyncio.sleep(0.01)
    assert len(app.calls) == 0, "a call outlived its test"
    assert len(app.live_lines) == 0, "a live line outlived its call"
    assert len(server.runtime.manager) == 0, "a session outlived its call"
    assert not app.sip.ringing and not app.sip._dialogs, "a SIP dialog outlived its call"
    while not receiver.deliveries.empty():
        receiver.deliveries.get_nowait()


def client(server, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=server.http_url + "/v1", max_retries=0)


def uri(server, user: str = "agent") -> str:
    return f"sip:{user}@127.0.0.1:{state(server).sip.port};transport=udp"


async def ring(server, receiver, phone: Baresip, user: str = "agent") -> str:
    """Dial; the ringing call's id, from the signed webhook."""
    await phone.dial(uri(server, user))
    headers, body, _ = await receiver.next()
    return Webhook(SECRET).verify(body, headers)["data"]["call_id"]


async def next_event(side, timeout: float = 20.0):
    return live_event((await asyncio.wait_for(side.recv_bytes(), timeout)).decode())


async def until(side, kind: str, seen: list | None = None, timeout: float = 20.0):
    async def read():
        while True:
            event = await next_event(side)
            if seen is not None:
                seen.append(event)
            if event.type == kind:
                return event
    return await asyncio.wait_for(read(), timeout)


async def phone_pressed(phone: Baresip, timeout: float = 10.0) -> list[str]:
    """The keys the phone received (baresip's ``CALL_DTMF_START`` events)."""
    for _ in range(int(timeout / 0.05)):
        keys = [e.get("param") for e in phone.events if e.get("type") == "CALL_DTMF_START"]
        if keys:
            return keys
        await asyncio.sleep(0.05)
    return []


async def test_an_accepted_call_is_a_live_session_its_sideband_follows_and_drives(server, receiver):
    async with Baresip(QUESTION) as phone, client(server) as api:
        call_id = await ring(server, receiver, phone)
        await api.live.sessions.accept(call_id, session=LIVE)
        await phone.event("CALL_ESTABLISHED")
        seen: list = []
        async with api.live.sideband.connect(session_id=call_id) as side:
            first = await next_event(side)
            assert first.type == "session.started"
            assert first.session.instructions == "You answer the phone."
            assert (first.session.audio.format.type, first.session.audio.format.rate) == \
                ("audio/pcmu", 8000)  # the call's law
            await until(side, "session.output_transcript.delta", seen)  # the reply to the phone
            await until(side, "session.usage.updated", seen)
            reflected = b"".join(base64.b64decode(e.audio) for e in seen
                                 if e.type == "session.input_audio.append")
            assert len(reflected) > 2 * 24000, "the caller's audio was not reflected (24 kHz)"
            replies = [e for e in seen if e.type == "session.output_audio.delta"]
            assert replies and all(e.start_ms is not None and e.end_ms - e.start_ms ==
                                   len(base64.b64decode(e.delta)) // 2 * 1000 // 24000
                                   for e in replies), "the reply was not reflected as 24 kHz PCM"
            # The phone's keys reach the sideband.
            await phone.send_digits("19#")
            keys = [(await until(side, "transport.dtmf.received")).event for _ in range(3)]
            assert keys == ["1", "9", "#"]
            # A key the sideband presses reaches the phone.
            await side.transport.dtmf.send(event="5", event_id="press_5")
            sent = await until(side, "transport.dtmf.sent")
            assert (sent.event, sent.client_event_id) == ("5", "press_5")
            assert await phone_pressed(phone) == ["5"]
            await side.transport.dtmf.send(event="x", event_id="bad")
            err = await until(side, "error")
            assert (err.error.code, err.error.param, err.error.client_event_id) == \
                ("invalid_value", "event", "bad")
            # Hanging up through the SDK ends the phone's call and the sideband.
            await api.live.sessions.hangup(call_id)
            closed = await until(side, "session.closed")
            assert closed.reason == "close_requested"
            with pytest.raises(websockets.ConnectionClosed):
                while True:
                    await asyncio.wait_for(side.recv_bytes(), 10)
        await phone.event("CALL_CLOSED")
        heard = phone.heard()
    frames = heard[:heard.size // 160 * 160].reshape(-1, 160).astype(np.float64)
    assert np.sqrt((frames ** 2).mean(axis=1)).max() > 1000, "no reply audio reached the phone"


async def test_a_sidebands_mute_silences_the_caller_for_the_session(server, receiver):
    async with Baresip(QUESTION) as phone, client(server) as api:
        call_id = await ring(server, receiver, phone)
        await api.live.sessions.accept(call_id, session=LIVE)
        async with api.live.sideband.connect(session_id=call_id) as side:
            await until(side, "session.started")
            await side.session.input_audio.mute(event_id="m")
            assert (await until(side, "session.input_audio.muted")).client_event_id == "m"
            await phone.event("CALL_ESTABLISHED")
            await asyncio.sleep(2.5)  # the phone's whole question, muted
            seen: list = []
            await side.session.update(session={}, event_id="sync")
            await until(side, "session.updated", seen)
            await asyncio.sleep(1.0)
            await side.session.update(session={}, event_id="sync2")
            await until(side, "session.updated", seen)
            assert not [e for e in seen if e.type in ("session.input_transcript.delta",
                                                      "session.output_transcript.delta")]
            assert [e for e in seen if e.type == "session.input_audio.append"]  # still reflected
        await api.live.sessions.hangup(call_id)
        await phone.event("CALL_CLOSED")


async def test_reject_and_refer_through_the_sdk(server, receiver):
    async with Baresip(QUESTION) as phone, client(server) as api:
        call_id = await ring(server, receiver, phone)
        await api.live.sessions.reject(call_id, status_code=486)
        assert "486" in (await phone.event("CALL_CLOSED")).get("param", "")
        with pytest.raises(openai.NotFoundError) as gone:  # no second answer
            await api.live.sessions.accept(call_id, session=LIVE)
        assert gone.value.body["code"] == "session_not_found"
    async with Baresip(QUESTION) as phone, client(server) as api:
        call_id = await ring(server, receiver, phone)
        await api.live.sessions.accept(call_id, session=LIVE)
        await phone.event("CALL_ESTABLISHED")
        await api.live.sessions.refer(call_id, target_uri=uri(server, "frontdesk"))
        headers, body, _ = await receiver.next()  # the phone calls the target: it rings here
        second = Webhook(SECRET).verify(body, headers)["data"]["call_id"]
        await api.live.sessions.accept(second, session=LIVE)
        for _ in range(500):  # once the new call is up, the transferred one ends
            if not any(c.call_id == call_id for c in state(server).calls._calls.values()):
                break
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the transferred call did not end")
        await api.live.sessions.hangup(second)
        await phone.event("CALL_CLOSED")


async def test_call_control_refuses_what_it_cannot_do_typed(server, receiver):
    async with client(server) as api:
        with pytest.raises(openai.NotFoundError) as unknown:
            await api.live.sessions.accept("sip_unknown", session=LIVE)
        assert (unknown.value.body["code"], unknown.value.body["param"]) == \
            ("session_not_found", "session_id")
        with pytest.raises(openai.NotFoundError):
            await api.live.sessions.hangup("sip_unknown")
    async with Baresip(QUESTION) as phone, client(server) as api, \
            client(server, OTHER_KEY) as stranger:
        call_id = await ring(server, receiver, phone)
        for session, param in (({**LIVE, "type": "realtime"}, "session.type"),
                               ({**LIVE, "audio": {"format": {"type": "audio/pcm",
                                                              "rate": 24000}}},
                                "session.audio.format"),
                               ({**LIVE, "model": "gpt-4o"}, "session.model"),
                               ({**LIVE, "store": True}, "session.store"),
                               ({**LIVE, "input": [{"type": "message", "role": "user",
                                                    "content": [{"type": "input_text",
                                                                 "text": "Hi."}]}]},
                                "session.input")):
            with pytest.raises(openai.APIStatusError) as bad:
                await api.live.sessions.accept(call_id, session=session)
            assert bad.value.status_code in (400, 404) and bad.value.body["param"] == param
        with pytest.raises(openai.BadRequestError) as bad:
            await api.live.sessions.reject(call_id, status_code=200)
        assert bad.value.body["param"] == "status_code"
        with pytest.raises(openai.NotFoundError):  # a ringing call is no session yet
            await api.live.sessions.hangup(call_id)
        await api.live.sessions.accept(call_id, session=LIVE)  # still rings: answered now
        await phone.event("CALL_ESTABLISHED")
        with pytest.raises(openai.NotFoundError):  # another key's call
            await stranger.live.sessions.hangup(call_id)
        async with stranger.live.sideband.connect(session_id=call_id) as side:
            assert (await next_event(side)).error.code == "session_not_found"
        with pytest.raises(openai.BadRequestError) as bad:
            await api.live.sessions.refer(call_id, target_uri="http://x")
        assert bad.value.body["param"] == "target_uri"
        await api.live.sessions.hangup(call_id)
        await phone.event("CALL_CLOSED")
