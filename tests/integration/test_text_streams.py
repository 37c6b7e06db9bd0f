"""Resumable streams and mid-generation control over real HTTP against the
real engine: replay from a cursor then follow live, lookup,
idempotent DELETE that stops the generation, expiry, control at a reported
event boundary, per-key ownership."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from support.text_fixtures import FRANCE, KEYS, MODEL, auth, client, sse_events  # noqa: F401
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")

STORY = [{"role": "user", "content": "Tell me a long story about a dragon who learns to fly."}]


class Reader:
    """Reads a streaming SSE response in parts (an httpx stream is read once)."""

    def __init__(self, response: httpx.Response) -> None:
        self.events = sse_events(response)

    async def take(self, limit: int | None = None) -> list[tuple[int, str, dict]]:
        out = []
        if limit == 0:
            return out
        async for seq, event, data in self.events:
            out.append((seq, event, data))
            if limit is not None and len(out) == limit:
                break
        return out


async def read(response: httpx.Response, limit: int | None = None) -> list[tuple[int, str, dict]]:
    return await Reader(response).take(limit)


async def replay(http: httpx.AsyncClient, stream_id: str, from_seq: int = 1) -> list[tuple[int, str, dict]]:
    async with http.stream("GET", f"/v1/streams/{stream_id}", params={"from": from_seq}) as r:
        assert r.status_code == 200, await r.aread()
        return await read(r)


async def status_of(http: httpx.AsyncClient, *ids: str) -> dict[str, str]:
    r = await http.post("/v1/streams/lookup", json={"stream_ids": list(ids)})
    assert r.status_code == 200
    return {d["stream_id"]: d["status"] for d in r.json()["data"]}


async def test_a_disconnected_client_resumes_without_loss_or_duplicates(text_server):
    body = {"model": MODEL, "messages": STORY, "stream_id": "resume-1", "options": {"max_tokens": 40}}
    async with client(text_server) as http:
        async with http.stream("POST", "/v1/generate", json=body) as r:
            assert r.headers["x-stream-id"] == "resume-1"
            first = await read(r, limit=5)  # then the client "disconnects"
        assert [s for s, _, _ in first] == [1, 2, 3, 4, 5]
        # the generation went on without us; resume after the last event we saw
        assert (await status_of(http, "resume-1"))["resume-1"] in ("active", "completed")
        rest = await replay(http, "resume-1", from_seq=6)
        # Last-Event-ID works as the cursor too (the EventSource way)
        async with http.stream("GET", "/v1/streams/resume-1",
                               headers={"last-event-id": "5"}) as r:
            again = await read(r)
        whole = await replay(http, "resume-1", from_seq=1)
    assert again == rest
    joined = first + rest
    assert joined == whole
    assert [s for s, _, _ in joined] == list(range(1, len(joined) + 1))  # no gap, no duplicate
    assert all(data["type"] == event for _, event, data in joined)  # replayed as rendered live
    assert [e for _, e, _ in joined].count("finish") == 1 and joined[-1][1] == "finish"
    assert joined[-1][2]["usage"]["completion_tokens"] == sum(1 for _, e, _ in joined if e == "text-delta") \
        or joined[-1][2]["usage"]["completion_tokens"] >= 1


async def test_lookup_answers_only_the_named_ids_of_the_caller(text_server):
    async with client(text_server) as alice, client(text_server, KEYS[1]) as bob:
        r = await alice.post("/v1/generate", json={"model": MODEL, "messages": FRANCE, "stream": False,
                                                    "stream_id": "lookup-1", "options": {"max_tokens": 8}})
        assert r.status_code == 200 and r.json()["stream_id"] == "lookup-1"
        r = await alice.post("/v1/streams/lookup", json={"stream_ids": ["lookup-1", "never-made"]})
        data = r.json()["data"]
        assert [d["stream_id"] for d in data] == ["lookup-1", "never-made"]  # nothing else listed
        assert data[0]["status"] == "completed" and data[0]["first_seq"] == 1 and data[0]["head_seq"] >= 2
        assert data[1]["status"] == "unknown"
        assert await status_of(bob, "lookup-1") == {"lookup-1": "unknown"}
        for method, path in (("GET", "/v1/streams/lookup-1"), ("DELETE", "/v1/streams/lookup-1"),
                             ("POST", "/v1/streams/lookup-1/control")):
            r = await bob.request(method, path, json={"max_tokens": 4} if method == "POST" else None)
            assert (r.status_code, r.json()["error"]["code"]) == (404, "stream_not_found")
        r = await alice.get("/v1/streams/lookup-1", params={"from": 999})
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_value")
        # a stream id is unique while retained
        r = await alice.post("/v1/generate", json={"model": MODEL, "messages": FRANCE,
                                                    "stream_id": "lookup-1"})
        assert (r.status_code, r.json()["error"]["param"]) == (409, "stream_id")
        assert r.json()["error"]["code"] == "duplicate_id"


async def test_delete_is_idempotent_and_stops_the_generation(text_server):
    text = text_server.runtime.text
    async with client(text_server) as http:
        async with http.stream("POST", "/v1/generate", json={
                "model": MODEL, "messages": STORY, "stream_id": "del-1",
                "options": {"max_tokens": 400}}) as r:
            await read(r, limit=2)
        assert text.generator.active_requests == 1  # still generating for nobody
        r = await http.delete("/v1/streams/del-1")
        assert r.status_code == 200 and r.json()["status_before"] == "active"
        assert text.generator.active_requests == 0  # DELETE stopped it
        r = await http.delete("/v1/streams/del-1")
        assert r.status_code == 200 and r.json()["status_before"] == "deleted"
        assert await status_of(http, "del-1") == {"del-1": "deleted"}
        r = await http.get("/v1/streams/del-1")
        assert r.status_code == 404
        r = await http.delete("/v1/streams/never-made")
        assert (r.status_code, r.json()["error"]["code"]) == (404, "stream_not_found")


async def test_completed_streams_expire_after_their_ttl(text_server):
    async with client(text_server) as http:
        r = await http.post("/v1/generate", json={"model": MODEL, "messages": FRANCE, "stream": False,
                                                   "stream_id": "ttl-1", "options": {"max_tokens": 4}})
        assert r.status_code == 200
        assert await status_of(http, "ttl-1") == {"ttl-1": "completed"}
        await asyncio.sleep(text_server.runtime.config.limits.stream_ttl_s + 0.2)  # the fixture's TTL: 2 s
        assert await status_of(http, "ttl-1") == {"ttl-1": "expired"}
        r = await http.get("/v1/streams/ttl-1")
        assert (r.status_code, r.json()["error"]["code"]) == (410, "stream_expired")


async def test_control_changes_max_tokens_at_a_reported_boundary(text_server):
    async with client(text_server) as http:
        async with http.stream("POST", "/v1/generate", json={
                "model": MODEL, "messages": STORY, "stream_id": "ctl-1",
                "options": {"max_tokens": 16}}) as r:
            reader = Reader(r)
            head = await reader.take(1)
            r2 = await http.post("/v1/streams/ctl-1/control", json={"max_tokens": 48})
            assert r2.status_code == 200, r2.json()
            boundary = r2.json()["applied_at_seq"]
            assert r2.json()["applied"] == {"max_tokens": 48}
            tail = await reader.take()
        events = head + tail
        control = next(ev for ev in events if ev[1] == "control")
        assert control[0] == boundary and control[2]["applied"] == {"max_tokens": 48}
        finish = events[-1][2]
        assert finish["finish_reason"] == "length" and finish["usage"]["completion_tokens"] == 48

        # lowering below what is already out ends it at that boundary
        async with http.stream("POST", "/v1/generate", json={
                "model": MODEL, "messages": STORY, "stream_id": "ctl-2",
                "options": {"max_tokens": 300}}) as r:
            reader = Reader(r)
            head = await reader.take(4)
            r2 = await http.post("/v1/streams/ctl-2/control", json={"max_tokens": 1})
            tail = await reader.take()
        events = head + tail
        control = next(ev for ev in events if ev[1] == "control")
        assert control[0] == r2.json()["applied_at_seq"]
        assert events[-1][1] == "finish" and events[-1][2]["finish_reason"] == "length"
        assert events[-1][2]["usage"]["completion_tokens"] == control[2]["output_tokens"]

        r = await http.post("/v1/streams/ctl-2/control", json={"max_tokens": 9})
        assert (r.status_code, r.json()["error"]["code"]) == (409, "generation_finished")


@pytest.mark.parametrize("body, code, param", [
    ({"temperature": 1.0}, "immutable_field", "temperature"),
    ({"messages": []}, "immutable_field", "messages"),
    ({"max_tokens": -1}, "invalid_value", "max_tokens"),
    ({"max_tokens": "many"}, "invalid_value", "max_tokens"),
    ({}, "invalid_value", "body"),
])
async def test_control_refuses_immutable_and_invalid_fields(text_server, body, code, param):
    stream_id = f"ctl-bad-{len(str(body))}-{code}-{param}"
    async with client(text_server) as http:
        async with http.stream("POST", "/v1/generate", json={
                "model": MODEL, "messages": STORY, "stream_id": stream_id,
                "options": {"max_tokens": 300}}) as r:
            assert r.status_code == 200
            await read(r, limit=1)
            r2 = await http.post(f"/v1/streams/{stream_id}/control", json=body)
            await http.delete(f"/v1/streams/{stream_id}")
    assert r2.status_code == 400
    assert (r2.json()["error"]["code"], r2.json()["error"]["param"]) == (code, param)
