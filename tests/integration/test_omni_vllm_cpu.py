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
from vllm.exceptions import VLLMValidationError
from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.omni import OmniInstructions
from vllm_duplex.domain.payloads import (
    GenerateRequest,
    GenerationDone,
    StageFailed,
    StageInput,
    TextDelta,
    TextIn,
)
from vllm_duplex.domain.truncation import Truncation
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


async def one_shot(stage: VllmOmniStage, port: VllmOmniPort, max_tokens: int = 24) -> str:
    """A plain generation of everything up to the last assistant prefix."""
    history = port.prompt.history
    last = max(i for i, c in enumerate(history) if c.kind == "generation")
    text = ""
    async for out in stage.engine.generate({"prompt": "".join(c.text for c in history[: last + 1])},
                                           SamplingParams(temperature=0.0, max_tokens=max_tokens),
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


# ---- a conversation longer than the context (the session's truncation) ------------------

FILLER = "The quick brown fox jumps over the lazy dog by the river bank today."  # ~15 tokens


async def talk(port: VllmOmniPort, fence: Fence, n: int, truncation: Truncation,
               max_tokens: int = 8) -> object:
    """One typed turn and its reply's terminal output (done or failed)."""
    await port.submit(StageInput(fence, fence.request_id("omni"), TextIn(f"Note {n}. {FILLER} Say OK.")))
    await port.submit(StageInput(fence, fence.request_id("omni"), GenerateRequest(
        f"r{n}", (), SamplingConfig(temperature=0.0, max_tokens=max_tokens), truncation=truncation)))
    text, done = await reply(port)
    return done if isinstance(done, StageFailed) else (text, done)


async def test_a_conversation_past_the_omni_context_keeps_answering(vllm_stage):  # noqa: F811
    """max_model_len 256 here; each turn is ~40 tokens with its reply: the
    oldest turns leave the context (the instructions stay), and each reply is
    what a one-shot generation of the kept context gives."""
    stage = VllmOmniStage(engine=vllm_stage.engine, dialect="qwen_omni", max_model_len=256)
    fence = Fence("omni-cpu-long")
    port = stage.port(fence.session_id)
    await port.open(fence)
    await port.submit(StageInput(fence, fence.request_id("omni"), OmniInstructions("You answer OK.")))
    seen = []
    for n in range(14):
        out = await talk(port, fence, n, Truncation())
        assert not isinstance(out, StageFailed), f"turn {n}: {out}"
        text, done = out
        seen.append(done.input_tokens)
        if n in (8, 13):
            assert text == await one_shot(stage, port, 8)  # the model saw exactly the kept history
    assert max(seen) <= 256 - 8 and port.truncations >= 2
    dropped = [n for n in range(1, 14) if seen[n] < seen[n - 1]]
    assert dropped and seen[dropped[0]] <= 0.75 * (256 - 8) + 45  # cut to 3/4 of the room, plus the turn
    history = port.prompt.history
    assert history[0].text == "<|im_start|>system\nYou answer OK.<|im_end|>\n"
    assert history[1].text.startswith("<|im_start|>") and "Note 0." not in "".join(c.text for c in history)
    assert f"Note 13. {FILLER}" in history[-3].text  # the newest turn, then its reply
    assert port.live is not None and port.live.held == sum(r.tokens for r in port.live.rendered)
    await port.close()
    await stage.close()


async def test_disabled_truncation_fails_the_reply_that_does_not_fit(vllm_stage):  # noqa: F811
    stage = VllmOmniStage(engine=vllm_stage.engine, dialect="qwen_omni", max_model_len=256)
    fence = Fence("omni-cpu-disabled")
    port = stage.port(fence.session_id)
    await port.open(fence)
    outs = []
    for n in range(8):
        outs.append(await talk(port, fence, n, Truncation("disabled")))
        if isinstance(outs[-1], StageFailed):
            break
    failed = outs[-1]
    assert isinstance(failed, StageFailed) and len(outs) >= 4  # the first turns fit
    assert failed.error.code == "stage_failed" and "max_model_len (256" in failed.error.message
    await port.close()
    await stage.close()


async def test_the_context_limit_is_vllms_own(vllm_stage):  # noqa: F811
    """vLLM refuses a prompt of max_model_len tokens and takes one of
    max_model_len - 1 (one token of reply). The omni stage draws the line at
    the same place for a streaming request, whose running total vLLM does not
    check: a context of exactly limit - 1 tokens is answered with the one
    token there is room for (max_tokens clamped), one of limit fails."""
    engine, limit = vllm_stage.engine, vllm_stage.host.max_model_len
    ids = [vllm_stage.host.chat.encode(" a")[0]]
    one = SamplingParams(max_tokens=1, temperature=0.0)
    outs = [o async for o in engine.generate({"prompt_token_ids": ids * (limit - 1)}, one,
                                             f"edge.{uuid.uuid4().hex}")]
    assert len(outs[-1].outputs[0].token_ids) == 1
    with pytest.raises(VLLMValidationError, match="longer than the maximum model length"):
        async for _ in engine.generate({"prompt_token_ids": ids * limit}, one, f"edge.{uuid.uuid4().hex}"):
            pass

    small = 96
    for extra, expect in ((-1, "answered"), (0, "failed")):
        stage = VllmOmniStage(engine=engine, dialect="qwen_omni", max_model_len=small)
        fence = Fence(f"omni-cpu-edge{extra}")
        port = stage.port(fence.session_id)
        await port.open(fence)
        d = port.prompt.dialect
        # The context: system + "<|im_start|>user\nx" + " a" * k + the assistant prefix.
        base = [await stage.host.render({"prompt": t}) for t in (
            d.system_open + port.prompt.system + d.close, d.user_open + "x",
            d.close + d.assistant_open)]
        k = small + extra - sum(len(b["prompt_token_ids"]) for b in base)
        words = "x" + " a" * k
        assert len((await stage.host.render({"prompt": "<|im_start|>user\n" + words}))["prompt_token_ids"]) \
            == len(base[1]["prompt_token_ids"]) + k
        await port.submit(StageInput(fence, fence.request_id("omni"), TextIn(words)))
        await port.submit(StageInput(fence, fence.request_id("omni"), GenerateRequest(
            "r", (), SamplingConfig(temperature=0.0, max_tokens=8), truncation=Truncation("disabled"))))
        text, done = await reply(port)
        if expect == "answered":
            assert isinstance(done, GenerationDone) and done.input_tokens == small - 1
            assert done.output_tokens == 1 and done.finish_reason == "length"
        else:
            assert isinstance(done, StageFailed) and "max_model_len (96" in done.error.message
        await port.close()
        await stage.close()
