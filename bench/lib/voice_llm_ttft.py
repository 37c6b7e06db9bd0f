"""Part B of the voice latency benchmark: LLM TTFT at end of turn, the vLLM stage driven directly.

A ~``target_tokens`` context (long system prompt with a fresh nonce + history) and one user
turn, run on the stage's ports three ways: streaming prefill (history prefilled, the turn's
words pushed as ``TextIn`` at speech pace, then ``GenerateRequest``), full prefill on a fresh
port (the baseline), and the same full prompt again (a prefix-cache hit, for reference).
Used by ``bench/voice_latency.py``, which describes the figures.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    ResetContext,
    StageFailed,
    StageInput,
    TextDelta,
    TextIn,
)

WORD_INTERVAL_S = 0.30  # one word every 300 ms (~200 words/min)
END_OF_TURN_SILENCE_S = 0.5  # the VAD's default silence_duration_ms before the reply

SYSTEM = (
    "You are a helpful voice assistant for a travel company. You speak with customers on the "
    "phone, so every answer is read aloud by a speech synthesizer: answer in one or two short "
    "sentences, never use lists, tables, markdown, emoji or URLs, and spell out numbers the way "
    "a person would say them. Be warm and polite but brief. If the customer asks about a booking, "
    "ask for the booking reference, which is six letters and digits, before anything else. If "
    "the customer is upset, acknowledge the problem first and then offer one concrete next step. "
    "Never promise refunds; say that a colleague will review the case within two working days. "
    "You know the following facts. Flights can be changed up to twenty four hours before "
    "departure for a fee of forty euros. Hotel bookings can be cancelled free of charge until "
    "six in the evening on the day before arrival. Car rentals require a credit card in the name "
    "of the main driver and a driving licence held for at least one year. Travel insurance covers "
    "cancellations for illness with a doctor's note, but not for a change of mind. Our office "
    "hours are from eight in the morning to eight in the evening, Monday to Saturday. Baggage "
    "allowance is one cabin bag of eight kilograms and one checked bag of twenty three kilograms "
    "on most routes. Children under two travel on a parent's lap and pay ten percent of the adult "
    "fare. Pets up to eight kilograms may travel in the cabin in an approved carrier. If you do "
    "not know an answer, say so and offer to transfer the call to a colleague."
)
HISTORY = (
    ("user", "Hi, I would like to change my flight to Lisbon next week."),
    ("assistant", "Of course. Could you tell me your booking reference, please?"),
    ("user", "It is K7 P2 Q9. I want to leave on Thursday instead of Tuesday."),
    ("assistant", "Thank you. Changing to Thursday is possible for a fee of forty euros."),
    ("user", "That is fine. Can I also bring my small dog in the cabin?"),
    ("assistant", "Yes, pets up to eight kilograms may travel in the cabin in an approved carrier."),
    ("user", "Great. And how much checked baggage can I take on that route?"),
    ("assistant", "You can take one checked bag of twenty three kilograms and one cabin bag."),
)
TURN = "Could you also book me a hotel near the old town for three nights starting on Thursday"


def part_b_context(nonce: str, target_tokens: int, count: Any) -> tuple[ContextMessage, ...]:
    """System prompt (nonce first) + history, trimmed/padded to about ``target_tokens``
    tokens before the new user turn."""
    history = [ContextMessage(r, t) for r, t in HISTORY]
    system = f"Call {nonce}. {SYSTEM}"
    ctx = (ContextMessage("system", system), *history)
    # Pad with more history (repeat) or trim the system prompt to hit the target size.
    while count(ctx) < target_tokens - 40:
        history = history + [ContextMessage(r, t) for r, t in HISTORY[:2]]
        ctx = (ContextMessage("system", system), *history)
    words = system.split()
    while count(ctx) > target_tokens and len(words) > 10:
        words = words[:-5]
        ctx = (ContextMessage("system", " ".join(words)), *history)
    return ctx


@dataclass
class PortRun:
    ttft_s: float = math.nan
    decode_s: float = math.nan  # per token after the first
    input_tokens: int = 0
    status: str = "not run"
    reply: str = ""
    words_ready: bool | None = None  # streaming: every pushed word prefilled at end of turn


class PortReader:
    def __init__(self, port: Any) -> None:
        self.port = port
        self.first_delta_t: float | None = None
        self.text = ""
        self.done: GenerationDone | None = None
        self.done_t: float | None = None
        self.failed: StageFailed | None = None
        self.ended = asyncio.Event()
        self.task = asyncio.create_task(self._read(), name="bench-port-reader")

    async def _read(self) -> None:
        async for out in self.port.outputs():
            p = out.payload
            if isinstance(p, TextDelta):
                if self.first_delta_t is None:
                    self.first_delta_t = time.monotonic()
                self.text += p.text
            elif isinstance(p, GenerationDone):
                self.done, self.done_t = p, time.monotonic()
                self.ended.set()
            elif isinstance(p, StageFailed):
                self.failed = p
                self.ended.set()


def _prefilled(port: Any) -> bool | None:
    """Whether every chunk appended to the port's live request has been computed.
    Reads the port's private state (read only); None when it is not there."""
    live = getattr(port, "_live", None)
    pending = getattr(live, "pending", None)
    return None if pending is None else len(pending) == 0


