"""A long spoken conversation: one realtime session on the default pipeline
(``configs/cascade-cpu.yaml``: Silero -> Whisper -> vLLM SmolLM2, 2,048-token
context -> Piper, ``semantic_vad``) held for ``--minutes`` (60), question
after question, so the conversation outgrows the model's context many times
over and the session's ``truncation`` (``auto``) keeps it answering.

The client is a person with an open microphone: 20 ms chunks at real time,
silence between questions (``--speed`` > 1 streams faster, for development
only: the turn gaps are then not a person's). Each question is spoken by Flite
(several voices); the next one is asked after the reply has "played" (its
audio's duration from its first delta) and a short pause. Every sixth turn
tells the assistant a fact; three turns later it is asked back (the fact is
then well inside the kept window). One fact is told only once, in the first
turns, and asked back at the end, long after truncation dropped it (what the
model saw then shows in the reply's ``usage.input_tokens``).

Reported per ``--window`` minutes (10): turns, turn gap p50 / p90 (the end of
the question's speech -> the reply's first audio delta at the client), turns
with no completed reply within 40 s, the server's RSS (the server and its
vLLM engine process, summed) at the window's end, truncations taken (a reply
whose ``usage.input_tokens`` is below the one before: the model saw less than
it had), the highest input tokens a reply saw, and facts asked back right.

    .venv/bin/python bench/long_conversation.py [--minutes 60] [--window 10] [--speed 1]
                                                [--config configs/cascade-cpu.yaml] [--json out.json]

The server is a fresh ``vllm-duplex serve`` of the config, with
``limits.max_session_s`` raised above the run (its default, 3,600 s, would end
a 60-minute conversation on the dot).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from lib.serve_process import ServerProcess, machine  # noqa: E402
from lib.speech_corpus import right_answer  # noqa: E402
from support.speech_fixtures import RATE, speak  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402

VOICES = ("slt", "rms", "awb", "kal16")
QUESTIONS = (  # (question, a word a right answer holds)
    ("What is the capital of France?", "paris"),
    ("What is the largest ocean?", "pacific"),
    ("What is the capital of Italy?", "rome"),
    ("How many days are in a week?", "seven"),
    ("What color is the sky on a clear day?", "blue"),
    ("Which planet is known as the red planet?", "mars"),
    ("What is the opposite of hot?", "cold"),
    ("What do bees make?", "honey"),
)
FACTS = (  # (a fact told, the question that asks it back, the word the answer holds)
    ("Please remember this: my dog is called Max.", "What is my dog called?", "max"),
    ("Please remember this: I live in Boston.", "Which city do I live in?", "boston"),
    ("Please remember this: my favorite fruit is the banana.", "What is my favorite fruit?", "banana"),
    ("Please remember this: my brother is called Tom.", "What is my brother called?", "tom"),
    ("Please remember this: I work as a baker.", "What is my job?", "baker"),
)
# Told once (the conversation's third turn), asked back at the end only.
FIRST = ("Please remember this: my cat is called Luna.", "What is my cat called?", "luna")
EVERY = 6  # a fact every sixth turn, asked back three turns later
LOUD = 300  # |sample| above this is speech (Flite pads with digital silence)
CHUNK = RATE * 20 // 1000  # samples per 20 ms
TURN_TIMEOUT_S = 40.0
PAUSE_S = 1.0  # between the end of a reply's playback and the next question


@dataclass
class Turn:
    n: int
    t_min: float  # minutes into the conversation when the question started
    question: str
    kind: str  # question | fact | recall | late_recall
    expect: str | None
    gap_ms: float | None = None
    answered: bool = False
    right: bool | None = None
    answer: str = ""
    input_tokens: int | None = None
    revisions: int = 0  # replies started, then cancelled
    rss_mib: float = 0.0


class Mic:
    """An open microphone: 20 ms chunks at ``speed`` x real time, silence
    when nothing is said. ``say`` queues speech and returns the wall time at
    which its last loud sample will have been sent."""

    def __init__(self, client: RealtimeClient, speed: float) -> None:
        self.client, self.period = client, 0.02 / speed
        self.queue: list[np.ndarray] = []
        self.silence = np.zeros(CHUNK, np.int16)
        self.sent = 0  # chunks
        self.t0 = 0.0

    def say(self, pcm: np.ndarray) -> float:
        loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > LOUD)
        start = self.sent + sum(len(p) // CHUNK + 1 for p in self.queue)
        self.queue.append(pcm)
        return self.t0 + (start + (loud[-1] + 1) / CHUNK) * self.period

    async def run(self) -> None:
        self.t0 = time.monotonic()
        pending: list[np.ndarray] = []
        while True:
            if not pending and self.queue:
                pcm = self.queue.pop(0)
                pending = [pcm[i:i + CHUNK] for i in range(0, len(pcm), CHUNK)]
            chunk = pending.pop(0) if pending else self.silence
            if len(chunk) < CHUNK:
                chunk = np.pad(chunk, (0, CHUNK - len(chunk)))
            await self.client.append_audio(chunk.astype("<i2").tobytes())
            self.sent += 1
            await asyncio.sleep(max(0.0, self.t0 + self.sent * self.period - time.monotonic()))


def script(n: int) -> tuple[str, str, str | None]:
    """Turn ``n``'s (question, kind, expected word)."""
    if n == 2:
        return FIRST[0], "fact", None
    k, r = divmod(n, EVERY)
    fact = FACTS[k % len(FACTS)]
    if r == 1:
        return fact[0], "fact", None
    if r == 4:
        return fact[1], "recall", fact[2]
    q, expect = QUESTIONS[n % len(QUESTIONS)]
    return q, "question", expect


