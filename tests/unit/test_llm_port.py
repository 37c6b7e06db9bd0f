"""The vLLM LLM port against a fake engine (the real SmolLM2 tokenizer and chat
template, no model): chat templates render in a worker thread, never on the
event loop; submissions keep their order while a render is in flight; a cancel
voids what was being prepared; vLLM request ids encode the session's fence.
The same port on the real engine: ``tests/integration/test_vllm_stage.py``."""

from __future__ import annotations

import asyncio
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest
from transformers import AutoTokenizer
from vllm_duplex.assets.prepare import prepared_model_dir
from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.fence import Fence, parse_request_id
from vllm_duplex.domain.payloads import (
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    ResetContext,
    StageInput,
    TextDelta,
    TextIn,
)

pytest.importorskip("vllm")
from vllm_duplex.stages.vllm.llm import VllmLlmStage  # noqa: E402

FENCE = Fence("s1")
FRANCE = (ContextMessage("user", "What is the capital of France?"),)


@dataclass
class Completion:
    token_ids: list[int]
    finish_reason: str | None = None


@dataclass
class Out:
    outputs: list[Completion]
    finished: bool = False


@dataclass
class FakeEngine:
    """Records the chunks of each request (their text, as the tokenizer reads
    it back); a prefill chunk yields one token, a reply chunk ``reply``."""

    tokenizer: Any
    reply: str = "Paris."
    errored: bool = False
    calls: list[tuple[str, list[tuple[str, int]]]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    warmups: list[list[tuple[str, int | None]]] = field(default_factory=list)

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def abort(self, ids: Any) -> None:
        self.aborted += ids if isinstance(ids, list) else [ids]

    async def generate(self, prompt: Any, params: Any, request_id: str):
        if request_id.startswith("duplex-warmup"):
            warm: list[tuple[str, int | None]] = []
            self.warmups.append(warm)
            async for inp in prompt if inspect.isasyncgen(prompt) else _one(prompt, params):
                text = self.tokenizer.decode(inp.prompt["prompt_token_ids"], skip_special_tokens=False)
                warm.append((text, inp.sampling_params.logprobs))
                yield Out([Completion([7], "length")])
            return
        chunks: list[tuple[str, int]] = []
        self.calls.append((request_id, chunks))
        async for inp in prompt if inspect.isasyncgen(prompt) else _one(prompt, params):
            text = self.tokenizer.decode(inp.prompt["prompt_token_ids"], skip_special_tokens=False)
            chunks.append((text, inp.sampling_params.max_tokens))
            if inp.sampling_params.max_tokens == 1:
                yield Out([Completion([7], "length")])
                continue
            ids = [*self.tokenizer.encode(self.reply, add_special_tokens=False),
                   self.tokenizer.eos_token_id]
            for i, tok in enumerate(ids):
                yield Out([Completion([tok], "stop" if i == len(ids) - 1 else None)])


async def _one(prompt: Any, params: Any):
    from vllm.engine.protocol import StreamingInput

    yield StreamingInput(prompt, params)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(prepared_model_dir()))


async def open_port(engine: FakeEngine):
    stage = VllmLlmStage(engine=engine)  # type: ignore[arg-type]
    port = stage.port("s1")
    await port.open(FENCE)
    return stage, port


def item(payload: Any, fence: Fence = FENCE, role: str = "llm") -> StageInput:
    return StageInput(fence, fence.request_id(role), payload)


def ask(context=FRANCE, rid: str = "r1") -> GenerateRequest:
    return GenerateRequest(rid, context, SamplingConfig(max_tokens=16))


async def reply(port: Any) -> tuple[str, list[Any]]:
    outs: list[Any] = []
    stream = port.outputs()
    async with asyncio.timeout(10):
        async for out in stream:
            outs.append(out)
            if isinstance(out.payload, GenerationDone):
                break
    await stream.aclose()
    return "".join(o.payload.text for o in outs if isinstance(o.payload, TextDelta)), outs


def record_threads(stage: VllmLlmStage, gate: threading.Event | None = None) -> list[int]:
    """Wrap the chat template's render: the threads it runs on (and, with
    ``gate``, renders wait for it)."""
    chat, threads = stage.host.chat, []
    render = chat.render

    def recorded(*args: Any, **kwargs: Any) -> str:
        threads.append(threading.get_ident())
        if gate is not None:
            gate.wait(10)
        return render(*args, **kwargs)

    chat.render = recorded  # type: ignore[method-assign]
    return threads


