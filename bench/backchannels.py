"""The engine's own backchannels ("Mm-hmm."; ``session/backchannel.py``)
over long utterances on the real pipeline.

One server (``configs/cascade-cpu.yaml``: Silero -> Whisper -> vLLM SmolLM2
-> Piper) in this process; each utterance is streamed into the realtime
socket at real time (20 ms chunks) under ``semantic_vad`` (auto) while a
reader takes the events as they arrive. The utterances are long turns with
pauses inside them: real people's recordings (``bench/real_voices``: read
audiobooks cut between two words mid-sentence, where 1 s thinking pauses
are put; JFK's speech with its own), and Flite statements and questions;
three end with a question. Per utterance, with
``session.audio.output.backchannels`` on (defaults) and, as the baseline in
the same run, off:

* **offered**: ``duplex.output_audio.backchannel`` events;
* **over a question's end**: one arriving after the last word of an
  utterance that ends with a question (target 0);
* **started over speech**: the clip starts (when it reaches the client, on
  the input's timeline: the audio is streamed at real time) while the user's
  input is voiced (target 0); and how much of the clips the user's next
  words overlapped (the clip plays on as the user resumes);
* **pause -> backchannel**: from the end of the voiced audio before it to
  its arrival;
* **turn gap**: the end of the last word -> the first reply audio, on and off
  (what the feature costs the reply).

    .venv/bin/python bench/backchannels.py [--repeat 1]

The machine's load moves every timing: the script prints the load beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import soxr  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib import machine  # noqa: E402
from lib.real_corpus import RATE as REAL_RATE  # noqa: E402
from lib.real_corpus import RECORDINGS  # noqa: E402
from support.speech_fixtures import RATE, say, speak  # noqa: E402
from vllm_duplex.host.deploy import load_config  # noqa: E402
from vllm_duplex.host.runtime import Runtime  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402
from vllm_duplex.realtime.server.serving import BackgroundServer  # noqa: E402

GAP_S = 1.0  # the pauses strung between the pieces of one turn
FRAME = RATE // 50  # 20 ms


@dataclass
class Utterance:
    name: str
    pcm: np.ndarray  # int16 at RATE, with 0.3 s before and 2 s after
    question: bool  # it ends with a question


def _real(name: str) -> np.ndarray:
    rec = next(r for r in RECORDINGS if r.name == name)
    return soxr.resample(rec.audio(), REAL_RATE, RATE).astype(np.int16)


def _voiced(pcm: np.ndarray) -> np.ndarray:
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > 300)
    return pcm[loud[0]:loud[-1] + 1]


def _turn(*pieces: np.ndarray) -> np.ndarray:
    gap = np.zeros(int(GAP_S * RATE), np.int16)
    out = [np.zeros(int(0.3 * RATE), np.int16)]
    for i, p in enumerate(pieces):
        out += [gap] if i else []
        out.append(p)
    out.append(np.zeros(2 * RATE, np.int16))
    return np.concatenate(out)


def _cut(pcm: np.ndarray, *at: float) -> list[np.ndarray]:
    """``pcm`` cut between two words near each fraction ``at`` of it (in the
    middle of the quiet run of 60 ms or more nearest to it): the words
    before a cut are mid-sentence, as a thinking pause's are."""
    frames = voiced_frames(pcm)
    quiet = []  # (start, end) frame runs
    i = 0
    while i < len(frames):
        if not frames[i]:
            j = i
            while j < len(frames) and not frames[j]:
                j += 1
            if j - i >= 3 and i > 0 and j < len(frames):
                quiet.append((i, j))
            i = j
        else:
            i += 1
    cuts = sorted({(a + b) // 2 * FRAME for a, b in (
        min(quiet, key=lambda r: abs((r[0] + r[1]) / 2 - f * len(frames))) for f in at)})
    edges = [0, *cuts, len(pcm)]
    return [pcm[a:b] for a, b in zip(edges, edges[1:])]


def utterances() -> list[Utterance]:
    flite = lambda text: _voiced(speak(text))  # noqa: E731
    return [
        # One long read sentence, with two thinking pauses put between its words.
        Utterance("real: ls-1221, 2 pauses mid-sentence",
                  _turn(*_cut(_real("ls-1221-135766-0001"), 0.4, 0.7)), False),
        Utterance("real: ls-2412, 2 pauses mid-sentence",
                  _turn(*_cut(_real("ls-2412-153948-0000"), 0.35, 0.7)), False),
        Utterance("real: librivox-sense 0870 + 0920, a pause mid-sentence in each",
                  _turn(*_cut(_real("librivox-sense-0870"), 0.5),
                        *_cut(_real("librivox-sense-0920"), 0.5)), False),
        Utterance("real: jfk (its own pauses)", _turn(_real("jfk-inaugural")), False),
        Utterance("real + question: ls-2412 (a pause mid-sentence) + 'what do you make of that?'",
                  _turn(*_cut(_real("ls-2412-153948-0000"), 0.5),
                        flite("So what do you make of that?")), True),
        Utterance("flite: statement, pauses, question", _turn(
            flite("So I spent the whole morning in the garden and"),
            flite("then I walked over to the market to buy some bread and"),
            flite("do you know what time the market closes on Sundays?")), True),
        Utterance("flite: long question", _turn(flite(
            "I have been reading about the history of Europe all week and now I wonder "
            "what is the capital of France?")), True),
    ]


