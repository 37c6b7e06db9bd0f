"""Admission by measured capacity (``limits.max_voice_sessions``), over real
loopback connections: a voice session past the ceiling is refused before the
WebSocket upgrade with HTTP 429, ``Retry-After`` and the typed
``at_capacity`` error -- on our client, plain ``websockets`` and the official
``openai`` SDK alike, and for a WebRTC offer -- while the admitted sessions go
on; a resume is never refused (its session holds its seat); the ceiling, the
sessions and the refusals are on ``/health`` and ``/metrics``; a seat that
frees is taken by the next caller. The real pipeline's admitted sessions
answering beside refusals: ``test_capacity_e2e.py``; the router:
``test_router_capacity.py``."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from openai import AsyncOpenAI
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    assert_alive,
    no_leaked_tasks,
    scripted_config,
    serve,
)
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

pytestmark = pytest.mark.asyncio(loop_scope="module")


def refusal_body(err: websockets.InvalidStatus) -> dict:
    assert err.response.status_code == 429
    assert err.response.headers["Retry-After"] == "5"
    body = json.loads(bytes(err.response.body))["error"]
    assert body["code"] == "at_capacity" and body["type"] == "server_error"
    assert body["retryable"] is True and body["retry_after_s"] == 5
    return body


async def live(http: httpx.AsyncClient, n: int) -> dict:
    for _ in range(200):
        health = (await http.get("/health")).json()
        if health["sessions"] == n:
            return health
        await asyncio.sleep(0.02)
    raise AssertionError(f"sessions never became {n}: {health}")


async def test_a_voice_session_over_the_ceiling_is_refused_before_the_upgrade():
    async with serve(scripted_config(max_voice_sessions=2)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            health = (await http.get("/health")).json()
            assert health["capacity"] == {
                "max_voice_sessions": {"value": 2, "source": "config", "reason": ""},
                "voice_sessions": 0, "room": 2, "refused": 0}
            async with await RealtimeClient.connect(srv.ws_url) as a, \
                    await RealtimeClient.connect(srv.ws_url) as b:
                with pytest.raises(websockets.InvalidStatus) as raw:
                    async with websockets.connect(srv.ws_url):
                        pass
                assert refusal_body(raw.value)["max_voice_sessions"] == 2
                with pytest.raises(RealtimeError) as ours:
                    await RealtimeClient.connect(srv.ws_url)
                assert ours.value.code == "at_capacity" and ours.value.retry_after_s == 5
                with pytest.raises(websockets.InvalidStatus) as sdk:
                    async with AsyncOpenAI(api_key="sk-local", base_url=srv.http_url + "/v1",
                                           websocket_base_url=f"ws://127.0.0.1:{srv.port}/v1") as oa:
                        async with oa.realtime.connect(model="duplex-scripted"):
                            pass
                refusal_body(sdk.value)
                call = await http.post("/v1/realtime/calls", content=b"v=0\r\n",
                                       headers={"Content-Type": "application/sdp"})
                assert call.status_code == 429 and call.headers["Retry-After"] == "5"
                assert call.json()["error"]["code"] == "at_capacity"

                await assert_alive(a)  # the admitted sessions are untouched
                await assert_alive(b)
                health = (await http.get("/health")).json()
                assert health["capacity"]["voice_sessions"] == 2
                assert health["capacity"]["room"] == 0 and health["capacity"]["refused"] == 4
                metrics = (await http.get("/metrics")).text
                assert "duplex_voice_sessions_refused_total 4" in metrics
                assert "duplex_voice_sessions_max 2" in metrics
                caps = (await http.get("/v1/capabilities")).json()
                assert caps["limits"]["max_voice_sessions"] == 2

                await a.send({"type": "session.close"})
                await live(http, 1)
                async with await RealtimeClient.connect(srv.ws_url) as c:  # a seat freed: admitted
                    await assert_alive(c)


async def test_a_resume_is_never_refused_its_session_holds_its_seat():
    async with serve(scripted_config(max_voice_sessions=1, resume_grace_s=30.0)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            first = await RealtimeClient.connect(srv.ws_url)
            first.ws.transport.abort()  # dropped, not ended: it waits for its resume
            health = await live(http, 1)
            assert health["capacity"]["room"] == 0
            with pytest.raises(RealtimeError) as refused:
                await RealtimeClient.connect(srv.ws_url)
            assert refused.value.code == "at_capacity"
            back = await first.reconnect()
            try:
                await assert_alive(back)
                assert back.session_id == first.session_id
            finally:
                await back.send({"type": "session.close"})
                await back.wait_for("session.closed", timeout=10)
                await back.close()
            await live(http, 0)


async def test_a_session_the_client_ended_frees_its_seat_at_once():
    """``session.close`` and the socket's end race: a session that reads its
    close after the socket went closes itself detached -- it must leave the
    registry then, not hold its seat for the 30 s resume grace."""
    async with serve(scripted_config(max_voice_sessions=1, resume_grace_s=30.0)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            for _ in range(5):
                client = await RealtimeClient.connect(srv.ws_url)
                await client.close()  # session.close, then the socket's close at once
                await live(http, 0)  # 4 s at most
            async with await RealtimeClient.connect(srv.ws_url) as last:
                await assert_alive(last)


async def test_without_a_ceiling_only_max_sessions_applies():
    async with serve(scripted_config(max_sessions=3)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            assert (await http.get("/health")).json()["capacity"]["max_voice_sessions"] is None
            clients = [await RealtimeClient.connect(srv.ws_url) for _ in range(3)]
            with pytest.raises(RealtimeError) as refused:
                await RealtimeClient.connect(srv.ws_url)
            assert refused.value.code == "resource_exhausted"  # after the upgrade, as before
            for c in clients:
                await c.close()
