"""The omni stages: the scripted one's port contract and deterministic reply,
the prompt dialects, and the vLLM one's chunk building against a fake engine
(no vLLM engine starts here), plus the scripted deployment end to end
without a socket."""

from __future__ import annotations

import asyncio
import inspect
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from support.audio import pcm16
from support.sessions import next_event
from vllm_duplex.domain import commands as cmd
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.omni import OmniInstructions, OmniUnit
from vllm_duplex.domain.payloads import (
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    StageInput,
    StageOutput,
    TextDelta,
    TextIn,
)
from vllm_duplex.host.deploy import load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.host.stage_types import build_stage
from vllm_duplex.stages.omni.prompt import DIALECTS, OmniPrompt, dialect
from vllm_duplex.testing.clock import VirtualClock
from vllm_duplex.testing.omni import Heard, ScriptedOmniStage, describe

FENCE = Fence("s1")


def unit(seconds: float = 1.0, frames: tuple[tuple[int, int], ...] = ((64, 48),), start_ms: int = 0,
         final: bool = False) -> OmniUnit:
    return OmniUnit(np.zeros(int(16000 * seconds), np.int16),
                    tuple(np.zeros((h, w, 3), np.uint8) for w, h in frames), start_ms=start_ms,
                    final=final)


def gen_request(rid: str = "resp_1", max_tokens: int | None = None,
                context: tuple[ContextMessage, ...] = ()) -> GenerateRequest:
    return GenerateRequest(rid, context, SamplingConfig(max_tokens=max_tokens))


def item(payload: Any, fence: Fence = FENCE, role: str = "omni") -> StageInput:
    return StageInput(fence, fence.request_id(role), payload)


async def collect(port: Any, until: type = GenerationDone, timeout: float = 5.0) -> list[StageOutput]:
    outs = []
    it = port.outputs().__aiter__()
    async with asyncio.timeout(timeout):
        while True:
            out = await it.__anext__()
            outs.append(out)
            if isinstance(out.payload, until):
                return outs


def text_of(outs: list[StageOutput]) -> str:
    return "".join(o.payload.text for o in outs if isinstance(o.payload, TextDelta))


# ---- the scripted omni stage ------------------------------------------------------------


def test_describe_says_what_was_received():
    heard = Heard()
    heard.add_unit(unit(1.0, ((32, 24),)))
    heard.add_unit(unit(1.0, ((64, 48),)))
    assert describe(heard) == "I heard 2.0 s of audio in 2 units and saw 2 frames, the last 64x48."
    one = Heard()
    one.add_unit(unit(0.5, ()))
    one.words = 1
    assert describe(one) == "I heard 0.5 s of audio in 1 unit and saw no frames. You typed 1 word."


async def test_scripted_omni_port_contract():
    stage = ScriptedOmniStage(clock=MonotonicClock(), token_interval_s=0)
    port = stage.port("s1")
    assert port.accepts(unit()) and port.accepts(gen_request()) and port.accepts(TextIn("x"))
    assert port.accepts(OmniInstructions("x")) and not port.accepts("audio")
    with pytest.raises(RuntimeError):
        await port.submit(item(unit()))  # not open
    await port.open(FENCE)
    with pytest.raises(TypeError):
        await port.submit(item("nope"))
    await port.submit(item(OmniInstructions("Be brief.")))
    await port.submit(item(unit(1.0, ((32, 24),))))
    await port.submit(item(unit(1.0, ((64, 48),), start_ms=1000, final=True)))
    await port.submit(item(gen_request()))
    outs = await collect(port)
    expected = "I heard 2.0 s of audio in 2 units and saw 2 frames, the last 64x48."
    assert text_of(outs) == expected
    deltas = [o.payload.text for o in outs if isinstance(o.payload, TextDelta)]
    assert len(deltas) == len(expected.split())  # word by word
    done = outs[-1].payload
    assert done.finish_reason == "stop" and done.output_tokens == len(deltas)
    assert all(o.fence == FENCE and o.stage == "omni" for o in outs)
    # The next turn starts from nothing.
    await port.submit(item(TextIn("hello there you")))
    await port.submit(item(gen_request("resp_2")))
    assert text_of(await collect(port)) == "I heard 0.0 s of audio in 0 units and saw no frames. You typed 3 words."
    await port.close()
    assert [o async for o in port.outputs()] == []  # outputs end after close
    await port.close()  # idempotent


