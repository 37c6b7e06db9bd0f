"""Faults (issue 5, item 5): the vLLM engine process is killed mid-response.

Every surface running on it gets one terminal ``engine_dead`` (a realtime
session: the error event, then close 1011; a stateless SSE step and an
application-session turn: an ``error`` event), ``/health`` turns 503, the
stage's supervisor rebuilds the engine, ``/health`` is 200 again, and every
surface works after it, the application session opened before the kill
included (its next turn prefills afresh).

The test builds its OWN engine (the session-scoped one of
``vllm_fixtures`` is shared by other modules and must survive): a
``VllmLlmStage`` that owns its engine, shared into a cascade-cpu
``Runtime`` and closed by the test. The kill-to-error times are printed
(``-s`` shows them), not asserted: wall-clock bounds belong to the benchmark.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx
import psutil
import pytest
from support.metrics import metric
from support.text_fixtures import FRANCE, KEYS, MODEL, auth, sse_events, text_runtime
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from vllm_duplex.stages.vllm.llm import VllmLlmStage
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from websockets.exceptions import ConnectionClosed

pytestmark = pytest.mark.asyncio(loop_scope="session")

STORY = "Tell me a long story about a dragon who learns to fly."
HANG_GUARD_S = 15.0  # not a latency bound: only keeps a broken build from hanging
RESTART_GUARD_S = 240.0


def engine_core_pids() -> set[int]:
    """vLLM's EngineCore processes among this process's children."""
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if "EngineCore" in proc.name() or any("EngineCore" in a for a in proc.cmdline()):
                found.add(proc.pid)
        except psutil.Error:
            pass
    return found


def user_item(text: str) -> dict[str, Any]:
    return {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}


async def realtime_ask(url: str, text: str, max_tokens: int) -> RealtimeClient:
    rt = await RealtimeClient.connect(url, api_key=KEYS[0])
    await rt.update_session({"output_modalities": ["text"], "max_output_tokens": max_tokens,
                             "audio": {"input": {"turn_detection": None}}})
    await rt.send(user_item(text))
    await rt.create_response({"output_modalities": ["text"]})
    return rt


class SseRun:
    """One streaming POST whose events are read by a task of its own."""

    def __init__(self, http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
        self.events: list[tuple[str, dict[str, Any], float]] = []
        self.first_delta = asyncio.Event()
        self.task = asyncio.create_task(self._read(http, path, body), name=f"test-sse-{path}")

    async def _read(self, http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> None:
        async with http.stream("POST", path, json=body) as r:
            assert r.status_code == 200, await r.aread()
            async for _, event, data in sse_events(r):
                self.events.append((event, data, time.monotonic()))
                if event == "text-delta":
                    self.first_delta.set()
        self.first_delta.set()  # ended (a failure shows in ``events``)


async def realtime_end(rt: RealtimeClient) -> tuple[dict[str, Any] | None, float | None, int | None]:
    """Read to the end of the socket: (the error event, when it came, close code)."""
    error = at = None
    try:
        while True:
            event = await rt.recv()
            if event["type"] == "error" and error is None:
                error, at = event, time.monotonic()
    except ConnectionClosed:
        pass
    return error, at, rt.ws.close_code


async def wait_health(http: httpx.AsyncClient, status: int) -> None:
    while (await http.get("/health")).status_code != status:
        await asyncio.sleep(0.25)


async def test_engine_death_fails_every_surface_then_a_restart_recovers() -> None:
    before = engine_core_pids()
    stage = VllmLlmStage()  # builds (and so restarts) its own engine
    try:
        async with BackgroundServer(text_runtime(stage)) as server, httpx.AsyncClient(
                base_url=server.http_url, timeout=60, headers=auth()) as http:
            mine = engine_core_pids() - before
            assert len(mine) == 1, mine
            assert (await http.get("/health")).status_code == 200
            # A lease that outlives a restart on a loaded machine (the default is 60 s).
            sid = (await http.post("/v1/sessions", json={"model": MODEL, "ttl_s": 900})).json()["id"]
            long = {"max_tokens": 1500}

            # Everything mid-response at once: two realtime sessions, a stateless
            # SSE step and an application-session turn.
            rts = [await realtime_ask(server.ws_url, STORY, 1500) for _ in range(2)]
            gen = SseRun(http, "/v1/generate", {"model": MODEL, "stream": True, "options": long,
                                                "messages": [{"role": "user", "content": STORY}]})
            turn = SseRun(http, f"/v1/sessions/{sid}/generate", {
                "stream": True, "options": long, "messages": [{"role": "user", "content": STORY}]})
            async with asyncio.timeout(120):
                for rt in rts:
                    await rt.wait_for("response.output_text.delta")
                await gen.first_delta.wait()
                await turn.first_delta.wait()
            assert all(e != "finish" for run in (gen, turn) for e, _, _ in run.events)

            (pid,) = mine
            doomed = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)

            async with asyncio.timeout(HANG_GUARD_S):
                ends = await asyncio.gather(*(realtime_end(rt) for rt in rts))
                await asyncio.gather(gen.task, turn.task)
            times = {}
            for i, (error, at, code) in enumerate(ends):
                assert error is not None and error["error"]["code"] == "engine_dead", error
                assert code == 1011
                assert at is not None
                times[f"realtime {i}"] = at - killed_at
                failed = [e for e in rts[i].events if e["type"] == "response.done"]
                assert failed and failed[-1]["response"]["status"] == "failed"
            for name, run in (("generate SSE", gen), ("session turn", turn)):
                event, data, at = run.events[-1]
                assert event == "error" and data["error"]["code"] == "engine_dead", run.events[-1]
                assert "finish" not in [e for e, _, _ in run.events]
                times[name] = at - killed_at
            print("\nkill -> terminal error (s): " +
                  ", ".join(f"{k} {v:.3f}" for k, v in times.items()))

            # Dead: unhealthy, and new work is refused at once.
            r = await http.get("/health")
            assert r.status_code == 503 and r.json()["stages"]["llm"] is False
            r = await http.post("/v1/generate", json={"model": MODEL, "messages": FRANCE,
                                                      "stream": False})
            assert r.json()["error"]["code"] == "engine_dead"

            async with asyncio.timeout(RESTART_GUARD_S):
                await wait_health(http, 200)
            print(f"kill -> healthy again (s): {time.monotonic() - killed_at:.1f} "
                  f"(rebuild {stage.engine_start_s:.1f})")
            assert engine_core_pids() - before - mine, "no new EngineCore"
            _, alive = await asyncio.to_thread(psutil.wait_procs, doomed, HANG_GUARD_S)
            assert not alive, f"processes of the killed engine live on: {alive}"
            assert metric((await http.get("/metrics")).text, "duplex_stage_engine_restarts",
                          stage="llm") == 1

            # Everything works again, the application session opened before the kill too.
            async with await RealtimeClient.connect(server.ws_url, api_key=KEYS[0]) as rt:
                await rt.update_session({"output_modalities": ["text"],
                                         "audio": {"input": {"turn_detection": None}}})
                await rt.send(user_item(FRANCE[-1]["content"]))
                await rt.create_response({"output_modalities": ["text"]})
                reply = await rt.collect_response(timeout=120)
            assert reply.status == "completed" and "Paris" in reply.text, reply.text
            r = await http.post("/v1/generate", json={"model": MODEL, "messages": FRANCE,
                                                      "stream": False, "options": {"max_tokens": 24}})
            assert r.status_code == 200 and "Paris" in r.json()["output"]["text"], r.json()
            r = await http.post(f"/v1/sessions/{sid}/generate", json={
                "messages": FRANCE, "stream": False, "options": {"max_tokens": 24}})
            assert r.status_code == 200 and "Paris" in r.json()["output"]["text"], r.json()
            await http.delete(f"/v1/sessions/{sid}")
            for rt in rts:
                await rt.close()
    finally:
        await stage.close()
    assert not engine_core_pids() - before, "an EngineCore outlived the stage"
