"""``VllmOmniStage`` on the real CPU vLLM engine, text only.

No omni model runs on a CPU here, but the stage's engine path does: the
session's engine (SmolLM2, a ChatML model like Qwen2.5-Omni's thinker) is
borrowed, and typed turns go through the same code as units -- chunks
rendered by the engine's renderer, streamed into one live request, prefill
tokens dropped, the reply kept and closed by the next turn, the context
replayed after a barge-in. Each reply must equal a one-shot generation of
the context the stage holds ("streaming equals batch").
"""

from __future__ import annotations

import uuid

import pytest
from vllm import SamplingParams
from vllm_duplex.core.contracts import SamplingConfig
from vllm_duplex.core.fence import Fence
from vllm_duplex.core.omni import OmniInstructions
from vllm_duplex.core.payloads import (
    GenerateRequest,
    GenerationDone,
    StageFailed,
    StageInput,
    TextDelta,
    TextIn,
)
from vllm_duplex.stages.omni.vllm_omni import VllmOmniPort, VllmOmniStage
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")  # the engine lives in that loop

GREEDY = SamplingConfig(temperature=0.0, max_tokens=24)


async def reply(port: VllmOmniPort) -> tuple[str, object]:
    text = ""
    stream = port.outputs()
    try:
        async for out in stream:
            p = out.payload
            if isinstance(p, TextDelta):
                text += p.text
            if isinstance(p, (GenerationDone, StageFailed)):
                return text, p
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    raise AssertionError("outputs ended")


async def one_shot(stage: VllmOmniStage, port: VllmOmniPort) -> str:
    """A plain generation of everything up to the last assistant prefix."""
    history = port.prompt.history
    last = max(i for i, c in enumerate(history) if c.kind == "generation")
    text = ""
    async for out in stage.engine.generate({"prompt": "".join(c.text for c in history[: last + 1])},
                                           SamplingParams(temperature=0.0, max_tokens=24),
                                           f"oneshot.{uuid.uuid4().hex}"):
        text = out.outputs[0].text
    return text


async def open_omni(vllm_stage, session_id: str) -> tuple[VllmOmniStage, VllmOmniPort, Fence]:  # noqa: F811
    stage = VllmOmniStage(engine=vllm_stage.engine, dialect="qwen_omni")
    fence = Fence(session_id)
    port = stage.port(session_id)
    await port.open(fence)
    return stage, port, fence


async def test_turns_stream_into_one_request_and_equal_one_shot(vllm_stage):  # noqa: F811
    stage, port, fence = await open_omni(vllm_stage, "omni-cpu-1")

    async def submit(payload: object) -> None:
        await port.submit(StageInput(fence, fence.request_id("omni"), payload))

    await submit(OmniInstructions("You are a helpful assistant. Answer in one short sentence."))
    for word in "What is the capital of France?".split():
        await submit(TextIn(word))
    await submit(GenerateRequest("r1", (), GREEDY))
    first, done = await reply(port)
    assert isinstance(done, GenerationDone) and done.finish_reason == "stop"
    assert "Paris" in first and first == await one_shot(stage, port)
    await submit(TextIn("And of Germany?"))
    await submit(GenerateRequest("r2", (), GREEDY))
    second, _ = await reply(port)
    assert "Berlin" in second and second == await one_shot(stage, port)
    assert stage.rebuilds == 0 and stage.completed_requests == 2
    await port.close()
    await stage.close()


async def test_barge_in_replays_the_context_into_a_new_request(vllm_stage):  # noqa: F811
    stage, port, fence = await open_omni(vllm_stage, "omni-cpu-2")
    await port.submit(StageInput(fence, fence.request_id("omni"), TextIn("Tell me a long story about a cat.")))
    await port.submit(StageInput(fence, fence.request_id("omni"),
                                 GenerateRequest("r1", (), SamplingConfig(temperature=0.0, max_tokens=200))))
    stream = port.outputs()
    async for out in stream:
        if isinstance(out.payload, TextDelta):
            break
    await stream.aclose()  # type: ignore[attr-defined]
    newer = fence.next_epoch()
    await port.cancel(newer)  # barge-in: the reply is aborted, kept as far as it was sent
    assert stage.aborted_requests == 1
    await port.submit(StageInput(newer, newer.request_id("omni"), TextIn("What is the capital of France?")))
    await port.submit(StageInput(newer, newer.request_id("omni"), GenerateRequest("r2", (), GREEDY)))
    text, done = await reply(port)
    assert isinstance(done, GenerationDone) and stage.rebuilds == 1
    assert text == await one_shot(stage, port)
    kinds = [c.kind for c in port.prompt.history]
    assert kinds == ["system", "text", "generation", "reply", "text", "generation", "reply"]
    await port.close()
    await stage.close()
