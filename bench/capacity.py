"""Capacity: N people talking to one server at once, this tree against the
code before it, in one run.

    .venv/bin/python bench/capacity.py [--sides before@4083ce1 now] [--ns 1 2 4 6 8]
                                       [--questions 3] [--rounds 1]
                                       [--config configs/cascade-cpu.yaml] [--json out.json]

One ``vllm-duplex serve`` per side (``fast_turns.py``'s sides: ``NAME[@REF][:KEY=VALUE,...]``,
e.g. ``now:VLLM_DUPLEX_CPU_SLOTS=1``) on the default pipeline, all started first, then for
each N the sides take turns (side A's N talkers, then side B's, ``--rounds`` times over: the
turns of one N overlap differently from run to run, so one round's p90 is two or three turns),
so both see the same machine.
N talkers each open a realtime session, started ``--stagger-s`` apart (0.9 s), and ask
``--questions`` questions in a row (two at N = 8) with Flite's voices at real time, 20 ms
chunks, the server's default turn detection, a breath of silence between questions and the
microphone open throughout. A side that refuses a talker at its ceiling (429) is counted as
refusing, and that talker sits out.

Per side and N: the **turn gap** (the last loud chunk's slot -> the first reply audio at
the client) p50 / p90 / max, turns answered and right, the worst talker's p50 beside the
pool's (fairness), replies whose audio ran dry while playing (a gap over 20 ms in a reply
played from its first delta at real time: speech pieces made too late), the server's critical path (``response.done.metadata.duplex_critical_path``)
per segment at p50 and p90 -- which stage grows with N --, each CPU stage's queue wait for a
slot by class (the CPU scheduler's ``duplex_cpu_wait_seconds`` over the N: mean, and the share
over 100 ms; the code before has no scheduler), partials shed, the seconds each stage held a
slot, the event loop's late wake-ups (over 50 ms), and the CPU seconds each process used over
the N (the server's event loop apart from its other threads, vLLM's engine core and worker). Last, the **capacity** of each side: the most talkers whose turn
gap p90 stayed within ``--target-p90-ms`` (1200) with every turn answered. Nothing is
asserted; the figures go in the README beside the single-session ones.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib.serve_process import REPO, http_get, machine, scrape  # noqa: E402
from lib.sides import Server, Side, before_tree  # noqa: E402
from lib.speech_corpus import right_answer  # noqa: E402
from lib.turns import LOUD  # noqa: E402
from support.speech_fixtures import RATE, chunks, speak  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError  # noqa: E402

QUESTIONS = (  # (text, voice, a word the right answer holds)
    ("What is the capital of France?", "slt", "paris"),
    ("What is the capital of Italy?", "kal16", "rome"),
    ("How many days are in a week?", "rms", "seven"),
    ("What is the capital of Japan?", "awb", "tokyo"),
    ("What is the largest ocean?", "slt", "pacific"),
    ("What is the capital of Germany?", "rms", "berlin"),
)
BREATH_S = 1.5  # silence after a reply ends before the next question
TURN_TIMEOUT_S = 40.0


@dataclass
class Turn:
    side: str
    n: int
    talker: int
    question: str
    gap_ms: float | None = None
    answered: bool = False
    right: bool = False
    answer: str = ""
    stall_ms: float = 0.0  # the reply's audio ran dry this long, played as it arrived
    path: dict[str, float] = field(default_factory=dict)


def stall_ms(deltas: list[tuple[float, float]]) -> float:
    """How long playback would have waited for audio: the reply played from
    its first delta at real time, each delta (arrival, seconds of audio)
    needed when the audio before it ends."""
    if not deltas:
        return 0.0
    start, played, stalled = deltas[0][0], 0.0, 0.0
    for arrived, seconds in deltas:
        need = start + played + stalled
        if arrived > need:
            stalled += arrived - need
        played += seconds
    return stalled * 1000


@dataclass
class Window:
    """What one side's N talkers cost the server."""

    wall_s: float = 0.0
    refused: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # process (or server thread group) -> s
    waits: dict[str, tuple[int, float, int]] = field(default_factory=dict)  # class/stage -> n, s, >100ms
    shed: float = 0.0
    busy: dict[str, float] = field(default_factory=dict)  # stage -> seconds holding a slot
    late_ticks: float = 0.0  # event-loop wake-ups over 50 ms late

    def add(self, other: Window) -> None:
        self.wall_s = round(self.wall_s + other.wall_s, 1)
        self.refused += other.refused
        self.shed += other.shed
        self.late_ticks += other.late_ticks
        for k, v in other.cpu.items():
            self.cpu[k] = round(self.cpu.get(k, 0.0) + v, 1)
        for k, v in other.busy.items():
            self.busy[k] = self.busy.get(k, 0.0) + v
        for k, (c, sec, over) in other.waits.items():
            c0, s0, o0 = self.waits.get(k, (0, 0.0, 0))
            self.waits[k] = (c0 + c, s0 + sec, o0 + over)


