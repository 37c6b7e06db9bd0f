"""Several machines behind an edge router, on loopback (issue 13, item 3).

Two ``serve`` instances on different ports stand in for two machines:
``m1`` a single process (owner ``m1w1``), ``m2`` two workers behind its own
nginx (``m2w1``, ``m2w2``). ``vllm-duplex edge`` sends owner ``m<k>w<n>`` to
machine ``m<k>`` and new sessions to the machine with the fewest
connections; each machine's router then finds the worker.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import websockets
from support.realtime_fixtures import no_leaked_tasks  # noqa: F401
from support.router_fixtures import Serve, get_json, owner, scripted_workers
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

TOKEN = "abcdefghijklmnopqrstuvwx"


@pytest.fixture(scope="module")
def edge():
    limits = {"resume_grace_s": 30}
    m1 = Serve(scripted_workers(1, machine="m1", limits=limits), "serve").start()
    m2 = None
    try:
        m2 = Serve(scripted_workers(2, machine="m2", limits=limits), "serve").start(
            expect_workers=2)
        front = Serve(None, "edge", "--machine", f"m1=127.0.0.1:{m1.port}",
                      "--machine", f"m2=127.0.0.1:{m2.port}").start()
    except BaseException:
        for s in (m1, m2):
            if s is not None:
                s.stop()
        raise
    yield front, m1, m2
    for s, clean in ((front, 0), (m2, 0), (m1, -15)):
        assert s.stop() == clean, s.output()


async def end_all(clients: list[RealtimeClient]) -> None:
    for c in clients:
        with contextlib.suppress(Exception):
            await c.send({"type": "session.close"})
            async with asyncio.timeout(10):
                while True:
                    await c.recv()
        await c.ws.close()


async def test_sessions_open_on_both_machines_and_resume_through_the_edge(edge):
    front, _, _ = edge
    clients = [await RealtimeClient.connect(front.ws) for _ in range(4)]
    owners = {owner(c) for c in clients}
    assert "m1w1" in owners and owners & {"m2w1", "m2w2"}, owners
    for c in clients:
        assert c.ws.response.headers["Duplex-Owner-Instance"] == owner(c)
        await c.close(end_session=False)
    resumed = []
    for c in clients:  # edge: m<k> -> machine k; machine router: m<k>w<n> -> worker n
        rt = await c.reconnect()
        assert rt.session_id == c.session_id
        assert rt.ws.response.headers["Duplex-Owner-Instance"] == owner(c)
        resumed.append(rt)
    await end_all(resumed)


@pytest.mark.parametrize("owner_id", ["m2w1", "m2w2", "m1w1"])
async def test_a_session_id_reaches_its_machine_and_worker(edge, owner_id):
    front, _, _ = edge
    status, head, body = get_json(f"{front.http}/v1/sessions/sess_{TOKEN}.{owner_id}")
    assert head.get("Duplex-Owner-Instance") == owner_id
    assert body["error"]["code"] == "capability_unsupported"  # that worker answered


@pytest.mark.parametrize("owner_id", ["m3w1", "m2", "w1"])
async def test_an_unknown_machine_is_refused_at_the_edge(edge, owner_id):
    front, _, _ = edge
    status, head, body = get_json(f"{front.http}/v1/sessions/sess_{TOKEN}.{owner_id}")
    assert status == 404 and "Duplex-Owner-Instance" not in head
    assert body["error"]["code"] == "session_not_found"
    with pytest.raises(websockets.InvalidStatus) as refused:
        await websockets.connect(f"{front.ws}?resume=1&session_id=sess_{TOKEN}.{owner_id}")
    assert refused.value.response.status_code == 404


async def test_a_machine_refuses_a_worker_it_does_not_have(edge):
    front, _, m2 = edge
    status, head, body = get_json(f"{front.http}/v1/sessions/sess_{TOKEN}.m2w7")
    assert status == 404 and body["error"]["code"] == "session_not_found"
    assert "Duplex-Owner-Instance" not in head  # refused by m2's router, not served
