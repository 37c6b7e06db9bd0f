"""Full-Duplex-Bench-style turn-taking scenarios over the real realtime socket.

One server (``--config``, default configs/cascade-cpu.yaml: Silero -> Whisper ->
vLLM -> Piper), two phases on it, one connection per trial, speech made on the
spot by Flite (several voices) and streamed in 20 ms chunks at real time:

- ``duplex``: the session's new behaviour -- adaptive interruptions, paced
  output, ``--turn-detection`` (server_vad, or semantic_vad once it decides
  from meaning);
- ``baseline``: OpenAI's behaviour -- ``server_vad``, ``interruption:
  immediate``, unpaced output.

Scenarios (Full-Duplex-Bench v1's categories, arXiv 2503.04721):

- pause: an unfinished question with a 300/600/900/1200 ms pause inside
  ("What is the capital ... of France?"); take-over = a response.created
  before the user's last word (lower is better);
- turn: complete questions; turn gap = end of the user's speech (the slot of
  its last chunk) -> first reply audio delta read by the client; answer right;
- interruption: a new question while a story plays; onset -> speech_started
  (a client stops playback there), onset -> last old audio delta read;
  handled = the story cancelled and the new question answered right;
- backchannel: "okay", "yeah", "I see", "right", "uh-huh" while a reply
  plays; kept = that reply is not cancelled (completed, or incomplete at
  its max_output_tokens). No hum ("mm-hmm", "mhm", "hmm"): Flite spells
  those out letter by letter ("em em aitch em em", over a second of speech),
  which no listener would take for a backchannel;
- greeting: the user speaks over the assistant's greeting; handled = the
  greeting cancelled and the question answered.

It prints one table (both phases) beside the published Full-Duplex-Bench v1
figures (bench/README.md says where each comes from); it never asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/: the lib package
from lib import machine  # noqa: E402
from lib.voice_scenarios import CHUNK_S, Conn, Speech, joined, utter  # noqa: E402

from vllm_duplex.host.deploy import load_config  # noqa: E402
from vllm_duplex.host.runtime import Runtime  # noqa: E402
from vllm_duplex.realtime.server.serving import BackgroundServer  # noqa: E402

VOICES = ("slt", "rms", "awb", "kal16")
PAUSED = (("What is the capital", "of France?"), ("Can you tell me", "the largest ocean?"),
          ("I would like to know", "where the Eiffel Tower is."))
PAUSES_MS = (300, 600, 900, 1200)
QUESTIONS = (("What is the capital of France?", "paris"), ("What is the largest ocean?", "pacific"),
             ("What is the capital of Italy?", "rome"), ("Where is the Eiffel Tower?", "paris"),
             ("What is the capital of Spain?", "madrid"))
STORY = "Tell me a long story about a dragon."
BACKCHANNELS = ("Okay.", "Yeah.", "I see.", "Right.", "Uh-huh.")
NEW_QUESTION = ("What is the capital of France?", "paris")

# Published Full-Duplex-Bench v1 figures (bench/README.md "duplex_bench.py" cites them).
PUBLISHED = {
    "Moshi": {"pause_tor": "0.985", "turn_gap": "265 ms", "interrupt": "257 ms",
              "backchannel_kept": "n/a"},
    "PersonaPlex": {"pause_tor": "0.584", "turn_gap": "170 ms", "interrupt": "70 / 240 ms",
                    "backchannel_kept": "0.673 (1 - TOR 0.327)"},
    "Gemini Live": {"pause_tor": "0.255", "turn_gap": "1301 ms", "interrupt": "1183 ms",
                    "backchannel_kept": "n/a"},
    "GPT-Realtime": {"pause_tor": "not found", "turn_gap": "not found", "interrupt": "not found",
                     "backchannel_kept": "not found"},
}


@dataclass
class Trial:
    scenario: str
    detail: str
    ok: bool | None = None  # take-over (pause), right answer, kept, handled
    gap_ms: float = math.nan  # turn gap / onset -> speech_started
    after_ms: float = math.nan  # onset -> last old audio delta (interruption)
    note: str = ""


def _reply_text(conn: Conn, rid: str) -> str:
    return "".join(e.get("delta", "") for e in conn.events
                   if e.get("type") == "response.output_audio_transcript.delta"
                   and e.get("response_id") == rid).lower()


def _done(conn: Conn, rid: str) -> dict[str, Any] | None:
    return next((e for e in conn.events if e.get("type") == "response.done"
                 and (e.get("response") or {}).get("id") == rid), None)


async def _open(url: str, session: dict[str, Any], max_tokens: int) -> Conn:
    conn = await Conn.open(url)
    await conn.rt.send({"type": "session.update",
                        "session": {**session, "max_output_tokens": max_tokens}})
    t0 = time.monotonic()
    while not conn.find(0, "session.updated") and time.monotonic() - t0 < 10:
        await asyncio.sleep(0.01)
    return conn


async def _wait(conn: Conn, cond, timeout: float) -> bool:
    return await conn.silence_until(cond, timeout)


async def pause_trial(url: str, session: dict, first: Speech, second: Speech, pause_ms: int) -> Trial:
    conn = await _open(url, session, 24)
    try:
        chunks, last = joined(first, second, gaps_ms=(pause_ms,))
        slots = await conn.send(chunks)
        end_t = slots[last] + CHUNK_S
        await asyncio.sleep(0.3)
        early = [e for e in conn.events if e.get("type") == "response.created"
                 and e["_recv_t"] < end_t]
        return Trial("pause", f"{pause_ms} ms", ok=bool(early),
                     note=f"{first.text} ... {second.text}")
    finally:
        await conn.close()


async def turn_trial(url: str, session: dict, q: Speech, expect: str) -> Trial:
    conn = await _open(url, session, 32)
    try:
        slots = await conn.send(q.chunks)
        end_t = slots[q.end] + CHUNK_S

        def answered() -> bool:
            return any(e.get("type") == "response.done" for e in conn.events)
        await _wait(conn, answered, 30)
        created = conn.find(0, "response.created")
        rid = (created or {}).get("response", {}).get("id")
        first = next((e for e in conn.events if e.get("type") == "response.output_audio.delta"
                      and e.get("response_id") == rid), None)
        text = _reply_text(conn, rid) if rid else ""
        return Trial("turn", q.text, ok=expect in text,
                     gap_ms=(first["_recv_t"] - end_t) * 1000 if first else math.nan, note=text[:60])
    finally:
        await conn.close()


async def _story(conn: Conn, story: Speech, listen_s: float) -> str | None:
    await conn.send(story.chunks)
    ok = await _wait(conn, lambda: conn.find(0, "response.output_audio.delta") is not None, 40)
    if not ok:
        return None
    rid = conn.find(0, "response.output_audio.delta")["response_id"]
    t = time.monotonic() + listen_s
    await _wait(conn, lambda: time.monotonic() >= t, listen_s + 5)
    return rid


async def interruption_trial(url: str, session: dict, story: Speech, q: Speech, expect: str,
                             scenario: str = "interruption") -> Trial:
    conn = await _open(url, session, 64)
    try:
        if scenario == "greeting":
            await conn.rt.send({"type": "response.create", "response": {
                "instructions": "Greet the user warmly and ask how you can help, in two sentences."}})
            ok = await _wait(conn, lambda: conn.find(0, "response.output_audio.delta") is not None, 40)
            rid = conn.find(0, "response.output_audio.delta")["response_id"] if ok else None
            await asyncio.sleep(0.4)
        else:
            rid = await _story(conn, story, 1.0)
        if rid is None:
            return Trial(scenario, q.text, ok=False, note="no reply to interrupt")
        mark = len(conn.events)
        slots = await conn.send(q.chunks)
        onset_t = slots[q.onset]

        def answers() -> list[dict]:
            # A reply a revised transcript (or a pause inside the question)
            # cancelled is not the answer: the one that ran to its end is.
            return [e for e in conn.events[mark:] if e.get("type") == "response.done"
                    and e["response"]["id"] != rid and e["response"]["status"] != "cancelled"]
        await _wait(conn, lambda: bool(answers()), 40)
        started = next((e for e in conn.events[mark:]
                        if e.get("type") == "input_audio_buffer.speech_started"), None)
        old = [e for e in conn.events if e.get("type") == "response.output_audio.delta"
               and e.get("response_id") == rid]
        done = _done(conn, rid)
        cancelled = bool(done) and done["response"]["status"] == "cancelled" and \
            done["_recv_t"] >= onset_t
        answer = answers()
        text = _reply_text(conn, answer[0]["response"]["id"]) if answer else ""
        restarts = sum(e.get("type") == "response.created" and e["response"]["id"] != rid
                       for e in conn.events[mark:]) - bool(answer)
        return Trial(scenario, q.text, ok=cancelled and expect in text,
                     gap_ms=(started["_recv_t"] - onset_t) * 1000 if started else math.nan,
                     after_ms=max(0.0, (old[-1]["_recv_t"] - onset_t) * 1000) if old else math.nan,
                     note=f"old {done['response']['status'] if done else '?'}; "
                          f"{restarts} cancelled before the answer; new: {text[:50]}")
    finally:
        await conn.close()


async def backchannel_trial(url: str, session: dict, story: Speech, bc: Speech) -> Trial:
    conn = await _open(url, session, 40)
    try:
        rid = await _story(conn, story, 1.0)
        if rid is None:
            return Trial("backchannel", bc.text, ok=False, note="no reply")
        await conn.send(bc.chunks)
        await _wait(conn, lambda: _done(conn, rid) is not None, 60)
        done = _done(conn, rid)
        status = done["response"]["status"] if done else "no response.done"
        resumed = conn.find(0, "duplex.output_audio.resumed") is not None
        # kept: not cancelled (incomplete = it ran to max_output_tokens)
        return Trial("backchannel", bc.text, ok=status in ("completed", "incomplete"),
                     note=f"{status}{', resumed' if resumed else ''}")
    finally:
        await conn.close()


@dataclass
class Phase:
    name: str
    session: dict[str, Any]
    trials: list[Trial] = field(default_factory=list)


def phase_sessions(td: str, eagerness: str | None) -> list[Phase]:
    turn = {"type": td} | ({"eagerness": eagerness} if eagerness and td == "semantic_vad" else {})
    return [
        Phase("duplex", {"interruption": {"mode": "adaptive"},
                         "audio": {"input": {"turn_detection": turn},
                                   "output": {"pacing": {"type": "realtime"}}}}),
        Phase("baseline", {"interruption": {"mode": "immediate"},
                           "audio": {"input": {"turn_detection": {"type": "server_vad"}},
                                     "output": {"pacing": {"type": "none"}}}}),
    ]


async def run_phase(url: str, phase: Phase, n: int) -> None:
    voices = iter(VOICES * 100)
    print(f"[{phase.name}] {json.dumps(phase.session)}", flush=True)

    def log(t: Trial) -> None:
        phase.trials.append(t)
        print(f"  {t.scenario:12s} {t.detail:34s} ok={t.ok!s:5s} gap={t.gap_ms:7.0f} ms "
              f"after={t.after_ms:6.0f} ms  {t.note}", flush=True)

    for pause in PAUSES_MS:
        for first, second in PAUSED[:n]:
            v = next(voices)
            log(await pause_trial(url, phase.session, utter(first, v, tail_s=0.0),
                                  utter(second, v, lead_s=0.0), pause))
    for q, expect in QUESTIONS[:max(n + 2, 3)]:
        log(await turn_trial(url, phase.session, utter(q, next(voices)), expect))
    for _ in range(n):
        v = next(voices)
        log(await interruption_trial(url, phase.session, utter(STORY, v, tail_s=0.8),
                                     utter(NEW_QUESTION[0], next(voices), lead_s=0.1),
                                     NEW_QUESTION[1]))
    for bc in BACKCHANNELS[:max(n + 2, 3)]:
        log(await backchannel_trial(url, phase.session, utter(STORY, next(voices), tail_s=0.8),
                                    utter(bc, next(voices), lead_s=0.1, tail_s=1.0)))
    for _ in range(max(1, n - 1)):
        log(await interruption_trial(url, phase.session, None, utter(NEW_QUESTION[0], next(voices)),
                                     NEW_QUESTION[1], scenario="greeting"))


def _pct(xs: list[float], q: float) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.percentile(xs, q)) if xs else math.nan


def summary(phase: Phase) -> dict[str, str]:
    t = phase.trials

    def rate(scn: str, pred=lambda x: x.ok) -> str:
        xs = [x for x in t if x.scenario == scn]
        return f"{sum(bool(pred(x)) for x in xs) / len(xs):.2f} ({len(xs)})" if xs else "n/a"
    out = {}
    for pause in PAUSES_MS:
        out[f"pause {pause} ms: take-over rate"] = _tor(t, pause)
    gaps = [x.gap_ms for x in t if x.scenario == "turn"]
    out["turn gap p50 / p90"] = f"{_pct(gaps, 50):.0f} / {_pct(gaps, 90):.0f} ms"
    out["turn: answer right"] = rate("turn")
    ints = [x for x in t if x.scenario == "interruption"]
    out["interruption handled (cancel + right answer)"] = rate("interruption")
    out["interruption: onset -> speech_started p50"] = f"{_pct([x.gap_ms for x in ints], 50):.0f} ms"
    out["interruption: onset -> last old audio p50"] = f"{_pct([x.after_ms for x in ints], 50):.0f} ms"
    out["backchannel: reply kept"] = rate("backchannel")
    out["greeting: speech over it handled"] = rate("greeting")
    return out


def _tor(trials: list[Trial], pause: int) -> str:
    xs = [x for x in trials if x.scenario == "pause" and x.detail == f"{pause} ms"]
    return f"{sum(bool(x.ok) for x in xs) / len(xs):.2f} ({len(xs)})" if xs else "n/a"


def table(phases: list[Phase]) -> str:
    sums = [summary(p) for p in phases]
    rows = [("figure", *[p.name for p in phases])] + [
        (k, *[s[k] for s in sums]) for k in sums[0]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    pub = ["", "published Full-Duplex-Bench v1 (bench/README.md for sources):",
           "model        | pause TOR (synth.) | turn-taking latency | interruption latency | backchannel"]
    for name, f in PUBLISHED.items():
        pub.append(f"{name:12s} | {f['pause_tor']:18s} | {f['turn_gap']:19s} | {f['interrupt']:20s} "
                   f"| {f['backchannel_kept']}")
    return "\n".join(lines + pub)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="cascade-cpu")
    ap.add_argument("--turn-detection", default="semantic_vad", choices=("server_vad", "semantic_vad"),
                    help="the duplex phase's (the baseline is always server_vad)")
    ap.add_argument("--eagerness", default=None, choices=("low", "medium", "high", "auto"))
    ap.add_argument("--trials", type=int, default=2, help="trials per scenario variant (1-3)")
    ap.add_argument("--phases", default="duplex,baseline")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    phases = [p for p in phase_sessions(args.turn_detection, args.eagerness)
              if p.name in args.phases.split(",")]
    print(machine.line(), flush=True)
    runtime = Runtime(load_config(args.config))
    async with BackgroundServer(runtime) as server:
        for phase in phases:
            await run_phase(server.ws_url, phase, max(1, min(3, args.trials)))
    print()
    print(table(phases))
    if args.json:
        Path(args.json).write_text(json.dumps({p.name: [asdict(t) for t in p.trials] for p in phases},
                                              indent=1, default=str))


if __name__ == "__main__":
    asyncio.run(main())
