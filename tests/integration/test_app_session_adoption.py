"""Application sessions outlive their worker (issue 32), over real HTTP and
gRPC against the real engine and a real Redis: two servers (``wa``, ``wb``)
share one ``redis-server`` as the workers of ``serve --workers 2`` do, and
one vLLM engine (the suite's). The owner's death is what its supervisor
tells the store when the process is gone (``mark_dead`` of its holder); the
dead owner is then not asked again, as the router would not send it
anything -- except to check that it is fenced (it still runs here).

* A session whose owner is gone is taken over by the worker a request
  reaches: its history, turns and lease (generation included) as the client
  last got them; its next turn prefills the same context (the same prompt
  tokens as the same conversation on a session that never moved).
* The old owner, which still holds a copy, is fenced at its next lease
  renewal: it drops the session and answers ``wrong_instance`` naming the
  new owner at once.
* Closed sessions stay closed elsewhere, expired ones expired, another
  key's are not found, chosen ids are unique across the workers.
(The real processes, ``serve --workers 2`` with kill -9:
``test_worker_adoption_vllm.py``, a soak test.)
"""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx
import pytest
import pytest_asyncio
from support.grpc_fixtures import grpc_client
from support.text_fixtures import INSTRUCTIONS, KEYS, MODEL, auth, durable_text_runtime
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.fleet.redis_server import RedisServer
from vllm_duplex.realtime.client.http import DuplexAPIError, DuplexHttpClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from vllm_duplex.realtime.wire.openengine.v1 import types_pb2 as t

pytestmark = pytest.mark.asyncio(loop_scope="session")

LEASE_S = 1.0
ADA = [{"role": "user", "content": "My name is Ada and I live in Paris."}]
CITY = [{"role": "user", "content": "Which city do I live in?"}]
OPTIONS = {"max_tokens": 12}


def runtime(vllm_stage, url: str, instance_id: str, **limits):
    return durable_text_runtime(vllm_stage, url, instance_id, lease_ttl_s=LEASE_S, **limits)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def workers(vllm_stage):
    redis = RedisServer()
    await redis.start()
    try:
        async with BackgroundServer(runtime(vllm_stage, redis.url, "wa"), grpc_port=0) as a, \
                BackgroundServer(runtime(vllm_stage, redis.url, "wb"), grpc_port=0) as b, \
                BackgroundServer(runtime(vllm_stage, redis.url, "wc", max_app_sessions=1)) as c:
            yield a, b, c
    finally:
        await redis.stop()


@pytest.fixture
def tag() -> str:
    """Ids a client chooses stay taken in the store: each test run chooses new ones."""
    return secrets.token_hex(4)


async def dies(server) -> None:
    """What the supervisor tells the store when the worker's process is gone."""
    durability = server.runtime.durability
    await durability.store.mark_dead(durability.holder)


def http(server, key: str = KEYS[0]) -> DuplexHttpClient:
    return DuplexHttpClient(server.http_url, key, timeout=120)


async def test_a_session_whose_owner_died_goes_on_where_the_request_lands(workers):
    a, b, _ = workers
    async with http(a) as on_a, http(b) as on_b:
        moved = await on_a.open_session(MODEL, instructions=INSTRUCTIONS, ttl_s=600)
        assert moved.owner_instance_id == "wa" and moved.session_id.endswith(".wa")
        await moved.ask(ADA, options=OPTIONS)
        lease = (await moved.renew(ttl_s=900, generation=1))["lease"]
        assert lease["generation"] == 2
        told = await moved.info(messages=True)
        # The same conversation on a session that never moves: the control.
        still = await on_b.open_session(MODEL, messages=told["history"])

        await dies(a)
        t0 = time.monotonic()
        there = on_b.session(moved.session_id, "wa")  # what the router sends to wa's backup
        keeper = b.runtime.text.sessions.keeper
        adopted = keeper.adopted
        # Two requests at once: one takeover, both served.
        info, again = await asyncio.gather(there.info(messages=True),
                                           on_b.session(moved.session_id, "wa").info())
        took_s = time.monotonic() - t0
        assert keeper.adopted == adopted + 1 and again["turns"] == 1
        assert info["ref"]["owner_instance_id"] == "wb" and there.owner_instance_id == "wb"
        assert info["history"] == told["history"] and info["turns"] == 1
        assert info["lease"]["ttl_s"] == 900 and info["lease"]["generation"] == 2
        assert 800 < info["lease"]["expires_in_s"] <= 900 and info["state"] == "detached"
        # the lease's compare-and-swap goes on where it was
        with pytest.raises(DuplexAPIError) as stale:
            await there.renew(generation=1)
        assert stale.value.code == "lease_conflict"
        assert (await there.renew(generation=2))["lease"]["generation"] == 3

        # The next turn sees the whole conversation: the prompt the model got
        # is the control's, token for token.
        moved_turn = await there.generate(CITY, options=OPTIONS).collect()
        control = await still.generate(CITY, options=OPTIONS).collect()
        assert moved_turn.finish_reason == control.finish_reason
        prompt = [r.finish["usage"]["prompt_tokens"] for r in (moved_turn, control)]
        assert prompt[0] == prompt[1]
        assert moved_turn.text == control.text  # greedy, the same context
        assert (await there.info())["turns"] == 2
        print(f"\ntaken over in {took_s * 1000:.0f} ms (lease {LEASE_S} s, owner marked dead)")
        await still.close()
        await there.close()


