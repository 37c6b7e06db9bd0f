"""A worker dies, its conversations live on (issue 32): ``serve --workers 2``
with ``durability: store: redis`` -- the real supervisor, nginx, private
redis-server and worker processes, killed with signals.

What a caller notices, per fault: its session resumes (through the router,
on another worker), it misses no event and gets none twice (the seqs it
holds are exactly 1..head), and a follow-up that needs the earlier turn is
answered with it (the scripted LLM's ``recall`` names the user's turn before
the last). A reply cut off by the crash ends ``incomplete`` (``owner_lost``),
kept as far as it was sent. The time to resume is printed, not asserted.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from support.router_fixtures import (Serve, assert_lossless, child_pid, get_json, open_text,
                                     owner, reply_text, say, scripted_workers, wait_until)

pytestmark = pytest.mark.asyncio(loop_scope="module")

LEASE_S = 1.5


@pytest.fixture(scope="module")
def fleet():
    config = scripted_workers(2, limits={"resume_grace_s": 60})
    # "long story": a reply slow enough (0.3 s a token) to be cut by a kill under any load
    config["stages"][1].update(recall=True, token_interval_s=0.02, slow_on="long story",
                               slow_interval_s=0.3)
    config["durability"] = {"store": "redis", "lease_ttl_s": LEASE_S}
    serve = Serve(config, "serve")
    serve.start(expect_workers=2)
    yield serve
    assert serve.stop() == 0, serve.output()


def worker(fleet, wid: str) -> dict:
    return fleet.health()["workers"][wid]


def reseeded(fleet, wid: str) -> int:
    """How many sessions worker ``wid`` has written whole into an emptied store."""
    return (worker(fleet, wid).get("health") or {}).get("durability", {}).get("reseeded", 0)


async def workers_up(fleet) -> None:
    await wait_until(lambda: Serve.workers_up(fleet.health()) == 2, timeout=60)


async def test_kill_9_an_idle_worker_its_sessions_resume_elsewhere_with_their_context(fleet):
    await workers_up(fleet)
    clients = [await open_text(fleet.ws) for _ in range(4)]
    for i, c in enumerate(clients):
        await say(c, f"my number is {i}")
    victim = owner(clients[0])
    mine = [c for c in clients if owner(c) == victim]
    others = [c for c in clients if owner(c) != victim]
    os.kill(worker(fleet, victim)["pid"], signal.SIGKILL)
    # The other worker's sessions are untouched while that one is down.
    for c in others:
        assert "You said before: my number is" in reply_text(await say(c, "still there?"))
    for c in mine:
        t0 = time.monotonic()
        resumed = await c.reconnect()
        print(f"idle kill -9: resumed in {1000 * (time.monotonic() - t0):.0f} ms "
              f"on {resumed.owner}")
        # on the other worker, or on the victim's restarted process (same id)
        n = clients.index(c)
        answer = reply_text(await say(resumed, "what is my number?"))
        assert answer.endswith(f"You said before: my number is {n}.")
        assert_lossless(c, resumed)
        await resumed.close()
    # Each was adopted from the store by a live process (the dead one kept nothing).
    adopted = sum((w.get("health") or {}).get("durability", {}).get("adopted", 0)
                  for w in fleet.health()["workers"].values())
    assert adopted >= len(mine)
    for c in others:
        await c.close()


async def test_kill_9_mid_reply_the_reply_ends_incomplete_as_far_as_it_was_sent(fleet):
    await workers_up(fleet)
    c = await open_text(fleet.ws)
    await say(c, "remember the word falcon")
    victim = owner(c)
    await say(c, "tell me a long story", wait=False)
    await c.wait_for("response.output_text.delta", timeout=10)
    os.kill(worker(fleet, victim)["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    resumed = await c.reconnect()
    done = (await resumed.wait_for("response.done", timeout=10))["response"]
    print(f"mid-reply kill -9: resumed in {1000 * (time.monotonic() - t0):.0f} ms")
    assert done["status"] == "incomplete"
    assert done["status_details"]["reason"] == "owner_lost"
    # Kept as far as the client was sent it (the deltas it got, and the ones
    # journaled but not yet read when the socket dropped, replayed now).
    got = "".join(e.get("delta", "") for e in c.events + resumed.events
                  if e.get("type") == "response.output_text.delta"
                  and e.get("response_id") == done["id"])
    assert reply_text(done) == got and got
    # The next turn knows the one before the cut reply.
    answer = reply_text(await say(resumed, "and the word?"))
    assert answer.endswith("You said before: tell me a long story.")
    assert_lossless(c, resumed)
    await resumed.close()


async def test_kill_9_mid_question_the_question_is_sent_again_and_answered(fleet):
    """The user's words not committed when the worker died are not in the
    store (input is not journaled): the client resends the question."""
    await workers_up(fleet)
    c = await open_text(fleet.ws)
    await say(c, "my city is Lyon")
    victim = owner(c)
    await c.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "where"}]}})
    os.kill(worker(fleet, victim)["pid"], signal.SIGKILL)
    resumed = await c.reconnect()
    answer = reply_text(await say(resumed, "which city did I name?"))
    # The half-sent question is in the history if the store had it when the
    # worker died (its conversation.item.added was sent only once durable),
    # else the turn before it is: either way nothing the client saw is lost.
    heard = any(e.get("type") == "conversation.item.added"
                and "where" in json.dumps(e.get("item")) for e in c.events + resumed.events)
    assert answer.endswith("You said before: where." if heard
                           else "You said before: my city is Lyon.")
    assert_lossless(c, resumed)
    await resumed.close()


async def test_redis_unreachable_sessions_go_on_degraded_then_durable_again(fleet):
    await workers_up(fleet)
    c = await open_text(fleet.ws)
    await say(c, "my color is green")
    redis_pid = child_pid(fleet.proc.pid, "redis-server")
    os.kill(redis_pid, signal.SIGSTOP)
    try:
        # The session goes on while the store does not answer ...
        answer = reply_text(await say(c, "still working?"))
        assert answer.endswith("You said before: my color is green.")
        await wait_until(lambda: fleet.health()["durability"] == "degraded", timeout=10)
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    await wait_until(lambda: fleet.health()["durability"] == "ok", timeout=15)
    # ... and once it answers again, the session is durable again: it survives its worker.
    await say(c, "my animal is a cat")
    os.kill(worker(fleet, owner(c))["pid"], signal.SIGKILL)
    resumed = await c.reconnect()
    assert reply_text(await say(resumed, "animal?")).endswith("You said before: my animal is a cat.")
    assert_lossless(c, resumed)
    await resumed.close()


async def test_redis_restarted_empty_the_workers_write_their_sessions_again(fleet):
    await workers_up(fleet)
    c = await open_text(fleet.ws)
    await say(c, "my tree is an oak")
    holder = owner(c)
    before = reseeded(fleet, holder)
    os.kill(child_pid(fleet.proc.pid, "redis-server"), signal.SIGKILL)  # restarted, empty
    # The owner itself has written the session into the empty store again
    # (another worker's count, or one left from an earlier fault, says nothing of it).
    await wait_until(lambda: reseeded(fleet, holder) > before, timeout=20)
    os.kill(worker(fleet, holder)["pid"], signal.SIGKILL)
    try:
        resumed = await c.reconnect()
    except Exception as err:
        raise AssertionError(f"{err}\n--- serve's log:\n{fleet.output()[-4000:]}") from err
    assert reply_text(await say(resumed, "tree?")).endswith("You said before: my tree is an oak.")
    assert_lossless(c, resumed)
    await resumed.close()


async def test_a_worker_stopped_past_its_lease_leaves_the_routing_is_fenced_and_comes_back(
        fleet):
    """A stopped worker still accepts connections (the kernel does): the
    supervisor finds its /health silent past the lease and reloads nginx
    with it down, so a plain resume (no ``owner=``) reaches the other worker."""
    await workers_up(fleet)
    c = await open_text(fleet.ws)
    await say(c, "my planet is Mars")
    victim = owner(c)
    info = worker(fleet, victim)
    other = next(w for w in fleet.health()["workers"] if w != victim)
    c.ws.transport.abort()  # the caller's socket dropped (its session waits for a resume)
    os.kill(info["pid"], signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        await wait_until(lambda: worker(fleet, victim)["routed"] is False, timeout=30)
        out_s = time.monotonic() - t0
        assert worker(fleet, victim)["state"] == "unresponsive"
        assert fleet.health()["status"] == "degraded"
        t1 = time.monotonic()
        resumed = await c.reconnect()  # through the router, naming no other worker
        print(f"SIGSTOP: out of the routing {1000 * out_s:.0f} ms after the stop "
              f"(lease {LEASE_S} s), resumed {1000 * (time.monotonic() - t1):.0f} ms later "
              f"on {resumed.owner}")
        assert resumed.owner == other
        assert resumed.ws.response.headers["Duplex-Owner-Instance"] == other
    finally:
        os.kill(info["pid"], signal.SIGCONT)
    # The stale owner finds its lease taken and drops the session: no second writer.
    await wait_until(lambda: get_json(f"http://{info['address']}/health")[2]
                     ["durability"]["fenced"] >= 1, timeout=10)
    assert reply_text(await say(resumed, "planet?")).endswith("You said before: my planet is Mars.")
    assert_lossless(c, resumed)
    # It answers again: back in the routing ...
    await wait_until(lambda: worker(fleet, victim)["state"] == "up"
                     and worker(fleet, victim)["routed"], timeout=30)
    # ... a resume that reaches the old owner is told where the session is now ...
    again = await resumed.reconnect(owner=victim)
    assert again.owner == other
    # ... and new sessions reach it again (least_conn: it holds none now).
    fresh = [await open_text(fleet.ws) for _ in range(2)]
    assert victim in {owner(f) for f in fresh}
    for f in fresh:
        await f.close()
    await again.close()


async def test_the_router_killed_comes_back_and_its_sessions_resume_where_they_were(fleet):
    await workers_up(fleet)
    c = await open_text(fleet.ws)
    await say(c, "my river is the Loire")
    nginx = child_pid(fleet.proc.pid, "nginx")
    os.kill(nginx, signal.SIGKILL)  # its workers would keep the port: the supervisor ends them
    await wait_until(lambda: _router_answers(fleet) and _nginx(fleet) not in (None, nginx),
                     timeout=20)
    resumed = await c.reconnect()
    assert resumed.owner == owner(c)  # its worker never went away: no adoption
    assert reply_text(await say(resumed, "river?")).endswith(
        "You said before: my river is the Loire.")
    assert_lossless(c, resumed)
    await resumed.close()


def _nginx(fleet) -> int | None:
    try:
        return child_pid(fleet.proc.pid, "nginx")
    except LookupError:
        return None


def _router_answers(fleet) -> bool:
    try:
        return get_json(fleet.http + "/health", timeout=2)[0] == 200
    except OSError:
        return False
