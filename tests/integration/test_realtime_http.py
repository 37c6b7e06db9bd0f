"""HTTP surfaces, API keys, admission and close over real loopback connections.

Pinned: session.close -> session.closed, then the socket closes (other
sockets unaffected; commands after close); admission beyond max_sessions ->
resource_exhausted, retryable; and the HTTP endpoints
``/health``, ``/metrics``, ``/v1/models``, ``/v1/capabilities`` with and without
API keys (``unauthorized`` on the socket, 401 over HTTP).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import pytest_asyncio
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    assert_alive,
    assert_error,
    module_server,
    no_leaked_tasks,
    scripted_config,
    serve,
    stream_audio,
    tone,
    types,
)
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

pytestmark = pytest.mark.asyncio(loop_scope="module")


server = module_server()


@pytest_asyncio.fixture(loop_scope="module")
async def http(server):
    async with httpx.AsyncClient(base_url=server.http_url) as client:
        yield client


async def _live_sessions(http: httpx.AsyncClient, expected: int) -> None:
    """Waits (bounded) until /health reports ``expected`` sessions: a socket's
    session is released by the server shortly after the client hangs up."""
    for _ in range(200):
        if (await http.get("/health")).json()["sessions"] == expected:
            return
        await asyncio.sleep(0.01)
    assert (await http.get("/health")).json()["sessions"] == expected


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


async def _refused(url: str, **headers: str) -> tuple[dict, int | None]:
    """The error event a refused socket gets, and the close code that follows it."""
    async with connect(url, additional_headers=headers) as ws:
        event = json.loads(await ws.recv())
        with pytest.raises(ConnectionClosed):
            await ws.recv()
        return event, ws.close_code


# ---- HTTP endpoints ------------------------------------------------------------------


async def test_health_counts_live_sessions(server, http):
    await _live_sessions(http, 0)
    body = (await http.get("/health")).json()
    assert body["status"] == "ok" and body["instance_id"]
    async with await RealtimeClient.connect(server.ws_url) as rt:
        assert (await http.get("/health")).json()["sessions"] == 1
        assert rt.session["owner_instance_id"] == body["instance_id"]
    await _live_sessions(http, 0)


async def test_metrics(server, http):
    async with await RealtimeClient.connect(server.ws_url) as rt:
        await stream_audio(rt, tone(0.3))  # server VAD on: every chunk is submitted to VAD
        await assert_alive(rt)
        await rt.create_response({"output_modalities": ["text"]})
        await rt.wait_for("response.output_text.delta")
        await rt.cancel_response()
        assert (await rt.collect_response()).status == "cancelled"
        response = await http.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        text = response.text
        assert _metric(text, "duplex_sessions_live") == 1
        assert _metric(text, "duplex_ingest_latency_seconds_count") >= 1
        assert 'duplex_ingest_latency_seconds{quantile="0.5"}' in text
        assert _metric(text, 'duplex_interrupts_total{reason="client_cancelled"}') >= 1
        assert _metric(text, "duplex_epoch_bumps_total") >= 1


async def test_models_and_capabilities(http):
    models = await http.get("/v1/models")
    assert models.status_code == 200
    body = models.json()
    assert body["object"] == "list"
    # the served model, then its aliases (configs/scripted.yaml served_model_names)
    assert [m["id"] for m in body["data"]] == ["duplex-scripted", "gpt-realtime", "gpt-realtime-2",
                                               "gpt-realtime-2.1", "gpt-realtime-mini"]
    assert {m.get("root") for m in body["data"][1:]} == {"duplex-scripted"}

    caps = (await http.get("/v1/capabilities")).json()
    assert caps["model"] == "duplex-scripted"
    scripted = caps["policies"]["scripted"]
    assert "append_audio_chunk" in scripted["input_modes"]
    assert "rollback_to_checkpoint" not in scripted["input_modes"]
    assert scripted["turn_detection"] == ["server_vad"]
    assert caps["limits"]["max_sessions"] == 256
    assert set(caps["audio_formats"]) >= {"audio/pcm", "audio/pcmu", "audio/pcma"}
    assert caps["realtime"]["path"] == "/v1/realtime"


async def test_wrong_model_on_the_socket_is_model_not_found(server):
    with pytest.raises(RealtimeError) as refused:
        await RealtimeClient.connect(server.ws_url, model="gpt-4o")
    assert_error(refused.value.event, "model_not_found", event_id=None, param="model")
    async with await RealtimeClient.connect(server.ws_url, model="duplex-scripted") as rt:
        await assert_alive(rt)


async def test_a_served_alias_is_the_served_model(server):
    async with await RealtimeClient.connect(server.ws_url, model="gpt-realtime") as rt:
        assert rt.session["model"] == "duplex-scripted"
        session = await rt.update_session({"model": "gpt-realtime-2.1", "instructions": "hi"})
        assert (session["model"], session["instructions"]) == ("duplex-scripted", "hi")


# ---- API keys -------------------------------------------------------------------------


async def test_api_keys():
    async with serve(scripted_config(api_keys=("k1",))) as srv:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            event, code = await _refused(srv.ws_url, **headers)
            assert_error(event, "unauthorized", event_id=None)
            assert code == 1008
        with pytest.raises(RealtimeError) as refused:
            await RealtimeClient.connect(srv.ws_url)
        assert refused.value.code == "unauthorized"

        async with await RealtimeClient.connect(srv.ws_url, api_key="k1") as rt:
            await assert_alive(rt)
        # Browsers cannot set headers: the key may come as a subprotocol.
        async with connect(srv.ws_url, subprotocols=["realtime", "openai-insecure-api-key.k1"]) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            assert ws.subprotocol == "realtime"

        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            for path in ("/v1/models", "/v1/capabilities"):
                for headers in ({}, {"Authorization": "Bearer wrong"}):
                    denied = await http.get(path, headers=headers)
                    assert denied.status_code == 401, path
                    err = denied.json()["error"]
                    assert (err["code"], err["type"], err["retryable"]) == \
                        ("unauthorized", "authentication_error", False)
                allowed = await http.get(path, headers={"Authorization": "Bearer k1"})
                assert allowed.status_code == 200, path
            assert (await http.get("/health")).status_code == 200


# ---- 29: close --------------------------------------------------------------------------


async def test_session_close_then_socket_closes_and_others_are_unaffected(server, http):
    async with await RealtimeClient.connect(server.ws_url) as a, \
            await RealtimeClient.connect(server.ws_url) as b:
        await a.send({"type": "session.close"})
        closed = await a.wait_for("session.closed", timeout=10)
        assert closed["reason"] == "client"
        assert closed["seq"] == a.events[-2]["seq"] + 1 and "fence" in closed["metadata"]
        with pytest.raises(ConnectionClosed):
            await a.recv(timeout=10)
        assert a.ws.close_code == 1000
        assert types(a.events)[-1] == "session.closed"
        await assert_alive(b)
        await _live_sessions(http, 1)
    await _live_sessions(http, 0)


async def test_commands_after_close_are_not_executed(server):
    async with await RealtimeClient.connect(server.ws_url) as rt:
        await rt.ws.send(json.dumps({"type": "session.close"}))
        await rt.ws.send(json.dumps({"type": "session.close"}))
        await rt.ws.send(json.dumps({"type": "response.create", "event_id": "after_close"}))
        with pytest.raises(ConnectionClosed):
            while True:
                await rt.recv(timeout=10)
        after = rt.events[[e["type"] for e in rt.events].index("session.closed") + 1:]
        assert types(rt.events).count("session.closed") == 1  # close is idempotent
        for event in after:  # nothing runs after close; at most session_closed errors
            assert_error(event, "session_closed")


# ---- 30: admission ---------------------------------------------------------------------


async def test_admission_beyond_max_sessions_is_resource_exhausted():
    async with serve(scripted_config(max_sessions=2)) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            async with await RealtimeClient.connect(srv.ws_url) as a, \
                    await RealtimeClient.connect(srv.ws_url) as b:
                event, code = await _refused(srv.ws_url)
                assert_error(event, "resource_exhausted", event_id=None)
                assert event["error"]["retryable"] is True
                assert code == 1013  # "try again later"
                with pytest.raises(RealtimeError) as refused:
                    await RealtimeClient.connect(srv.ws_url)
                assert refused.value.code == "resource_exhausted"

                await assert_alive(a)
                await assert_alive(b)
                await a.close()  # closing again on exit is a no-op
                await _live_sessions(http, 1)
                async with await RealtimeClient.connect(srv.ws_url) as c:  # the retry succeeds
                    await assert_alive(c)
