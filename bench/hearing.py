"""Hearing: the final transcripts a user gets, streamed through the server at
real time, this tree against the code before it, in one run.

Two ``vllm-duplex serve`` subprocesses on the default pipeline
(``configs/cascade-cpu.yaml`` of each tree; ``fast_turns.py``'s sides). Each
utterance of the speech bench (``lib/speech_corpus.py``) is spoken into its own
realtime session at real time with the server's default turn detection, an
open microphone (silence keeps flowing), and the session's
``conversation.item.input_audio_transcription.completed`` is scored against
the text: word error rate per voice and overall, for the **tuned** part (the
sentences and voices the defaults were chosen on) and the **held-out** part
(written before anything was measured on them; never used to choose a
setting) apart. The sides take turns utterance by utterance, so both see the
same machine. Also per side: the gap from the end of the speech to the
completed transcript at the client (p50 / p90).

    .venv/bin/python bench/hearing.py [--sides before@e5d36d4 now] [--tuned 8] [--held-out 12]

``--tuned N`` / ``--held-out N``: the first N sentences of each part, in
every voice of the part.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from lib.sides import Server, Side, machine_line, side_servers  # noqa: E402
from lib.speech_corpus import RATE as CORPUS_RATE  # noqa: E402
from lib.speech_corpus import (  # noqa: E402
    ASR_QUESTIONS,
    HELD_OUT_SENTENCES,
    HELD_OUT_VOICES,
    VOICES,
    Voice,
    WerCount,
    pct,
)
from lib.turns import last_loud_s  # noqa: E402
from support.speech_fixtures import RATE, chunks  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402

LEAD_S, TAIL_S = 0.3, 2.0  # silence around each utterance (the microphone stays open)


@dataclass
class Heard:
    side: str
    part: str
    voice: str
    text: str
    transcript: str | None = None  # None: no completed transcript within the wait
    after_ms: float | None = None  # end of speech -> the completed transcript at the client


async def hear(server: Server, part: str, voice: Voice, text: str, pcm: np.ndarray) -> Heard:
    heard = Heard(server.side, part, voice.name, text)
    async with await RealtimeClient.connect(server.url) as client:
        start = time.monotonic()

        async def send() -> None:
            for i, chunk in enumerate(chunks(pcm)):
                await client.append_audio(chunk)
                await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))

        sender = asyncio.ensure_future(send())
        try:
            while time.monotonic() - start < len(pcm) / RATE + 15:
                try:
                    event = await client.recv(timeout=1.0)
                except TimeoutError:
                    continue
                if event["type"] == "conversation.item.input_audio_transcription.completed":
                    heard.transcript = event["transcript"]
                    heard.after_ms = (event["_recv_t"] - start - last_loud_s(pcm)) * 1000
                    break
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    return heard


def corpus(tuned: int, held_out: int) -> list[tuple[str, Voice, str, np.ndarray]]:
    def spoken(voice: Voice, text: str) -> np.ndarray:
        # The corpus speaks at 16 kHz; the session's input is the Realtime default, 24 kHz.
        speech = soxr.resample(voice.speak(text), CORPUS_RATE, RATE).astype(np.int16)
        lead, tail = np.zeros(int(RATE * LEAD_S), np.int16), np.zeros(int(RATE * TAIL_S), np.int16)
        return np.concatenate([lead, speech, tail])

    return ([("tuned", v, t, spoken(v, t)) for v in VOICES for t in ASR_QUESTIONS[:tuned]]
            + [("held-out", v, t, spoken(v, t)) for v in HELD_OUT_VOICES
               for t in HELD_OUT_SENTENCES[:held_out]])


def report(heard: list[Heard], sides: list[str]) -> None:
    print("\n| part | side | WER | worst voice | per voice | missing | end of speech → final p50 / p90 |")
    print("|---|---|---:|---:|---|---:|---:|")
    for part in ("tuned", "held-out"):
        for side in sides:
            rows = [h for h in heard if h.side == side and h.part == part]
            if not rows:
                continue
            per: dict[str, WerCount] = {}
            for h in rows:
                per.setdefault(h.voice, WerCount()).add(h.text, h.transcript or "")
            total = WerCount(sum(w.errors for w in per.values()), sum(w.words for w in per.values()))
            after = sorted(h.after_ms for h in rows if h.after_ms is not None)
            timing = (f"{statistics.median(after):.0f} / {after[int(0.9 * (len(after) - 1))]:.0f} ms"
                      if after else "-")
            voices = ", ".join(f"{v.split(' ', 1)[1]} {pct(w.wer).strip()}" for v, w in per.items())
            print(f"| {part} | {side} | {pct(total.wer).strip()} | {pct(max(w.wer for w in per.values())).strip()} "
                  f"| {voices} | {sum(h.transcript is None for h in rows)} | {timing} |")


async def run(args: argparse.Namespace) -> list[Heard]:
    items = corpus(args.tuned, args.held_out)
    heard: list[Heard] = []
    with side_servers(args.sides, args.config) as servers:
        for n, (part, voice, text, pcm) in enumerate(items):
            order = servers if n % 2 == 0 else servers[::-1]  # alternate who goes first
            for s in order:
                h = await hear(s, part, voice, text, pcm)
                heard.append(h)
                print(f"{h.side:6} {part:8} {voice.name:22} {h.after_ms or float('nan'):5.0f} ms "
                      f"{text!r} -> {h.transcript!r}", flush=True)
    return heard


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sides", nargs="+", default=["before@e5d36d4", "now"],
                   help="NAME[@REF][:KEY=VALUE,...] each (fast_turns.py's sides)")
    p.add_argument("--tuned", type=int, default=8, help="sentences of the tuned part (x 6 voices)")
    p.add_argument("--held-out", type=int, default=len(HELD_OUT_SENTENCES),
                   help="sentences of the held-out part (x 4 voices)")
    p.add_argument("--config", default="configs/cascade-cpu.yaml")
    args = p.parse_args(argv)
    load0 = os.getloadavg()
    heard = asyncio.run(run(args))
    print("\n" + machine_line(load0))
    report(heard, [Side.parse(spec).name for spec in args.sides])
    return 0


if __name__ == "__main__":
    sys.exit(main())
