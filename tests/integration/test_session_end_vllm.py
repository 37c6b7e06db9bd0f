"""A clean close ends the session on the real server and engine (issue 42,
item 3): fifty sessions opened one after another on the default pipeline
(real vLLM), at the default resume grace (30 s) and two seats, are all
admitted; every one is gone from ``/health`` right after its socket closes
(1000), and one closed mid-reply leaves no vLLM request behind -- not 30 s
later, at once. The rules and the resume side: ``test_session_end.py``."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from support.metrics import metric
from support.speech_fixtures import cascade_runtime
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

TEXT = {"output_modalities": ["text"], "instructions": "Answer in one short sentence."}


async def until(ws: websockets.ClientConnection, kind: str, timeout: float = 60.0) -> dict:
    async with asyncio.timeout(timeout):
        while True:
            event = json.loads(await ws.recv())
            assert event["type"] != "error", event
            if event["type"] == kind:
                return event


async def nothing_left(http: httpx.AsyncClient, timeout: float = 5.0) -> None:
    """No session on ``/health`` and no vLLM request on ``/metrics``, within
    ``timeout`` (far below the 30 s grace a kept session would wait)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        health = (await http.get("/health")).json()
        llm = metric((await http.get("/metrics")).text, "duplex_stage_active_requests",
                     stage="llm")
        if health["sessions"] == 0 and health["capacity"]["voice_sessions"] == 0 and llm == 0:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"left after {timeout} s: {health['sessions']} sessions, "
                                 f"{health['capacity']}, {llm} vLLM requests")
        await asyncio.sleep(0.05)


async def test_fifty_sessions_in_a_row_on_the_real_engine_free_everything_at_once(vllm_stage):
    runtime = cascade_runtime(vllm_stage, max_voice_sessions=2, resume_grace_s=30.0)
    async with BackgroundServer(runtime) as srv:
        async with httpx.AsyncClient(base_url=srv.http_url) as http:
            for i in range(50):
                async with websockets.connect(srv.ws_url) as ws:  # refused: InvalidStatus 429
                    await until(ws, "session.created")
                    await ws.send(json.dumps({"type": "session.update", "session": TEXT}))
                    await until(ws, "session.updated")
                    if i % 10 == 9:  # now and then, closed while vLLM is answering
                        await ws.send(json.dumps({"type": "conversation.item.create", "item": {
                            "type": "message", "role": "user",
                            "content": [{"type": "input_text", "text": "Count to fifty."}]}}))
                        await ws.send(json.dumps({"type": "response.create"}))
                        await until(ws, "response.output_text.delta")
                assert ws.close_code == 1000
                await nothing_left(http)
            health = (await http.get("/health")).json()
            assert health["capacity"]["refused"] == 0
            assert runtime.journal_budget.used == 0  # every journal freed
            assert vllm_stage.engine.get_num_unfinished_requests() == 0
