"""``serve --workers 2`` behind the real nginx, on loopback (issue 13): an id
reaches its owner, an unknown owner is refused.

One router for the module: the scripted pipeline in two worker processes
(``w1``, ``w2``), each admitting at most ``PER_WORKER`` sessions. What a user
of the router sees: new sessions spread over the workers; a resume, a
``/v1/sessions/{id}`` call, a stream or an abort reaches the owner its id
(or the ``Duplex-Owner-Instance`` header) names; an unknown owner is refused
by the router itself; limits hold per worker and in total; a killed worker's
sessions end with a typed error while the other worker's go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import urllib.request

import pytest
import websockets
from support.realtime_fixtures import no_leaked_tasks  # noqa: F401
from support.router_fixtures import Serve, get_json, owner, scripted_workers, wait_until
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

pytestmark = pytest.mark.asyncio(loop_scope="module")

PER_WORKER = 3
MAX_BODY = 4096
TOKEN = "abcdefghijklmnopqrstuvwx"  # 24 url-safe chars: the shape of a minted id
TEXT = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": None}}}


@pytest.fixture(scope="module")
def router():
    serve = Serve(scripted_workers(2, limits={"max_sessions": PER_WORKER, "resume_grace_s": 30,
                                              "max_request_bytes": MAX_BODY}), "serve")
    serve.start(expect_workers=2)
    yield serve
    assert serve.stop() == 0, serve.output()


async def open_sessions(router, n: int) -> list[RealtimeClient]:
    return [await RealtimeClient.connect(router.ws) for _ in range(n)]


async def end_all(clients: list[RealtimeClient]) -> None:
    """End each session for good: ``session.close``, then wait for the server
    to close the socket (a socket closed at once might detach it instead)."""
    for c in clients:
        with contextlib.suppress(Exception):
            await c.send({"type": "session.close"})
            async with asyncio.timeout(10):
                while True:
                    await c.recv()
        await c.ws.close()


async def one_per_worker(router) -> dict[str, RealtimeClient]:
    """A session on each worker (least_conn alternates; extra ones are ended)."""
    by_owner: dict[str, RealtimeClient] = {}
    extra = []
    for _ in range(4):
        c = await RealtimeClient.connect(router.ws)
        (extra.append(c) if owner(c) in by_owner else by_owner.__setitem__(owner(c), c))
        if len(by_owner) == 2:
            break
    await end_all(extra)
    assert set(by_owner) == {"w1", "w2"}
    return by_owner


async def reply(rt: RealtimeClient) -> dict:
    """A whole text turn; the response.done event."""
    await rt.send({"type": "session.update", "session": TEXT})
    await rt.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}})
    await rt.send({"type": "response.create"})
    return await rt.wait_for("response.done", timeout=20)


async def resume_outcome(router, client: RealtimeClient) -> tuple[str, int | None]:
    """('resumed', None), or the error code and the HTTP status when the
    router refused the handshake (None: the worker refused on the socket)."""
    try:
        rt = await client.reconnect()
    except websockets.InvalidStatus as err:
        body = json.loads(bytes(err.response.body))
        return body["error"]["code"], err.response.status_code
    except RealtimeError as err:
        return err.code, None
    await rt.close()
    return "resumed", None


async def test_new_sessions_spread_and_each_resume_lands_on_its_owner(router):
    clients = await open_sessions(router, 4)
    owners = [owner(c) for c in clients]
    assert sorted(owners) == ["w1", "w1", "w2", "w2"], owners  # least_conn: 2 and 2
    for c in clients:
        assert c.ws.response.headers["Duplex-Owner-Instance"] == owner(c)
        await c.close(end_session=False)  # the session waits, detached, for its resume
    resumed = []
    for c in clients:
        rt = await c.reconnect()  # /v1/realtime?resume=1&session_id=<id> through the router
        assert rt.session_id == c.session_id
        assert rt.ws.response.headers["Duplex-Owner-Instance"] == owner(c)
        resumed.append(rt)
    done = await reply(resumed[0])  # the resumed session still works
    assert done["response"]["status"] == "completed"
    await end_all(resumed)


async def test_a_resume_whose_query_names_another_session_is_refused(router):
    a, b = (await one_per_worker(router)).values()
    await a.close(end_session=False)
    # The router follows the query (b's owner); the worker refuses the mismatch.
    ws = await websockets.connect(f"{router.ws}?resume=1&session_id={b.session_id}")
    await ws.send(json.dumps({"type": "session.resume", "session_id": a.session_id,
                                            "resume_token": a.resume_token, "last_seq": 0}))
    event = json.loads(await ws.recv())
    assert event["type"] == "error" and event["error"]["code"] == "invalid_value"
    assert event["error"]["param"] == "session_id"
    await ws.close()
    rt = await a.reconnect()  # a's own resume still works: nothing was consumed
    await end_all([rt, b])


@pytest.mark.parametrize("method,path,headers", [
    ("GET", "/v1/sessions/sess_{t}.{w}", {}),
    ("POST", "/v1/sessions/sess_{t}.{w}/renew", {}),
    ("DELETE", "/v1/sessions/sess_{t}.{w}", {}),
    ("GET", "/v1/sessions/my-own-session-id", {"Duplex-Owner-Instance": "{w}"}),
    ("GET", "/v1/streams/my-stream", {"Duplex-Owner-Instance": "{w}"}),
    ("POST", "/v1/streams/my-stream/control", {"Duplex-Owner-Instance": "{w}"}),
    ("POST", "/v1/streams/lookup", {"Duplex-Owner-Instance": "{w}"}),
    ("POST", "/v1/requests/gen_{t}.{w}/abort", {}),
    ("POST", "/v1/requests/my-request/abort", {"Duplex-Owner-Instance": "{w}"}),
])
async def test_requests_that_name_an_id_reach_its_owner(router, method, path, headers):
    for w in ("w1", "w2", "w1"):
        url = router.http + path.format(t=TOKEN, w=w)
        status, head, body = get_json(url, {k: v.format(w=w) for k, v in headers.items()},
                                      method, b"{}" if method == "POST" else None)
        assert head.get("Duplex-Owner-Instance") == w, (path, w, head)
        # The owner answered (the scripted pipeline serves no text surfaces).
        assert body["error"]["code"] == "capability_unsupported", body


async def test_streaming_input_bound_to_a_session_reaches_its_owner(router):
    for w in ("w2", "w1"):
        url = router.ws.replace("/v1/realtime", f"/v1/generate/stream?session_id=sess_{TOKEN}.{w}")
        async with websockets.connect(url) as ws:
            assert ws.response.headers["Duplex-Owner-Instance"] == w
            frame = json.loads(await ws.recv())
            assert frame["error"]["code"] == "capability_unsupported"


@pytest.mark.parametrize("method,path,headers,code", [
    ("GET", "/v1/sessions/sess_{t}.w9", {}, "session_not_found"),  # unknown owner
    ("GET", "/v1/sessions/sess_{t}.w-1", {}, "session_not_found"),  # malformed owner part
    ("GET", "/v1/sessions/my-own-session-id", {}, "session_not_found"),  # chosen id, no owner
    ("GET", "/v1/sessions/my-own-session-id", {"Duplex-Owner-Instance": "w9"}, "session_not_found"),
    ("GET", "/v1/sessions/sess_{t}.w9", {"Duplex-Owner-Instance": "w1"}, "session_not_found"),
    ("GET", "/v1/streams/my-stream", {}, "stream_not_found"),
    ("DELETE", "/v1/streams/my-stream", {"Duplex-Owner-Instance": "w1/../w2"}, "stream_not_found"),
    ("POST", "/v1/streams/lookup", {}, "stream_not_found"),
    ("POST", "/v1/requests/gen_{t}.w3/abort", {}, "request_not_found"),
    ("POST", "/v1/requests/my-request/abort", {}, "request_not_found"),
])
async def test_an_id_naming_no_known_owner_is_refused_by_the_router(router, method, path,
                                                                   headers, code):
    status, head, body = get_json(router.http + path.format(t=TOKEN), headers, method,
                                  b"{}" if method == "POST" else None)
    assert status == 404
    assert "Duplex-Owner-Instance" not in head  # no worker saw it
    err = body["error"]
    assert err["code"] == code and err["type"] == "invalid_request_error"
    assert err["retryable"] is False and "owner" in err["message"]
    assert set(err) == {"type", "code", "message", "param", "event_id", "retryable"}


@pytest.mark.parametrize("query", [f"resume=1&session_id=sess_{TOKEN}.w9", "resume=1",
                                   f"resume=true&session_id=sess_{TOKEN}.inst_x"])
async def test_a_resume_naming_no_known_owner_is_refused_by_the_router(router, query):
    with pytest.raises(websockets.InvalidStatus) as refused:
        await websockets.connect(f"{router.ws}?{query}")
    assert refused.value.response.status_code == 404
    body = json.loads(bytes(refused.value.response.body))
    assert body["error"]["code"] == "session_not_found"


async def test_an_oversized_body_is_refused_by_the_router_with_the_apps_error(router):
    status, head, body = get_json(router.http + "/v1/generate", {"content-type": "application/json"},
                                  "POST", b'{"x": "' + b"a" * MAX_BODY + b'"}')
    assert status == 413 and "Duplex-Owner-Instance" not in head
    assert body == {"error": {"type": "invalid_request_error", "code": "payload_too_large",
                              "message": f"bodies are at most {MAX_BODY} bytes", "param": None,
                              "event_id": None, "retryable": False}}
    status, head, body = get_json(router.http + "/v1/generate", {"content-type": "application/json"},
                                  "POST", b"{}")
    assert head.get("Duplex-Owner-Instance") in ("w1", "w2")  # within the limit: a worker answers


async def test_models_capabilities_health_and_metrics_through_the_router(router):
    status, head, models = get_json(router.http + "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "duplex-scripted"
    status, _, caps = get_json(router.http + "/v1/capabilities")
    assert status == 200 and caps["instance_id"] in ("w1", "w2")
    clients = await open_sessions(router, 2)
    await wait_until(lambda: router.health()["sessions"] == 2, timeout=10)  # earlier ones closed
    status, _, health = get_json(router.http + "/health")
    assert status == 200 and health["status"] == "ok"
    assert set(health["workers"]) == {"w1", "w2"} and health["sessions"] == 2
    assert {w["health"]["instance_id"] for w in health["workers"].values()} == {"w1", "w2"}
    with urllib.request.urlopen(router.http + "/metrics") as resp:
        text = resp.read().decode()
    for w in ("w1", "w2"):
        assert f'duplex_sessions_live{{worker="{w}"}} 1' in text
        assert f'duplex_worker_up{{worker="{w}"}} 1' in text
    assert text.count("# TYPE duplex_sessions_live gauge") == 1
    with urllib.request.urlopen(router.http + "/metrics?worker=w2") as resp:
        only = resp.read().decode()
    assert 'worker="w2"' in only and 'worker="w1"' not in only
    await end_all(clients)


async def test_admission_limits_hold_per_worker_and_in_total(router):
    clients = await open_sessions(router, 2 * PER_WORKER)
    assert sorted(owner(c) for c in clients) == ["w1"] * PER_WORKER + ["w2"] * PER_WORKER
    for _ in range(2):  # every worker is full: the router's choice is refused by it
        with pytest.raises(RealtimeError) as refused:
            await RealtimeClient.connect(router.ws)
        assert refused.value.code == "resource_exhausted"
    await end_all(clients[:1])  # one slot frees, on that worker only
    freed = owner(clients[0])
    await wait_until(lambda: router.health()["workers"][freed]["health"]["sessions"] < PER_WORKER)
    again = await RealtimeClient.connect(router.ws)
    assert owner(again) == freed
    await end_all([again, *clients[1:]])


async def test_a_killed_worker_ends_its_sessions_typed_and_the_other_goes_on(router):
    sessions = await one_per_worker(router)
    victim, survivor = sessions["w1"], sessions["w2"]
    os.kill(router.health()["workers"]["w1"]["pid"], signal.SIGKILL)
    with pytest.raises(websockets.ConnectionClosed):
        async with asyncio.timeout(10):
            while True:
                await victim.recv()
    code, _ = await resume_outcome(router, victim)
    assert code == "engine_dead"  # 503 from the router while w1 is down, or from w1 reborn
    done = await reply(survivor)  # w2 never noticed
    assert done["response"]["status"] == "completed"
    await wait_until(lambda: router.health()["workers"]["w1"]["serving"], timeout=60)
    health = router.health()["workers"]["w1"]
    assert health["restarts"] == 1 and health["life"] == 2
    assert await resume_outcome(router, victim) == ("engine_dead", None)  # the new w1 says why
    fresh = await open_sessions(router, 2)  # the restarted w1 takes new sessions again
    assert "w1" in {owner(c) for c in fresh}
    await end_all([survivor, *fresh])
