"""The echo canceller's CPU (``audio.input.echo_cancellation``), this tree
against another, on the same signals.

    python bench/echo_cpu.py [--before REF] [--rounds 5] [--seconds 30]

One session's canceller (``EchoCanceller()``, the product's default) fed
20 ms chunks of a microphone that hears a reply as echo (a medium room at
-10 dB, 60 ms device latency, fan noise) with a pause in it, as fast as it
goes; its process time per second of audio is the CPU share a session pays.
Each side runs in its own child process (``REF``'s tree imported in place
of this one, as the benches with sides do) and the sides take turns round by
round: the machine's drift between runs (a shared, virtual machine) shows
in each side's spread, and the lowest of each is compared.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine

# Run in a child: argv = [tree, bench file, seconds]; prints the CPU share as JSON.
_MEASURE = r"""
import sys, time
import numpy as np
sys.path.insert(0, str(__import__("pathlib").Path(sys.argv[1]).parent))
from lib.rooms import ROOMS, impulse
from lib.speech_corpus import VOICES
from vllm_duplex.media.echo import EchoCanceller
from vllm_duplex.testing import noise
from vllm_duplex.testing.room import Room
seconds = float(sys.argv[2])
reply = np.concatenate([VOICES[0].speak("The capital of France is Paris, a city of museums."),
                        np.zeros(16000, np.int16),
                        VOICES[4].speak("Shall I book a table for two at seven tonight?")])
reply = np.tile(reply, int(seconds * 16000) // reply.size + 1)[:int(seconds * 16000)]
room = Room(impulse(ROOMS[1], -10.0), 16000, seconds=seconds + 1,
            noise=noise.fan(seconds + 1, -55).astype(np.float64))
room.play(reply, 0)
mic = room.mic(0, reply.size, np.zeros(reply.size)).astype(np.int16)
ec = EchoCanceller()
t = time.process_time()
for i in range(0, reply.size - 319, 320):
    ec.process(mic[i:i + 320], reply[i:i + 320])
print(100 * (time.process_time() - t) / seconds)
"""


def measure(ref: str | None, seconds: float) -> float:
    from lib.sides import REPO, TREE_IMPORTS, before_tree

    root = before_tree(ref) if ref else REPO
    out = subprocess.run([sys.executable, "-c", TREE_IMPORTS + _MEASURE, str(root), __file__,
                          str(seconds)], check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", default=None, help="a git ref to measure beside this tree")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=30.0, help="audio per run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    load0 = os.getloadavg()
    sides = {"now": None} | ({f"before ({args.before})": args.before} if args.before else {})
    runs: dict[str, list[float]] = {name: [] for name in sides}
    for k in range(args.rounds):
        for name, ref in (sides.items() if k % 2 == 0 else reversed(sides.items())):
            runs[name].append(measure(ref, args.seconds))
    print(machine.line(), f"(load before {load0[0]:.2f})")
    for name, values in runs.items():
        print(f"{name}: {min(values):.2f} % of a core per session "
              f"(runs {', '.join(f'{v:.2f}' for v in values)})")
    if args.before:
        before = min(runs[f"before ({args.before})"])
        print(f"now / before: {min(runs['now']) / before:.2f}")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
