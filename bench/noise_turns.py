"""Noise never takes the turn, over a live socket (issue 44's noise target:
"no more false turns in the noise bench than today (0)"): silence, white,
pink and brown noise, mains hum and backwards babble at three levels, with
and without server echo cancellation, and under a reply playing through a
room -- where the echo path and its residual suppressor act.

One ``vllm-duplex serve`` per side (``fast_turns.py``'s sides) on the
default pipeline. Each try is a raw-socket client at real time (20 ms chunks
of 24 kHz PCM16), ``server_vad`` (``--vad``), nobody speaking:

* ``quiet``: the microphone streams ``--seconds`` of the sound, nothing
  else happens (``audio.input.echo_cancellation`` off, then on: with it on
  and no reply the canceller has no reference, and its gate may not make
  up a voice either);
* ``reply``: echo cancellation on, the client asks (as text) for a short
  story, paced output, and plays every reply delta on its speaker as it
  arrives, into ``lib/rooms.py``'s medium room at -10 dB echo; the
  microphone hears that echo with the sound under it.

Counted per try, over the whole session: ``input_audio_buffer.speech_started``
(a reply's own speech_started cut it: ``response.done`` ``cancelled``),
turns committed (``input_audio_buffer.committed``), transcripts with words
(``conversation.item.input_audio_transcription.completed``), and responses
nobody asked for (``response.created`` past the one the client asked for).
A false turn is a committed turn or a response nobody asked for.

    .venv/bin/python bench/noise_turns.py [--sides before@REF now] [--seconds 8]
        [--levels -50 -35 -25] [--modes quiet reply] [--vad server_vad] [--json out.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import asyncio
import base64
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib.rooms import ROOMS, impulse
from lib.sides import add_sides_argument, as_row, in_turn, run_and_report, side_servers
from lib.speech_corpus import espeak, flite
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.testing import noise
from vllm_duplex.testing.room import Room

WIRE = 24000
STEP = WIRE // 50  # 20 ms
AUDIO_DELTA = "response.output_audio.delta"
ASK = "Tell me a short story about a lighthouse keeper."
ECHO_DB = -10.0
BABBLE = ((flite("slt"), "The meeting moved to the third floor after lunch today."),
          (flite("awb"), "Could you pass me the report from last week please?"),
          (flite("rms"), "I think the train leaves at half past seven tonight."),
          (espeak("en-us+f3"), "We should paint the kitchen a lighter colour."),
          (espeak("en-gb"), "Nobody told me the shop was closed on Sundays."),
          (espeak("en-us"), "Bring two coffees and a glass of water, thanks."))


def sounds(seconds: float, levels: list[float]) -> list[tuple[str, np.ndarray]]:
    """(name, int16 16 kHz): digital silence's dither once, every other kind at each level."""
    backwards = [v.speak(text)[::-1].copy() for v, text in BABBLE]
    kinds = {"white": lambda db: noise.colored(seconds, db, 0.0, seed=1),
             "pink": lambda db: noise.colored(seconds, db, 1.0, seed=2),
             "brown": lambda db: noise.colored(seconds, db, 2.0, seed=3),
             "hum": lambda db: noise.hum(seconds, db),
             "backwards babble": lambda db: noise.babble(backwards, seconds, db, seed=4)}
    out = [("silence", noise.silence(seconds))]
    for name, make in kinds.items():
        for db in levels:
            out.append((f"{name} {db:+.0f} dBFS", make(db)))
    return out


@dataclass
class Try:
    side: str
    mode: str
    echo_cancellation: bool
    sound: str
    status: str = "?"
    speech_started: int = 0
    committed: int = 0
    words: list[str] = field(default_factory=list)
    unasked_responses: int = 0
    reply_s: float = 0.0
    reply_status: str = ""

    @property
    def false_turn(self) -> bool:
        return self.committed > 0 or self.unasked_responses > 0