async def one_turn(client: RealtimeClient, mic: Mic, pcm: np.ndarray, turn: Turn,
                   speed: float) -> float:
    """Ask, wait for the completed reply; returns when its playback ends."""
    mark = len(client.events)
    speech_end = mic.say(pcm)
    deadline = time.monotonic() + TURN_TIMEOUT_S + len(pcm) / RATE / speed
    done: dict[str, Any] | None = None
    while done is None and time.monotonic() < deadline:
        try:
            event = await client.recv(timeout=1.0)
        except TimeoutError:
            continue
        if event["type"] == "response.done":
            resp = event["response"]
            if resp.get("status") == "cancelled":
                turn.revisions += 1
            elif event["_recv_t"] > speech_end - 1.0:  # not a late reply to the turn before
                done = resp
    if done is None:
        return time.monotonic()
    turn.answered = done.get("status") in ("completed", "incomplete")
    rid = done["id"]
    mine = [e for e in client.events[mark:] if e.get("response_id") == rid]
    audio = [e for e in mine if e["type"] == "response.output_audio.delta"]
    turn.answer = "".join(e.get("delta", "") for e in mine
                          if e["type"] == "response.output_audio_transcript.delta")
    turn.input_tokens = (done.get("usage") or {}).get("input_tokens")
    if turn.expect is not None:
        turn.right = right_answer(turn.answer, (turn.expect,))
    if not audio:
        return time.monotonic()
    turn.gap_ms = (audio[0]["_recv_t"] - speech_end) * 1000
    played_s = sum(len(e["delta"]) * 3 // 4 for e in audio) / 2 / 24000  # pcm16 at 24 kHz
    return audio[0]["_recv_t"] + played_s / speed


def config_for(path: str, minutes: float) -> str:
    raw = yaml.safe_load(Path(path).read_text()) or {}
    raw.setdefault("limits", {})["max_session_s"] = minutes * 60 + 600
    fd, out = tempfile.mkstemp(prefix="bench-long-conversation-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(raw, f, sort_keys=False)
    return out


async def converse(server: ServerProcess, args: argparse.Namespace) -> list[Turn]:
    speech: dict[tuple[str, str], np.ndarray] = {}
    turns: list[Turn] = []
    async with await RealtimeClient.connect(server.ws_url) as client:
        mic = Mic(client, args.speed)
        sender = asyncio.ensure_future(mic.run())
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        end = t0 + args.minutes * 60 / args.speed
        try:
            n = 0
            while True:
                now = time.monotonic()
                last = now >= end
                q, kind, expect = (FIRST[1], "late_recall", FIRST[2]) if last else script(n)
                voice = VOICES[n % len(VOICES)]
                if (q, voice) not in speech:
                    speech[(q, voice)] = await asyncio.to_thread(speak, q, voice=voice, tail_s=0.2)
                turn = Turn(n, (now - t0) * args.speed / 60, q, kind, expect)
                played = await one_turn(client, mic, speech[(q, voice)], turn, args.speed)
                turn.rss_mib = server.rss() / 2**20
                turns.append(turn)
                print(f"{turn.t_min:5.1f} min #{n:3} {kind:11} gap {turn.gap_ms or float('nan'):6.0f} ms "
                      f"in {turn.input_tokens} rss {turn.rss_mib:.0f} MiB "
                      f"{'' if turn.right is None else ('ok ' if turn.right else 'BAD ')}"
                      f"{q!r} -> {turn.answer[:70]!r}", flush=True)
                del client.events[:]  # a long run: keep only this turn's events
                client._collected = 0
                if last:
                    break
                await asyncio.sleep(max(0.0, played + PAUSE_S / args.speed - time.monotonic()))
                n += 1
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    return turns


def pct(xs: list[float], q: float) -> str:
    return f"{np.quantile(xs, q):.0f}" if xs else "-"


def report(turns: list[Turn], window: float) -> None:
    print("\n| minutes | turns | turn gap p50 / p90 (ms) | unanswered | server RSS at end (MiB) "
          "| truncations | max input tokens | questions right | facts asked back right |")
    print("|---|---|---|---|---|---|---|---|---|")
    last_in: int | None = None
    w = 0
    while True:
        ts = [t for t in turns if w * window <= t.t_min < (w + 1) * window and t.kind != "late_recall"]
        if not ts:
            break
        gaps = [t.gap_ms for t in ts if t.gap_ms is not None]
        cuts = 0
        for t in ts:
            if t.input_tokens is not None:
                if last_in is not None and t.input_tokens < last_in:
                    cuts += 1
                last_in = t.input_tokens
        recalls = [t for t in ts if t.kind == "recall"]
        qs = [t for t in ts if t.kind == "question"]
        print(f"| {w * window:.0f}-{(w + 1) * window:.0f} | {len(ts)} | {pct(gaps, .5)} / {pct(gaps, .9)} "
              f"| {sum(not t.answered for t in ts)} | {ts[-1].rss_mib:.0f} | {cuts} "
              f"| {max((t.input_tokens or 0) for t in ts)} | {sum(bool(t.right) for t in qs)}/{len(qs)} "
              f"| {sum(bool(t.right) for t in recalls)}/{len(recalls)} |")
        w += 1
    qs = [t for t in turns if t.kind == "question"]
    print(f"\nquestions answered right: {sum(bool(t.right) for t in qs)}/{len(qs)}")
    seen = [t.input_tokens for t in turns if t.input_tokens is not None]
    cuts = sum(b < a for a, b in zip(seen, seen[1:]))
    for t in (t for t in turns if t.kind == "late_recall"):
        print(f"asked back at {t.t_min:.0f} min after {cuts} truncations: {t.question!r} -> "
              f"{'right' if t.right else 'not known'} ({t.input_tokens} input tokens): {t.answer[:80]!r}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--window", type=float, default=10.0, help="minutes per reported window")
    p.add_argument("--speed", type=float, default=1.0, help="> 1: faster than real time")
    p.add_argument("--config", default="configs/cascade-cpu.yaml")
    p.add_argument("--json", help="write every turn here")
    p.add_argument("--report", metavar="JSON", help="print the tables of a run's --json, run nothing")
    args = p.parse_args(argv)
    if args.report:
        report([Turn(**t) for t in json.loads(Path(args.report).read_text())], args.window)
        return 0
    load0 = os.getloadavg()
    cfg = config_for(args.config, args.minutes)
    try:
        with ServerProcess(cfg, sessions=1, start_timeout_s=900.0) as server:
            rss0 = server.rss() / 2**20
            t0 = time.monotonic()
            turns = asyncio.run(converse(server, args))
            wall = time.monotonic() - t0
    finally:
        os.unlink(cfg)
    m = machine()
    print(f"\nmachine: {m['summary']}; load average {load0[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {wall / 60:.1f} min wall at {args.speed:g}x real time; "
          f"server RSS {rss0:.0f} MiB before the session")
    report(turns, args.window)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(t) for t in turns], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