def _loud_end(pcm: np.ndarray) -> float:
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > LOUD)
    return float(loud[-1] + 1) / RATE


async def talker(server: Server, n: int, index: int, questions: int, delay_s: float,
                 window: Window | None = None) -> list[Turn]:
    """One person: a session, ``questions`` questions in a row, each answered
    (or timed out) before the next, the microphone open all along."""
    await asyncio.sleep(delay_s)
    picks = [QUESTIONS[(index + k) % len(QUESTIONS)] for k in range(questions)]
    turns: list[Turn] = []
    silence = np.zeros(RATE // 50, np.int16).astype("<i2").tobytes()  # 20 ms
    try:
        client = await RealtimeClient.connect(server.url)
    except RealtimeError as exc:  # a refusal at the ceiling is a figure
        if exc.code not in ("at_capacity", "resource_exhausted") or window is None:
            raise
        window.refused += 1
        return []
    async with client:
        server.sessions += 1
        mic_on = True

        async def keep_mic_open() -> None:  # silence between questions, at real time
            t0 = time.monotonic()
            k = 0
            while mic_on:
                k += 1
                if not speaking.is_set():
                    await client.append_audio(silence)
                await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))

        speaking = asyncio.Event()
        background = asyncio.ensure_future(keep_mic_open())
        try:
            for text, voice, expect in picks:
                turns.append(await _ask(client, server.side, n, index, text, voice, expect, speaking))
                await asyncio.sleep(BREATH_S)
        finally:
            mic_on = False
            await asyncio.gather(background, return_exceptions=True)
            # Ended, not dropped: a dropped session waits for its resume and
            # keeps its seat (resume_grace_s) after the talker has gone.
            await client.send({"type": "session.close"})
            await client.wait_for("session.closed", timeout=10)
    return turns


async def _ask(client: RealtimeClient, side: str, n: int, index: int, text: str, voice: str,
               expect: str, speaking: asyncio.Event) -> Turn:
    pcm = speak(text, voice=voice, lead_s=0.2, tail_s=0.0)
    turn = Turn(side, n, index, text)
    seen = len(client.events)
    speaking.set()
    start = time.monotonic()
    for i, chunk in enumerate(chunks(pcm)):
        await client.append_audio(chunk)
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))
    speaking.clear()  # the open microphone's silence goes on from here
    end = start + _loud_end(pcm)
    done: dict[str, Any] | None = None
    while done is None and time.monotonic() - start < TURN_TIMEOUT_S:
        try:
            event = await client.recv(timeout=1.0)
        except TimeoutError:
            continue
        if event["type"] == "response.done" and event["response"].get("status") != "cancelled":
            done = event["response"]
    if done is None:
        return turn
    events = client.events[seen:]
    rid = done["id"]
    deltas = [(e["_recv_t"], len(base64.b64decode(e["delta"])) / 2 / RATE) for e in events
              if e["type"] == "response.output_audio.delta" and e.get("response_id") == rid]
    turn.gap_ms = (deltas[0][0] - end) * 1000 if deltas else None
    turn.stall_ms = stall_ms(deltas)
    turn.answer = "".join(e.get("delta", "") for e in events
                          if e["type"] == "response.output_audio_transcript.delta"
                          and e.get("response_id") == rid)
    turn.answered, turn.right = True, right_answer(turn.answer, (expect,))
    path = (done.get("metadata") or {}).get("duplex_critical_path", "")
    for part in filter(None, path.split(", ")):
        name, ms = part.rsplit(" ", 1)
        turn.path[name] = float(ms)
    return turn


def cpu_seconds(root: psutil.Process) -> dict[str, float]:
    """CPU seconds (user + system) of the server's event loop (its main
    thread), of its other threads (the stages' model work, which the OS
    cannot tell apart: ``busy_seconds`` splits it by stage), and of each child
    process, by name."""
    out: dict[str, float] = {}
    try:
        for t in root.threads():
            group = "server:loop" if t.id == root.pid else "server:threads"
            out[group] = out.get(group, 0.0) + t.user_time + t.system_time
    except psutil.Error:
        pass
    for p in root.children(recursive=True):
        try:
            t = p.cpu_times()
            out[p.name()] = out.get(p.name(), 0.0) + t.user + t.system
        except psutil.Error:
            continue
    return out