async def _wait_prefilled(port: Any, timeout: float) -> bool | None:
    deadline = time.monotonic() + timeout
    while (ready := _prefilled(port)) is False and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return ready


async def port_run(stage: Any, ctx: tuple[ContextMessage, ...], *, streaming: bool,
                   max_tokens: int) -> PortRun:
    r = PortRun()
    sid = f"bench-{'stream' if streaming else 'full'}-{uuid.uuid4().hex[:8]}"
    fence = Fence(sid)
    port = stage.port(sid)
    await port.open(fence)
    reader = PortReader(port)
    sampling = SamplingConfig(temperature=0.0, max_tokens=max_tokens)
    turn_ctx = (*ctx, ContextMessage("user", TURN))
    try:
        if streaming:
            # Before the turn: the live request holds the history (in the product, from the
            # previous turns). Then the words arrive while the user speaks.
            await port.submit(StageInput(fence, fence.request_id("llm"), ResetContext(ctx)))
            await _wait_prefilled(port, 60)
            for word in TURN.split():
                await port.submit(StageInput(fence, fence.request_id("llm"), TextIn(word)))
                await asyncio.sleep(WORD_INTERVAL_S)
            await asyncio.sleep(END_OF_TURN_SILENCE_S - WORD_INTERVAL_S)
            r.words_ready = _prefilled(port)
        t0 = time.monotonic()
        await port.submit(StageInput(fence, fence.request_id("resp"),
                                     GenerateRequest(f"resp_{sid}", turn_ctx, sampling)))
        await asyncio.wait_for(reader.ended.wait(), 120)
        if reader.failed is not None:
            r.status = f"failed: {reader.failed.error}"
        elif reader.done is not None and reader.first_delta_t is not None:
            r.ttft_s = reader.first_delta_t - t0
            if reader.done.output_tokens > 1 and reader.done_t is not None:
                r.decode_s = (reader.done_t - reader.first_delta_t) / (reader.done.output_tokens - 1)
            r.input_tokens = reader.done.input_tokens
            r.status = reader.done.finish_reason
            r.reply = reader.text
        else:
            r.status = "no text"
    except TimeoutError:
        r.status = "timeout"
    finally:
        await port.close()
        await asyncio.gather(reader.task, return_exceptions=True)
    return r


async def run_part_b(stage: Any, reps: int, target_tokens: int) -> dict[str, Any]:
    chat = stage.host.chat

    def count(ctx: tuple[ContextMessage, ...]) -> int:
        return len(chat.encode(chat.render(ctx, False)))

    before = {k: getattr(stage, k) for k in ("fast_paths", "rebuilds", "fresh_prefills")}
    full: list[PortRun] = []
    stream: list[PortRun] = []
    hit: list[PortRun] = []
    for rep in range(reps):
        # A fresh nonce for EVERY run (streaming and full included): the first tokens differ,
        # so no block of the prompt can be found in the prefix cache.
        ctx_full = part_b_context(uuid.uuid4().hex[:12], target_tokens, count)
        ctx_stream = part_b_context(uuid.uuid4().hex[:12], target_tokens, count)
        order = ("full", "stream") if rep % 2 == 0 else ("stream", "full")
        for mode in order:
            if mode == "full":
                full.append(await port_run(stage, ctx_full, streaming=False, max_tokens=16))
            else:
                stream.append(await port_run(stage, ctx_stream, streaming=True, max_tokens=16))
        # For reference only: the same full prompt again is a prefix-cache hit.
        hit.append(await port_run(stage, ctx_full, streaming=False, max_tokens=16))
        print(f"  rep {rep + 1}/{reps}: full {full[-1].ttft_s * 1e3:.1f} ms, streaming "
              f"{stream[-1].ttft_s * 1e3:.1f} ms, cached full {hit[-1].ttft_s * 1e3:.1f} ms "
              f"({full[-1].input_tokens} prompt tokens)", flush=True)
    after = {k: getattr(stage, k) for k in before}
    return {"full": full, "stream": stream, "hit": hit,
            "counters": {k: after[k] - before[k] for k in before}}
