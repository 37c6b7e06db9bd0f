"""Voice latency benchmark: spoken turns over the real socket, barge-in, and LLM TTFT.

    python bench/voice_latency.py [--turns 5] [--barge-ins 3] [--barge-after 1.0]
                                  [--story-tokens 400] [--reps 5] [--context-tokens 500]
                                  [--config cascade-cpu] [--no-baseline] [--no-part-b]
                                  [--json out.json]

Part A (end to end, one in-process ``BackgroundServer`` per pipeline, loopback socket,
``RealtimeClient``): ``--turns`` questions spoken by Flite are streamed in 20 ms PCM16
24 kHz chunks on a real-time schedule, in ONE session (a multi-turn conversation); the
client keeps streaming silence while a reply is produced, as an open microphone does.
Per turn, on the client: ``input_audio_buffer.speech_stopped`` -> first
``response.output_audio.delta`` (TTFA), -> ``response.done``, the reply's audio seconds
and RTF = (speech_stopped -> response.done) / reply audio seconds.

Barge-in (``--barge-ins`` tries, a fresh session each): the client asks for a long story
(session ``max_output_tokens`` raised), keeps streaming silence until the reply has
played for ``--barge-after`` seconds, then streams a spoken interruption. From the slot
(scheduled send time) of the first chunk holding speech (the audio is built here, so its
onset chunk is known) to ``response.done`` (status ``cancelled``) and to the last
``response.output_audio.delta`` of the interrupted response.

The server runs in this process, so the client's arrival stamps share its event loop:
a loop stall delays both. Two cross-checks do not depend on the server's own events:
TTFA from the slot at which ``speech_stopped`` was due (end-of-speech audio position +
``silence_duration_ms``), and the client's send lag (printed, flagged above 20 ms).

Part B (the vLLM stage driven directly, same process, same engine, after Part A): LLM
TTFT at end of turn for a ~``--context-tokens`` context (long system prompt + history).
Streaming: the history is prefilled on a port, the turn's words are pushed as ``TextIn``
at speech pace, then ``GenerateRequest``. Full prefill (the baseline): the same turn as a
``GenerateRequest`` on a fresh port. Every run starts its system prompt with a fresh
nonce, so vLLM's prefix cache cannot turn the full prefill into a cache hit.

Baselines (house rule: figures next to a baseline from the same process, as ratios):
Part A's is the model-free ``scripted`` pipeline (energy VAD -> scripted LLM -> tone TTS)
through the same server code and client, i.e. the control-plane floor; Part B's is the
full prefill. Targets are reported PASS/MISS, never asserted. See bench/README.md.

This file is the entry point: arguments, the machine/load checks, the phases and the
printed report. Part A's audio and scenarios are in ``lib/voice_scenarios.py``, Part B's
driver in ``lib/voice_llm_ttft.py`` (the benches' shared parts, ``bench/lib/``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")  # keep the figures readable

# ruff: noqa: E402
import argparse
import asyncio
import datetime as dt
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling modules below

from lib import serve_process  # noqa: E402
from vllm_duplex.host.deploy import DeployConfig, load_config, resolve_config_path  # noqa: E402
from vllm_duplex.host.runtime import Runtime  # noqa: E402
from vllm_duplex.realtime.server.serving import BackgroundServer  # noqa: E402
from lib.voice_llm_ttft import END_OF_TURN_SILENCE_S, WORD_INTERVAL_S, run_part_b  # noqa: E402
from lib.voice_scenarios import (  # noqa: E402
    CHUNK_S,
    INTERRUPTION,
    QUESTIONS,
    SEND_LAG,
    STORY,
    TIMED,
    Barge,
    Turn,
    run_barge,
    run_turns,
    utterance,
    vad_floor_s,
)

TTFA_TARGET_S = 0.300
BARGE_TARGET_S = 0.150
TTFT_RATIO_TARGET = 0.5
SCRIPTED_REPLY = " ".join(["Hello from the scripted duplex engine."] * 40)


# ---- machine and load -----------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """``serve_process.machine()`` and the commit measured."""
    try:
        commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown", ""
    return {**serve_process.machine(), "commit": commit + (" (modified tree)" if dirty else "")}


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def _tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of this process, its reaped children and its live descendants
    (the vLLM engine core)."""
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


