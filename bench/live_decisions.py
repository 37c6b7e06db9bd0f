"""What a GPT-Live decision costs on the engine's own LLM, against a baseline
run in the same process on the same engine: the same prompt answered greedily
with no grammar and no logprobs (what any one-word reply costs).

- **predicate**: one yes / no question, as ``EngineChooser`` asks it
  (``StructuredOutputsParams(choice=...)`` and the answer's top-20 logprobs).
- **choice of 3**: one question with three values.
- **decision of 3**: a ``decision.create`` of three questions (predicate,
  choice, score), evaluated in order as the socket's runner does.

Each figure is the median over ``--reps`` runs on a short conversation (the
prefix cache warm after the first, as in a session). Run::

    .venv/bin/python bench/live_decisions.py --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from lib import machine
from vllm import SamplingParams
from vllm.inputs import tokens_input
from vllm.sampling_params import RequestOutputKind
from vllm_duplex.realtime.wire.live import decision_eval
from vllm_duplex.stages.vllm.llm import VllmLlmStage
from vllm_duplex.text.decisions import EngineChooser

CONVERSATION = [("user", "What's the weather like in Paris today?"),
                ("assistant", "It is sunny and warm in Paris today.")]
PREDICATE = {"type": "predicate", "instructions": "Did the user ask about the weather?"}
CHOICE = {"type": "choice", "instructions": "Which city did the user ask about?",
          "choices": [{"value": "Tokyo"}, {"value": "Paris"}, {"value": "London"}]}
SCORE = {"type": "score", "instructions": "How urgent is the user's request?",
         "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high"}]}


async def timed(fn, reps: int) -> float:
    runs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await fn()
        runs.append((time.perf_counter() - t0) * 1000)
    return statistics.median(runs)


async def main(reps: int) -> None:
    stage = VllmLlmStage()
    await stage.start()
    host = stage.host
    chooser = EngineChooser(host, "smollm2")
    try:
        def asks(questions):
            return decision_eval.asks(questions, CONVERSATION, [])

        async def plain(ask) -> None:  # the baseline: one greedy word, no grammar
            prompt = host.chat.encode(host.chat.render(ask.messages, True))
            params = SamplingParams(temperature=0.0, max_tokens=2, detokenize=False,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
            async for _ in host.generate(tokens_input(prompt), params, host.request_id("bench")):
                pass

        async def decide(questions) -> None:
            for ask in asks(questions):
                await chooser.choose(ask)

        rows = [("predicate", [PREDICATE]), ("choice of 3", [CHOICE]),
                ("decision of 3", [PREDICATE, CHOICE, SCORE])]
        print(machine.line())
        print(f"{'':16}{'decision ms':>12}{'baseline ms':>13}{'ratio':>8}")
        for name, questions in rows:
            async def baseline(questions=questions) -> None:
                for ask in asks(questions):
                    await plain(ask)
            base = await timed(baseline, reps)
            ms = await timed(lambda questions=questions: decide(questions), reps)
            print(f"{name:16}{ms:12.0f}{base:13.0f}{ms / base:8.2f}")
    finally:
        await stage.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    asyncio.run(main(parser.parse_args().reps))
