"""``serve --workers 2`` behind the real nginx with a voice ceiling per worker:
a new session goes to a worker with room -- a full worker's 429 sends the
router on to the next -- and is refused (429, ``at_capacity``, ``Retry-After``)
only when every worker is full.

Each worker holds ``limits.max_voice_sessions: 1``. A session dropped without
``session.close`` waits for its resume on its worker: it holds that worker's
seat while it has no connection, so nginx's ``least_conn`` sees both workers
alike and sends new sessions to the full one as often as to the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
import websockets
from support.realtime_fixtures import no_leaked_tasks  # noqa: F401
from support.router_fixtures import Serve, owner, scripted_workers, wait_until
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def router():
    serve = Serve(scripted_workers(2, limits={"max_voice_sessions": 1, "resume_grace_s": 60}),
                  "serve")
    serve.start(expect_workers=2)
    yield serve
    assert serve.stop() == 0, serve.output()


async def end(client: RealtimeClient) -> None:
    with contextlib.suppress(Exception):
        await client.send({"type": "session.close"})
        await client.wait_for("session.closed", timeout=10)
    await client.ws.close()


def room(router, worker: str) -> int:
    return router.health()["workers"][worker]["health"]["capacity"]["room"]


async def test_a_new_session_finds_the_worker_with_room_and_is_refused_when_all_are_full(router):
    parked = await RealtimeClient.connect(router.ws)
    full = owner(parked)
    other = "w2" if full == "w1" else "w1"
    parked.ws.transport.abort()  # detached: it keeps its seat on its worker, with no connection
    await wait_until(lambda: room(router, full) == 0
                     and router.health()["workers"][full]["health"]["sessions"] == 1)
    for _ in range(6):  # least_conn ties: nginx picks the full worker too; its 429 moves on
        client = await RealtimeClient.connect(router.ws)
        assert owner(client) == other
        await end(client)
        await wait_until(lambda: room(router, other) == 1)

    taken = await RealtimeClient.connect(router.ws)  # the last seat
    assert owner(taken) == other
    try:
        with pytest.raises(RealtimeError) as refused:
            await RealtimeClient.connect(router.ws)
        assert refused.value.code == "at_capacity" and refused.value.retry_after_s == 5
        with pytest.raises(websockets.InvalidStatus) as raw:
            async with websockets.connect(router.ws):
                pass
        assert raw.value.response.status_code == 429
        assert raw.value.response.headers["Retry-After"] == "5"
        assert json.loads(bytes(raw.value.response.body))["error"]["code"] == "at_capacity"
        resumed = await parked.reconnect()  # never refused: its seat is its own
        assert owner(resumed) == full
        await end(resumed)
    finally:
        await end(taken)
    await wait_until(lambda: room(router, "w1") == room(router, "w2") == 1)
    await asyncio.sleep(0)
