"""How early the voice may start: the reply's first phrase at 4, 2 and 1 words,
through the real Piper stage, and whether the voice still sounds whole.

Each reply is streamed into ``PiperTtsStage`` token by token (words, at a
fixed interval standing for the LLM's decode step), the way the pipeline
does; the bench records when the first audio came (after how many words and
how long after the first word) and transcribes the whole spoken reply with
Whisper base: its word error rate against the reply's text says whether
cutting the first phrase short cost intelligibility (the baseline is
``first_words=4``, the earlier default, in the same run).

    .venv/bin/python bench/first_phrase.py [--first-words 4 2 1] [--step-ms 110] [--reps 1]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import machine  # noqa: E402
from lib.speech_corpus import WerCount, pct  # noqa: E402
from vllm_duplex.assets.locate import whisper_model_dir  # noqa: E402
from vllm_duplex.domain.clock import MonotonicClock  # noqa: E402
from vllm_duplex.domain.fence import Fence  # noqa: E402
from vllm_duplex.domain.payloads import AudioOut, GenerationDone, SpeechDone, StageInput, TextDelta  # noqa: E402
from vllm_duplex.stages.listening.whisper_model import load  # noqa: E402
from vllm_duplex.stages.speech.piper import PiperTtsStage  # noqa: E402

REPLIES = (  # what SmolLM2 answers the bench's questions, and a few longer ones
    "The capital of France is Paris.",
    "The largest ocean is the Pacific Ocean.",
    "The Eiffel Tower is in Paris, France.",
    "The capital of Italy is Rome.",
    "A week has seven days.",
    "I'm doing well, thank you for asking. How can I help you today?",
    "Sure, here is a joke: why did the cat sit on the computer? To keep an eye on the mouse.",
    "The sky looks blue because air scatters blue light more than red light.",
)


async def speak(stage: PiperTtsStage, text: str, step_s: float) -> tuple[np.ndarray, int, float]:
    """``text`` streamed word by word; (the audio, words sent before the first
    audio, seconds from the first word to the first audio)."""
    fence = Fence("bench")
    port = stage.port("bench")
    await port.open(fence)
    rid = "resp_bench"
    audio: list[np.ndarray] = []
    first: tuple[int, float] | None = None
    sent = 0
    start = time.perf_counter()

    async def read() -> None:
        nonlocal first
        async for out in port.outputs():
            if isinstance(out.payload, AudioOut) and out.payload.pcm.size:
                if first is None:
                    first = (sent, time.perf_counter() - start)
                audio.append(out.payload.pcm)
            if isinstance(out.payload, SpeechDone):
                return

    reader = asyncio.create_task(read())
    words = text.split(" ")
    for i, word in enumerate(words):
        sent = i + 1
        await port.submit(StageInput(fence, fence.request_id("llm"),
                                     TextDelta(rid, word if i == 0 else " " + word)))
        await asyncio.sleep(step_s)
    await port.submit(StageInput(fence, fence.request_id("llm"), GenerationDone(rid, "stop")))
    await asyncio.wait_for(reader, 60)
    await port.close()
    assert first is not None
    return np.concatenate(audio), first[0], first[1]


async def run(args: argparse.Namespace) -> None:
    print(machine.line(), flush=True)
    whisper = load(whisper_model_dir("whisper-base"), threads=2)
    whisper.warm_up()
    rows: list[tuple[int, float, float, float]] = []
    for n in args.first_words:
        stage = PiperTtsStage(clock=MonotonicClock(), first_words=n)
        await stage.synthesize("Hello there.")  # warm the graph
        wer, words_before, latency = WerCount(), [], []
        for text in REPLIES * args.reps:
            pcm, k, s = await speak(stage, text, args.step_ms / 1000)
            heard = whisper.transcribe(pcm).text
            wer.add(text, heard)
            words_before.append(k)
            latency.append(s)
            print(f"  first_words={n}: first audio after {k} word(s), {1000 * s:4.0f} ms; "
                  f"heard {heard!r}", flush=True)
        stage.shutdown_workers()
        rows.append((n, statistics.median(words_before), statistics.median(latency), wer.wer))
    base = next((r for r in rows if r[0] == 4), rows[0])
    print(f"\nfirst phrase through Piper, words every {args.step_ms} ms "
          f"({len(REPLIES)} replies x {args.reps})")
    print("| first_words | words before the first audio (median) | first word -> first audio "
          "(median) | Whisper base WER on the spoken reply |")
    print("|---:|---:|---:|---:|")
    for n, k, s, w in rows:
        print(f"| {n} | {k:g} | {1000 * s:.0f} ms ({s / base[2]:.2f}x) | {pct(w)} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--first-words", type=int, nargs="+", default=[4, 2, 1])
    p.add_argument("--step-ms", type=float, default=110.0, help="the LLM's decode step per word")
    p.add_argument("--reps", type=int, default=1, help="each reply this many times (Piper samples noise)")
    asyncio.run(run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

