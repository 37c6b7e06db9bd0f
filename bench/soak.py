"""Soak: does the server ever freeze? (issue 21)

One ``vllm-duplex serve`` subprocess on the default config (``--config``,
configs/cascade-cpu.yaml: Silero -> Whisper -> vLLM -> Piper), realtime
sessions for ``--minutes`` on ``--lanes`` lanes (each lane opens one session
after another, the lanes overlap), Flite speech streamed at real time, and
``GET /health`` polled every 250 ms by a thread of its own (its latency is the
server's, not this process's event loop's). The sessions cycle through:

- ``plain``: a question;
- ``pause``: a question with a 900 ms thinking pause inside;
- ``interrupt``: a long story asked for, interrupted after 1.5 s of its audio by
  a question (the story must be cancelled, the question answered);
- ``backchannel``: "okay" said over a reply (the reply should go on; when
  the okay is taken for a turn, that turn must be answered);
- ``vanish-reply`` / ``vanish-speech``: a client that drops its TCP connection
  without a close (during the reply / in the middle of its question); its
  session waits detached for the resume grace.

It reports the worst and the distribution of the /health latencies, the
server's ``duplex_event_loop_lag_seconds`` histogram and its stall warnings
(the stacks its watchdog logged, ``host/loop_lag.py``), every session's
question, what the server heard and what it answered, and the server's RSS
and open asyncio tasks before the sessions and after they (and their grace)
ended. It never asserts; targets are printed as PASS/MISS.

    .venv/bin/python bench/soak.py [--minutes 10] [--lanes 2] [--config cascade-cpu]
                                   [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib.serve_process import REPO, ServerProcess, machine, scrape  # noqa: E402
from lib.voice_scenarios import CHUNK_S, SILENCE, Conn, Speech, joined, utter  # noqa: E402

HEALTH_EVERY_S = 0.25
HEALTH_TARGET_S = 0.25
ANSWER_TIMEOUT_S = 60.0
SCENARIOS = ("plain", "pause", "interrupt", "backchannel", "plain", "vanish-reply", "pause",
             "vanish-speech")
QUESTIONS = (("What is the capital of France?", "paris"), ("What is the capital of Italy?", "rome"),
             ("What is the largest ocean?", "pacific"), ("What is the capital of Spain?", "madrid"))
PAUSED = (("What is the capital", "of France?", "paris"),
          ("Can you tell me", "the capital of Italy?", "rome"))
STORY = "Tell me a long story about a dragon."
VOICES = ("slt", "rms", "awb")


# ---- /health, polled from a thread ------------------------------------------------------------


class HealthPoller(threading.Thread):
    """``GET /health`` every 250 ms on an absolute schedule; a request that is
    still out when the next is due delays it (so a 30 s freeze is one 30 s sample,
    not 120 queued ones)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="soak-health", daemon=True)
        self.url = url + "/health"
        self.samples: list[tuple[float, float, int]] = []  # (start, seconds, status)
        self.stop = threading.Event()

    def run(self) -> None:
        due = time.monotonic()
        while not self.stop.is_set():
            start = time.monotonic()
            try:
                with urllib.request.urlopen(self.url, timeout=120) as r:  # noqa: S310 (loopback)
                    r.read()
                    status = r.status
            except urllib.error.HTTPError as e:
                status = e.code
            except OSError:
                status = 0
            self.samples.append((start, time.monotonic() - start, status))
            due += HEALTH_EVERY_S
            self.stop.wait(max(0.0, due - time.monotonic()))
            due = max(due, time.monotonic() - HEALTH_EVERY_S)


# ---- one session --------------------------------------------------------------------------------


@dataclass
class SessionResult:
    lane: int
    n: int
    scenario: str
    question: str
    expect: str = ""
    started_s: float = 0.0  # since the soak began
    heard: list[str] = field(default_factory=list)  # final transcripts
    answer: str = ""  # the reply that ran to its end
    status: str = ""  # answered / no answer / vanished / ...
    right: bool | None = None  # the answer holds the expected word
    seconds: float = 0.0
    note: str = ""
    timeline: list[str] = field(default_factory=list)  # a session that failed: its events


