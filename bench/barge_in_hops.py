"""Barge-in, hop by hop (issue 44 item 3): from the interruption's onset to
the VAD's decision, to ``speech_started`` on the wire, to the old audio's
last byte and ``response.done`` -- real people and our voices, with and
without a room's echo, under ``semantic_vad`` and ``server_vad``, this tree
against the code before it, in one run.

One ``vllm-duplex serve`` per side on the default pipeline (``fast_turns.py``'s
sides). Each try is a raw-socket client at real time (20 ms chunks of 24 kHz
PCM16): a session asks (as text) for a long story, paced output
(``pacing: realtime``: the server sends the reply as it plays, so what it
sends after the decision is measurable), and streams its microphone:

* ``--echo`` off: silence, then the interruption;
* headset: the same silence with ``audio.input.echo_cancellation: {"type":
  "server"}`` on and fan noise at -55 dBFS: the reply plays in the user's
  ears, none of it reaches the microphone (a client that always asks for
  echo cancellation, worn with headphones);
* on: ``room_echo.py``'s medium room (``lib/rooms.py``: 1 m, RT60 0.45 s,
  the echo at -10 dB, fan noise at -55 dBFS) plays every reply delta as it
  arrives (the client's speaker) into the microphone, the session has
  ``audio.input.echo_cancellation: {"type": "server"}``, and the user's
  voice is added over the echo; at ``speech_started`` the client stops its
  speaker, as an OpenAI client does.

The interruption starts ``--after`` seconds into the reply's audio
(alternating 0.6 / 1.4 s). Its onset is the slot of the first chunk where the
voice alone is louder than -40 dBFS. Per try, from the onset:

* ``vad``: the chunk whose arrival let Silero decide, replayed offline
  through this tree's input path and VAD with the side's onset rule (two
  phases; ``--ref-phases 1`` for a ref before the second grid, 7b26fc9;
  ``bench/vad_onset.py``) -- with echo, the AEC3
  reference from the deltas' arrival times, so an approximation;
* ``heard``: ``input_audio_buffer.speech_started`` at the client, and
  ``server``: heard minus vad (the stage's thread, the session's mailbox
  and core, the socket);
* ``old audio``: the last delta of the interrupted reply received, and the
  milliseconds of its audio received after ``speech_started``;
* ``done``: ``response.done`` (``cancelled``) or
  ``duplex.output_audio.resumed`` (the words were a backchannel).

    .venv/bin/python bench/barge_in_hops.py [--sides before@5f3afbd now] [--tries 10]
        [--echo off headset on] [--vad semantic_vad server_vad] [--ref-phases 2] [--json out.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import asyncio
import base64
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib.real_corpus import RECORDINGS
from lib.rooms import ROOMS, impulse
from lib.sides import Side, as_row, in_turn, run_and_report, side_servers
from lib.speech_corpus import espeak, flite
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import VadConfig, VadSpeechStarted
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.echo import EchoCanceller
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.session.effects import Emit
from vllm_duplex.session.input_buffer import InputBuffer
from vllm_duplex.stages.listening.silero_vad import SileroVad, load_model
from vllm_duplex.testing import noise
from vllm_duplex.testing.room import Room

WIRE = 24000
STEP = WIRE // 50  # 20 ms
ONSET_DBFS = -40.0
AUDIO_DELTA = "response.output_audio.delta"
STORY = "Tell me a long story about a brave knight and a dragon."
# real people (bench/real_voices) and our voices; the first seconds of each
REAL = ("cmu-cards-001", "ami-ES2011a-headset0", "cmu-goforward", "cmu-cards-003",
        "fsdd-jackson-7", "ls-1089-134686-0001")
SYNTHETIC = ((flite("slt"), "Stop, wait a moment please."), (flite("awb"), "Wait, wait."),
             (espeak("en-us+f3"), "Hold on a second."), (flite("rms"), "No, that's wrong."),
             (espeak("en-gb"), "Actually, I have a question."))


@dataclass
class Try:
    side: str
    vad: str
    echo: str  # off, headset or on (``--echo``)
    voice: str
    status: str = "?"
    vad_s: float = math.nan
    heard_s: float = math.nan
    old_audio_s: float = math.nan
    old_ms_after_heard: float = math.nan
    done_s: float = math.nan
    outcome: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def voices() -> list[tuple[str, np.ndarray]]:
    """(name, int16 24 kHz): the interruptions, 2.5 s at most, 0.2 s of silence first."""
    by_name = {r.name: r for r in RECORDINGS}
    out = [(f"real {n}", by_name[n].audio()) for n in REAL if n in by_name]
    out += [(f"{v.name}: {t}", v.speak(t)) for v, t in SYNTHETIC]
    lead = np.zeros(int(0.2 * 16000), np.int16)
    return [(n, soxr.resample(np.concatenate([lead, p[:40000]]).astype(np.float32), 16000, WIRE)
             .astype(np.int16)) for n, p in out]


def onset_chunk(pcm: np.ndarray) -> int:
    floor = 32768.0 * 10 ** (ONSET_DBFS / 20)
    for i in range(0, pcm.size - STEP + 1, STEP):
        x = pcm[i:i + STEP].astype(np.float64)
        if math.sqrt(float(np.mean(x * x))) > floor:
            return i // STEP
    raise ValueError("no speech")


def a_room(echo: str) -> Room:
    if echo == "off":
        return Room(np.zeros(1), WIRE, seconds=90.0)
    fan = soxr.resample(noise.fan(10.0, -55), noise.RATE, WIRE).astype(np.float64)
    ir = np.zeros(1) if echo == "headset" else soxr.resample(impulse(ROOMS[1], -10.0), 16000,
                                                             WIRE)
    return Room(ir, WIRE, seconds=90.0, noise=fan)


def replay_vad(mic: list[bytes], deltas: list[tuple[int, bytes]], echo: str, phases: int,
               from_chunk: int) -> int | None:
    """The chunk whose arrival made this tree's VAD (``phases``) start speech,
    at or after ``from_chunk``: the session's input path replayed offline
    (``deltas``: (chunk index at arrival, PCM) for the echo canceller)."""
    clock = [0.0]
    buf = InputBuffer(AudioFormat(), max_ms=600_000, clock=lambda: clock[0])
    cancelling = echo != "off"
    if cancelling:
        buf.set_echo_cancellation("server", AudioFormat(), EchoCanceller())
    # as a session has it: with echo cancellation, the main windows alone
    vad = SileroVad(load_model(), onset_phases=phases,
                    config=VadConfig(half_window_onsets=not cancelling))
    pending = list(deltas)
    for i, chunk in enumerate(mic):
        clock[0] = (i + 1) * 0.02
        while pending and pending[0][0] <= i:
            _, pcm = pending.pop(0)
            buf.sent([Emit(Envelope(1, Fence("s"), ev.OutputAudioDelta(
                response_id="r", item_id="i", output_index=0, content_index=0, delta=pcm)))],
                clock[0])
        audio = buf.append(chunk)
        if audio is None:
            continue
        view = audio.for_vad()  # with echo cancellation, the VAD's own view (AudioIn.vad_pcm)
        started = any(isinstance(e, VadSpeechStarted) for e in vad.feed(view.pcm, view.start_ms))
        if started and i >= from_chunk:
            return i
        if len(buf._chunks) > 64:  # noqa: SLF001 -- a bench: keep the buffer small
            buf.trim_idle(0)
    return None


async def one_try(url: str, t: Try, voice: np.ndarray, after_s: float, phases: int) -> Try:
    room = a_room(t.echo)
    said = np.zeros(room.played.size, np.float64)
    client = await RealtimeClient.connect(url, open_timeout=60)
    audio_in: dict[str, Any] = {"turn_detection": {"type": t.vad}}
    if t.echo != "off":
        audio_in["echo_cancellation"] = {"type": "server"}
    mic: list[bytes] = []
    slots: list[float] = []
    deltas: list[tuple[int, bytes]] = []
    state: dict[str, Any] = {"heard_at": None, "first_audio": None, "t0": None}

    async def listen() -> None:
        while True:
            e = await client.recv()
            # The speaker plays on the client's clock, the microphone's: where the
            # event came, not where the sending has got to (behind when this process
            # stalls). Placed at the chunks sent, an echo came before its audio was
            # sent: no canceller can take that out (until 2026-12-07, here and in
            # echo_live.py; tests/support/room_client.py always placed it so).
            kind = e["type"]
            at = max(len(mic) * STEP, int((e["_recv_t"] - state["t0"]) * WIRE))
            if kind == AUDIO_DELTA:
                pcm = np.frombuffer(base64.b64decode(e["delta"]), "<i2")
                deltas.append((at // STEP, pcm.tobytes()))
                if state["first_audio"] is None:
                    state["first_audio"] = (e["_recv_t"], e["response_id"])
                if state["heard_at"] is None:  # stopped at speech_started, as OpenAI clients do
                    room.play(pcm.astype(np.float64), at)
            elif kind == "input_audio_buffer.speech_started" and state["first_audio"] is not None:
                # Before the voice too: the reply cutting in on its own echo, counted apart
                # (a speech_started before the voice was first said went uncounted until
                # 2026-12-07: such a try read "not heard", or on time).
                if state["heard_at"] is None:
                    state["heard_at"] = e["_recv_t"]
                    room.stop(at)

    try:
        await client.update_session({"type": "realtime", "max_output_tokens": 400,
                                     "audio": {"input": audio_in,
                                               "output": {"pacing": {"type": "realtime"}}}})
        await client.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": STORY}]}})
        await client.create_response()
        t0 = state["t0"] = time.monotonic()
        listener = asyncio.create_task(listen())
        i, end = 0, None
        onset = onset_chunk(voice)
        while True:
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))
            if listener.done():
                listener.result()
            if state.get("said_at") is None and state["first_audio"] is not None \
                    and time.monotonic() >= state["first_audio"][0] + after_s:
                state["said_at"] = i
                said[i * STEP:i * STEP + voice.size] = voice[:said.size - i * STEP]
                end = i + voice.size // STEP + 150  # then 3 s more
            start = i * STEP
            chunk = room.mic(start, STEP, said[start:start + STEP]).astype("<i2").tobytes()
            mic.append(chunk)
            slots.append(time.monotonic())
            await client.append_audio(chunk)
            i += 1
            if end is not None and i >= end:
                break
            if i > 3000:  # 60 s: no reply audio
                t.status = "no reply"
                return t
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    finally:
        await client.close()
    rid = state["first_audio"][1]
    on = state["said_at"] + onset
    t_on = slots[on]
    events = client.events
    done = next((e for e in events if e["type"] == "response.done"
                 and e["response"]["id"] == rid), None)
    resumed = next((e for e in events if e["type"] == "duplex.output_audio.resumed"), None)
    old = [e for e in events if e["type"] == AUDIO_DELTA and e["response_id"] == rid
           and (resumed is None or e["_recv_t"] < resumed["_recv_t"])]
    heard = state["heard_at"]
    if heard is None:
        t.status = "not heard"
        return t
    t.status = "ok"
    t.heard_s = heard - t_on
    t.old_audio_s = max(0.0, old[-1]["_recv_t"] - t_on) if old else 0.0
    t.old_ms_after_heard = sum(len(base64.b64decode(e["delta"])) / 2 / WIRE * 1000
                               for e in old if e["_recv_t"] > heard)
    if done is not None:
        t.done_s, t.outcome = done["_recv_t"] - t_on, done["response"]["status"]
    elif resumed is not None:
        t.done_s, t.outcome = resumed["_recv_t"] - t_on, "resumed"
    decided = replay_vad(mic, deltas, t.echo, phases, on)
    if decided is not None:
        t.vad_s = slots[decided] - t_on
    t.extra = {"t_on": t_on, "t_heard": heard,
               "t_decided": slots[decided] if decided is not None else None}
    return t


def ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1000:.0f}"


def report(rows: list[Try], sides: list[str]) -> None:
    # A speech_started before the voice is the reply cutting in on its own echo, not a
    # barge-in heard in time: counted apart, never within the target.
    print("\n| side | vad | echo | tries | heard ≤ target | before the voice | vad p50 / max "
          "| heard p50 / p90 / max "
          "| server (heard − vad) p50 / max | old audio's end p50 / max | old audio after heard "
          "(ms of audio, max) | done p50 |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for side in sides:
        for vad in sorted({r.vad for r in rows}):
            for echo in ("off", "headset", "on"):
                rs = [r for r in rows if (r.side, r.vad, r.echo) == (side, vad, echo)]
                if not rs:
                    continue
                ok = [r for r in rs if r.status == "ok"]
                target = 0.150 if echo == "on" else 0.100

                def col(vals: list[float], *qs: str) -> str:
                    vals = sorted(v for v in vals if not math.isnan(v))
                    if not vals:
                        return "-"
                    out = {"p50": statistics.median(vals), "max": vals[-1],
                           "p90": vals[min(len(vals) - 1, math.ceil(0.9 * len(vals)) - 1)]}
                    return " / ".join(ms(out[q]) for q in qs)

                print(f"| {side} | {vad} | {echo} | {len(rs)} "
                      f"| {sum(0 <= r.heard_s <= target for r in ok)} of {len(rs)} "
                      f"(≤ {target * 1000:.0f}) | {sum(r.heard_s < 0 for r in ok)} "
                      f"| {col([r.vad_s for r in ok], 'p50', 'max')} "
                      f"| {col([r.heard_s for r in ok], 'p50', 'p90', 'max')} "
                      f"| {col([r.heard_s - r.vad_s for r in ok], 'p50', 'max')} "
                      f"| {col([r.old_audio_s for r in ok], 'p50', 'max')} "
                      f"| {max((r.old_ms_after_heard for r in ok), default=math.nan):.0f} "
                      f"| {col([r.done_s for r in ok], 'p50')} |")


async def run(args: argparse.Namespace) -> list[Try]:
    vs = voices()
    rows: list[Try] = []
    phases = {Side.parse(s).name: (args.ref_phases if "@" in s else 2) for s in args.sides}
    with side_servers(args.sides, args.config) as servers:
        n = 0
        for echo in args.echo:
            for vad in args.vad:
                for k in range(args.tries):
                    name, voice = vs[k % len(vs)]
                    after = args.after[n % len(args.after)]
                    n += 1
                    for s in in_turn(servers, k):
                        t = await as_row(Try(s.side, vad, echo, name), lambda t, s=s: one_try(
                            s.url, t, voice, after, phases[s.side]))
                        rows.append(t)
                        print(f"{t.side:6} {vad:12} echo {echo:7} {name[:34]:34} "
                              f"{t.status:9} vad {ms(t.vad_s):>4} heard {ms(t.heard_s):>4} "
                              f"old audio {ms(t.old_audio_s):>4} (+{t.old_ms_after_heard:.0f} ms "
                              f"after heard) done {ms(t.done_s):>5} {t.outcome}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sides", nargs="+", default=["before@5f3afbd", "now"],
                   help="NAME[@REF][:KEY=VALUE,...] each (fast_turns.py's sides); a side "
                        "with @REF is replayed with --ref-phases onset phases, else two")
    p.add_argument("--tries", type=int, default=10, help="per side, VAD and echo setting")
    p.add_argument("--after", type=float, nargs="+", default=[0.6, 1.4])
    p.add_argument("--echo", nargs="+", default=["off", "on"], choices=["off", "headset", "on"])
    p.add_argument("--vad", nargs="+", default=["semantic_vad", "server_vad"])
    p.add_argument("--config", default="configs/cascade-cpu.yaml")
    p.add_argument("--ref-phases", type=int, default=2, choices=[1, 2],
                   help="Silero's onset phases at a side's ref, for the offline replay of its "
                        "decision (1: a ref before 7b26fc9's second grid)")
    p.add_argument("--json")
    args = p.parse_args(argv)
    return run_and_report(args, run, report)


if __name__ == "__main__":
    sys.exit(main())
