"""Barge-in: how soon the user's interruption silences the reply, every time,
this tree against the code before it, in one run.

One ``vllm-duplex serve`` subprocess per side on the default pipeline
(``fast_turns.py``'s sides). Each try opens a session, asks for a long story
(``max_output_tokens`` raised), streams silence while the reply plays for
``--after`` seconds (alternating through the list: early, while the LLM and
Piper are busy making the reply's next pieces, and later), then speaks an
interruption at real time (``lib/voice_scenarios.py``'s ``Conn`` and
``run_barge``). From the slot of the first chunk holding speech (the onset):

* **speech_started**: the client's ``input_audio_buffer.speech_started``;
* **old audio's end**: the last ``response.output_audio.delta`` of the
  interrupted reply (0 when none came after the onset);
* **done**: ``response.done`` (``cancelled``);

per try, and how many tries had both within ``--target-ms`` (100). With
``--busy`` a second session asks questions without pause on the same server
the whole time (another talker's reply on the CPU). The sides take turns try
by try, so both see the same machine.

    .venv/bin/python bench/barge_in.py [--sides before@e5d36d4 now] [--tries 10]
                                       [--after 0.4 1.2] [--busy] [--target-ms 100]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib.sides import Server, Side, machine_line, side_servers  # noqa: E402
from lib.turns import QUESTIONS, ask  # noqa: E402
from lib.voice_scenarios import INTERRUPTION, STORY, Barge, run_barge, utterance  # noqa: E402

STORY_TOKENS = 400


async def other_talker(server: Server) -> None:
    """Questions one after another in their own sessions, until cancelled."""
    n = 0
    while True:
        text, voice, expect = QUESTIONS[n % len(QUESTIONS)]
        await ask(server, "semantic", "busy", text, voice, expect, tail_s=3.0)
        n += 1


def ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.0f}"


def report(rows: list[tuple[str, float, Barge]], sides: list[str], target_s: float) -> None:
    print("\n| side | tries | both ≤ target | speech_started p50 / max | old audio's end p50 / max "
          "| done p50 / max | not cancelled |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for side in sides:
        bs = [b for s, _, b in rows if s == side]
        ok = [b for b in bs if b.status == "cancelled"]

        def p50max(vals: list[float]) -> str:
            vals = [v for v in vals if not math.isnan(v)]
            return f"{ms(statistics.median(vals))} / {ms(max(vals))}" if vals else "-"

        within = sum(b.to_speech_started_s <= target_s and b.to_last_audio_s <= target_s for b in ok)
        print(f"| {side} | {len(bs)} | {within} | {p50max([b.to_speech_started_s for b in ok])} "
              f"| {p50max([b.to_last_audio_s for b in ok])} | {p50max([b.to_done_s for b in ok])} "
              f"| {len(bs) - len(ok)} |")


async def run(args: argparse.Namespace) -> list[tuple[str, float, Barge]]:
    story, stop = utterance(STORY), utterance(INTERRUPTION)
    rows: list[tuple[str, float, Barge]] = []
    with side_servers(args.sides, args.config) as servers:
        for n in range(args.tries):
            after = args.after[n % len(args.after)]
            order = servers if n % 2 == 0 else servers[::-1]  # alternate who goes first
            for s in order:
                busy = asyncio.ensure_future(other_talker(s)) if args.busy else None
                try:
                    if busy is not None:
                        await asyncio.sleep(2.0)  # the other talker is mid-question
                    b = await run_barge(s.url, story, stop, STORY_TOKENS, after)
                finally:
                    if busy is not None:
                        busy.cancel()
                        await asyncio.gather(busy, return_exceptions=True)
                rows.append((s.side, after, b))
                print(f"{s.side:6} after {after:.1f} s  {b.status:10} speech_started "
                      f"{ms(b.to_speech_started_s):>5} ms  old audio's end {ms(b.to_last_audio_s):>5} ms  "
                      f"done {ms(b.to_done_s):>5} ms  deltas after onset {b.deltas_after_onset}",
                      flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sides", nargs="+", default=["before@e5d36d4", "now"],
                   help="NAME[@REF][:KEY=VALUE,...] each (fast_turns.py's sides)")
    p.add_argument("--tries", type=int, default=10)
    p.add_argument("--after", type=float, nargs="+", default=[0.4, 1.2],
                   help="seconds of the reply played before the interruption, in turn")
    p.add_argument("--busy", action="store_true", help="another talker on the server throughout")
    p.add_argument("--target-ms", type=float, default=100.0)
    p.add_argument("--config", default="configs/cascade-cpu.yaml")
    args = p.parse_args(argv)
    load0 = os.getloadavg()
    rows = asyncio.run(run(args))
    print("\n" + machine_line(load0) + ("; another talker throughout" if args.busy else ""))
    report(rows, [Side.parse(spec).name for spec in args.sides], args.target_ms / 1000)
    return 0


if __name__ == "__main__":
    sys.exit(main())