def timeline(conn: Conn, t0: float) -> list[str]:
    """The session's events (without audio/text deltas) at their arrival."""
    out = []
    for e in conn.events:
        etype = e.get("type", "")
        if etype.endswith(".delta"):
            continue
        extra = (e.get("response") or {}).get("status") or e.get("transcript") or \
            (e.get("error") or {}).get("code") or ""
        out.append(f"{(e['_recv_t'] - t0) * 1000:7.0f} ms {etype} {extra}".rstrip())
    return out


def _reply_text(conn: Conn, rid: str) -> str:
    return "".join(e.get("delta", "") for e in conn.events
                   if e.get("type") == "response.output_audio_transcript.delta"
                   and e.get("response_id") == rid)


def _answers(conn: Conn, start: int, skip: str | None = None) -> list[dict[str, Any]]:
    """response.done events after ``start`` that ran to their end (not the one ``skip``)."""
    return [e for e in conn.events[start:] if e.get("type") == "response.done"
            and e["response"]["id"] != skip and e["response"]["status"] in ("completed", "incomplete")]


def _first_audio(conn: Conn, start: int = 0) -> dict[str, Any] | None:
    return conn.find(start, "response.output_audio.delta")


def _vanish(conn: Conn) -> None:
    """Drop the TCP connection: no close frame, no session.close."""
    conn.reader.cancel()
    transport = getattr(conn.rt.ws, "transport", None)
    if transport is not None:
        transport.abort()


