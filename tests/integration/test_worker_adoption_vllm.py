"""A worker dies, its conversation lives on -- on the real default pipeline
(issue 32): ``serve --workers 2`` on ``cascade-cpu`` (one vLLM engine core,
SmolLM2-135M-Instruct, greedy) with ``durability: store: redis``. The owner
of a text conversation is killed (SIGKILL); the caller resumes through the
router on the other worker, which rebuilt the conversation from Redis: the
model, prefilled again from the items, answers a question that needs the
earlier turn.

The same for an application session (``/v1/sessions``, the HTTP client
through the router): its owner killed after a turn, the next turn is served
by another worker (or the owner's restarted process), which took the
history over from Redis. And for a resumable stream (``stream_id``): its
worker killed mid-generation, the client's ``GET /v1/streams/{id}?from=``
through the router replays on another worker exactly the events after its
cursor, then the terminal error that says the generation died.

A soak test (``-m soak``): the engine core and two workers joining it take
1.5-4.5 minutes to start on 2 shared cores (as test_router_vllm.py); the
suite's fault tests run the scripted pipeline (test_worker_adoption.py).
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest
import yaml
from support.router_fixtures import Serve, owner, wait_until
from vllm_duplex.host.deploy import resolve_config_path
from vllm_duplex.realtime.client.http import DuplexHttpClient
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = [pytest.mark.soak, pytest.mark.asyncio(loop_scope="module")]

TEXT = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": None}},
        "instructions": "You are a helpful assistant. Answer in one short sentence."}


@pytest.fixture(scope="module")
def fleet():
    raw = yaml.safe_load(resolve_config_path("cascade-cpu").read_text())
    raw["workers"] = {"count": 2, "spare_engine_slots": 3, "restart_backoff_s": 0.2}
    raw["durability"] = {"store": "redis", "lease_ttl_s": 3.0}
    raw.setdefault("limits", {})["resume_grace_s"] = 120
    serve = Serve(raw, "serve", ready_timeout_s=600).start(expect_workers=2)
    yield serve
    assert serve.stop() == 0, serve.output()


async def whole(fleet: Serve) -> None:
    """Both workers serve (a worker killed by an earlier test restarts on a
    spare engine slot: tens of seconds), so the next kill leaves one."""
    await wait_until(lambda: Serve.workers_up(fleet.health()) == 2, timeout=600, every=0.5)


async def ask(c: RealtimeClient, text: str) -> str:
    await c.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await c.send({"type": "response.create"})
    done = (await c.wait_for("response.done", timeout=180))["response"]
    assert done["status"] == "completed", done
    return " ".join(p.get("text") or "" for i in done["output"] for p in i.get("content", []))


async def test_the_model_answers_with_the_turn_its_dead_worker_heard(fleet):
    c = await RealtimeClient.connect(fleet.ws)
    await c.send({"type": "session.update", "session": TEXT})
    await c.wait_for("session.updated")
    first = await ask(c, "My name is Ada and I live in Paris.")
    victim = owner(c)
    os.kill(fleet.health()["workers"][victim]["pid"], signal.SIGKILL)
    t0 = time.monotonic()
    resumed = await c.reconnect()
    print(f"real pipeline kill -9: resumed in {1000 * (time.monotonic() - t0):.0f} ms; "
          f"first answer {first!r}")
    # (on the other worker, or on the victim's restarted process: same id)
    answer = await ask(resumed, "Which city do I live in?")
    print(f"after adoption: {answer!r}")
    assert "Paris" in answer  # named only in the turn the dead worker heard
    # The control: the same question in a conversation without that turn.
    fresh = await RealtimeClient.connect(fleet.ws)
    await fresh.send({"type": "session.update", "session": TEXT})
    await fresh.wait_for("session.updated")
    control = await ask(fresh, "Which city do I live in?")
    print(f"control (no earlier turn): {control!r}")
    assert "Paris" not in control
    await fresh.close()
    seqs = [e["seq"] for s in (c, resumed) for e in s.events if isinstance(e.get("seq"), int)]
    assert sorted(seqs) == list(range(1, max(seqs) + 1)) and len(seqs) == len(set(seqs))
    await resumed.close()


async def test_an_application_session_goes_on_after_its_worker_is_killed(fleet):
    await whole(fleet)
    instructions = TEXT["instructions"]
    async with DuplexHttpClient(fleet.http, timeout=300) as http:
        session = await http.open_session("smollm2-135m-instruct", instructions=instructions)
        first = await session.ask([{"role": "user", "content": "My name is Ada and I live in Paris."}],
                                  options={"max_tokens": 24})
        victim = session.owner_instance_id
        os.kill(fleet.health()["workers"][victim]["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        info = await session.info(messages=True)  # through the router: the victim's backup
        took = time.monotonic() - t0
        print(f"application session, kill -9 of {victim}: served by {info['ref']['owner_instance_id']}"
              f" after {1000 * took:.0f} ms; first answer {first!r}")
        assert info["turns"] == 1 and [m["role"] for m in info["history"]] == [
            "system", "user", "assistant"]
        answer = await session.ask([{"role": "user", "content": "Which city do I live in?"}],
                                   options={"max_tokens": 24})
        print(f"after the takeover: {answer!r}")
        assert "Paris" in answer  # named only in the turn the dead worker served
        assert (await session.info())["turns"] == 2
        await session.close()


async def test_a_stream_cut_by_a_killed_worker_replays_elsewhere_and_says_so(fleet):
    await whole(fleet)
    body = {"model": "smollm2-135m-instruct", "stream_id": "soak-stream-1",
            "messages": [{"role": "user", "content": "Tell me a long story about a dragon."}],
            "options": {"max_tokens": 400}}
    seen: list[int] = []
    async with httpx.AsyncClient(base_url=fleet.http, timeout=300) as http:
        async with http.stream("POST", "/v1/generate", json=body) as r:
            victim = r.headers["Duplex-Owner-Instance"]
            async for line in r.aiter_lines():
                if line.startswith("id:"):
                    seen.append(int(line[3:]))
                if len(seen) == 5:
                    break
        os.kill(fleet.health()["workers"][victim]["pid"], signal.SIGKILL)
        t0 = time.monotonic()
        events: list[tuple[int, str]] = []
        async with http.stream("GET", "/v1/streams/soak-stream-1", params={"from": seen[-1] + 1},
                               headers={"Duplex-Owner-Instance": victim}) as r:
            assert r.status_code == 200, await r.aread()
            served_by = r.headers["Duplex-Owner-Instance"]
            seq, name = None, None
            async for line in r.aiter_lines():
                if line.startswith("id:"):
                    seq = int(line[3:])
                elif line.startswith("event:"):
                    name = line[6:].strip()
                elif line.startswith("data:"):
                    events.append((seq, name))
        print(f"stream, kill -9 of {victim}: replayed by {served_by} in "
              f"{1000 * (time.monotonic() - t0):.0f} ms, {len(events)} events after seq {seen[-1]}")
        seqs = [s for s, _ in events]
        assert seqs == list(range(seen[-1] + 1, seen[-1] + 1 + len(seqs)))  # no gap, no repeat
        assert events[-1][1] == "error"  # the generation died with its worker: said, not hidden