async def test_scripted_omni_reply_respects_max_tokens():
    stage = ScriptedOmniStage(clock=MonotonicClock(), token_interval_s=0)
    port = stage.port("s1")
    await port.open(FENCE)
    await port.submit(item(unit()))
    await port.submit(item(gen_request(max_tokens=3)))
    outs = await collect(port)
    assert text_of(outs) == "I heard 1.0 "
    assert outs[-1].payload.finish_reason == "length"
    await port.close()


async def test_scripted_omni_cancel_stops_the_reply():
    clock = VirtualClock()
    stage = ScriptedOmniStage(clock=clock, token_interval_s=0.05)
    port = stage.port("s1")
    await port.open(FENCE)
    await port.submit(item(unit()))
    await port.submit(item(gen_request()))
    it = port.outputs().__aiter__()
    first = await it.__anext__()
    assert first.payload.text == "I "
    await port.cancel(FENCE.next_epoch())
    assert stage.aborted_requests == 1
    await clock.advance(10)
    # Work of the old fence is refused; units under the new one still count.
    await port.submit(item(unit(), fence=FENCE))
    await port.submit(item(unit(2.0), fence=FENCE.next_epoch()))
    await port.submit(item(gen_request("resp_2"), fence=FENCE.next_epoch()))
    outs: list[StageOutput] = []
    async with asyncio.timeout(5):
        while not (outs and isinstance(outs[-1].payload, GenerationDone)):
            nxt = asyncio.ensure_future(it.__anext__())
            while not nxt.done():
                await clock.advance(0.05)
            outs.append(nxt.result())
    assert text_of(outs) == "I heard 2.0 s of audio in 1 unit and saw 1 frame, the last 64x48."
    assert all(o.fence == FENCE.next_epoch() for o in outs)
    await port.close()


async def test_omni_unit_validates_its_data():
    with pytest.raises(ValueError):
        OmniUnit(np.zeros((2, 2), np.int16))
    with pytest.raises(ValueError):
        OmniUnit(np.zeros(4, np.int16), frames=(np.zeros((4, 4), np.uint8),))
    u = OmniUnit(np.array([16384, -32768], np.int16))
    assert u.audio_f32().dtype == np.float32 and u.audio_f32().tolist() == [0.5, -1.0]
    assert OmniUnit(np.zeros(8000, np.float32)).duration_ms == 500


# ---- prompt dialects (pure) -------------------------------------------------------------


def test_qwen_omni_chunks():
    p = OmniPrompt(dialect("qwen_omni"), "Be brief.")
    c1 = p.unit(unit())
    c2 = p.unit(unit(0.5, ()))
    g = p.generation()
    p.reply("Hello there.")
    c3 = p.unit(unit(1.0, ((8, 8), (8, 8))))
    assert [c.text for c in p.history] == [
        "<|im_start|>system\nBe brief.<|im_end|>\n",
        "<|im_start|>user\n<|vision_bos|><|IMAGE|><|vision_eos|><|audio_bos|><|AUDIO|><|audio_eos|>",
        "<|audio_bos|><|AUDIO|><|audio_eos|>",
        "<|im_end|>\n<|im_start|>assistant\n",
        "Hello there.",
        ("<|im_end|>\n<|im_start|>user\n<|vision_bos|><|IMAGE|><|vision_eos|><|vision_bos|><|IMAGE|>"
         "<|vision_eos|><|audio_bos|><|AUDIO|><|audio_eos|>"),
    ]
    assert g.kind == "generation" and c1.kind == c2.kind == c3.kind == "unit"
    prompt = c1.prompt()
    (audio, rate), = prompt["multi_modal_data"]["audio"]
    assert rate == 16000 and audio.dtype == np.float32 and audio.size == 16000
    (image,) = prompt["multi_modal_data"]["image"]
    assert image.size == (64, 48) and image.mode == "RGB"
    assert "image" not in c2.prompt()["multi_modal_data"]
    assert p.history[0].prompt() == {"prompt": "<|im_start|>system\nBe brief.<|im_end|>\n"}


def test_minicpmo_chunks():
    p = OmniPrompt(dialect("minicpmo"))
    p.unit(unit())
    p.text("what is this")
    p.generation()
    texts = [c.text for c in p.history]
    assert texts[0].startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert texts[1] == "<|im_start|>user\n<unit>(<image>./</image>)(<audio>./</audio>)"
    assert texts[2] == " what is this"
    assert texts[3] == "<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("name", sorted(DIALECTS))
