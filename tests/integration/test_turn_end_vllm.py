"""P(end of turn) from the REAL engine (SmolLM2-135M-Instruct): every chunk of
user words pushed into a session's live request comes back as a
``TurnEndProbability``, read from the dropped token of that chunk -- no extra
request, no re-prefill -- and it tells a complete question from an
unfinished one.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from vllm_duplex.domain.payloads import (
    ContextMessage,
    ResetContext,
    StageInput,
    TurnEndProbability,
)
from vllm_duplex.stages.vllm.llm import VllmLlmStage
from support.vllm_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    ask,
    no_leaked_tasks,
    open_port,
    speak,
    user,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

SYSTEM = (ContextMessage("system", "You are a helpful voice assistant. Answer in one short sentence."),)


async def probabilities(port, n: int, timeout: float = 60.0) -> list[TurnEndProbability]:
    got: list[TurnEndProbability] = []
    stream = port.outputs()

    async def read() -> None:
        async for out in stream:
            if isinstance(out.payload, TurnEndProbability):
                got.append(out.payload)
                if len(got) == n:
                    return

    try:
        await asyncio.wait_for(read(), timeout)
    finally:
        await stream.aclose()
    return got


async def test_each_pushed_word_says_how_likely_the_turn_ends_there(vllm_stage: VllmLlmStage) -> None:
    port, fence = await open_port(vllm_stage, "turn-end")
    try:
        await port.submit(StageInput(fence, fence.request_id("llm"), ResetContext(SYSTEM)))
        started = time.perf_counter()
        words = "what is the capital of france"
        await speak(port, fence, words)
        got = await probabilities(port, len(words.split()))
        per_word_ms = (time.perf_counter() - started) * 1000 / len(got)
        assert [g.text for g in got] == [" ".join(words.split()[:n]) for n in range(1, 7)]
        p = {g.text: g.p for g in got}
        print(f"P(end): {p}; {per_word_ms:.0f} ms per pushed word")
        assert p["what is the capital of france"] > 0.1  # complete: a fast commit
        assert p["what is the capital of"] < 0.01  # unfinished: wait
        assert p["what is the capital of"] < p["what is the capital of france"] / 20
        # The live request still answers from those words (the probe changed nothing).
        text, _ = await ask(port, fence, (*SYSTEM, user(words)))
        assert "paris" in text.lower()
    finally:
        await port.close()