async def test_chat_templates_render_off_the_event_loop(tokenizer):
    engine = FakeEngine(tokenizer)
    stage, port = await open_port(engine)
    threads = record_threads(stage)
    await port.submit(item(ResetContext((ContextMessage("system", "Be brief."),))))
    for word in "What is the capital of France?".split():
        await port.submit(item(TextIn(word)))
    await port.submit(item(ask(((ContextMessage("system", "Be brief."), *FRANCE)))))
    text, outs = await reply(port)
    assert text == "Paris." and outs[-1].payload.finish_reason == "stop"
    assert len(threads) == 3  # the reset, the user message's opener, the reply's prompt
    assert threading.get_ident() not in threads
    # One live request: the reset, the words (the first opens the user message), the prefix.
    (vllm_id, chunks), = engine.calls
    assert [t for t, _ in chunks] == [
        "<|im_start|>system\nBe brief.<|im_end|>\n", "<|im_start|>user\nWhat", " is", " the",
        " capital", " of", " France?", "<|im_end|>\n<|im_start|>assistant\n"]
    assert [n for _, n in chunks] == [1] * 7 + [16]
    assert (stage.fast_paths, stage.rebuilds, stage.fresh_prefills) == (1, 0, 0)  # the reply extended it
    # The vLLM request id encodes the session's fence (plus a unique suffix).
    base, _, suffix = vllm_id.rpartition(".")
    assert parse_request_id(base) == (FENCE, "llm") and suffix.isdigit()
    await port.close()
    assert engine.aborted == [vllm_id]


async def test_input_during_a_render_waits_its_turn_and_a_cancel_voids_it(tokenizer):
    engine = FakeEngine(tokenizer)
    stage, port = await open_port(engine)
    gate = threading.Event()
    threads = record_threads(stage, gate)
    first = asyncio.create_task(port.submit(item(TextIn("Hello"))))
    while not threads:  # the opener's render is in its thread, held by the gate
        await asyncio.sleep(0.01)
    await port.submit(item(TextIn("there")))  # waits behind it, in order
    await port.submit(item(ask((ContextMessage("user", "Hello there"),))))
    assert not engine.calls
    gate.set()
    await first
    text, _ = await reply(port)
    (_, chunks), = engine.calls
    texts = [t for t, _ in chunks]  # (SmolLM2's template adds its default system message)
    assert text == "Paris." and texts[0].endswith("<|im_end|>\n<|im_start|>user\nHello")
    assert texts[1:] == [" there", "<|im_end|>\n<|im_start|>assistant\n"]

    # A cancel while the next submission renders: it is dropped, not sent.
    gate.clear()
    newer = FENCE.next_epoch()
    renders = len(threads)
    rendering = asyncio.create_task(port.submit(item(ResetContext(FRANCE))))
    while len(threads) == renders:
        await asyncio.sleep(0.01)
    cancel = asyncio.create_task(port.cancel(newer))
    await asyncio.sleep(0.05)
    gate.set()
    await asyncio.gather(rendering, cancel)
    assert len(engine.calls) == 1 and len(chunks) == 3  # nothing of the old fence went out
    await port.submit(item(ask(rid="r2"), fence=newer))
    text, outs = await reply(port)
    assert text == "Paris." and all(o.fence == newer for o in outs)
    await port.close()


async def test_the_warm_up_streams_a_turn_as_a_session_does(tokenizer):
    """A fresh engine's first prompt of a turn's length and its first logprobs
    cost seconds on CPU: the warm-up pays them, in one streaming-input request
    (the instructions, then the user's words, each chunk with the turn-end
    logprobs), so the first user's P(end) comes in time."""
    engine = FakeEngine(tokenizer)
    stage = VllmLlmStage(engine=engine)  # type: ignore[arg-type]
    await stage.start()
    try:
        (warm,) = engine.warmups
        texts = [text for text, _ in warm]
        assert len(texts) == 2 and "<|im_start|>system" in texts[0]
        assert texts[0].rstrip().endswith("What is the") and texts[1] == " capital of France"
        assert all(logprobs == stage.host.probe_logprobs == 20 for _, logprobs in warm)
    finally:
        await stage.shutdown()