def test_a_unit_too_short_for_the_model_is_padded_with_silence(name):
    """The end of a turn can be a few ms of audio; the model's processor
    gives that no token (vLLM then refuses the chunk), so it is padded."""
    d = dialect(name)
    p = OmniPrompt(d)
    short = p.unit(unit(0.01, ()))
    (audio,) = short.audios
    assert audio.size == d.min_audio_ms * 16 and not audio[160:].any()
    long = p.unit(unit(0.5, ()))
    assert long.audios[0].size == 8000  # long enough: as it came


def test_system_prompt_changes_rewrite_the_first_chunk():
    p = OmniPrompt(DIALECTS["qwen_omni"])
    assert not p.set_system("")  # the default already
    assert not p.set_system("A")  # nothing sent yet: no rebuild
    p.unit(unit())
    assert not p.set_system("A")
    assert p.set_system("B") and p.history[0].text == "<|im_start|>system\nB<|im_end|>\n"
    with pytest.raises(ValueError):
        dialect("llama")


def test_generation_after_an_aborted_reply_closes_it():
    p = OmniPrompt(dialect("qwen_omni"), "S")
    p.generation()
    assert p.reply("") is None  # aborted before its first token: nothing to keep
    p.text("again")
    assert [c.text for c in p.history][1:] == ["<|im_start|>assistant\n",
                                               "<|im_end|>\n<|im_start|>user\nagain"]


def test_the_oldest_messages_leave_the_context_and_it_stays_chatml():
    """Truncation drops whole messages after the system block: a user turn
    (its units and words), an assistant reply with its prefix."""
    p = OmniPrompt(dialect("qwen_omni"), "S")
    p.unit(unit())
    p.text("and this")
    p.generation()
    p.reply("One.")
    p.text("Second question")
    p.generation()
    p.reply("Two.")
    p.unit(unit(0.5, ()))
    assert p.messages() == [(1, 3), (3, 5), (5, 6), (6, 8), (8, 9)]
    removed = p.drop(1)  # the first user turn: both its chunks, its audio and image with them
    assert [c.kind for c in removed] == ["unit", "text"] and removed[0].audios
    assert [c.text for c in p.history][:3] == ["<|im_start|>system\nS<|im_end|>\n",
                                               "<|im_start|>assistant\n", "One."]
    p.drop(1)  # the reply: the next user turn follows the system block, its opening tag whole
    assert [c.text for c in p.history][:2] == ["<|im_start|>system\nS<|im_end|>\n",
                                               "<|im_start|>user\nSecond question"]
    assert p.messages() == [(1, 2), (2, 4), (4, 5)] and p.history[1].opens
    assert "".join(c.text for c in p.history[1:]).count("<|im_start|>") == 3
    assert p.drop(0) == [] and len(p.history) == 5


# ---- the vLLM omni stage against a fake engine -------------------------------------------

END = 99
VOCAB = {1: "Hello", 2: " there", 3: ".", 7: "x", END: "<|im_end|>"}


class FakeTokenizer:
    """A slow (pure Python) tokenizer: the reply decoder takes vLLM's slow
    incremental path with it."""

    is_fast = False
    all_special_ids = (END,)

    def __len__(self) -> int:
        return max(VOCAB) + 1

    def get_added_vocab(self) -> dict[str, int]:
        return {}

    def convert_ids_to_tokens(self, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
        return [VOCAB[i] for i in ids if not (skip_special_tokens and i == END)]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.convert_ids_to_tokens(ids, skip_special_tokens))


