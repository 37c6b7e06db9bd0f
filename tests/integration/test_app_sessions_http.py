"""Application sessions over real HTTP against the real engine: open / get /
renew / close, continuation by unary generate with the
conversation kept in the live vLLM request, eviction, expiry, per-key and
per-instance ownership."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from support.metrics import metric
from support.text_fixtures import FRANCE, KEYS, MODEL, auth, client, sse_events, text_runtime  # noqa: F401
from vllm_duplex.realtime.server.serving import BackgroundServer
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")

GERMANY = [{"role": "user", "content": "And what is the capital of Germany?"}]


async def live_llm_requests(http: httpx.AsyncClient) -> float:
    return metric((await http.get("/metrics")).text, "duplex_stage_active_requests", stage="llm")


async def turn(http: httpx.AsyncClient, sid: str, messages, **extra) -> dict:
    r = await http.post(f"/v1/sessions/{sid}/generate", json={
        "messages": messages, "stream": False, "options": {"max_tokens": 24}, **extra})
    assert r.status_code == 200, r.json()
    return r.json()


async def test_open_reports_lease_expiry_state_and_ref(text_server):
    async with client(text_server) as http:
        r = await http.post("/v1/sessions", json={"model": MODEL, "ttl_s": 30})
        assert r.status_code == 201
        s = r.json()
        assert s["state"] == "active" and s["model"] == MODEL and s["adapter"] is None
        assert s["lease"]["ttl_s"] == 30 and 0 < s["lease"]["expires_in_s"] <= 30
        assert s["lease"]["generation"] == 1 and s["lease"]["expires_at"] > 1e9
        instance = text_server.runtime.manager.instance_id
        assert s["ref"] == {"session_id": s["id"], "owner_instance_id": instance}
        # ttl 0 and absent both mean the server default; above the maximum is clamped
        default = text_server.runtime.config.limits.session_ttl_s
        for ttl, expect in ((0, default), (None, default), (10**9, 3600.0)):
            body = {"model": MODEL} if ttl is None else {"model": MODEL, "ttl_s": ttl}
            r = await http.post("/v1/sessions", json=body)
            assert r.json()["lease"]["ttl_s"] == expect
            await http.delete(f"/v1/sessions/{r.json()['id']}")
        await http.delete(f"/v1/sessions/{s['id']}")


@pytest.mark.parametrize("body, status, code", [
    ({"model": "gpt-4o"}, 404, "model_not_found"),
    ({}, 400, "invalid_value"),
    ({"model": MODEL, "adapter": "my-lora"}, 404, "model_not_found"),
    ({"model": MODEL, "session_id": ""}, 400, "invalid_value"),
    ({"model": MODEL, "session_id": "has spaces"}, 400, "invalid_value"),
    ({"model": MODEL, "ttl_s": -5}, 400, "invalid_value"),
    ({"model": MODEL, "kv_handle": "x"}, 400, "unsupported_option"),
])
async def test_open_refuses_bad_requests(text_server, body, status, code):
    async with client(text_server) as http:
        r = await http.post("/v1/sessions", json=body)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code)


async def test_caller_ids_are_unique_and_close_is_idempotent(text_server):
    async with client(text_server) as http, client(text_server, KEYS[1]) as bob:
        r = await http.post("/v1/sessions", json={"model": MODEL, "session_id": "my-app.conv:1"})
        assert r.status_code == 201 and r.json()["id"] == "my-app.conv:1"
        r = await http.post("/v1/sessions", json={"model": MODEL, "session_id": "my-app.conv:1"})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "duplicate_id")
        for method, path in (("GET", ""), ("DELETE", ""), ("POST", "/renew"), ("POST", "/generate")):
            r = await bob.request(method, f"/v1/sessions/my-app.conv:1{path}",
                                  json={"messages": FRANCE} if method == "POST" else None)
            assert (r.status_code, r.json()["error"]["code"]) == (404, "session_not_found")
        r = await http.delete("/v1/sessions/my-app.conv:1")
        assert r.status_code == 200 and r.json()["state"] == "closed"
        r = await http.delete("/v1/sessions/my-app.conv:1")
        assert r.status_code == 200 and r.json()["state"] == "closed"
        r = await http.get("/v1/sessions/my-app.conv:1")
        assert r.status_code == 200 and r.json()["state"] == "closed"
        r = await http.post("/v1/sessions/my-app.conv:1/generate", json={"messages": FRANCE})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "session_closed")
        r = await http.delete("/v1/sessions/never-made")
        assert (r.status_code, r.json()["error"]["code"]) == (404, "session_not_found")


async def test_renew_extends_the_lease_with_compare_and_swap(text_server):
    async with client(text_server) as http:
        sid = (await http.post("/v1/sessions", json={"model": MODEL, "ttl_s": 20})).json()["id"]
        r = await http.post(f"/v1/sessions/{sid}/renew", json={"ttl_s": 40, "generation": 1})
        assert r.status_code == 200
        assert r.json()["lease"]["generation"] == 2 and r.json()["lease"]["ttl_s"] == 40
        r = await http.post(f"/v1/sessions/{sid}/renew", json={"generation": 1})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "lease_conflict")
        await http.delete(f"/v1/sessions/{sid}")


async def test_continuation_keeps_the_conversation_in_the_live_request(text_server):
    stage = text_server.runtime.text.generator.stage
    async with client(text_server) as http:
        before = await live_llm_requests(http)
        sid = (await http.post("/v1/sessions", json={"model": MODEL})).json()["id"]
        first = await turn(http, sid, FRANCE)
        assert "Paris" in first["output"]["text"] and first["finish_reason"] == "stop"
        assert await live_llm_requests(http) == before + 1  # the session holds its request (KV)
        fast, rebuilds = stage.fast_paths, stage.rebuilds
        second = await turn(http, sid, GERMANY, model=MODEL)
        assert (stage.fast_paths, stage.rebuilds) == (fast + 1, rebuilds)  # appended, not re-prefilled
        # The same history sent whole to the stateless API answers the same (greedy).
        history = [*FRANCE, {"role": "assistant", "content": first["output"]["text"]}, *GERMANY]
        r = await http.post("/v1/generate", json={"model": MODEL, "messages": history, "stream": False,
                                                  "options": {"max_tokens": 24}})
        assert r.json()["output"]["text"] == second["output"]["text"]
        info = (await http.get(f"/v1/sessions/{sid}", params={"messages": "true"})).json()
        assert info["turns"] == 2 and [m["role"] for m in info["history"]] == [
            "system", "user", "assistant", "user", "assistant"]
        assert info["resident"] is True and info["state"] == "detached"
        await http.delete(f"/v1/sessions/{sid}")
        assert await live_llm_requests(http) == before  # close freed it


async def test_continuation_modes_and_model_checks(text_server):
    async with client(text_server) as http:
        sid = (await http.post("/v1/sessions", json={"model": MODEL})).json()["id"]
        await turn(http, sid, FRANCE)
        r = await http.post(f"/v1/sessions/{sid}/generate", json={"messages": GERMANY, "mode": "branch"})
        assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["param"]) == (
            400, "capability_unsupported", "mode")
        r = await http.post(f"/v1/sessions/{sid}/generate", json={"messages": GERMANY, "model": "gpt-4o"})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "model_mismatch")
        r = await http.post(f"/v1/sessions/{sid}/generate", json={"messages": GERMANY, "adapter": "x"})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "model_mismatch")
        r = await http.post(f"/v1/sessions/{sid}/generate", json={"messages": GERMANY, "mode": "replace",
                                                                  "replace_from": 7})
        assert (r.status_code, r.json()["error"]["param"]) == (400, "replace_from")
        # replace: drop the first exchange and ask something else instead
        out = await turn(http, sid, GERMANY, mode="replace", replace_from=0)
        assert "Berlin" in out["output"]["text"]
        info = (await http.get(f"/v1/sessions/{sid}", params={"messages": "true"})).json()
        assert [m["content"] for m in info["history"]][0] == GERMANY[0]["content"]
        assert len(info["history"]) == 2 and info["messages"] == 2
        await http.delete(f"/v1/sessions/{sid}")


async def test_one_generation_at_a_time_and_abort_keeps_the_session(text_server):
    story = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    async with client(text_server) as http:
        sid = (await http.post("/v1/sessions", json={"model": MODEL})).json()["id"]
        async with http.stream("POST", f"/v1/sessions/{sid}/generate", json={
                "messages": story, "request_id": "sess-story", "options": {"max_tokens": 300}}) as r:
            events = sse_events(r)
            async for _, event, _ in events:
                if event == "text-delta":
                    break
            r2 = await http.post(f"/v1/sessions/{sid}/generate", json={"messages": FRANCE})
            assert (r2.status_code, r2.json()["error"]["code"]) == (
                409, "conversation_already_has_active_response")
            r3 = await http.post("/v1/requests/sess-story/abort")
            assert r3.status_code == 200
            rest = [(e, d) async for _, e, d in events]
        assert rest[-1][0] == "finish" and rest[-1][1]["finish_reason"] == "cancelled"
        info = (await http.get(f"/v1/sessions/{sid}")).json()
        assert info["state"] == "detached" and info["turns"] == 0 and info["messages"] == 0
        out = await turn(http, sid, FRANCE)  # still usable
        assert "Paris" in out["output"]["text"]
        await http.delete(f"/v1/sessions/{sid}")


async def test_expiry_frees_the_live_request_and_answers_410(text_server):
    async with client(text_server) as http:
        before = await live_llm_requests(http)
        sid = (await http.post("/v1/sessions", json={"model": MODEL, "ttl_s": 0.5})).json()["id"]
        await turn(http, sid, FRANCE)
        assert await live_llm_requests(http) == before + 1
        await asyncio.sleep(1.6)  # lease 0.5 s after the turn, then the reaper's 1 s pass
        r = await http.get(f"/v1/sessions/{sid}")
        assert r.status_code == 200 and r.json()["state"] == "expired"
        r = await http.post(f"/v1/sessions/{sid}/generate", json={"messages": FRANCE})
        assert (r.status_code, r.json()["error"]["code"]) == (410, "session_expired")
        r = await http.delete(f"/v1/sessions/{sid}")
        assert (r.status_code, r.json()["error"]["code"]) == (410, "session_expired")
        assert await live_llm_requests(http) == before


async def test_the_resident_cap_evicts_the_least_recently_used(vllm_stage):
    runtime = text_runtime(vllm_stage, max_resident_sessions=1)
    async with BackgroundServer(runtime) as server, client(server) as http:
        a = (await http.post("/v1/sessions", json={"model": MODEL})).json()["id"]
        b = (await http.post("/v1/sessions", json={"model": MODEL})).json()["id"]
        await turn(http, a, FRANCE)
        await turn(http, b, FRANCE)
        metrics = (await http.get("/metrics")).text
        assert metric(metrics, "duplex_app_session_evictions") == 1
        assert metric(metrics, "duplex_app_sessions_resident") == 1
        assert (await http.get(f"/v1/sessions/{a}")).json()["resident"] is False
        out = await turn(http, a, GERMANY)  # evicted, not forgotten: it prefills again
        assert "Berlin" in out["output"]["text"]


async def test_another_instance_refuses_with_the_owner_id(text_server, vllm_stage):
    other = text_runtime(vllm_stage)
    async with BackgroundServer(other) as server_b, client(text_server) as a, client(server_b) as b:
        s = (await a.post("/v1/sessions", json={"model": MODEL})).json()
        owner = s["ref"]["owner_instance_id"]
        assert owner != other.manager.instance_id
        for method, path in (("GET", ""), ("POST", "/generate"), ("POST", "/renew"), ("DELETE", "")):
            r = await b.request(method, f"/v1/sessions/{s['id']}{path}",
                                json={"messages": FRANCE} if method == "POST" else None)
            err = r.json()["error"]
            assert (r.status_code, err["code"], err["owner_instance_id"]) == (421, "wrong_instance", owner)
        # a caller-chosen id carries no owner: the ref's owner header does
        await a.post("/v1/sessions", json={"model": MODEL, "session_id": "chosen-1"})
        r = await b.get("/v1/sessions/chosen-1", headers={"duplex-owner-instance": owner})
        assert (r.status_code, r.json()["error"]["owner_instance_id"]) == (421, owner)
        assert (await a.get("/v1/sessions/chosen-1", headers={"duplex-owner-instance": owner})).status_code == 200
        await a.delete(f"/v1/sessions/{s['id']}")
        await a.delete("/v1/sessions/chosen-1")


async def test_capabilities_advertise_the_text_surfaces(text_server):
    async with client(text_server) as http:
        caps = (await http.get("/v1/capabilities")).json()["text"]
    limits = text_server.runtime.config.limits
    sessions = caps["application_sessions"]
    assert sessions["continuation_modes"] == {"append": True, "replace": True, "branch": False}
    assert sessions["lease"]["max_ttl_s"] == limits.max_session_ttl_s
    assert sessions["max_sessions"] == limits.max_app_sessions
    assert caps["streaming_input"]["modalities"]["text"] is True
    assert caps["streaming_input"]["early_output"] is False
    assert caps["streaming_input"]["max_chunk_bytes"] == limits.max_input_chunk_bytes
    assert caps["streams"]["mutable_fields"] == ["max_tokens", "reasoning_budget"]
    assert caps["streams"]["ttl_s"] == limits.stream_ttl_s
    assert caps["owner_affinity"] == {"required": True, "header": "Duplex-Owner-Instance",
                                      "instance_id": text_server.runtime.manager.instance_id}
    assert "tool-call-delta" in caps["generate"]["events"]
