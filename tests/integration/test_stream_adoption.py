"""Resumable streams outlive their worker (issue 32), over real HTTP against
the real engine and a real Redis: two servers (``wa``, ``wb``) share one
``redis-server`` as the workers of ``serve --workers 2`` do, and one vLLM
engine (the suite's). The owner's death is what its supervisor tells the
store (``mark_dead`` of its holder); the dead owner still runs here, as a
stopped process that woke up would.

* A client following a stream on ``wa`` loses it mid-generation when ``wa``
  dies: ``GET ?from=<last + 1>`` on ``wb`` gets exactly the events after its
  cursor (no gap, no duplicate), then a terminal ``error`` (``engine_dead``,
  ``reason: owner_lost``): the generation died with its worker.
* A completed stream replays whole on ``wb``; a deleted one stays gone,
  another key's stays unknown to the caller.
(The same on a shared in-memory store: tests/unit/test_durable_streams.py.)
"""

from __future__ import annotations

import asyncio
import secrets

import httpx
import pytest
import pytest_asyncio
from support.text_fixtures import FRANCE, KEYS, MODEL, client, durable_text_runtime, sse_events
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.fleet.redis_server import RedisServer
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

STORY = [{"role": "user", "content": "Tell me a long story about a dragon who learns to fly."}]


@pytest.fixture
def tag() -> str:
    """Stream ids stay taken in the store: each test run chooses new ones."""
    return secrets.token_hex(4)


def runtime(vllm_stage, url: str, instance_id: str):
    return durable_text_runtime(vllm_stage, url, instance_id)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def workers(vllm_stage):
    redis = RedisServer()
    await redis.start()
    try:
        async with BackgroundServer(runtime(vllm_stage, redis.url, "wa")) as a, \
                BackgroundServer(runtime(vllm_stage, redis.url, "wb")) as b:
            yield a, b
    finally:
        await redis.stop()


async def dies(server) -> None:
    """What the supervisor tells the store when the worker's process is gone."""
    durability = server.runtime.durability
    await durability.store.mark_dead(durability.holder)


async def read(response: httpx.Response, limit: int | None = None) -> list[tuple[int, str, dict]]:
    out = []
    async for seq, event, data in sse_events(response):
        out.append((seq, event, data))
        if len(out) == limit:
            break
    return out


async def replay(http: httpx.AsyncClient, stream_id: str, **params) -> list[tuple[int, str, dict]]:
    async with http.stream("GET", f"/v1/streams/{stream_id}", params=params) as r:
        assert r.status_code == 200, await r.aread()
        return await read(r)


async def generated(http: httpx.AsyncClient, stream_id: str, messages, limit: int | None = None,
                    **options) -> list[tuple[int, str, dict]]:
    body = {"model": MODEL, "messages": messages, "stream_id": stream_id, "options": options}
    async with http.stream("POST", "/v1/generate", json=body) as r:
        assert r.status_code == 200, await r.aread()
        return await read(r, limit)


async def test_a_stream_cut_by_its_workers_death_resumes_elsewhere_then_ends_in_error(workers, tag):
    a, b = workers
    async with client(a) as on_a, client(b) as on_b:
        # A long generation; the client sees 5 events, then its connection drops.
        seen = await generated(on_a, f"dur-live-{tag}", STORY, limit=5, max_tokens=400,
                               min_tokens=400)
        assert [s for s, _, _ in seen] == [1, 2, 3, 4, 5]
        await dies(a)  # mid-generation
        rest = await replay(on_b, f"dur-live-{tag}", **{"from": 6})  # what wa's backup gets
        assert [s for s, _, _ in rest] == list(range(6, 6 + len(rest)))  # no gap, no duplicate
        assert [e for _, e, _ in rest].count("error") == 1 and rest[-1][1] == "error"
        assert "finish" not in [e for _, e, _ in rest]
        error = rest[-1][2]["error"]
        assert error["code"] == "engine_dead" and error["reason"] == "owner_lost"
        assert error["owner_instance_id"] == "wa"
        # The whole stream on wb begins as the client saw it on wa; Last-Event-ID works too.
        assert (await replay(on_b, f"dur-live-{tag}"))[:5] == seen
        async with on_b.stream("GET", f"/v1/streams/dur-live-{tag}",
                               headers={"last-event-id": "5"}) as r:
            assert await read(r) == rest
        found = (await on_b.post("/v1/streams/lookup",
                                 json={"stream_ids": [f"dur-live-{tag}"]})).json()
        assert found["data"] == [{"stream_id": f"dur-live-{tag}", "status": "completed",
                                  "first_seq": 1, "head_seq": rest[-1][0]}]
        # wa, still running, is fenced at its next write: it stops the generation,
        # drops its copy and names the new owner.
        held_by_a = a.runtime.text.streams.held
        for _ in range(100):
            if not held_by_a(f"dur-live-{tag}"):
                break
            await asyncio.sleep(0.05)
        assert not held_by_a(f"dur-live-{tag}")  # dropped, within a lease
        stale = await on_a.get(f"/v1/streams/dur-live-{tag}")
        assert stale.status_code == 421
        assert stale.json()["error"]["owner_instance_id"] == "wb"


async def test_a_completed_stream_replays_whole_elsewhere_a_deleted_one_stays_gone(workers, tag):
    a, b = workers
    async with client(a) as on_a, client(b) as on_b, client(b, KEYS[1]) as bob_on_b:
        done = await generated(on_a, f"dur-done-{tag}", FRANCE, max_tokens=12)
        assert done[-1][1] == "finish"
        await generated(on_a, f"dur-gone-{tag}", FRANCE, max_tokens=4)
        assert (await on_a.delete(f"/v1/streams/dur-gone-{tag}")).status_code == 200
        await dies(a)
        # Another key: unknown to it, and not taken over for it.
        assert (await bob_on_b.get(f"/v1/streams/dur-done-{tag}")).status_code == 404
        r = await on_b.post("/v1/streams/lookup", json={"stream_ids": [
            f"dur-done-{tag}", f"dur-gone-{tag}", f"dur-never-{tag}", f"dur-done-{tag}"]})
        assert r.json()["data"] == [
            {"stream_id": f"dur-done-{tag}", "status": "completed", "first_seq": 1,
             "head_seq": len(done)},
            {"stream_id": f"dur-gone-{tag}", "status": "unknown"},
            {"stream_id": f"dur-never-{tag}", "status": "unknown"}]
        assert await replay(on_b, f"dur-done-{tag}") == done  # as it was, event for event
        gone = await on_b.get(f"/v1/streams/dur-gone-{tag}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "stream_not_found"
        # wa, fenced at its next lease renewal, drops its copy; deleted on wb, the
        # stream is dropped from the store, so wa cannot bring it back.
        for _ in range(100):
            if f"dur-done-{tag}" not in a.runtime.text.streams._live:
                break
            await asyncio.sleep(0.05)
        assert f"dur-done-{tag}" not in a.runtime.text.streams._live
        assert (await on_b.delete(f"/v1/streams/dur-done-{tag}")).status_code == 200
        # The drop reaches the store behind the DELETE's answer (the writer's
        # next batch; until then wa would name wb): once it has, wa says gone.
        store = b.runtime.durability.store
        for _ in range(100):
            if await store.load(f"stream:dur-done-{tag}") is None:
                break
            await asyncio.sleep(0.05)
        assert await store.load(f"stream:dur-done-{tag}") is None
        assert (await on_a.get(f"/v1/streams/dur-done-{tag}")).status_code == 404
