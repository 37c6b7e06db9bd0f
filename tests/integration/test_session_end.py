"""A realtime session ends when its client says so (issue 42, item 3).

A socket the client closes cleanly -- close code 1000 (normal) or 1001 (going
away) -- ends its session at once: its admission seat is free for the next
caller, and a ``session.resume`` of it is refused ``session_closed`` (the
session existed and was closed, as after ``session.close``). Any other end --
no close frame at all (the connection lost), or another code, such as the
4000 ``RealtimeClient.close(end_session=False)`` sends -- leaves the session
detached for a resume within ``limits.resume_grace_s`` (docs/usage.md,
"Resume"). Before this, a clean close held its seat for the whole grace: of
sessions opened one after another on a server of two seats, the third was
refused ``at_capacity``. A WebRTC call the caller hangs up frees its seat at
once too (a call has no resume). With a Redis store the session's keys go
with it. The same on the real engine, with the vLLM request freed:
``test_session_end_vllm.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import httpx
import pytest
import websockets
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    assert_alive,
    no_leaked_tasks,
    scripted_config,
    serve,
)
from support.webrtc import RtcClient
from vllm_duplex.fleet.redis_server import RedisServer
from vllm_duplex.host.store_config import StoreConfig
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

pytestmark = pytest.mark.asyncio(loop_scope="module")

# The default grace, so that a session the server wrongly keeps outlives every
# wait here by far.
GRACE_S = 30.0


async def sessions_become(http: httpx.AsyncClient, n: int, timeout: float = 5.0) -> dict:
    """``/health`` once it counts ``n`` sessions (and ``n`` voice sessions)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        health = (await http.get("/health")).json()
        if health["sessions"] == n and health["capacity"]["voice_sessions"] == n:
            return health
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"sessions never became {n} in {timeout} s: "
                                 f"{health['sessions']} / {health['capacity']}")
        await asyncio.sleep(0.02)


async def until(ws: websockets.ClientConnection, kind: str) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert event["type"] != "error", event
        if event["type"] == kind:
            return event


async def test_fifty_sessions_one_after_another_are_never_refused():
    """What the issue measured: open, ``session.update``, read the answer,
    close (1000), fifty times one at a time, on a server of two seats."""
    async with serve(scripted_config(max_voice_sessions=2, resume_grace_s=GRACE_S)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            for i in range(50):
                async with websockets.connect(srv.ws_url) as ws:  # refused: InvalidStatus 429
                    await until(ws, "session.created")
                    await ws.send(json.dumps({"type": "session.update",
                                              "session": {"instructions": f"Session {i}."}}))
                    updated = await until(ws, "session.updated")
                    assert updated["session"]["instructions"] == f"Session {i}."
                assert ws.close_code == 1000
                await sessions_become(http, 0)
            health = (await http.get("/health")).json()
            assert health["capacity"]["refused"] == 0


@pytest.mark.parametrize("code", [1000, 1001])
async def test_a_cleanly_closed_session_cannot_be_resumed(code):
    async with serve(scripted_config(max_voice_sessions=1, resume_grace_s=GRACE_S)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            first = await RealtimeClient.connect(srv.ws_url)
            await first.ws.close(code=code)
            await sessions_become(http, 0)
            with pytest.raises(RealtimeError) as refused:
                await first.reconnect()
            assert refused.value.code == "session_closed"
            async with await RealtimeClient.connect(srv.ws_url) as second:  # its seat is free
                await assert_alive(second)


async def test_a_connection_lost_without_a_close_frame_still_resumes():
    async with serve(scripted_config(max_voice_sessions=1, resume_grace_s=GRACE_S)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            first = await RealtimeClient.connect(srv.ws_url)
            await first.update_session({"instructions": "Still here."})
            first.ws.transport.abort()  # no close frame: the network went, not the client
            await asyncio.sleep(0.3)  # the server has seen the connection end
            health = await sessions_become(http, 1)
            assert health["capacity"]["room"] == 0  # the detached session keeps its seat
            back = await first.reconnect()
            try:
                assert back.session_id == first.session_id
                await assert_alive(back)
                assert back.events[0]["type"] == "session.resumed"
            finally:
                await back.close()
            await sessions_become(http, 0)


async def test_a_client_that_detaches_on_purpose_resumes():
    """``close(end_session=False)`` closes with 4000: not the end of the session."""
    async with serve(scripted_config(max_voice_sessions=1, resume_grace_s=GRACE_S)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            first = await RealtimeClient.connect(srv.ws_url)
            await first.close(end_session=False)
            assert first.ws.close_code == 4000
            await asyncio.sleep(0.3)
            await sessions_become(http, 1)
            back = await first.reconnect()
            try:
                await assert_alive(back)
            finally:
                await back.close()
            await sessions_become(http, 0)


async def test_a_webrtc_call_the_caller_hangs_up_frees_its_seat_at_once():
    """A call has no resume: its end is the session's, whatever the grace."""
    async with serve(scripted_config(max_voice_sessions=1, resume_grace_s=GRACE_S)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            for _ in range(5):
                call = RtcClient(srv.http_url)  # a sixth call past one seat: CallRefused 429
                try:
                    await call.connect()
                    await call.event("session.created")
                finally:
                    await call.close()
                await sessions_become(http, 0)


async def test_with_a_redis_store_a_clean_close_drops_the_session_and_a_drop_keeps_it():
    """The session's keys in the store go with it (no other worker could
    adopt what the client ended); a lost connection's stay, for its resume."""
    redis = RedisServer()
    await redis.start()
    try:
        config = dataclasses.replace(
            scripted_config(max_voice_sessions=2, resume_grace_s=GRACE_S),
            durability=StoreConfig(store="redis", url=redis.url))
        async with serve(config) as srv:
            store = srv.runtime.durability.store

            async def stored(c: RealtimeClient) -> bool:
                return await store.load(c.session_id) is not None

            ended = await RealtimeClient.connect(srv.ws_url)
            kept = await RealtimeClient.connect(srv.ws_url)
            for c in (ended, kept):
                await c.update_session({"instructions": "Remember me."})
            for _ in range(100):  # the writer saves in the background
                if await stored(ended) and await stored(kept):
                    break
                await asyncio.sleep(0.05)
            assert await stored(ended) and await stored(kept)
            await ended.ws.close()  # 1000
            kept.ws.transport.abort()
            for _ in range(100):
                if not await stored(ended):
                    break
                await asyncio.sleep(0.05)
            assert not await stored(ended)
            assert await stored(kept)
            back = await kept.reconnect()
            try:
                await assert_alive(back)
            finally:
                await back.close()
    finally:
        await redis.stop()
