"""Ephemeral client keys (``POST /v1/realtime/client_secrets``) and
transcription sessions, on the scripted pipeline over loopback: a key opens
one session (WebSocket or WebRTC call), expires, is refused for another kind
of session, and makes what it opens its minting key's; a transcription
session never responds.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import pytest_asyncio
import websockets
from openai.types.realtime import ClientSecretCreateResponse, SessionCreatedEvent
from support.audio import silence, tone
from support.realtime_fixtures import no_leaked_tasks, scripted_config, serve  # noqa: F401
from support.webrtc import CallRefused, RtcClient
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY, OTHER_KEY = "sk-backend", "sk-other-backend"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    async with serve(scripted_config(api_keys=(KEY, OTHER_KEY))) as srv:
        yield srv


async def mint(server, body=None, *, key=KEY) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        return await http.post("/v1/realtime/client_secrets", json=body or {},
                               headers={"Authorization": f"Bearer {key}"})


async def secret(server, body=None) -> dict:
    r = await mint(server, body)
    assert r.status_code == 200, r.text
    return r.json()


async def refused(url: str, key: str) -> dict:
    """The error event a refused socket gets before its close."""
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
    assert event["type"] == "error", event
    return event["error"]


async def test_an_api_key_mints_a_key_in_openais_shape(server):
    body = await secret(server, {"expires_after": {"anchor": "created_at", "seconds": 120},
                                 "session": {"type": "realtime", "instructions": "Be brief."}})
    ClientSecretCreateResponse.model_validate(body)
    assert body["value"].startswith("ek_")
    assert abs(body["expires_at"] - (time.time() + 120)) < 5
    assert body["session"]["instructions"] == "Be brief."
    assert body["session"]["id"].startswith("sess_")


async def test_a_key_opens_its_session_once_over_a_websocket(server):
    body = await secret(server, {"session": {"type": "realtime", "instructions": "Fixed in."}})
    async with await RealtimeClient.connect(server.ws_url, api_key=body["value"]) as rt:
        created = rt.events[0]
        assert created["session"]["id"] == body["session"]["id"]
        assert created["session"]["instructions"] == "Fixed in."
        err = await refused(server.ws_url, body["value"])
        assert err["code"] == "client_secret_used" and err["type"] == "authentication_error"
    # the browser-style subprotocol carries it too
    body = await secret(server)
    async with websockets.connect(server.ws_url, subprotocols=[
            "realtime", f"openai-insecure-api-key.{body['value']}"]) as ws:
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "session.created"


async def test_a_key_opens_a_call_and_the_call_is_its_minting_keys(server):
    body = await secret(server)
    async with RtcClient(server.http_url, key=body["value"]) as call:
        created = await call.event("session.created")
        assert created["session"]["id"] == body["session"]["id"]
        with pytest.raises(CallRefused) as again:
            async with RtcClient(server.http_url, key=body["value"]):
                pass
        assert again.value.status == 401 and again.value.code == "client_secret_used"
        # the backend's sideband, with its API key, drives the browser's call
        url = f"{server.ws_url}?call_id={call.call_id}"
        async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {KEY}"}) as side:
            await side.send(json.dumps({"type": "session.update", "session": {"instructions": "hi"}}))
            assert json.loads(await asyncio.wait_for(side.recv(), 10))["type"] == "session.updated"
        assert (await refused(url, OTHER_KEY))["code"] == "call_not_found"


async def test_an_expired_key_is_refused_and_an_unknown_one_is_unauthorized(server):
    body = await secret(server, {"expires_after": {"seconds": 10}})
    secrets = server.runtime.client_secrets
    real = secrets.clock

    class Later:  # the runtime's clock, 11 s on
        def now(self):
            return real.now() + 11

        async def sleep(self, s):
            await real.sleep(s)

    secrets.clock = Later()
    try:
        err = await refused(server.ws_url, body["value"])
        assert err["code"] == "client_secret_expired" and err["type"] == "authentication_error"
        with pytest.raises(CallRefused) as late:
            async with RtcClient(server.http_url, key=body["value"]):
                pass
        assert late.value.status == 401 and late.value.code == "client_secret_expired"
    finally:
        secrets.clock = real
    assert (await refused(server.ws_url, "ek_never_minted"))["code"] == "unauthorized"


async def test_a_key_minted_for_another_session_type_is_refused(server):
    body = await secret(server, {"session": {"type": "transcription"}})
    err = await refused(f"{server.ws_url}?intent=realtime", body["value"])
    assert err["code"] == "client_secret_mismatch" and err["param"] == "session.type"
    with pytest.raises(CallRefused) as mismatch:
        async with RtcClient(server.http_url, key=body["value"], session={"type": "realtime"}):
            pass
    assert mismatch.value.status == 403 and mismatch.value.code == "client_secret_mismatch"
    # a refusal consumed nothing: the key still opens what it was minted for
    async with await RealtimeClient.connect(f"{server.ws_url}?intent=transcription",
                                            api_key=body["value"]) as rt:
        assert rt.events[0]["session"]["type"] == "transcription"
        await rt.send({"type": "session.update", "session": {"type": "realtime"}, "event_id": "u"})
        err = await rt.wait_for("error")
        assert err["error"]["code"] == "immutable_field" and err["error"]["param"] == "session.type"


@pytest.mark.parametrize("body, key, status, code, param", [
    ({"expires_after": {"seconds": 5}}, KEY, 400, "invalid_value", "expires_after.seconds"),
    ({"expires_after": {"anchor": "now"}}, KEY, 400, "invalid_value", "expires_after.anchor"),
    ({"session": {"type": "realtime", "voice": 3}}, KEY, 400, "invalid_value", "session.voice"),
    ({"session": {"type": "translation"}}, KEY, 400, "invalid_value", "session.type"),
    ({"session": {"model": "gpt-9"}}, KEY, 404, "model_not_found", "session.model"),
    ({}, "sk-unknown", 401, "unauthorized", None),
])
async def test_a_bad_mint_is_a_typed_error(server, body, key, status, code, param):
    r = await mint(server, body, key=key)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code and r.json()["error"]["param"] == param


async def test_a_client_secret_cannot_mint_another(server):
    body = await secret(server)
    r = await mint(server, key=body["value"])
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


# ---- transcription sessions ------------------------------------------------------------


async def test_a_transcription_session_never_responds(server):
    async with await RealtimeClient.connect(f"{server.ws_url}?intent=transcription",
                                            api_key=KEY) as rt:
        created = rt.events[0]
        SessionCreatedEvent.model_validate(created)
        assert created["session"]["type"] == "transcription"
        assert created["session"]["object"] == "realtime.transcription_session"
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        await rt.send({"type": "response.create", "event_id": "r1"})
        err = await rt.wait_for("error")
        assert err["error"]["code"] == "capability_unsupported" and err["error"]["event_id"] == "r1"
        pcm = tone(0.8) + silence(1.0)  # a turn: the VAD hears it and commits it
        for i in range(0, len(pcm), 960):
            await rt.append_audio(pcm[i:i + 960])
        await rt.wait_for("input_audio_buffer.committed")
        await rt.send({"type": "input_audio_buffer.clear"})  # a marker after the turn's events
        await rt.wait_for("input_audio_buffer.cleared")
        assert not [e for e in rt.events if e["type"].startswith("response.")]


async def test_semantic_vad_in_a_transcription_session_runs_as_server_vad(server):
    async with await RealtimeClient.connect(f"{server.ws_url}?intent=transcription",
                                            api_key=KEY) as rt:
        updated = await rt.update_session({"type": "transcription", "audio": {"input": {
            "turn_detection": {"type": "semantic_vad", "eagerness": "high"}}}})
        td = updated["audio"]["input"]["turn_detection"]
        assert td["type"] == "server_vad" and td["silence_duration_ms"] == 300