class LoadWindow:
    """Cores used by the bench process tree and by everything else during a phase."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.t0 = time.monotonic()
        self.own0 = _tree_cpu(self.proc)
        self.sys0 = psutil.cpu_times()

    def close(self) -> dict[str, float]:
        wall = time.monotonic() - self.t0
        own = (_tree_cpu(self.proc) - self.own0) / wall
        s1 = psutil.cpu_times()
        busy = lambda t: t.user + t.nice + t.system + t.irq + t.softirq + t.steal  # noqa: E731
        machine_busy = (busy(s1) - busy(self.sys0)) / wall
        return {"wall_s": wall, "bench_cores": own, "machine_cores": machine_busy,
                "other_cores": max(0.0, machine_busy - own)}


# ---- phases -----------------------------------------------------------------------------------


def scripted_config() -> DeployConfig:
    raw = yaml.safe_load(resolve_config_path("scripted").read_text())
    for spec in raw["stages"]:
        if spec["type"] == "scripted_llm":
            spec["reply"] = SCRIPTED_REPLY  # long enough to be interrupted
    return DeployConfig.from_dict(raw)


def _find_llm(runtime: Runtime) -> Any:
    for stage in runtime.stages:
        if hasattr(stage, "fast_paths") and hasattr(stage, "port"):
            return stage
    return None


async def run_phase(name: str, config: DeployConfig, args: argparse.Namespace,
                    utts: dict[str, Any], turn_session: dict[str, Any]) -> dict[str, Any]:
    print(f"[{name}] starting the server ({config.name}) ...", flush=True)
    t_start = time.monotonic()
    runtime = Runtime(config)
    result: dict[str, Any] = {"name": name, "config": config.name, "loadavg_before": loadavg()}
    vad = next((sp.type for sp in config.stages if sp.type in ("silero_vad", "energy_vad")), None)
    if vad is not None:
        result["vad_floor_s"] = vad_floor_s(utts["stop"], "silero" if vad == "silero_vad" else "energy")
    async with BackgroundServer(runtime) as server:
        result["server_start_s"] = time.monotonic() - t_start
        llm = _find_llm(runtime)
        c0 = {k: getattr(llm, k) for k in ("fast_paths", "rebuilds", "fresh_prefills")} if llm else {}
        print(f"[{name}] {args.turns} spoken turns ...", flush=True)
        SEND_LAG.clear()
        win = LoadWindow()
        turns = await run_turns(server.ws_url, utts["turns"], turn_session)
        for t in turns:
            print(f"  {t.status:9s} TTFA {t.ttfa_s * 1e3:7.1f} ms  done {t.done_s * 1e3:7.1f} ms  "
                  f"audio {t.audio_s:5.2f} s  heard {t.heard!r} -> {t.reply[:60]!r}", flush=True)
        result["turns"] = turns
        if llm:
            result["turn_counters"] = {k: getattr(llm, k) - v for k, v in c0.items()}
        print(f"[{name}] {args.barge_ins} barge-ins ...", flush=True)
        barges = []
        for _ in range(args.barge_ins):
            b = await run_barge(server.ws_url, utts["story"], utts["stop"], args.story_tokens,
                                args.barge_after)
            print(f"  {b.status:9s} onset->done {b.to_done_s * 1e3:7.1f} ms  onset->last audio "
                  f"{b.to_last_audio_s * 1e3:7.1f} ms  onset->speech_started "
                  f"{b.to_speech_started_s * 1e3:7.1f} ms  deltas after onset {b.deltas_after_onset}"
                  f"  reply played {b.played_s:.2f} s", flush=True)
            barges.append(b)
        result["barges"] = barges
        result["load_a"] = win.close()
        result["send_lag_max_s"] = max(SEND_LAG, default=math.nan)
        result["send_lag_p99_s"] = (float(np.percentile(SEND_LAG, 99)) if SEND_LAG else math.nan)
        if llm is not None and not args.no_part_b:
            print(f"[{name}] Part B: LLM TTFT, {args.reps} repetitions ...", flush=True)
            win = LoadWindow()
            result["part_b"] = await run_part_b(llm, args.reps, args.context_tokens)
            result["load_b"] = win.close()
        if llm is not None:
            result["platform"] = _platform()
    result["loadavg_after"] = loadavg()
    return result


def _platform() -> str:
    try:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            return "vLLM on CPU (no GPU in this machine)"
        return f"vLLM on {current_platform.device_name}"
    except Exception as exc:  # noqa: BLE001
        return f"unknown ({exc!r})"


# ---- report -----------------------------------------------------------------------------------


def p50(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def pmax(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return max(xs) if xs else math.nan


def fmt(v: float, spec: str = "{:.1f}") -> str:
    return "n/a" if v is None or math.isnan(v) else spec.format(v)


def verdict(v: float, target: float) -> str:
    return "n/a" if math.isnan(v) else ("PASS" if v <= target else "MISS")


def render_table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for i, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def part_a_rows(base: dict[str, Any] | None, cas: dict[str, Any]) -> list[tuple[str, ...]]:
    def ok(turns: list[Turn]) -> list[Turn]:
        return [t for t in turns if t.status in TIMED]

    def okb(barges: list[Barge]) -> list[Barge]:
        return [b for b in barges if b.status == "cancelled"]

    def series(phase: dict[str, Any] | None, key: str, barge: bool = False) -> list[float]:
        if phase is None:
            return []
        items = okb(phase["barges"]) if barge else ok(phase["turns"])
        return [getattr(x, key) for x in items]

    specs = [  # label, key, barge?, scale, target
        ("TTFA: speech_stopped -> first audio (ms)", "ttfa_s", False, 1e3, TTFA_TARGET_S),
        ("  of which: speech_stopped -> ASR final (ms)", "asr_s", False, 1e3, None),
        ("  of which: speech_stopped -> response.created (ms)", "created_s", False, 1e3, None),
        ("TTFA from when speech_stopped was due (ms)", "ttfa_due_s", False, 1e3, TTFA_TARGET_S),
        ("  speech_stopped seen after it was due (ms)", "stopped_late_s", False, 1e3, None),
        ("speech_stopped -> response.done (ms)", "done_s", False, 1e3, None),
        ("end of speech sent -> first audio (ms)", "eos_to_audio_s", False, 1e3, None),
        ("reply audio (s)", "audio_s", False, 1, None),
        ("RTF: (stopped -> done) / reply audio", "rtf", False, 1, None),
        ("barge-in: onset -> response.done(cancelled) (ms)", "to_done_s", True, 1e3, BARGE_TARGET_S),
        ("barge-in: onset -> last audio delta (ms)", "to_last_audio_s", True, 1e3, None),
        ("barge-in: onset -> speech_started (ms)", "to_speech_started_s", True, 1e3, None),
        ("barge-in: audio deltas after onset", "deltas_after_onset", True, 1, None),
    ]
    rows = [("Part A (p50 / max)", "baseline: scripted", f"{cas['config']}", "ratio p50",
             "target", "p50 / max")]
    for label, key, barge, scale, target in specs:
        b, c = series(base, key, barge), series(cas, key, barge)
        spec = "{:.0f}" if scale == 1e3 or key == "deltas_after_onset" else "{:.2f}"
        bp, cp = p50(b) * scale, p50(c) * scale
        ratio = (cp / bp if key != "deltas_after_onset" and not math.isnan(bp) and not math.isnan(cp)
                 and bp >= (1.0 if scale == 1e3 else 0.01) else math.nan)
        tgt = f"<= {target * 1e3:.0f} ms" if target else ""
        ver = (f"{verdict(p50(c), target)} / {verdict(pmax(c), target)}" if target else "")
        rows.append((label, f"{fmt(bp, spec)} / {fmt(pmax(b) * scale, spec)}" if base else "n/a",
                     f"{fmt(cp, spec)} / {fmt(pmax(c) * scale, spec)}", fmt(ratio, "{:.2f}x"),
                     tgt, ver))
        if key == "to_speech_started_s":
            bf = (base or {}).get("vad_floor_s", math.nan) * 1e3
            cf = cas.get("vad_floor_s", math.nan) * 1e3
            rows.append(("  of which: VAD needs this much audio (offline)", fmt(bf, "{:.0f}"),
                         fmt(cf, "{:.0f}"), fmt(cf / bf if bf else math.nan, "{:.2f}x"), "", ""))
    return rows


def part_b_rows(pb: dict[str, Any]) -> tuple[list[tuple[str, ...]], dict[str, float]]:
    full = [r.ttft_s for r in pb["full"]]
    stream = [r.ttft_s for r in pb["stream"]]
    hit = [r.ttft_s for r in pb["hit"]]
    decode = [r.decode_s for r in pb["full"] + pb["stream"] + pb["hit"]]
    ratios = [s / f for s, f in zip(stream, full) if f and not math.isnan(s) and not math.isnan(f)]
    fp = p50(full)
    rows = [("Part B: LLM TTFT at end of turn", "p50 (ms)", "max (ms)", "vs full p50", "target",
             "verdict"),
            ("full prefill, fresh port [baseline]", fmt(fp * 1e3), fmt(pmax(full) * 1e3), "1.00x",
             "", ""),
            ("streaming prefill (fast path)", fmt(p50(stream) * 1e3), fmt(pmax(stream) * 1e3),
             fmt(p50(stream) / fp if fp else math.nan, "{:.3f}x"),
             f"<= {TTFT_RATIO_TARGET}x", verdict(p50(stream) / fp if fp else math.nan, TTFT_RATIO_TARGET)),
            ("per-rep ratio streaming/full", fmt(p50(ratios), "{:.3f}x"),
             fmt(pmax(ratios), "{:.3f}x"), "", f"<= {TTFT_RATIO_TARGET}x",
             verdict(pmax(ratios), TTFT_RATIO_TARGET) + " (max)"),
            ("full prefill, same prompt again (cache hit) [info]", fmt(p50(hit) * 1e3),
             fmt(pmax(hit) * 1e3), fmt(p50(hit) / fp if fp else math.nan, "{:.3f}x"), "", ""),
            ("decode per token after the first [info]", fmt(p50(decode) * 1e3),
             fmt(pmax(decode) * 1e3), "", "", "")]
    return rows, {"full_p50_s": fp, "stream_p50_s": p50(stream), "ratio_p50": p50(ratios)}


def notes(phases: list[dict[str, Any]], info: dict[str, Any]) -> list[str]:
    out = []
    for ph in phases:
        tag = f"[{ph['name']}]"
        if ph["send_lag_p99_s"] > CHUNK_S:
            out.append(f"{tag} client send lag p99 {ph['send_lag_p99_s'] * 1e3:.1f} ms > 20 ms: "
                       "the input was not streamed at real time")
        bad = [t for t in ph["turns"] if t.status not in TIMED]
        if bad:
            out.append(f"{tag} {len(bad)} turn(s) not timed: {[t.status for t in bad]}")
        badb = [b for b in ph["barges"] if b.status != "cancelled"]
        if badb:
            out.append(f"{tag} {len(badb)} barge-in(s) not timed: {[b.status for b in badb]}")
        stray = sum(b.deltas_after_done for b in ph["barges"])
        if stray:
            out.append(f"{tag} {stray} audio delta(s) of an interrupted response arrived AFTER "
                       "its response.done(cancelled)")
        for key in ("load_a", "load_b"):
            ld = ph.get(key)
            if ld and ld["other_cores"] >= 0.2:
                out.append(f"{tag} other processes used {ld['other_cores']:.2f} cores during "
                           f"{'Part A' if key == 'load_a' else 'Part B'}: the machine was not quiet")
        pb = ph.get("part_b")
        if pb:
            notready = [r for r in pb["stream"] if r.words_ready is False]
            if notready:
                out.append(f"{tag} {len(notready)} streaming run(s) still had pushed words to "
                           "prefill at end of turn")
            failed = [r.status for r in pb["full"] + pb["stream"] + pb["hit"]
                      if r.status not in ("length", "stop")]
            if failed:
                out.append(f"{tag} Part B runs not timed: {failed}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--barge-ins", type=int, default=3)
    p.add_argument("--barge-after", type=float, default=1.0,
                   help="seconds of reply audio before the interruption starts")
    p.add_argument("--story-tokens", type=int, default=400,
                   help="session max_output_tokens for the long reply that gets interrupted")
    p.add_argument("--reps", type=int, default=5, help="Part B repetitions")
    p.add_argument("--context-tokens", type=int, default=500, help="Part B context size")
    p.add_argument("--config", default="cascade-cpu")
    p.add_argument("--no-baseline", action="store_true", help="skip the scripted baseline")
    p.add_argument("--no-part-b", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not 1 <= args.turns <= len(QUESTIONS):
        p.error(f"--turns must be 1..{len(QUESTIONS)}")

    info = machine()
    print(f"machine: {info['summary']}, {info['memory_gib']} GiB, "
          f"Python {info['python']}, Linux {info['kernel']}, commit {info['commit']}", flush=True)
    print(f"load average before: {loadavg()}", flush=True)
    utts = {"turns": [utterance(q) for q in QUESTIONS[:args.turns]],
            "story": utterance(STORY), "stop": utterance(INTERRUPTION)}

    async def run_all() -> list[dict[str, Any]]:
        phases = []
        if not args.no_baseline:
            # Replies of about one sentence, like the cascade's (its policy caps at 96 tokens
            # and the instructions ask for one sentence).
            phases.append(await run_phase("baseline", scripted_config(), args, utts,
                                          {"max_output_tokens": 12}))
        phases.append(await run_phase("cascade", load_config(args.config), args, utts, {}))
        return phases

    phases = asyncio.run(run_all())
    base = phases[0] if not args.no_baseline else None
    cas = phases[-1]
    print()
    print(f"accelerator: {cas.get('platform', 'n/a')}; a GPU run (vLLM on GPU) was not possible here")
    print(f"load average: before {phases[0]['loadavg_before']}, after {cas['loadavg_after']}")
    for ph in phases:
        for key, label in (("load_a", "Part A"), ("load_b", "Part B")):
            if key in ph:
                ld = ph[key]
                lag = (f", client send lag p99 / max {ph['send_lag_p99_s'] * 1e3:.1f} / "
                       f"{ph['send_lag_max_s'] * 1e3:.1f} ms" if key == "load_a" else "")
                print(f"[{ph['name']}] {label}: bench process tree {ld['bench_cores']:.2f} cores, "
                      f"machine {ld['machine_cores']:.2f}, other processes {ld['other_cores']:.2f} "
                      f"over {ld['wall_s']:.0f} s{lag}")
    if "turn_counters" in cas:
        print(f"[cascade] LLM stage during the spoken turns: {cas['turn_counters']}")
    print()
    print(render_table(part_a_rows(base, cas)))
    print("ratio = cascade / scripted baseline (same process, same server code and client); "
          f"{len([t for t in cas['turns'] if t.status in TIMED])} turns, "
          f"{len([b for b in cas['barges'] if b.status == 'cancelled'])} barge-ins timed")
    summary: dict[str, Any] = {}
    if "part_b" in cas:
        rows, summary = part_b_rows(cas["part_b"])
        print()
        print(render_table(rows))
        n = cas["part_b"]["full"][0].input_tokens if cas["part_b"]["full"] else 0
        print(f"context {n} prompt tokens; streaming words every {WORD_INTERVAL_S * 1e3:.0f} ms, "
              f"end of turn {END_OF_TURN_SILENCE_S * 1e3:.0f} ms after the last word; "
              f"stage counters {cas['part_b']['counters']}")
    print()
    ttfa = p50([t.ttfa_s for t in cas["turns"] if t.status in TIMED])
    barge = p50([b.to_done_s for b in cas["barges"] if b.status == "cancelled"])
    print(f"target TTFA <= {TTFA_TARGET_S * 1e3:.0f} ms: p50 {fmt(ttfa * 1e3)} ms -> "
          f"{verdict(ttfa, TTFA_TARGET_S)}")
    print(f"target barge-in <= {BARGE_TARGET_S * 1e3:.0f} ms (speech onset -> response.done, VAD "
          f"included): p50 {fmt(barge * 1e3)} ms -> {verdict(barge, BARGE_TARGET_S)}")
    if summary:
        r = summary["stream_p50_s"] / summary["full_p50_s"]
        print(f"target streaming-prefill TTFT <= {TTFT_RATIO_TARGET}x full prefill: "
              f"{fmt(r, '{:.3f}')}x -> {verdict(r, TTFT_RATIO_TARGET)}")
    for line in notes(phases, info):
        print("note:", line)
    if args.json:
        def plain(x: Any) -> Any:
            if isinstance(x, list):
                return [plain(i) for i in x]
            if isinstance(x, dict):
                return {k: plain(v) for k, v in x.items()}
            if hasattr(x, "__dataclass_fields__"):
                return {k: plain(getattr(x, k)) for k in x.__dataclass_fields__}
            return x

        Path(args.json).write_text(json.dumps(
            {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "machine": info, "args": vars(args), "phases": plain(phases)}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