def scheduler_figures(metrics: dict[str, float]) -> tuple[dict[str, tuple[int, float, int]], float]:
    """From /metrics: per "class/stage", the waits for a CPU slot (count, seconds, over
    100 ms), and the partials shed (the code before has none of these)."""
    waits: dict[str, list[float]] = {}
    for key, value in metrics.items():
        if not key.startswith("duplex_cpu_wait_seconds"):
            continue
        labels = dict(part.split("=", 1) for part in key[key.index("{") + 1:-1].split(","))
        name = f"{labels['class'].strip(chr(34))}/{labels['stage'].strip(chr(34))}"
        row = waits.setdefault(name, [0.0, 0.0, 0.0, 0.0])  # count, sum, <=0.1, seen
        if key.startswith("duplex_cpu_wait_seconds_count"):
            row[0] = value
        elif key.startswith("duplex_cpu_wait_seconds_sum"):
            row[1] = value
        elif 'le="0.1"' in key:
            row[2] = value
    shed = sum(v for k, v in metrics.items() if k.startswith("duplex_cpu_shed_total"))
    return {k: (int(c), s, int(c - le)) for k, (c, s, le, _) in waits.items()}, shed


def busy_seconds(metrics: dict[str, float]) -> dict[str, float]:
    """Seconds each stage held a CPU slot (``duplex_cpu_busy_seconds_total``), by stage."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key.startswith("duplex_cpu_busy_seconds_total{"):
            stage = key.split('stage="', 1)[1].split('"', 1)[0]
            out[stage] = out.get(stage, 0.0) + value
    return out


def late_ticks(metrics: dict[str, float]) -> float:
    """Event-loop wake-ups more than 50 ms late (``duplex_event_loop_lag_seconds``)."""
    count = metrics.get("duplex_event_loop_lag_seconds_count", 0.0)
    return count - metrics.get('duplex_event_loop_lag_seconds_bucket{le="0.05"}', count)


def _metrics(server: Server) -> dict[str, float]:
    return scrape(http_get(f"http://127.0.0.1:{server.port}/metrics"))


async def one_n(server: Server, n: int, questions: int, stagger_s: float) -> tuple[list[Turn], Window]:
    assert server.proc is not None
    proc = psutil.Process(server.proc.pid)
    window = Window()
    m0 = _metrics(server)
    cpu0, (waits0, shed0) = cpu_seconds(proc), scheduler_figures(m0)
    t0 = time.monotonic()
    per = await asyncio.gather(*(talker(server, n, i, questions, i * stagger_s, window)
                                 for i in range(n)))
    window.wall_s = round(time.monotonic() - t0, 1)
    m1 = _metrics(server)
    cpu1, (waits1, shed1) = cpu_seconds(proc), scheduler_figures(m1)
    busy0 = busy_seconds(m0)
    window.busy = {k: v - busy0.get(k, 0.0) for k, v in busy_seconds(m1).items()}
    window.late_ticks = late_ticks(m1) - late_ticks(m0)
    window.cpu = {k: round(v - cpu0.get(k, 0.0), 1) for k, v in cpu1.items()}
    for k, (c, s, over) in waits1.items():
        c0, s0, over0 = waits0.get(k, (0, 0.0, 0))
        if c > c0:
            window.waits[k] = (c - c0, s - s0, over - over0)
    window.shed = shed1 - shed0
    return [t for ts in per for t in ts], window


def q(xs: list[float], p: float) -> str:
    return f"{np.quantile(xs, p):.0f}" if xs else "-"


def _gaps(turns: list[Turn]) -> list[float]:
    return [t.gap_ms for t in turns if t.gap_ms is not None]


def report(turns: list[Turn], windows: dict[tuple[str, int], Window], sides: list[str],
           ns: list[int], target_p90_ms: float) -> None:
    print("\n| side | N | turn gap p50 / p90 / max (ms) | worst talker's p50 | answered | right "
          "| replies with audio gaps (total ms) | refused |")
    print("|---|---|---|---|---|---|---|---|")
    for n in ns:
        for side in sides:
            ts = [t for t in turns if (t.side, t.n) == (side, n)]
            w = windows.get((side, n))
            if w is None:
                continue
            gaps = _gaps(ts)
            worst = max((float(np.median(g)) for g in (
                [t.gap_ms for t in ts if t.talker == i and t.gap_ms is not None] for i in range(n)) if g),
                default=float("nan"))
            print(f"| {side} | {n} | {q(gaps, .5)} / {q(gaps, .9)} / {q(gaps, 1.0)} | {worst:.0f} | "
                  f"{sum(t.answered for t in ts)}/{len(ts)} | {sum(t.right for t in ts)}/{len(ts)} "
                  f"| {sum(t.stall_ms > 20 for t in ts)} ({sum(t.stall_ms for t in ts):.0f}) "
                  f"| {w.refused} |")
    print("\ncritical path per segment, p50 / p90 (ms), over the answered turns:")
    for n in ns:
        for side in sides:
            segs: dict[str, list[float]] = {}
            for t in turns:
                if (t.side, t.n) == (side, n):
                    for k, v in t.path.items():
                        segs.setdefault(k, []).append(v)
            if segs:
                print(f"  {side:8} N={n}: " + ", ".join(f"{k} {q(v, .5)}/{q(v, .9)}"
                                                       for k, v in segs.items() if k != "pacing"))
    print("\nwaits for a CPU slot, class/stage: mean ms (count, over 100 ms); shed partials:")
    for n in ns:
        for side in sides:
            w = windows.get((side, n))
            if w is None or not w.waits:
                continue
            print(f"  {side:8} N={n}: " + ", ".join(
                f"{k} {1000 * s / c:.0f} ({c}, {over})" for k, (c, s, over) in sorted(w.waits.items()))
                  + f"; shed {w.shed:.0f}")
    print("\nCPU seconds over each N (wall s): the server's event loop and other threads, its "
          "children; seconds each stage held a slot; event-loop wake-ups over 50 ms late:")
    for n in ns:
        for side in sides:
            w = windows.get((side, n))
            if w is not None:
                parts = sorted(w.cpu.items(), key=lambda kv: -kv[1])
                held = ", ".join(f"{k} {v:.1f}" for k, v in sorted(w.busy.items()) if v >= 0.05)
                print(f"  {side:8} N={n} ({w.wall_s}): " + ", ".join(f"{k} {v}" for k, v in parts if v)
                      + (f"; slots held: {held}" if held else "") + f"; late ticks {w.late_ticks:.0f}")
    print(f"\ncapacity (the most talkers with turn gap p90 <= {target_p90_ms:.0f} ms, every turn "
          "answered, none refused):")
    for side in sides:
        ok = [n for n in ns if (w := windows.get((side, n))) is not None and w.refused == 0
              and (ts := [t for t in turns if (t.side, t.n) == (side, n)])
              and all(t.answered for t in ts) and _gaps(ts)
              and float(np.quantile(_gaps(ts), 0.9)) <= target_p90_ms]
        print(f"  {side}: {max(ok) if ok else 'below ' + str(min(ns))}")


async def run(args: argparse.Namespace) -> tuple[list[Turn], dict[tuple[str, int], Window]]:
    sides = [Side.parse(spec) for spec in args.sides]
    servers = {s.name: Server(s.name, before_tree(s.ref) if s.ref else REPO, args.config, s.env)
               for s in sides}
    turns: list[Turn] = []
    windows: dict[tuple[str, int], Window] = {}
    try:
        for s in servers.values():
            s.start()
        for s in servers.values():
            s.wait_ready()
        for s in servers.values():  # a warm-up turn each: a fresh server's first decodes are slow
            await talker(s, 0, 0, 1, 0.0)
        for n in args.ns:
            questions = 2 if n >= 8 else args.questions
            for r in range(args.rounds):
                # The order alternates round by round: the side that runs second
                # measured slower at one talker with the same code (30-50 ms p50).
                order = list(servers.items())
                for name, s in (order if r % 2 == 0 else order[::-1]):
                    got, window = await one_n(s, n, questions, args.stagger_s)
                    turns += got
                    windows.setdefault((name, n), Window()).add(window)
                    print(f"{name:8} N={n}: gaps {[round(g) for g in _gaps(got)]}, answered "
                          f"{sum(t.answered for t in got)}/{len(got)}, right "
                          f"{sum(t.right for t in got)}"
                          + (f", refused {window.refused}" if window.refused else ""), flush=True)
    finally:
        for s in servers.values():
            s.stop()
    return turns, windows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sides", nargs="+", default=["before@4083ce1", "now"])
    p.add_argument("--ns", nargs="+", type=int, default=[1, 2, 4, 6, 8])
    p.add_argument("--questions", type=int, default=3)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--stagger-s", type=float, default=0.9)
    p.add_argument("--target-p90-ms", type=float, default=1200.0)
    p.add_argument("--config", default="configs/cascade-cpu.yaml")
    p.add_argument("--json", help="write every turn here")
    args = p.parse_args(argv)
    m = machine()
    print(f"machine: {m['summary']}, {m['memory_gib']} GiB; load {m['load']}", flush=True)
    turns, windows = asyncio.run(run(args))
    names = [Side.parse(s).name for s in args.sides]
    report(turns, windows, names, args.ns, args.target_p90_ms)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": m, "turns": [asdict(t) for t in turns],
             "windows": {f"{k[0]} N={k[1]}": asdict(v) for k, v in windows.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