async def run_session(url: str, r: SessionResult, speech: dict[str, Any]) -> None:
    t0 = time.monotonic()
    conn = await Conn.open(url)
    vanished = False
    try:
        await conn.rt.send({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 48 if r.scenario in ("interrupt", "backchannel")
            else 32}})
        await conn.silence_until(lambda: conn.find(0, "session.updated") is not None, 10)
        s = r.scenario
        if s in ("plain", "pause"):
            chunks = speech["chunks"]
            await conn.send(chunks)
            ok = await conn.silence_until(lambda: bool(_answers(conn, 0)), ANSWER_TIMEOUT_S)
            _settle_answer(conn, r, 0, None, ok)
        elif s == "interrupt":
            story: Speech = speech["story"]
            await conn.send(story.chunks)
            if not await conn.silence_until(lambda: _first_audio(conn) is not None, ANSWER_TIMEOUT_S):
                r.status, r.note = "no answer", "the story never started"
                return
            rid = _first_audio(conn)["response_id"]
            until = time.monotonic() + 1.5
            await conn.silence_until(lambda: time.monotonic() >= until, 5)
            mark = len(conn.events)
            await conn.send(speech["chunks"])
            ok = await conn.silence_until(lambda: bool(_answers(conn, mark, rid)), ANSWER_TIMEOUT_S)
            _settle_answer(conn, r, mark, rid, ok)
            done = next((e for e in conn.events if e.get("type") == "response.done"
                         and e["response"]["id"] == rid), None)
            r.note = f"story {done['response']['status'] if done else 'not done'}"
        elif s == "backchannel":
            chunks = speech["chunks"]
            await conn.send(chunks)
            if not await conn.silence_until(lambda: _first_audio(conn) is not None, ANSWER_TIMEOUT_S):
                r.status, r.note = "no answer", "no reply to speak over"
                return
            rid = _first_audio(conn)["response_id"]
            until = time.monotonic() + 0.8
            await conn.silence_until(lambda: time.monotonic() >= until, 5)
            await conn.send(speech["okay"].chunks)

            def ended() -> dict[str, Any] | None:
                return next((e for e in conn.events if e.get("type") == "response.done"
                             and e["response"]["id"] == rid), None)
            await conn.silence_until(lambda: ended() is not None, ANSWER_TIMEOUT_S)
            done = ended()
            status = done["response"]["status"] if done else "no response.done"
            if status in ("completed", "incomplete"):
                r.answer = _reply_text(conn, rid)
                r.status = "answered"
            elif done is not None:  # "okay" was taken for a turn: it must be answered then
                mark = conn.events.index(done)
                ok = await conn.silence_until(lambda: bool(_answers(conn, mark, rid)),
                                              ANSWER_TIMEOUT_S)
                _settle_answer(conn, r, mark, rid, ok)
            else:
                r.status = "no answer"
            resumed = conn.find(0, "duplex.output_audio.resumed") is not None
            r.note = f"reply {status}{', resumed after okay' if resumed else ''}"
        elif s == "vanish-reply":
            await conn.send(speech["chunks"])
            got = await conn.silence_until(lambda: _first_audio(conn) is not None, ANSWER_TIMEOUT_S)
            r.status = "vanished" if got else "no answer"
            r.note = "dropped the socket at the first reply audio" if got else "no reply audio"
            if got:
                r.answer = "(first audio received)"
            _vanish(conn)
            vanished = True
        elif s == "vanish-speech":
            chunks = speech["chunks"]
            await conn.send(chunks[: len(chunks) // 2])
            r.status, r.note = "vanished", "dropped the socket mid-question"
            _vanish(conn)
            vanished = True
        r.heard = [e.get("transcript", "") for e in conn.events if e.get("type") ==
                   "conversation.item.input_audio_transcription.completed"]
        if r.expect and r.status == "answered":
            r.right = r.expect in r.answer.lower()
    finally:
        r.seconds = time.monotonic() - t0
        if r.status not in ("answered", "vanished"):
            r.timeline = timeline(conn, t0)
        if not vanished:
            await conn.close()


def _settle_answer(conn: Conn, r: SessionResult, start: int, skip: str | None, ok: bool) -> None:
    answers = _answers(conn, start, skip)
    if ok and answers:
        r.answer = _reply_text(conn, answers[-1]["response"]["id"])
        r.status = "answered"
    else:
        errors = [e.get("error", {}).get("code") for e in conn.events if e.get("type") == "error"]
        r.status = "no answer"
        r.note = f"errors: {errors}" if errors else "nothing within the timeout"


# ---- the soak -------------------------------------------------------------------------------------


def speech_for(scenario: str, k: int, rng: random.Random) -> tuple[str, str, dict[str, Any]]:
    voice = VOICES[k % len(VOICES)]
    if scenario == "pause":
        first, second, expect = PAUSED[k % len(PAUSED)]
        chunks, _ = joined(utter(first, voice), utter(second, voice), gaps_ms=(900,))
        return f"{first} ... {second}", expect, {"chunks": chunks}
    question, expect = QUESTIONS[k % len(QUESTIONS)]
    out: dict[str, Any] = {"chunks": utter(question, voice).chunks}
    if scenario == "interrupt":
        out["story"] = utter(STORY, voice, tail_s=0.6)
    if scenario == "backchannel":
        question, expect = "Tell me about the Eiffel Tower.", ""
        out["chunks"] = utter(question, voice).chunks
        out["okay"] = utter("Okay.", voice, lead_s=0.0, tail_s=0.8)
    return question, expect, out


async def lane(url: str, index: int, deadline: float, t_start: float, results: list[SessionResult],
               rng: random.Random, counter: list[int]) -> None:
    await asyncio.sleep(index * 7.0)  # the lanes start apart, then overlap as they drift
    while time.monotonic() < deadline:
        k = counter[0]
        counter[0] += 1
        scenario = SCENARIOS[k % len(SCENARIOS)]
        question, expect, speech = await asyncio.to_thread(speech_for, scenario, k, rng)
        r = SessionResult(index, k, scenario, question, expect,
                          started_s=round(time.monotonic() - t_start, 1))
        results.append(r)
        try:
            await run_session(url, r, speech)
        except Exception as e:  # a refused or broken session is a result, not the end
            r.status, r.note = "failed", f"{type(e).__name__}: {e}"[:200]
        print(f"  [{r.started_s:6.1f}s lane {index}] {r.scenario:13s} {r.status:10s} "
              f"{r.seconds:5.1f}s  heard={r.heard!r:.60} answer={r.answer!r:.60} {r.note}",
              flush=True)
        await asyncio.sleep(rng.uniform(0.5, 3.0))


def tasks_and_rss(server: ServerProcess) -> tuple[float, int]:
    m = scrape(_get(server.http_url + "/metrics"))
    return m.get("duplex_event_loop_tasks", math.nan), server.rss()


def _get(url: str, timeout: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback only)
        return r.read().decode()


def lag_histogram(metrics_text: str) -> list[tuple[str, int]]:
    """(le, count in that bucket alone) of duplex_event_loop_lag_seconds."""
    cumulative = []
    for line in metrics_text.splitlines():
        m = re.match(r'duplex_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\d+)', line)
        if m:
            cumulative.append((m.group(1), int(m.group(2))))
    out, prev = [], 0
    for le, n in cumulative:
        out.append((le, n - prev))
        prev = n
    return out


def stall_counts(m: dict[str, float]) -> dict[str, float]:
    """duplex_event_loop_stalls_total by cause."""
    return {c: m.get(f'duplex_event_loop_stalls_total{{cause="{c}"}}', 0.0)
            for c in ("blocked", "gil", "starved")}


def stall_warnings(log_text: str) -> list[str]:
    """The watchdog's warnings in the server log, each with its stack (or,
    for a stall it could not see while it lasted, the other threads)."""
    blocks, cur = [], None
    for line in log_text.splitlines():
        if "event loop blocked for" in line or ("event loop stalled for" in line
                                                 and "cause: " in line and " -- " in line):
            if cur is not None:
                blocks.append("\n".join(cur))
            cur = [line]
        elif cur is not None and (line.startswith(" ") or line.startswith("The loop thread")):
            cur.append(line)
        elif cur is not None:
            blocks.append("\n".join(cur))
            cur = None
    if cur is not None:
        blocks.append("\n".join(cur))
    return blocks


def quantile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    config = args.config if args.config.endswith(".yaml") else str(REPO / "configs" / f"{args.config}.yaml")
    load0 = os.getloadavg()
    with ServerProcess(config, sessions=16, start_timeout_s=300) as server:
        url = server.ws_url
        print(f"server up on {server.http_url}; warm-up session", flush=True)
        warm = SessionResult(-1, -1, "plain", QUESTIONS[0][0], QUESTIONS[0][1])
        _, _, speech = speech_for("plain", 0, rng)
        await run_session(url, warm, speech)
        print(f"  warm-up: {warm.status} {warm.answer!r}", flush=True)
        await asyncio.sleep(2.0)
        tasks0, rss0 = tasks_and_rss(server)
        startup_warnings = len(stall_warnings(Path(server.log_path).read_text(errors="replace")))
        stalls0 = stall_counts(scrape(_get(server.http_url + "/metrics")))
        lag0 = lag_histogram(_get(server.http_url + "/metrics"))
        poller = HealthPoller(server.http_url)
        poller.start()
        t_start = time.monotonic()
        deadline = t_start + args.minutes * 60
        results: list[SessionResult] = []
        counter = [0]
        await asyncio.gather(*(lane(url, i, deadline, t_start, results, rng, counter)
                               for i in range(args.lanes)))
        soak_s = time.monotonic() - t_start
        grace = 35.0  # the detached sessions' resume grace (30 s) runs out
        print(f"sessions done after {soak_s:.0f} s; waiting {grace:.0f} s for detached ones",
              flush=True)
        await asyncio.sleep(grace)
        poller.stop.set()
        poller.join(130)
        metrics_text = _get(server.http_url + "/metrics")
        tasks1, rss1 = tasks_and_rss(server)
        log_text = Path(server.log_path).read_text(errors="replace")
    load1 = os.getloadavg()
    m = scrape(metrics_text)
    lat = [s for _, s, _ in poller.samples]
    worst = max(poller.samples, key=lambda x: x[1]) if poller.samples else (0, math.nan, 0)
    counted = [r for r in results if r.scenario not in ("vanish-reply", "vanish-speech")]
    answered = sum(r.status == "answered" for r in counted)
    stalls = stall_warnings(log_text)[startup_warnings:]  # those of the soak itself
    return {
        "machine": machine(), "config": config, "minutes": args.minutes, "lanes": args.lanes,
        "soak_s": round(soak_s, 1), "load_before": load0, "load_after": load1,
        "health": {"polls": len(lat), "worst_s": worst[1], "worst_at_s": worst[0] - t_start,
                   "p50_s": quantile(lat, 0.5), "p99_s": quantile(lat, 0.99),
                   "over_250ms": sum(x > HEALTH_TARGET_S for x in lat),
                   "not_200": sum(st != 200 for _, _, st in poller.samples)},
        "loop_lag": {"histogram": [(le, n - n0) for (le, n), (_, n0) in
                               zip(lag_histogram(metrics_text), lag0)],
                     "count": m.get("duplex_event_loop_lag_seconds_count", math.nan),
                     "sum_s": m.get("duplex_event_loop_lag_seconds_sum", math.nan),
                     "stalls": {c: n - stalls0[c] for c, n in stall_counts(m).items()},
                     "startup_warnings": startup_warnings, "warnings": stalls},
        "sessions": [asdict(r) for r in results], "answered": answered, "asked": len(counted),
        "right": sum(bool(r.right) for r in counted),
        "rss_before_mib": rss0 / 2**20, "rss_after_mib": rss1 / 2**20,
        "tasks_before": tasks0, "tasks_after": tasks1,
        "sessions_live_after": m.get("duplex_sessions_live", math.nan),
        "errors": {k: v for k, v in m.items() if k.startswith("duplex_errors_total")},
    }


def report(out: dict[str, Any]) -> None:
    h, lag = out["health"], out["loop_lag"]
    print(f"\nsoak: {out['soak_s']:.0f} s, {out['lanes']} lanes, {len(out['sessions'])} sessions, "
          f"config {Path(out['config']).name}; load average before {out['load_before'][0]:.2f}, "
          f"after {out['load_after'][0]:.2f}")
    print(f"machine: {out['machine']['summary']}, {out['machine']['memory_gib']} GiB")
    print("\n| figure | result | target |\n|---|---|---|")
    rows = [
        ("GET /health worst (polled every 250 ms)",
         f"{h['worst_s'] * 1000:.0f} ms at {h['worst_at_s']:.0f} s; p50 {h['p50_s'] * 1000:.1f} ms, "
         f"p99 {h['p99_s'] * 1000:.1f} ms; {h['over_250ms']} of {h['polls']} over 250 ms",
         "≤ 250 ms: " + ("PASS" if h["worst_s"] <= HEALTH_TARGET_S else "MISS")),
        ("questions answered", f"{out['answered']} / {out['asked']} "
         f"({out['right']} with the expected word)",
         "all: " + ("PASS" if out["answered"] == out["asked"] else "MISS")),
        ("loop-lag warnings: blocked (code on the loop) / gil / starved (no CPU)",
         " / ".join(f"{lag['stalls'][c]:.0f}" for c in ("blocked", "gil", "starved")),
         "0 on an idle machine"),
        ("RSS before → after", f"{out['rss_before_mib']:.0f} → {out['rss_after_mib']:.0f} MiB "
         f"({out['rss_after_mib'] / out['rss_before_mib']:.2f}×)",
         "≤ 1.10×: " + ("PASS" if out["rss_after_mib"] <= 1.1 * out["rss_before_mib"] else "MISS")),
        ("open asyncio tasks before → after", f"{out['tasks_before']:.0f} → {out['tasks_after']:.0f}",
         "equal"),
        ("sessions live after", f"{out['sessions_live_after']:.0f}", "0"),
    ]
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nduplex_event_loop_lag_seconds during the soak (per bucket): " + ", ".join(
        f"≤{le}: {n}" for le, n in lag["histogram"] if n))
    print(f"(stall warnings during the server's start, before the sessions: "
          f"{lag['startup_warnings']})")
    for w in lag["warnings"]:
        print("\n" + w)
    print("\n| # | lane | at | scenario | question | heard | answer | status |\n|---|---|---|---|---|---|---|---|")
    for s in out["sessions"]:
        print(f"| {s['n']} | {s['lane']} | {s['started_s']:.0f} s | {s['scenario']} | {s['question']} | "
              f"{' / '.join(s['heard'])} | {s['answer'].strip()} | {s['status']}"
              f"{' (' + s['note'] + ')' if s['note'] else ''} |")
    for s in out["sessions"]:
        if s["timeline"]:
            print(f"\nsession {s['n']} ({s['scenario']}, {s['status']}):\n  " + "\n  ".join(s["timeline"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--lanes", type=int, default=2)
    ap.add_argument("--config", default="cascade-cpu")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = asyncio.run(soak(args))
    report(out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
