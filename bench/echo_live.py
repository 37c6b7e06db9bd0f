"""Self-interruptions over a live socket (issue 44): the room bench's target,
"0 in 20 replies at echo -10 dB and 0 dB", measured on a real server at
real time instead of on a virtual clock -- the client plays each reply
delta on its speaker as it arrives (on the microphone's clock), so a server
that falls behind, sending the reply late or reading the microphone in
bursts, moves the echo against its own model of the playback, which
``room_echo.py`` never does. (Until 2026-12-07 the echo was placed at the
microphone chunks sent so far: behind real time, by up to 20 ms and more
when this process stalled, an echo heard before its audio was sent.)

One ``vllm-duplex serve`` per side (``fast_turns.py``'s sides) on the
default pipeline. Each try is a raw-socket client at real time (20 ms
chunks of 24 kHz PCM16) with ``audio.input.echo_cancellation: {"type":
"server"}``: it asks (as text) for a short story, paced output (``pacing:
realtime``, as ``barge_in_hops.py``), and streams its microphone, which
hears a ``lib/rooms.py`` room (small / medium / large in turn) playing
every reply delta as it arrives, the echo at ``--levels`` dB, fan noise at
-55 dBFS, and nobody speaking. Counted per side and level: replies during
which the server heard speech (``input_audio_buffer.speech_started``
between the reply's first audio and its ``response.done``, or 2 s after
the last delta), replies ``cancelled``, and where in the reply the first
``speech_started`` came. The sides take turns try by try.

    .venv/bin/python bench/echo_live.py [--sides before@REF now] [--tries 20]
        [--levels -10 0] [--rooms small medium large] [--json out.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import asyncio
import base64
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib.rooms import ROOMS, impulse
from lib.sides import add_sides_argument, as_row, in_turn, run_and_report, side_servers
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.testing import noise
from vllm_duplex.testing.room import Room

WIRE = 24000
STEP = WIRE // 50  # 20 ms
AUDIO_DELTA = "response.output_audio.delta"
ASKS = ("Tell me a short story about a lighthouse keeper.",
        "Describe a walk through a busy market in the morning.",
        "Tell me about the history of the bicycle.",
        "Explain how bread is made, step by step.")
AFTER_S = 2.0  # the microphone stays open this long after the last delta


@dataclass
class Try:
    side: str
    level: float
    room: str
    status: str = "?"
    reply_s: float = 0.0  # the reply's audio received, in seconds
    heard_at_s: float | None = None  # the first speech_started, seconds into the reply's audio
    outcome: str = ""


def a_room(room: tuple, level: float) -> Room:
    ir = soxr.resample(impulse(room, level), 16000, WIRE)
    fan = soxr.resample(noise.fan(10.0, -55), noise.RATE, WIRE).astype(np.float64)
    return Room(ir, WIRE, seconds=90.0, noise=fan)


async def one_try(url: str, t: Try, room: Room, ask: str) -> Try:
    client = await RealtimeClient.connect(url, open_timeout=60)
    state: dict = {"first": None, "last": None, "heard": None, "done": None}
    sent = [0]  # microphone chunks sent
    clock = [time.monotonic()]  # the microphone's first sample (set again when it starts)

    async def listen() -> None:
        while True:
            e = await client.recv()
            kind = e["type"]
            if kind == AUDIO_DELTA:
                pcm = np.frombuffer(base64.b64decode(e["delta"]), "<i2").astype(np.float64)
                if state["first"] is None:
                    state["first"] = e["_recv_t"]
                state["last"] = e["_recv_t"]
                t.reply_s += pcm.size / WIRE
                # On the client's clock, where the event came (not at the chunks
                # sent: behind when this process stalls, an echo there came before
                # its audio was sent; so until 2026-12-07).
                room.play(pcm, max(sent[0] * STEP, int((e["_recv_t"] - clock[0]) * WIRE)))
            elif kind == "input_audio_buffer.speech_started" and state["first"] is not None \
                    and state["heard"] is None and state["done"] is None:
                state["heard"] = e["_recv_t"]
            elif kind == "response.done":
                state["done"] = e["response"]["status"]

    try:
        await client.update_session({
            "type": "realtime", "max_output_tokens": 60,
            "audio": {"input": {"turn_detection": {"type": "server_vad"},
                                "echo_cancellation": {"type": "server"}},
                      "output": {"pacing": {"type": "realtime"}}}})
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": ask}]}})
        await client.create_response()
        t0 = clock[0] = time.monotonic()
        listener = asyncio.create_task(listen())
        while True:
            await asyncio.sleep(max(0.0, t0 + (sent[0] + 1) * 0.02 - time.monotonic()))
            if listener.done():
                listener.result()
            chunk = room.mic(sent[0] * STEP, STEP).astype("<i2").tobytes()
            await client.append_audio(chunk)
            sent[0] += 1
            now = time.monotonic()
            if state["done"] is not None and state["last"] is not None \
                    and now > state["last"] + AFTER_S:
                break
            if sent[0] > 6000:  # 120 s
                t.status = "no end"
                break
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    finally:
        await client.close()
    if state["first"] is None:
        t.status = "no reply"
        return t
    if t.status == "?":
        t.status = "ok"
    t.outcome = state["done"] or ""
    if state["heard"] is not None:
        t.heard_at_s = state["heard"] - state["first"]
    return t


def report(rows: list[Try], sides: list[str], levels: list[float]) -> None:
    print("\n| side | echo | replies | heard speech during the reply | cancelled "
          "| where (s into the reply) | reply audio p50 (s) |")
    print("|---|---:|---:|---:|---:|---|---:|")
    for side in sides:
        for level in levels:
            rs = [r for r in rows if r.side == side and r.level == level and r.status == "ok"]
            if not rs:
                continue
            heard = [r for r in rs if r.heard_at_s is not None]
            where = ", ".join(f"{r.heard_at_s:.1f} ({r.room})" for r in heard) or "-"
            print(f"| {side} | {level:+.0f} dB | {len(rs)} | {len(heard)} "
                  f"| {sum(r.outcome == 'cancelled' for r in rs)} | {where} "
                  f"| {statistics.median(r.reply_s for r in rs):.1f} |")


async def run(args: argparse.Namespace) -> list[Try]:
    rows: list[Try] = []
    with side_servers(args.sides, args.config) as servers:
        for level in args.levels:
            rooms = [r for r in ROOMS if r[0] in args.rooms]
            for k in range(args.tries):
                room = rooms[k % len(rooms)]
                for s in in_turn(servers, k):
                    t = await as_row(Try(s.side, level, room[0]), lambda t, url=s.url: one_try(
                        url, t, a_room(room, level), ASKS[k % len(ASKS)]))
                    rows.append(t)
                    heard = "-" if t.heard_at_s is None else f"{t.heard_at_s:.2f} s"
                    print(f"{t.side:6} {level:+.0f} dB {t.room:6} {t.status:9} reply "
                          f"{t.reply_s:5.1f} s  speech heard at {heard:>7}  {t.outcome}",
                          flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_sides_argument(p, ["now"])
    p.add_argument("--tries", type=int, default=20, help="replies per side and level")
    p.add_argument("--levels", type=float, nargs="+", default=[-10.0, 0.0])
    p.add_argument("--rooms", nargs="+", default=[r[0] for r in ROOMS],
                   choices=[r[0] for r in ROOMS], help="taken in turn (all three unless given)")
    p.add_argument("--config", default="configs/cascade-cpu.yaml")
    p.add_argument("--json")
    args = p.parse_args(argv)
    return run_and_report(args, run, lambda rows, sides: report(rows, sides, args.levels))


if __name__ == "__main__":
    sys.exit(main())
