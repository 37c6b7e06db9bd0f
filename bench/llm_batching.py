"""Does one session's P(end) or first token wait behind other sessions' replies?

    .venv/bin/python bench/llm_batching.py [--busy 0 1 3 7] [--reps 6]

The product's vLLM stage (``VllmLlmStage``: one engine, one streaming-input
request per session, the machine's dtype and core binding) with ``B`` other
sessions each speaking a long reply (greedy, 160 tokens, again and again),
and one more session that takes turns as a user does: its words pushed as an
``append_tokens`` chunk, P(end) read from that chunk's dropped token
(``TurnEndProbability``), then the reply asked for. Per ``B``: the probe's
**P(end) latency** (words submitted -> P(end) out) and **first-token
latency** (reply asked for -> first text out), p50 / p90, beside the engine
**step time** (the busy replies' median gap between tokens) -- the baseline
row is ``B = 0``, in the same process. vLLM's scheduler puts a new chunk's
prefill into the next step beside the running decodes, so both latencies
stay about one or two steps however many replies are running; the step
grows with the batch. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import machine  # noqa: E402
from vllm_duplex.domain.contracts import SamplingConfig  # noqa: E402
from vllm_duplex.domain.fence import Fence  # noqa: E402
from vllm_duplex.domain.payloads import (  # noqa: E402
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    ResetContext,
    StageInput,
    TextDelta,
    TextIn,
    TurnEndProbability,
)

SYSTEM = ContextMessage("system", "You are a helpful voice assistant. Answer in one short sentence.")
STORY = ContextMessage("user", "Tell me a very long story about a dragon and a knight.")
LONG = SamplingConfig(temperature=0.0, max_tokens=160)
SHORT = SamplingConfig(temperature=0.0, max_tokens=8)
QUESTION = "What is the capital of France?"


class Busy:
    """A session speaking long replies back to back; the gaps between its tokens."""

    def __init__(self, stage, name: str) -> None:
        self.stage, self.name = stage, name
        self.gaps: list[float] = []
        self.running = True

    async def run(self) -> None:
        fence = Fence(self.name)
        port = self.stage.port(self.name)
        await port.open(fence)
        outputs = port.outputs()
        k = 0
        try:
            while self.running:
                k += 1
                await port.submit(StageInput(fence, fence.request_id("resp"),
                                             GenerateRequest(f"r{k}", (SYSTEM, STORY), LONG)))
                last = None
                async for out in outputs:
                    if isinstance(out.payload, TextDelta):
                        now = time.perf_counter()
                        if last is not None:
                            self.gaps.append(now - last)
                        last = now
                    if isinstance(out.payload, GenerationDone):
                        break
        finally:
            await port.close()


async def probe_turns(stage, name: str, reps: int) -> tuple[list[float], list[float]]:
    """(P(end) latencies, first-token latencies) of ``reps`` turns of one session."""
    p_end, first = [], []
    for r in range(reps):
        fence = Fence(f"{name}-{r}")
        port = stage.port(fence.session_id)
        await port.open(fence)
        outputs = port.outputs()
        try:
            await port.submit(StageInput(fence, fence.request_id("in"), ResetContext((SYSTEM,))))
            await asyncio.sleep(0.3)  # the instructions are in before the user talks
            t0 = time.perf_counter()
            await port.submit(StageInput(fence, fence.request_id("in"), TextIn(QUESTION)))
            async for out in outputs:
                if isinstance(out.payload, TurnEndProbability):
                    p_end.append(time.perf_counter() - t0)
                    break
            t0 = time.perf_counter()
            await port.submit(StageInput(fence, fence.request_id("resp"), GenerateRequest(
                "answer", (SYSTEM, ContextMessage("user", QUESTION)), SHORT)))
            async for out in outputs:
                if isinstance(out.payload, TextDelta) and out.payload.text.strip():
                    first.append(time.perf_counter() - t0)
                    break
        finally:
            await port.close()
    return p_end, first


def pct(xs: list[float], q: float) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return f"{1000 * xs[min(len(xs) - 1, int(q * len(xs)))]:.0f}"


async def main_async(args: argparse.Namespace) -> None:
    from vllm_duplex.stages.vllm.llm import VllmLlmStage

    stage = VllmLlmStage()
    await stage.start()
    try:
        await probe_turns(stage, "warm", 2)
        print("\n| other sessions replying | engine step p50 (ms) | P(end) p50 / p90 (ms) "
              "| first token p50 / p90 (ms) |")
        print("|---|---|---|---|")
        for b in args.busy:
            busy = [Busy(stage, f"busy{b}-{i}") for i in range(b)]
            tasks = [asyncio.create_task(x.run()) for x in busy]
            await asyncio.sleep(2.0 if b else 0.0)  # every reply streaming
            p_end, first = await probe_turns(stage, f"probe{b}", args.reps)
            for x in busy:
                x.running = False
            await asyncio.gather(*tasks)
            gaps = [g for x in busy for g in x.gaps]
            step = f"{1000 * statistics.median(gaps):.0f}" if gaps else "-"
            print(f"| {b} | {step} | {pct(p_end, .5)} / {pct(p_end, .9)} | "
                  f"{pct(first, .5)} / {pct(first, .9)} |", flush=True)
    finally:
        await stage.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--busy", nargs="+", type=int, default=[0, 1, 3, 7])
    p.add_argument("--reps", type=int, default=6)
    args = p.parse_args(argv)
    print(machine.line(), flush=True)
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