def voiced_frames(pcm: np.ndarray) -> np.ndarray:
    """Per 20 ms frame: whether the input is speech there (its level)."""
    n = len(pcm) // FRAME
    level = np.abs(pcm[:n * FRAME].astype(np.int32)).reshape(n, FRAME).mean(axis=1)
    return level > max(150.0, 0.08 * float(np.quantile(level, 0.95)))


async def run_one(server: BackgroundServer, u: Utterance, on: bool) -> dict:
    counter = server.runtime.metrics.backchannels
    before = dict(counter.values)
    out = await _talk(server.ws_url, u, on)
    out["outcomes"] = {dict(k)["outcome"]: int(v - before.get(k, 0))
                       for k, v in counter.values.items() if v != before.get(k, 0)}
    return out


async def _talk(url: str, u: Utterance, on: bool) -> dict:
    output = {"backchannels": {} if on else None}
    session = {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "auto"}},
                         "output": output}}
    async with await RealtimeClient.connect(url) as client:
        await client.update_session(session)
        speaking = asyncio.create_task(say(client, u.pcm))
        try:
            await client.collect_response(timeout=180)
        except TimeoutError:
            pass
        start = await speaking
    voiced = voiced_frames(u.pcm)
    last = float(np.flatnonzero(voiced)[-1] + 1) * 0.02  # the end of the last word (s)
    out = {"offered": 0, "over_question": 0, "over_speech": 0, "overlap_ms": [], "delay_ms": [],
           "gap_s": None}
    for e in client.events:
        if e["type"] == "duplex.output_audio.backchannel":
            at = e["_recv_t"] - start  # where the input stream was when it arrived
            i = int(at / 0.02)
            out["offered"] += 1
            if u.question and at >= last:
                out["over_question"] += 1
            if voiced[max(0, i - 1):i + 2].any():
                out["over_speech"] += 1
            plays = voiced[i:i + int(e["duration_ms"] / 20)]
            out["overlap_ms"].append(int(plays.sum()) * 20)
            before = np.flatnonzero(voiced[:i])
            if before.size:
                out["delay_ms"].append((at - (before[-1] + 1) * 0.02) * 1000)
    first = next((e["_recv_t"] for e in client.events
                  if e["type"] == "response.output_audio.delta"), None)
    if first is not None:
        out["gap_s"] = first - (start + last)
    return out


def q(values: list[float], p: float) -> float:
    return float(np.quantile(values, p)) if values else float("nan")


async def run(args: argparse.Namespace) -> None:
    config = load_config("cascade-cpu")
    config = dataclasses.replace(config, limits=dataclasses.replace(config.limits,
                                                                    resume_grace_s=0))
    talks = utterances()
    load0 = os.getloadavg()
    t0 = time.monotonic()
    async with BackgroundServer(Runtime(config)) as server:
        await run_one(server, talks[-1], on=False)  # warm-up (not counted)
        rows = []
        for u in talks:
            for _ in range(args.repeat):
                off = await run_one(server, u, on=False)
                on = await run_one(server, u, on=True)
                rows.append((u, on, off))
                print(f"{u.name:52s} {len(u.pcm) / RATE:5.1f} s  offered {on['offered']}  "
                      f"over question {on['over_question']}  over speech {on['over_speech']}  "
                      f"delay {[round(d) for d in on['delay_ms']]} ms  overlap "
                      f"{on['overlap_ms']} ms  gap on {on['gap_s'] or float('nan'):.2f} s / "
                      f"off {off['gap_s'] or float('nan'):.2f} s; pauses {on['outcomes']}",
                      flush=True)
    on_rows = [on for _, on, _ in rows]
    delays = [d for r in on_rows for d in r["delay_ms"]]
    overlaps = [o for r in on_rows for o in r["overlap_ms"]]
    gaps_on = [r["gap_s"] for r in on_rows if r["gap_s"] is not None]
    gaps_off = [off["gap_s"] for _, _, off in rows if off["gap_s"] is not None]
    print(f"\n{len(rows)} long utterances ({sum(u.question for u, _, _ in rows)} ending with a "
          f"question): backchannels offered {sum(r['offered'] for r in on_rows)}, "
          f"over a question's end {sum(r['over_question'] for r in on_rows)}, "
          f"started over speech {sum(r['over_speech'] for r in on_rows)}")
    print(f"pause -> backchannel p50 {q(delays, 0.5):.0f} ms, p90 {q(delays, 0.9):.0f} ms; "
          f"clips the user's next words overlapped {sum(o > 0 for o in overlaps)}/{len(overlaps)} "
          f"(p50 {q(overlaps, 0.5):.0f} ms)")
    outcomes: dict[str, int] = {}
    for r in on_rows:
        for k, v in r["outcomes"].items():
            outcomes[k] = outcomes.get(k, 0) + v
    print(f"pauses a backchannel could fill, by outcome (duplex_backchannels_total): {outcomes}")
    print(f"turn gap (last word -> first reply audio) p50 on {q(gaps_on, 0.5):.2f} s, "
          f"off {q(gaps_off, 0.5):.2f} s")
    print(f"\n{machine.line()} (at start {load0[0]:.1f}); {time.monotonic() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=1)
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
