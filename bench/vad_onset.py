"""VAD onset bench (issue 44 item 3): how soon Silero starts speech after a
voice begins, and that noise never starts it -- offline, no server, this
tree's ``SileroVad`` with one onset phase (the code before: 32 ms windows on
one grid) against two (the windows of a second phase half a window later,
``onset_phases``), in one process.

    python bench/vad_onset.py [--leads 8] [--noise-s 90] [--json out.json]

Speech: the real people of ``bench/real_voices`` (every recording) and our
synthetic voices saying interruptions ("Stop, wait a moment please.",
"Wait, wait.", "Hold on a second.", "No, that's wrong.", "Actually, I have a
question."), each placed after ``--leads`` different lengths of silence
(0.30 s plus 0-31 ms, so the 32 ms window grid falls everywhere on the
onset). Everything goes through the session's input path as a socket sends
it: 24 kHz PCM16 in 20 ms chunks through ``InputBuffer`` (soxr to 16 kHz,
whose filter holds back 2.5-20 ms of audio), each chunk to the VAD as the
stage gets it. The onset is the first 20 ms chunk louder than -40 dBFS (as
``bench/barge_in.py`` takes it); the decision is the chunk whose arrival made
``VadSpeechStarted``: latency = (decision chunk - onset chunk) x 20 ms, what
a live session adds to it is the server's and the socket's time
(``bench/barge_in_hops.py``).

Noise: fan, line hiss, music and keyboard (typing)
(``vllm_duplex.testing.noise``) at -35 / -25 / -15 / -10 dBFS, ``--noise-s``
seconds each: any ``VadSpeechStarted`` is a false barge-in.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine
from lib.real_corpus import RECORDINGS
from lib.speech_corpus import espeak, flite
from vllm_duplex.domain.payloads import VadSpeechStarted
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.session.input_buffer import InputBuffer
from vllm_duplex.stages.listening.silero_vad import SileroVad, load_model
from vllm_duplex.testing import noise

RATE = 16000
WIRE = 24000
CHUNK_MS = 20
ONSET_DBFS = -40.0
PHASES = {"before (one phase)": 1, "now (two phases)": 2}
INTERRUPTIONS = ("Stop, wait a moment please.", "Wait, wait.", "Hold on a second.",
                 "No, that's wrong.", "Actually, I have a question.")
SYNTHETIC = (flite("slt"), flite("awb"), flite("rms"), flite("kal16"), espeak("en-us+f3"),
             espeak("en-gb"))
NOISES = ("fan", "line_hiss", "music", "keyboard")
LEVELS = (-35, -25, -15, -10)
TARGET_MS = 100


def wire_chunks(pcm16k: np.ndarray) -> list[bytes]:
    wire = soxr.resample(pcm16k.astype(np.float32) / 32768, RATE, WIRE)
    wire = (np.clip(wire, -1, 1) * 32767).astype("<i2")
    step = WIRE * CHUNK_MS // 1000
    return [wire[i:i + step].tobytes() for i in range(0, wire.size - step + 1, step)]


def onset_chunk(chunks: list[bytes]) -> int | None:
    floor = 32768.0 * 10 ** (ONSET_DBFS / 20)
    for i, c in enumerate(chunks):
        x = np.frombuffer(c, "<i2").astype(np.float64)
        if np.sqrt(np.mean(x * x)) > floor:
            return i
    return None


def started_chunks(chunks: list[bytes], phases: int, model: Any) -> list[int]:
    """The chunks whose arrival made a ``VadSpeechStarted`` (the session's input path)."""
    buf = InputBuffer(AudioFormat(), max_ms=3_600_000, clock=lambda: 0.0)
    vad = SileroVad(model, onset_phases=phases)
    out = []
    for i, c in enumerate(chunks):
        audio = buf.append(c)
        if audio is not None and any(isinstance(e, VadSpeechStarted)
                                     for e in vad.feed(audio.pcm, audio.start_ms)):
            out.append(i)
        if len(buf._chunks) > 64:  # noqa: SLF001 -- a bench: keep the buffer small
            buf.trim_idle(0)
    return out


def speech_cases(leads: int) -> list[tuple[str, np.ndarray]]:
    cases = [(f"real {r.name}", r.audio()) for r in RECORDINGS]
    cases += [(f"{v.name}: {t}", v.speak(t)) for v in SYNTHETIC for t in INTERRUPTIONS]
    out = []
    for name, pcm in cases:
        for j in range(leads):
            lead = np.zeros(int(RATE * (0.3 + j * 0.032 / leads)), np.int16)
            out.append((name, np.concatenate([lead, pcm[:RATE * 3], np.zeros(RATE // 2, np.int16)])))
    return out


def measure(leads: int, noise_s: float) -> dict[str, Any]:
    model = load_model()
    speech: dict[str, list[float]] = {side: [] for side in PHASES}
    names: list[str] = []
    for name, pcm in speech_cases(leads):
        chunks = wire_chunks(pcm)
        on = onset_chunk(chunks)
        if on is None:
            continue
        names.append(name)
        for side, phases in PHASES.items():
            # (before the onset chunk: Silero heard a soft start under -40 dBFS)
            started = started_chunks(chunks, phases, model)
            speech[side].append((started[0] - on) * CHUNK_MS if started else float("nan"))
    makers = noise.makers([])  # babble is people talking: not noise to this bench
    false: dict[str, dict[str, int]] = {side: {} for side in PHASES}
    for kind in NOISES:
        for db in LEVELS:
            chunks = wire_chunks(makers[kind](noise_s, db))
            for side, phases in PHASES.items():
                false[side][f"{kind} {db}"] = len(started_chunks(chunks, phases, model))
    return {"machine": machine.line(), "speech_ms": speech, "names": names, "false_onsets": false,
            "noise_s": noise_s, "leads": leads}


def summary(result: dict[str, Any]) -> None:
    print(f"\n{result['machine']}")
    print("\n| side | onsets | within 100 ms | p50 | p90 | max | missed | false onsets in noise "
          "(fan, hiss, music, typing) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for side, vals in result["speech_ms"].items():
        heard = [v for v in vals if v == v]
        q = statistics.quantiles(heard, n=10)
        false = result["false_onsets"][side]
        falses = sum(false.values())
        print(f"| {side} | {len(vals)} | {sum(v <= TARGET_MS for v in heard)} "
              f"| {statistics.median(heard):.0f} | {q[8]:.0f} | {max(heard):.0f} "
              f"| {len(vals) - len(heard)} | {falses} |")
    slow = {}
    for side, vals in result["speech_ms"].items():
        for name, v in zip(result["names"], vals):
            if not v <= TARGET_MS:
                slow.setdefault(name, {})[side] = v
    print("\nover 100 ms (or missed):")
    for name, by in sorted(slow.items()):
        print(f"  {name}: " + ", ".join(f"{side.split()[0]} {v:.0f}" for side, v in by.items()))
    print(f"\n({result['noise_s']:.0f} s of each noise at each of {LEVELS} dBFS)")
    for side, false in result["false_onsets"].items():
        print(side, {k: n for k, n in false.items() if n})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--leads", type=int, default=8, help="grid placements per utterance")
    p.add_argument("--noise-s", type=float, default=90.0)
    p.add_argument("--json")
    args = p.parse_args(argv)
    result = measure(args.leads, args.noise_s)
    summary(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
