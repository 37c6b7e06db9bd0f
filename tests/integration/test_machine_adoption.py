"""A machine is lost, its conversations live on: two machines on one Redis
behind ``vllm-duplex edge --adopt`` (issue 32, several machines).

Two ``serve --workers 2`` processes stand in for two machines (``m1w1``,
``m1w2``; ``m2w1``, ``m2w2``), each with ``durability: {store: redis, url}``
naming the same ``redis-server`` (started here). The edge has each machine's
router as the owner of its ids and the other machine's as a ``backup``. m1 is
then killed whole (kill -9 of its supervisor, workers and nginx): its router
refuses connections, so the edge sends m1's ids to m2's router, which sends
an owner it does not have to its pool; a worker there takes the session over
from the store once m1's lease lapsed. The time to resume is printed.
"""

from __future__ import annotations

import time

import pytest
import pytest_asyncio
import websockets
from support.realtime_fixtures import no_leaked_tasks  # noqa: F401
from support.router_fixtures import (Serve, assert_lossless, get_json, kill_machine, open_text,
                                     owner, reply_text, say, scripted_workers)
from vllm_duplex.fleet.redis_server import RedisServer
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

pytestmark = pytest.mark.asyncio(loop_scope="module")

LEASE_S = 1.5
TOKEN = "abcdefghijklmnopqrstuvwx"


def machine_config(name: str, url: str) -> dict:
    config = scripted_workers(2, machine=name, limits={"resume_grace_s": 60})
    config["stages"][1].update(recall=True, token_interval_s=0.02)
    config["durability"] = {"store": "redis", "url": url, "lease_ttl_s": LEASE_S}
    return config


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def machines():
    redis = RedisServer()
    await redis.start()
    started: list[Serve] = []
    try:
        for name in ("m1", "m2"):
            started.append(Serve(machine_config(name, redis.url), "serve", new_session=True)
                           .start(expect_workers=2))
        m1, m2 = started
        started.append(Serve(None, "edge", "--adopt", "--machine", f"m1=127.0.0.1:{m1.port}",
                             "--machine", f"m2=127.0.0.1:{m2.port}").start())
        yield started[2], m1, m2
    finally:
        for s in reversed(started):
            s.stop()
        await redis.stop()


async def test_a_live_owner_on_another_machine_is_named_not_taken_over(machines):
    """A resume that reaches the wrong machine (straight to m2's router) is
    answered by a worker there from the store: the live owner, by name."""
    _, m1, m2 = machines
    c = await open_text(m1.ws)
    await say(c, "my colour is blue")
    c.ws.transport.abort()
    with pytest.raises(RealtimeError) as refused:
        await RealtimeClient.resume(m2.ws, c.session_id, c.resume_token, c.last_seq)
    assert refused.value.code == "wrong_instance"
    assert refused.value.event["error"]["owner_instance_id"] == owner(c)
    # Nothing moved: at its own machine the session is where it was.
    resumed = await c.reconnect()
    assert resumed.owner == owner(c)
    assert reply_text(await say(resumed, "colour?")).endswith("You said before: my colour is blue.")
    await resumed.close()


async def test_a_machine_sends_foreign_owners_to_its_workers_and_refuses_malformed_ids(machines):
    _, _, m2 = machines
    # an owner it does not have: a worker answers from the store (unknown here)
    with pytest.raises(RealtimeError) as unknown:
        await RealtimeClient.resume(m2.ws, f"sess_{TOKEN}.m1w7", "token", 0)
    assert unknown.value.code == "session_not_found"
    status, head, _ = get_json(f"{m2.http}/v1/sessions/sess_{TOKEN}.m1w7")
    assert head.get("Duplex-Owner-Instance", "").startswith("m2w")  # a worker of m2 answered
    # an id with no owner part is still refused by the router itself
    for bad in ("sess_short.m1w1", f"sess_{TOKEN}", f"sess_{TOKEN}.m1_w1"):
        status, head, body = get_json(f"{m2.http}/v1/sessions/{bad}")
        assert status == 404 and body["error"]["code"] == "session_not_found", bad
        assert "Duplex-Owner-Instance" not in head, bad
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(f"{m2.ws}?resume=1&session_id={bad}")
        assert refused.value.response.status_code == 404


async def test_a_machine_killed_its_sessions_resume_on_the_other_through_the_edge(machines):
    edge, m1, m2 = machines
    clients: list[RealtimeClient] = []
    while len(clients) < 4 or not ({"m1", "m2"} <= {owner(c)[:2] for c in clients}):
        assert len(clients) < 12, [owner(c) for c in clients]  # least_conn spreads them
        clients.append(await open_text(edge.ws))
    for i, c in enumerate(clients):
        await say(c, f"my number is {i}")
    lost = [c for c in clients if owner(c).startswith("m1")]
    kept = [c for c in clients if owner(c).startswith("m2")]
    kill_machine(m1)
    # The other machine's sessions never noticed.
    for c in kept:
        n = clients.index(c)
        assert reply_text(await say(c, "still there?")).endswith(
            f"You said before: my number is {n}.")
    for c in lost:
        n = clients.index(c)
        t0 = time.monotonic()
        resumed = await c.reconnect()  # through the edge: m1 refuses, m2 takes it over
        print(f"machine kill -9: {owner(c)}'s session resumed in "
              f"{1000 * (time.monotonic() - t0):.0f} ms on {resumed.owner} "
              f"(lease {LEASE_S} s)")
        assert resumed.owner.startswith("m2w")
        assert resumed.ws.response.headers["Duplex-Owner-Instance"] == resumed.owner
        assert reply_text(await say(resumed, "what is my number?")).endswith(
            f"You said before: my number is {n}.")
        assert_lossless(c, resumed)
        # and again, now naming its new owner (&owner=m2w…): straight to it
        resumed.ws.transport.abort()
        again = await resumed.reconnect()
        assert again.owner == resumed.owner
        assert_lossless(c, resumed, again)
        await again.close()
    for c in kept:
        assert_lossless(c)
        await c.close()
    # New sessions go to the machine that is left; an unknown machine is still refused.
    fresh = await open_text(edge.ws)
    assert owner(fresh).startswith("m2w")
    await fresh.close()
    status, head, body = get_json(f"{edge.http}/v1/sessions/sess_{TOKEN}.m3w1")
    assert status == 404 and body["error"]["code"] == "session_not_found"
    assert "Duplex-Owner-Instance" not in head
    # A lost machine's id nobody stored: refused by a live worker, not by a 503.
    with pytest.raises(RealtimeError) as unknown:
        await RealtimeClient.resume(edge.ws, f"sess_{TOKEN}.m1w1", "token", 0)
    assert unknown.value.code == "session_not_found"
