"""Faults (issue 5, item 5), second half: an exception inside one stage is
contained to its session. Over a real loopback server, session A's turn
makes the scripted LLM raise mid-reply: A gets ``stage_failed`` and a failed
response, keeps its socket, and its next turn is answered; session B, mid-
response on the same stage at that moment, completes normally.

The server runs on a ``VirtualClock``: B's reply waits between words until
the test moves time, so B is provably mid-response when A fails.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from support.realtime_fixtures import LONG_REPLY, assert_alive, no_leaked_tasks  # noqa: F401
from vllm_duplex.host.deploy import StageSpec, load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from vllm_duplex.testing.clock import VirtualClock

pytestmark = pytest.mark.asyncio(loop_scope="module")

T = TypeVar("T")
FAULT = "trigger the fault"


def faulty_config() -> Any:
    config = load_config("scripted")
    stages = tuple(StageSpec(s.type, {**s.options, "reply": LONG_REPLY, "fail_on": FAULT})
                   if s.type == "scripted_llm" else s for s in config.stages)
    return dataclasses.replace(config, stages=stages)


async def ticking(clock: VirtualClock, work: Awaitable[T]) -> T:
    """Await ``work`` while moving virtual time on (the scripted words wait on it)."""
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            await clock.advance(0.05)
            await asyncio.sleep(0.001)  # socket I/O
        return task.result()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def ask(rt: RealtimeClient, text: str) -> None:
    await rt.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await rt.create_response()


async def text_client(url: str) -> RealtimeClient:
    rt = await RealtimeClient.connect(url)
    await rt.update_session({"output_modalities": ["text"],
                             "audio": {"input": {"turn_detection": None}}})
    return rt


async def test_a_stage_exception_fails_only_its_own_session() -> None:
    clock = VirtualClock()
    async with BackgroundServer(Runtime(faulty_config(), clock=clock)) as server:
        async with await text_client(server.ws_url) as a, await text_client(server.ws_url) as b:
            await ask(b, "Tell me something long.")
            await b.wait_for("response.output_text.delta", timeout=10)  # B now waits for time to move

            await ask(a, f"Please {FAULT} now.")
            failed = await a.collect_response(timeout=10)  # no time moves: A fails on its own
            assert failed.status == "failed"
            assert failed.done["response"]["status_details"]["error"]["code"] == "stage_failed"
            (error,) = [e["error"] for e in failed.errors]
            assert (error["code"], error["type"], error["retryable"]) == (
                "stage_failed", "server_error", True)
            assert "scripted fault" in error["message"]
            assert not any(e["type"] == "response.done" for e in b.events)  # B: still mid-reply

            reply = await ticking(clock, b.collect_response(timeout=30))
            assert reply.status == "completed" and reply.text == LONG_REPLY
            assert not [e for e in b.events if e["type"] == "error"]

            await assert_alive(a)  # A's socket survived its failure
            await ask(a, "And now a normal question.")
            again = await ticking(clock, a.collect_response(timeout=30))
            assert again.status == "completed" and again.text == LONG_REPLY
        runtime = server.runtime
        llm = next(s for s in runtime.stages if s.name == "llm")
        assert llm.failed_requests == 1 and llm.completed_requests == 2
