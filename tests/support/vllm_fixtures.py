"""The real vLLM engine for tests: ONE engine per test session.

Tests that use ``vllm_stage`` run in the session event loop (the engine's
output handler lives there)::

    pytestmark = pytest.mark.asyncio(loop_scope="session")
    from support.vllm_fixtures import no_leaked_tasks  # noqa: F401  (vllm_stage: tests/conftest.py)

``no_leaked_tasks`` overrides the conftest fixture of the same name (that one
runs in a per-function loop and would not see this loop's tasks). The engine's
own background tasks exist before the first test (``start`` warms it up), so
only tasks a test caused are counted.
"""

from __future__ import annotations

import asyncio
from typing import Any

from support.task_leaks import leak_check
from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    ResetContext,
    StageFailed,
    StageInput,
    StageOutput,
    TextDelta,
    TextIn,
)
from vllm_duplex.stages.vllm.llm import VllmLlmPort, VllmLlmStage

GREEDY = SamplingConfig(temperature=0.0, max_tokens=48)


no_leaked_tasks = leak_check(loop_scope="session", tries=100)


# An app's instruction: with it SmolLM2's greedy answers do not follow the
# CPU's numerics (support/text_fixtures.py, FRANCE).
INSTRUCTED = ContextMessage("system", "You are a helpful assistant. Answer in one short sentence.")


async def open_port(stage: VllmLlmStage, session_id: str,
                    context: tuple[ContextMessage, ...] = ()) -> tuple[VllmLlmPort, Fence]:
    """A port; with ``context``, its live request starts with it (as the
    cascade opens a turn: ``ResetContext``), before any words are spoken."""
    fence = Fence(session_id)
    port = stage.port(session_id)
    await port.open(fence)
    if context:
        await port.submit(StageInput(fence, fence.request_id("in"), ResetContext(context)))
    return port, fence


def user(text: str) -> ContextMessage:
    return ContextMessage("user", text)


def assistant(text: str) -> ContextMessage:
    return ContextMessage("assistant", text)


async def speak(port: VllmLlmPort, fence: Fence, words: str) -> None:
    """The user's words as ``append_tokens`` chunks, one word each."""
    for word in words.split():
        await port.submit(StageInput(fence, fence.request_id("in"), TextIn(word)))


async def next_reply(port: VllmLlmPort, timeout: float = 120.0) -> tuple[str, list[StageOutput]]:
    """Read outputs up to the next GenerationDone (or StageFailed)."""
    outs: list[StageOutput] = []

    stream = port.outputs()

    async def read() -> None:
        async for out in stream:
            outs.append(out)
            if isinstance(out.payload, (GenerationDone, StageFailed)):
                return

    try:
        await asyncio.wait_for(read(), timeout)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return "".join(o.payload.text for o in outs if isinstance(o.payload, TextDelta)), outs


async def ask(port: VllmLlmPort, fence: Fence, context: tuple[ContextMessage, ...],
              response_id: str = "resp", sampling: SamplingConfig = GREEDY,
              tools: tuple[dict[str, Any], ...] = ()) -> tuple[str, list[StageOutput]]:
    await port.submit(StageInput(fence, fence.request_id("resp"),
                                 GenerateRequest(response_id, context, sampling, tools)))
    return await next_reply(port)
