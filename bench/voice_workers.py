"""Concurrent voice sessions on the real pipeline: one process vs ``serve --workers N``.

    python bench/voice_workers.py [--sessions 8] [--turns 3] [--workers 2]
                                  [--config cascade-cpu] [--json out.json]

Two phases in one run, each against a fresh ``vllm-duplex serve`` subprocess on the
same deployment config: one process (the baseline), then ``--workers N`` (nginx in
front of N worker processes sharing one vLLM engine core). In each, ``--sessions``
clients connect at once and each speaks ``--turns`` Flite questions in 20 ms PCM16
chunks on a real-time schedule, keeping the microphone open (silence) while the reply
plays -- the same client and scenario as ``voice_latency.py`` Part A
(``voice_scenarios.run_turns``), only many at a time.

Figures per phase: turns answered, end of the user's speech -> first reply audio at
the client (p50 / p90 / max), ``speech_stopped`` -> first audio (TTFA), the server's
ingest p99 (``duplex_ingest_latency_seconds``; behind the router the worst worker's),
and the CPU of the whole server process tree. Printed side by side with the ratio
workers / one process. Reported, never asserted: this is a benchmark.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

# ruff: noqa: E402
import argparse
import asyncio
import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lib.serve_process import CpuWindow, ServerProcess, http_get, machine, scrape, worst_quantile
from lib.voice_scenarios import QUESTIONS, Turn, run_turns, utterance
from vllm_duplex.host.deploy import resolve_config_path


def pct(xs: list[float], q: float) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return float(np.percentile(xs, q)) if xs else math.nan


async def run_phase(config: str, sessions: int, turns: int, workers: int,
                    utts: list[Any]) -> dict[str, Any]:
    print(f"[{workers} worker(s)] starting the server ...", flush=True)
    with ServerProcess(config, sessions, workers, start_timeout_s=600.0) as server:
        print(f"[{workers} worker(s)] {sessions} sessions x {turns} turns ...", flush=True)
        cpu = CpuWindow(*server.tree())

        async def one(i: int) -> list[Turn]:
            await asyncio.sleep(0.25 * i)  # sessions do not all speak in lockstep
            mine = [utts[(i + k) % len(utts)] for k in range(turns)]
            return await run_turns(server.ws_url, mine, {})

        results = await asyncio.gather(*(one(i) for i in range(sessions)),
                                       return_exceptions=True)
        cores, wall = cpu.cores()
        metrics = scrape(http_get(server.http_url + "/metrics"))
    done = [t for r in results if isinstance(r, list) for t in r]
    failed = [repr(r) for r in results if isinstance(r, BaseException)]
    answered = [t for t in done if t.status in ("completed", "incomplete")]
    eos = [t.eos_to_audio_s for t in answered]
    ttfa = [t.ttfa_s for t in answered]
    return {
        "workers": workers, "sessions": sessions, "turns_asked": sessions * turns,
        "turns_answered": len(answered), "session_failures": failed,
        "eos_to_audio_p50_s": pct(eos, 50), "eos_to_audio_p90_s": pct(eos, 90),
        "eos_to_audio_max_s": max((x for x in eos if not math.isnan(x)), default=math.nan),
        "ttfa_p50_s": pct(ttfa, 50), "ttfa_p90_s": pct(ttfa, 90),
        "ingest_p99_s": worst_quantile(metrics, "duplex_ingest_latency_seconds", "0.99"),
        "server_cpu_cores": cores, "window_s": wall,
        "heard": [[t.question, t.heard, t.reply[:80]] for t in done],
    }


ROWS = (("turns answered", "turns_answered", 1, "{:.0f}"),
        ("end of speech -> first audio p50 (ms)", "eos_to_audio_p50_s", 1e3, "{:.0f}"),
        ("end of speech -> first audio p90 (ms)", "eos_to_audio_p90_s", 1e3, "{:.0f}"),
        ("end of speech -> first audio max (ms)", "eos_to_audio_max_s", 1e3, "{:.0f}"),
        ("speech_stopped -> first audio p50 (ms)", "ttfa_p50_s", 1e3, "{:.0f}"),
        ("speech_stopped -> first audio p90 (ms)", "ttfa_p90_s", 1e3, "{:.0f}"),
        ("ingest p99 (ms) [server, worst worker]", "ingest_p99_s", 1e3, "{:.2f}"),
        ("server CPU (cores busy)", "server_cpu_cores", 1, "{:.2f}"))


def table(one: dict[str, Any], many: dict[str, Any]) -> str:
    def fmt(v: float, spec: str) -> str:
        return "n/a" if math.isnan(v) else spec.format(v)

    rows = [("metric", "1 process", f"{many['workers']} workers", "workers/1")]
    for label, key, scale, spec in ROWS:
        a, b = one[key] * scale, many[key] * scale
        ratio = b / a if a and not math.isnan(a) and not math.isnan(b) else math.nan
        rows.append((label, fmt(a, spec), fmt(b, spec), fmt(ratio, "{:.2f}x")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join([r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])])
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--config", default="cascade-cpu")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.workers < 2 or args.sessions < 1 or args.turns < 1:
        p.error("--workers must be >= 2, --sessions and --turns >= 1")
    config = str(resolve_config_path(args.config))
    info = machine()
    print(f"machine: {info['summary']}, {info['memory_gib']} GiB; config {config}", flush=True)
    utts = [utterance(q) for q in QUESTIONS]
    one = asyncio.run(run_phase(config, args.sessions, args.turns, 1, utts))
    many = asyncio.run(run_phase(config, args.sessions, args.turns, args.workers, utts))
    print()
    print(table(one, many))
    for phase in (one, many):
        if phase["session_failures"]:
            print(f"note: [{phase['workers']} worker(s)] sessions failed: "
                  f"{phase['session_failures']}")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "machine": info, "args": vars(args), "one": one, "workers": many}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