async def one_try(url: str, t: Try, sound: np.ndarray, vad: str, seconds: float) -> Try:
    wire = soxr.resample(sound.astype(np.float32), noise.RATE, WIRE).astype(np.float64)
    if t.mode == "reply":
        ir = soxr.resample(impulse(ROOMS[1], ECHO_DB), 16000, WIRE)
        room = Room(ir, WIRE, seconds=120.0, noise=wire)
    else:
        room = Room(np.zeros(1), WIRE, seconds=seconds + 1.0, noise=wire)
    client = await RealtimeClient.connect(url, open_timeout=60)
    audio_in: dict = {"turn_detection": {"type": vad}}
    if t.echo_cancellation:
        audio_in["echo_cancellation"] = {"type": "server"}
    state: dict = {"t0": None, "asked": None, "done": False, "last": None}
    sent = [0]

    async def listen() -> None:
        while True:
            e = await client.recv()
            kind = e["type"]
            if kind == AUDIO_DELTA and e.get("response_id") == state["asked"]:
                pcm = np.frombuffer(base64.b64decode(e["delta"]), "<i2").astype(np.float64)
                t.reply_s += pcm.size / WIRE
                state["last"] = e["_recv_t"]
                # on the microphone's clock, where the event came (echo_live.py)
                room.play(pcm, max(sent[0] * STEP, int((e["_recv_t"] - state["t0"]) * WIRE)))
            elif kind == "input_audio_buffer.speech_started":
                t.speech_started += 1
            elif kind == "input_audio_buffer.committed":
                t.committed += 1
            elif kind == "conversation.item.input_audio_transcription.completed":
                if e.get("transcript", "").strip():
                    t.words.append(e["transcript"].strip())
            elif kind == "response.created":
                if state["asked"] is None and t.mode == "reply":
                    state["asked"] = e["response"]["id"]
                else:
                    t.unasked_responses += 1
            elif kind == "response.done" and e["response"]["id"] == state["asked"]:
                state["done"], state["done_at"] = True, e["_recv_t"]
                t.reply_status = e["response"]["status"]

    try:
        await client.update_session({"type": "realtime", "max_output_tokens": 60,
                                     "audio": {"input": audio_in,
                                               "output": {"pacing": {"type": "realtime"}}}})
        if t.mode == "reply":
            await client.send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]}})
            await client.create_response()
        t0 = state["t0"] = time.monotonic()
        listener = asyncio.create_task(listen())
        while True:
            await asyncio.sleep(max(0.0, t0 + (sent[0] + 1) * 0.02 - time.monotonic()))
            if listener.done():
                listener.result()
            await client.append_audio(room.mic(sent[0] * STEP, STEP).astype("<i2").tobytes())
            sent[0] += 1
            elapsed = sent[0] * 0.02
            if t.mode == "quiet" and elapsed >= seconds:
                break
            if t.mode == "reply" and state["done"] and time.monotonic() > (
                    state["last"] or state["done_at"]) + 2.0:
                break
            if elapsed > 90.0:
                t.status = "no end"
                break
        await asyncio.sleep(1.5)  # a turn the last chunks started: its commit and transcript
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    finally:
        await client.close()
    if t.status == "?":
        t.status = "ok" if t.mode == "quiet" or t.reply_s > 0 else "no reply"
    return t


def report(rows: list[Try], sides: list[str]) -> None:
    print("\n| side | mode | echo cancellation | tries | false turns (committed / unasked "
          "responses) | speech_started | transcripts with words | replies cancelled |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for side in sides:
        for mode in ("quiet", "reply"):
            for ec in (False, True):
                rs = [r for r in rows if (r.side, r.mode, r.echo_cancellation) == (side, mode, ec)]
                if not rs:
                    continue
                print(f"| {side} | {mode} | {'on' if ec else 'off'} | {len(rs)} "
                      f"| {sum(r.false_turn for r in rs)} ({sum(r.committed for r in rs)} / "
                      f"{sum(r.unasked_responses for r in rs)}) "
                      f"| {sum(r.speech_started > 0 for r in rs)} "
                      f"| {sum(bool(r.words) for r in rs)} "
                      f"| {sum(r.reply_status == 'cancelled' for r in rs)} |")
    for r in rows:
        if r.false_turn or r.speech_started or r.words or r.status != "ok":
            print(f"  {r.side} {r.mode} echo {'on' if r.echo_cancellation else 'off'} {r.sound}: "
                  f"{r.status}, speech_started {r.speech_started}, committed {r.committed}, "
                  f"words {r.words}, unasked {r.unasked_responses}, reply {r.reply_status}")


async def run(args: argparse.Namespace) -> list[Try]:
    cases = sounds(args.seconds, args.levels)
    rows: list[Try] = []
    settings = [(m, ec) for m in args.modes for ec in ((False, True) if m == "quiet" else (True,))]
    with side_servers(args.sides, args.config) as servers:
        for mode, ec in settings:
            for k, (name, sound) in enumerate(cases):
                for s in in_turn(servers, k):
                    t = await as_row(Try(s.side, mode, ec, name), lambda t, url=s.url: one_try(
                        url, t, sound, args.vad, args.seconds))
                    rows.append(t)
                    print(f"{t.side:6} {mode:5} echo {'on ' if ec else 'off'} {name:24} "
                          f"{t.status:8} speech_started {t.speech_started} committed "
                          f"{t.committed} words {t.words} unasked {t.unasked_responses} "
                          f"reply {t.reply_s:4.1f} s {t.reply_status}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sides_argument(p, ["now"])
    p.add_argument("--seconds", type=float, default=8.0, help="of each sound, quiet mode")
    p.add_argument("--levels", type=float, nargs="+", default=[-50.0, -35.0, -25.0],
                   help="each sound's level, dBFS (silence: its dither alone)")
    p.add_argument("--modes", nargs="+", default=["quiet", "reply"], choices=["quiet", "reply"])
    p.add_argument("--vad", default="server_vad", choices=["server_vad", "semantic_vad"])
    p.add_argument("--config", default="configs/cascade-cpu.yaml")
    p.add_argument("--json")
    args = p.parse_args(argv)
    return run_and_report(args, run, report)


if __name__ == "__main__":
    raise SystemExit(main())
