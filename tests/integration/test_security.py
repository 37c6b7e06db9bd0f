"""API keys and per-key limits on a real socket (issue 5, item 7): a request
without one of the configured keys is refused, keys are compared safely
(any bytes), and one key cannot take more than its share of sessions.
Cross-key access answers not-found: see test_realtime_resume.py (resume
tokens), test_text_streams.py (streams), test_app_sessions_http.py (sessions)."""

from __future__ import annotations

import httpx
import pytest
import websockets
from support.realtime_fixtures import module_server, no_leaked_tasks, scripted_config # noqa: F401
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEYS = ("key-a", "key-b")


server = module_server(scripted_config(api_keys=KEYS, max_sessions_per_key=2))


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer nope"},
                                     {"authorization": "Bearer k\u00e9y"},  # not ASCII (latin-1 on the wire)
                                     {"authorization": "Basic a2V5LWE6"}])
async def test_requests_without_a_configured_key_are_refused(server, headers):
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for path in ("/v1/models", "/v1/capabilities"):
            r = await http.get(path, headers={k: v.encode("latin-1") for k, v in headers.items()})
            assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
        assert (await http.get("/health")).status_code == 200  # probes need no key
    async with websockets.connect(server.ws_url, additional_headers=headers) as ws:
        event = await ws.recv()
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
    assert '"unauthorized"' in event and ws.close_code == 1008


async def test_the_browser_subprotocol_carries_a_key(server):
    async with websockets.connect(server.ws_url, subprotocols=[
            "realtime", f"openai-insecure-api-key.{KEYS[1]}"]) as ws:
        assert '"session.created"' in await ws.recv()
        assert ws.subprotocol == "realtime"


async def test_one_key_cannot_take_every_session(server):
    first = [await RealtimeClient.connect(server.ws_url, api_key=KEYS[0]) for _ in range(2)]
    try:
        with pytest.raises(RealtimeError) as info:
            await RealtimeClient.connect(server.ws_url, api_key=KEYS[0])
        assert info.value.code == "resource_exhausted"
        other = await RealtimeClient.connect(server.ws_url, api_key=KEYS[1])  # B is not starved
        await other.close()
    finally:
        for rt in first:
            await rt.close()
    again = await RealtimeClient.connect(server.ws_url, api_key=KEYS[0])  # closing freed the slots
    await again.close()
