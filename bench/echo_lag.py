"""Echo lag bench (issue 44): self-interruptions when the client's speaker
plays the reply later than the server's model of its playback
(``plugin/session/echo.py``) says -- its own buffers, a player that ran dry
and refilled -- with the reference held back to meet the echo
(``plugin/media/echo_lag.py``, the product) and without (``align=False``,
the code before it).

    python bench/echo_lag.py [--lags 60,300,500,700] [--levels -10,0] [--replies 9]
        [--json out.json]

The room bench's self-interruption count (``room_echo.py``): each reply (its
voices and answers) played as echo alone in one of its three rooms, the
device's latency being the lag (60 ms there), through the product's input
path on a virtual clock; a reply with any Silero onset in the VAD's view
would have interrupted itself. Both ways run in the same process on the same
microphone signals.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import room_echo as bench
from lib import machine
from lib.rooms import ROOMS, impulse
from vllm_duplex.media.echo import EchoCanceller
from vllm_duplex.media.echo_linear import FILTER_MS
from vllm_duplex.testing import noise
from vllm_duplex.testing.room import Room

WAYS = {"as it came": False, "held back": True}  # the reference: EchoCanceller(align=...)


def measure(lags: list[int], levels: list[float], replies: int) -> dict[str, Any]:
    from vllm_duplex.stages.listening.silero_vad import load_model

    vad_model = load_model()
    variant = bench.linear(FILTER_MS)  # the product's canceller, as the room bench names it
    hum = noise.fan(30.0, -55).astype(np.float64)
    said = [bench.VOICES[i % len(bench.VOICES)].speak(bench.REPLIES[i % len(bench.REPLIES)])
            for i in range(replies)]
    rows = []
    for lag in lags:
        for level in levels:
            row: dict[str, Any] = {"lag_ms": lag, "level_db": level}
            for way, align in WAYS.items():
                interrupted = []
                for k, reply in enumerate(said):
                    room_spec = ROOMS[k % len(ROOMS)]
                    n = int((bench.SENT_AT + reply.size / bench.RATE + 1.0) * bench.RATE)
                    room = Room(impulse(room_spec, level, device_ms=lag), bench.RATE,
                                seconds=n / bench.RATE + 1, noise=hum)
                    room.play(reply, int(bench.SENT_AT * bench.RATE))
                    mic = bench.in_room(room, n)
                    echo = EchoCanceller(residual="broadband", words="linear",
                                         filter_ms=FILTER_MS, align=align)
                    _, vad_pcm, _ = bench.run_input(mic, reply, variant, echo=echo)
                    if bench.onsets_ms(vad_model, vad_pcm, variant):
                        interrupted.append(f"{k} ({room_spec[0]})")
                row[way] = interrupted
            rows.append(row)
            print(f"lag {lag} ms, echo {level:+.0f} dB: self-interruptions of {replies}: "
                  + ", ".join(f"{way} {len(row[way])} {row[way]}" for way in WAYS), flush=True)
    return {"machine": machine.info(), "replies": replies, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lags", default="60,300,500,700",
                    help="the echo's lag behind the modelled playback (ms), comma-separated")
    ap.add_argument("--levels", default="-10,0", help="echo levels (dB), comma-separated")
    ap.add_argument("--replies", type=int, default=9, help="replies per lag and level")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    print(machine.line(), flush=True)
    result = measure([int(x) for x in args.lags.split(",")],
                     [float(x) for x in args.levels.split(",")], args.replies)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