async def test_the_dead_owner_is_fenced_and_names_the_new_one(workers):
    a, b, _ = workers
    async with http(a) as on_a, http(b) as on_b:
        s = await on_a.open_session(MODEL, instructions=INSTRUCTIONS)
        await dies(a)
        await on_b.session(s.session_id, "wa").info()  # taken over by wb
        # wa still runs (a paused process that woke up): its next renewal is
        # refused for the generation, and it drops its copy.
        held_by_a = a.runtime.text.sessions.manager.held
        for _ in range(50):
            if held_by_a(s.session_id) is None:
                break
            await asyncio.sleep(0.1)
        assert held_by_a(s.session_id) is None  # dropped, within a lease
        assert a.runtime.text.sessions.keeper.moved >= 1
        stale = on_a.session(s.session_id, "wa")
        t0 = time.monotonic()
        with pytest.raises(DuplexAPIError) as refused:
            await stale.client._json("GET", f"/v1/sessions/{s.session_id}")
        assert refused.value.code == "wrong_instance" and refused.value.status == 421
        assert refused.value.owner_instance_id == "wb"
        assert time.monotonic() - t0 < 0.5  # it knows where it went: no lease to wait for
        await on_b.session(s.session_id, "wb").close()


async def test_a_session_opened_over_grpc_is_taken_over_over_grpc(workers, tag):
    a, b, _ = workers
    async with grpc_client(a) as ga, grpc_client(b) as gb:
        s = await ga.open_session(MODEL, session_id=f"grpc-moves-{tag}", instructions=INSTRUCTIONS)
        first = await ga.generate(messages=ADA, session=s.ref, max_tokens=12)
        await dies(a)
        ref = t.GenerationSessionRef(session_id=f"grpc-moves-{tag}", owner_instance_id="wa")
        got = await gb.get_session(ref, history=True)
        assert got.ref.owner_instance_id == "wb" and got.turns == 1
        assert [m.role for m in got.history] == ["system", "user", "assistant"]
        assert got.history[2].content == first.text
        again = await gb.generate(messages=CITY, session=ref, max_tokens=12)
        assert again.finish_reason in ("stop", "length")
        assert (await gb.get_session(ref)).turns == 2
        await gb.close_session(ref)


async def test_closed_expired_foreign_and_duplicate_ids_stay_what_they_are(workers, tag):
    a, b, _ = workers
    async with http(a) as on_a, http(b) as on_b, http(b, KEYS[1]) as bob_on_b:
        closed = await on_a.open_session(MODEL)
        await closed.close()
        short = await on_a.open_session(MODEL, ttl_s=1)
        foreign = await on_a.open_session(MODEL)
        await on_a.open_session(MODEL, session_id=f"chosen-{tag}")
        await asyncio.sleep(1.2)
        await dies(a)
        for sid, client, code in ((closed.session_id, on_b, "session_not_found"),
                                  (short.session_id, on_b, "session_expired"),
                                  (foreign.session_id, bob_on_b, "session_not_found")):
            with pytest.raises(DuplexAPIError) as err:
                await client.session(sid, "wa").info()
            assert err.value.code == code, sid
        # the owner's key still has it (the foreign key's try took nothing)
        assert (await on_b.session(foreign.session_id, "wa").info())["state"] == "detached"
        # an id chosen on one worker is taken on every worker
        async with httpx.AsyncClient(base_url=b.http_url, headers=auth()) as raw:
            r = await raw.post("/v1/sessions", json={"model": MODEL,
                                                     "session_id": f"chosen-{tag}"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "duplicate_id"
        assert (await on_b.session(f"chosen-{tag}", "wa").info())["ref"][
            "owner_instance_id"] == "wb"
        await on_b.session(f"chosen-{tag}", "wb").close()
        await on_b.session(foreign.session_id, "wb").close()


async def test_a_chosen_id_refused_for_a_full_worker_is_free_to_open_elsewhere(workers, tag):
    """The id is claimed across the workers before the session is admitted;
    a worker that then refuses it (full) lets the claim go, so the client's
    retry with the same id, here or on another worker, is not a duplicate."""
    _, b, full = workers
    async with http(full) as on_full, http(b) as on_b:
        first = await on_full.open_session(MODEL)
        with pytest.raises(DuplexAPIError) as refused:
            await on_full.open_session(MODEL, session_id=f"retry-me-{tag}")
        assert refused.value.code == "resource_exhausted"
        # an id another worker holds right now is a duplicate (its claim's lease is live)
        await on_b.open_session(MODEL, session_id=f"held-by-b-{tag}")
        with pytest.raises(DuplexAPIError) as taken:
            await on_full.open_session(MODEL, session_id=f"held-by-b-{tag}")
        assert taken.value.code == "duplicate_id"
        retried = await on_b.open_session(MODEL, session_id=f"retry-me-{tag}")
        assert retried.owner_instance_id == "wb"
        await retried.close()
        await first.close()
        await on_b.session(f"held-by-b-{tag}", "wb").close()