class PassThroughRenderer:
    """Hands the prompt dicts back (so tests read their text), with a token
    per character as vLLM's renderer adds the tokens."""

    class default_cmpl_tok_params:  # noqa: N801 - mimics vLLM's attribute
        @staticmethod
        def with_kwargs(**kw: Any) -> dict[str, Any]:
            return kw

    async def render_cmpl_async(self, prompts: list[Any], params: Any) -> list[Any]:
        return [{**p, "prompt_token_ids": list(range(len(p["prompt"])))} for p in prompts]


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
    """Records what ``generate`` receives: one list of StreamingInputs per
    request. Prefill chunks yield one token, a generation chunk the reply
    (optionally held after ``hold_after`` tokens until ``gate`` is set)."""

    reply: tuple[int, ...] = (1, 2, 3, END)
    hold_after: int | None = None
    errored: bool = False
    calls: list[tuple[str, list[Any]]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    renderer: Any = field(default_factory=PassThroughRenderer)

    def get_tokenizer(self) -> FakeTokenizer:
        return FakeTokenizer()

    async def abort(self, ids: Any) -> None:
        self.aborted += ids if isinstance(ids, list) else [ids]

    def shutdown(self) -> None:
        pass

    async def generate(self, prompt: Any, params: Any, request_id: str):
        if not inspect.isasyncgen(prompt):  # the warm-up
            yield Out([Completion([7], "length")], finished=True)
            return
        chunks: list[Any] = []
        self.calls.append((request_id, chunks))
        async for inp in prompt:
            chunks.append(inp)
            if inp.sampling_params.max_tokens == 1:
                yield Out([Completion([7], "length")])
                continue
            for i, tok in enumerate(self.reply):
                if self.hold_after is not None and i == self.hold_after:
                    await self.gate.wait()
                yield Out([Completion([tok], "stop" if i == len(self.reply) - 1 else None)])


def texts(chunks: list[Any]) -> list[str]:
    return [c.prompt["prompt"] for c in chunks]


async def open_port(engine: FakeEngine, dialect_name: str = "qwen_omni"):
    pytest.importorskip("vllm")
    from vllm_duplex.stages.omni.vllm_omni import VllmOmniStage

    stage = VllmOmniStage(engine=engine, dialect=dialect_name, clock=MonotonicClock())
    port = stage.port("s1")
    await port.open(FENCE)
    return stage, port


@pytest.mark.parametrize("name, unit_text", [
    ("qwen_omni", "<|im_start|>user\n<|vision_bos|><|IMAGE|><|vision_eos|><|audio_bos|><|AUDIO|><|audio_eos|>"),
    ("minicpmo", "<|im_start|>user\n<unit>(<image>./</image>)(<audio>./</audio>)"),
])
async def test_units_stream_into_one_live_request(name, unit_text):
    engine = FakeEngine()
    stage, port = await open_port(engine, name)
    await port.submit(item(OmniInstructions("Be brief.")))
    await port.submit(item(unit()))
    await port.submit(item(unit(0.4, (), final=True)))
    await port.submit(item(gen_request(max_tokens=20, context=(ContextMessage("system", "Be brief."),))))
    outs = await collect(port)
    assert text_of(outs) == "Hello there."
    (rid, chunks), = engine.calls
    assert rid.startswith(FENCE.request_id("omni"))
    d = DIALECTS[name]
    assert texts(chunks) == ["<|im_start|>system\nBe brief.<|im_end|>\n", unit_text,
                             d.unit_open + d.audio, "<|im_end|>\n<|im_start|>assistant\n"]
    # The reply's input tokens: what the request held as it started (here a
    # token per character of the rendered chunks).
    held = sum(len(t) for t in texts(chunks))
    assert outs[-1].payload == GenerationDone("resp_1", "stop", input_tokens=held, output_tokens=4)
    # Intermediate chunks prefill (one dropped token); the last one generates.
    assert [c.sampling_params.max_tokens for c in chunks] == [1, 1, 1, 20]
    mm = chunks[1].prompt["multi_modal_data"]
    assert mm["audio"][0][1] == 16000 and mm["audio"][0][0].shape == (16000,)
    assert mm["image"][0].size == (64, 48)
    assert chunks[2].prompt["multi_modal_data"]["audio"][0][0].shape == (6400,)
    # The next turn continues the same request, closing the reply first.
    await port.submit(item(unit()))
    await port.submit(item(gen_request("resp_2")))
    assert text_of(await collect(port)) == "Hello there."
    assert len(engine.calls) == 1
    assert texts(chunks)[4] == "<|im_end|>\n<|im_start|>user\n" + unit_text.split("\n", 1)[1]
    assert port.prompt.history[4].text == "Hello there."  # the KV holds the reply but its last token
    assert stage.rebuilds == 0
    await port.close()
    assert engine.aborted  # close aborts the live request


async def test_barge_in_aborts_the_reply_and_replays_the_context():
    engine = FakeEngine(hold_after=1)
    stage, port = await open_port(engine)
    await port.submit(item(unit()))
    await port.submit(item(gen_request()))
    it = port.outputs().__aiter__()
    first = await asyncio.wait_for(it.__anext__(), 5)
    assert first.payload == TextDelta("resp_1", "Hello")
    # Input during the reply waits for it ...
    newer = FENCE.next_epoch()
    await port.cancel(newer)  # ... a barge-in aborts it
    assert engine.aborted == [engine.calls[0][0]]
    await port.submit(item(unit(0.5, ()), fence=newer))
    await port.submit(item(gen_request("resp_2"), fence=newer))
    engine.gate.set()
    outs = []
    async with asyncio.timeout(5):
        while not (outs and isinstance(outs[-1].payload, GenerationDone)):
            outs.append(await it.__anext__())
    assert text_of(outs) == "Hello there." and outs[-1].payload.response_id == "resp_2"
    assert all(o.fence == newer for o in outs)
    # A new request replayed everything, with the part of the reply that was sent.
    assert len(engine.calls) == 2 and stage.rebuilds == 1
    replay = texts(engine.calls[1][1])
    assert replay[:4] == texts(engine.calls[0][1]) + ["Hello"]
    assert replay[4:] == ["<|im_end|>\n<|im_start|>user\n<|audio_bos|><|AUDIO|><|audio_eos|>",
                          "<|im_end|>\n<|im_start|>assistant\n"]
    await port.close()


async def test_a_long_cut_reply_stays_in_the_context_of_a_short_next_reply():
    """The omni barge-in flake (issue 42): a reply asked for many tokens is cut
    late, then the session asks the next one for 8. The user's next units
    must not leave the cut exchange out to make room for a reply as large as
    the last one's max_tokens (half the context, here): the 8-token reply
    fits beside all of it. Before, whether the model still held the first
    exchange depended on how far the first reply got before the barge-in."""
    pytest.importorskip("vllm")
    from vllm_duplex.stages.omni.vllm_omni import VllmOmniStage

    engine = FakeEngine(reply=(1, 2) * 100 + (END,), hold_after=80)
    stage = VllmOmniStage(engine=engine, dialect="qwen_omni", clock=MonotonicClock(),
                          max_model_len=1000, default_max_tokens=16, stop_loops=False)
    port = stage.port("s1")
    await port.open(FENCE)
    try:
        await port.submit(item(OmniInstructions("Be brief.")))
        await port.submit(item(unit(frames=())))
        await port.submit(item(gen_request("resp_1", max_tokens=4000)))
        it = port.outputs().__aiter__()
        heard = ""
        async with asyncio.timeout(5):
            while len(heard) < 400:  # 80 tokens of "Hello there": 440 characters
                heard += (await it.__anext__()).payload.text
        newer = FENCE.next_epoch()
        await port.cancel(newer)  # the barge-in
        engine.gate.set()
        for u in (unit(frames=()), unit(frames=()), unit(0.3, (), final=True)):
            await port.submit(item(u, fence=newer))
            # Units come a second apart: the new request has rendered what it
            # replayed (the cut reply's tokens are known) before the next one.
            async with asyncio.timeout(5):
                while port.live is None or len(port.live.rendered) < port.live.sent:
                    await asyncio.sleep(0.01)
        context = (ContextMessage("system", "Be brief."), ContextMessage("assistant", heard))
        await port.submit(item(gen_request("resp_2", max_tokens=8, context=context), fence=newer))
        async with asyncio.timeout(5):
            while not isinstance((out := await it.__anext__()).payload, GenerationDone):
                pass
        assert out.payload.response_id == "resp_2"
        history = port.prompt.history
        kinds = [c.kind for c in history]
        # About 700 of the 1000 tokens: all of it stays, the cut reply as it was heard.
        assert kinds == ["system", "unit", "generation", "reply", "unit", "unit", "unit", "generation",
                         "reply"]
        assert history[3].text == heard and port.truncations == 0
        held = sum(len(c.text) for c in history[:-1])  # a token per character
        assert out.payload.input_tokens == held < 1000 - 8
    finally:
        await port.close()


@dataclass
class SlowToTake(FakeEngine):
    """vLLM's input task sends each chunk to the engine after the renderer
    made it (and marked its audio as held by the engine): here the second
    request's chunk ``slow`` waits for ``take`` before it is added; what each
    aborted request had been given is kept in ``given``."""

    slow: int = 4
    take: asyncio.Event = field(default_factory=asyncio.Event)
    given: dict[str, int] = field(default_factory=dict)

    async def abort(self, ids: Any) -> None:
        await super().abort(ids)
        for rid, chunks in self.calls:
            if rid in (ids if isinstance(ids, list) else [ids]):
                self.given[rid] = len(chunks)

    async def generate(self, prompt: Any, params: Any, request_id: str):
        if not inspect.isasyncgen(prompt):
            async for out in super().generate(prompt, params, request_id):
                yield out
            return
        second = len(self.calls) == 1

        async def gated():
            n = 0
            async for inp in prompt:
                if second and n == self.slow:
                    await self.take.wait()
                n += 1
                yield inp

        async for out in super().generate(gated(), params, request_id):
            yield out


async def test_a_request_is_replaced_only_once_the_engine_has_every_chunk_sent():
    """The second omni barge-in flake (issue 42): the request that replayed a
    cut reply is replaced when the client heard less of it; a unit queued on
    it just before had been rendered (its audio marked as held by the engine)
    but not yet sent, the abort cancelled it, and the new request's copy
    failed with vLLM's "Multi-modal cache miss": the unit never reached the
    model and the next reply lost its first token (7 of 8). The port now
    waits until the engine took every chunk queued before it aborts."""
    engine = SlowToTake(hold_after=2)
    _, port = await open_port(engine)
    try:
        await port.submit(item(unit(frames=())))
        await port.submit(item(gen_request("resp_1")))
        it = port.outputs().__aiter__()
        released = [(await asyncio.wait_for(it.__anext__(), 5)).payload for _ in range(2)]
        assert released == [TextDelta("resp_1", "Hello"), TextDelta("resp_1", " there")]
        newer = FENCE.next_epoch()
        await port.cancel(newer)  # the barge-in: the client got "Hello" only
        engine.gate.set()
        await port.submit(item(unit(frames=()), fence=newer))  # replays into a second request
        heard = (ContextMessage("assistant", "Hello"),)

        async def take_later() -> None:
            await asyncio.sleep(0.2)
            engine.take.set()

        taker = asyncio.create_task(take_later())
        await port.submit(item(gen_request("resp_2", context=heard), fence=newer))
        async with asyncio.timeout(5):
            while not isinstance((out := await it.__anext__()).payload, GenerationDone):
                pass
        await taker
        assert port.heard_replays == 1 and out.payload.response_id == "resp_2"
        # The request replaced (the second) had every chunk queued on it in the engine.
        second = engine.aborted[1]
        assert engine.given.get(second, 0) == 5
        replayed = texts(engine.calls[-1][1])
        assert replayed[3] == "Hello" and len(replayed) == 6
        assert out.payload.output_tokens == 4  # every token of the reply is the reply's
    finally:
        await port.close()


async def test_units_during_a_reply_wait_and_survive_an_epoch_bump():
    engine = FakeEngine(hold_after=1)
    _, port = await open_port(engine)
    await port.submit(item(unit()))
    await port.submit(item(gen_request()))
    it = port.outputs().__aiter__()
    await asyncio.wait_for(it.__anext__(), 5)
    await port.submit(item(unit(0.2, ())))  # deferred behind the reply
    assert len(engine.calls[0][1]) == 3
    await port.cancel(FENCE.next_epoch())
    # The unit was heard: it went on (into a new request), the reply did not.
    await asyncio.sleep(0.05)
    assert texts(engine.calls[1][1])[-1] == "<|im_end|>\n<|im_start|>user\n<|audio_bos|><|AUDIO|><|audio_eos|>"
    await port.close()


async def test_new_instructions_rebuild_the_context():
    engine = FakeEngine()
    stage, port = await open_port(engine)
    await port.submit(item(OmniInstructions("A")))
    await port.submit(item(unit()))
    await asyncio.sleep(0.05)
    assert texts(engine.calls[0][1])[0] == "<|im_start|>system\nA<|im_end|>\n"
    await port.submit(item(OmniInstructions("B")))
    await port.submit(item(unit()))
    await asyncio.sleep(0.05)
    assert len(engine.calls) == 2 and stage.rebuilds == 1
    assert texts(engine.calls[1][1])[0] == "<|im_start|>system\nB<|im_end|>\n"
    assert len(engine.calls[1][1]) == 3
    await port.close()


async def test_chunks_are_rendered_by_the_engines_renderer():
    rendered: list[Any] = []

    class TokParams:
        def with_kwargs(self, **kw):
            return kw

    class Renderer:
        default_cmpl_tok_params = TokParams()

        async def render_cmpl_async(self, prompts, params):
            rendered.append((prompts, params))
            return [{"type": "token", "prompt_token_ids": [1, 2], "prompt": prompts[0]["prompt"]}]

    engine = FakeEngine()
    engine.renderer = Renderer()
    _, port = await open_port(engine)
    await port.submit(item(unit()))
    await asyncio.sleep(0.05)
    assert [p for p, _ in rendered][1][0]["multi_modal_data"]["audio"]
    assert all(params == {"add_special_tokens": False} for _, params in rendered)
    assert engine.calls[0][1][0].prompt["type"] == "token"
    await port.close()


def test_gpu_config_builds_its_omni_stage_without_starting_it():
    pytest.importorskip("vllm")
    from vllm_duplex.stages.omni.vllm_omni import VllmOmniStage

    config = load_config("omni-gpu")
    assert config.policy == "omni"
    spec = next(s for s in config.stages if s.type == "vllm_omni")
    stage = build_stage(spec, MonotonicClock())
    assert isinstance(stage, VllmOmniStage) and not stage.healthy
    assert stage.dialect is DIALECTS["qwen_omni"]
    assert stage.engine_kwargs["limit_mm_per_prompt"]["audio"] == 1


# ---- the scripted deployment, driven without a socket ------------------------------------


async def test_omni_scripted_deployment_answers_a_turn():
    runtime = Runtime(load_config("omni-scripted"))
    await runtime.start()
    try:
        assert runtime.capabilities()["policies"]["omni"]["input_modalities"] == [
            "audio", "image", "text", "video"]
        session = await runtime.sessions.open(None)
        for _ in range(10):  # 0.2 s of silence, then speech
            session.deliver(cmd.AudioAppend(audio=pcm16(0.02)))
        for _ in range(15):
            session.deliver(cmd.AudioAppend(audio=pcm16(0.02, 0.3)))
        await next_event(session, "input_audio_buffer.speech_started")
        for _ in range(85):
            session.deliver(cmd.AudioAppend(audio=pcm16(0.02, 0.3)))
        for _ in range(30):  # the VAD's silence_duration_ms, and the resampler's delay
            session.deliver(cmd.AudioAppend(audio=pcm16(0.02)))
        await next_event(session, "input_audio_buffer.committed")
        text = ""
        while True:
            env = await next_event(session, "response.output_text.delta", "response.done")
            if env.event.type == "response.done":
                assert env.event.response["status"] == "completed"
                break
            text += env.event.delta
        # From onset (0 ms: 0.2 s of silence, within the prefix padding) through
        # 2 s of speech and the silence until the VAD's stop: about 2.7 s.
        m = re.fullmatch(r"I heard (\d\.\d) s of audio in 3 units and saw no frames\.", text)
        assert m is not None and 2.6 <= float(m.group(1)) <= 2.8, text
        await runtime.sessions.end(session, CloseReason.CLIENT)
    finally:
        await runtime.stop()


async def test_omni_scripted_deployment_sees_the_camera():
    """The video wire path into a native omni model: frames sent during a turn
    ride along in the turn's units (``duplex.video.frame`` → session →
    ``OmniPolicy`` → ``scripted_omni``)."""
    import io

    from PIL import Image

    runtime = Runtime(load_config("omni-scripted"))
    await runtime.start()
    try:
        session = await runtime.sessions.open(None)
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), (10, 200, 30)).save(buf, "PNG")
        for _ in range(15):
            session.deliver(cmd.AudioAppend(audio=pcm16(0.02, 0.3)))
        await next_event(session, "input_audio_buffer.speech_started")
        for i in range(85):
            session.deliver(cmd.AudioAppend(audio=pcm16(0.02, 0.3)))
            if i % 25 == 0:  # a frame every half second
                session.deliver(cmd.VideoFrameIn(image=buf.getvalue(), timestamp_ms=i * 20))
        for _ in range(30):
            session.deliver(cmd.AudioAppend(audio=pcm16(0.02)))
        text = ""
        while True:
            env = await next_event(session, "response.output_text.delta", "response.done")
            if env.event.type == "response.done":
                break
            text += env.event.delta
        m = re.search(r"saw (\d+) frames?, the last 64x48", text)
        assert m is not None and int(m.group(1)) >= 1, text  # how many: tests/test_omni_policy.py
        await runtime.sessions.end(session, CloseReason.CLIENT)
    finally:
        await runtime.stop()
