"""The VAD's hand-off (issue 44 item 3): from the chunk that lets Silero decide
that speech started to ``VadSpeechStarted`` out of the stage's port, with the
windows judged on a worker thread (the default) and inline on the event loop
(``inline``), in one process, the two taking turns.

A stream of interruptions ("Stop, wait a moment please.", Flite) between
0.7 s silences goes into ``SileroVadStage``'s port at real time in 20 ms
chunks, as the session's feed submits them. The chunk that decides each onset
is found offline (the same VAD, the same chunks); per onset the figure is the
time from that chunk's ``submit`` to the event at the port's reader (the
pipeline's pump). Load in the same process, as a server has it:

* ``--whisper``: threads transcribing with Whisper tiny.en (faster-whisper,
  one CTranslate2 thread each) without a pause, as the ASR stage's partials
  and finals do: CTranslate2 releases the GIL, the Python around it takes it;
* ``--gil-threads``: threads of pure-Python work that take the GIL whenever
  it is free (a worst case no stage of ours comes near: with two, the event
  loop itself starves, in either mode);
* ``--loop-busy``: a task on the event loop that runs this many ms of Python
  out of every 10 ms (the session's core, JSON, the other sessions);
* ``--hogs``: processes burning a core each (the rest of the machine).

    .venv/bin/python bench/vad_handoff.py [--onsets 12] [--rounds 2]
        [--whisper 1] [--gil-threads 0] [--loop-busy 2] [--hogs 2] [--json out.json]
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# ruff: noqa: E402
import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib.sides import machine_line
from lib.speech_corpus import flite
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import AudioIn, StageInput, VadSpeechStarted
from vllm_duplex.stages.listening.silero_vad import SileroVad, SileroVadStage

RATE = 16000
CHUNK = RATE // 50  # 20 ms
GAP_S = 0.7
MODES = ("thread", "inline")


def stream(onsets: int) -> np.ndarray:
    said = flite("slt").speak("Stop, wait a moment please.")
    gap = np.zeros(int(GAP_S * RATE), np.int16)
    return np.concatenate([gap] + [np.concatenate([said, gap]) for _ in range(onsets)])


def deciding_chunks(pcm: np.ndarray) -> list[int]:
    """The index of the 20 ms chunk whose arrival started speech, per onset."""
    stage = SileroVadStage(clock=MonotonicClock())
    vad: SileroVad = stage.new_vad()
    stage.shutdown_workers()
    found = []
    for k in range(len(pcm) // CHUNK):
        events = vad.feed(pcm[k * CHUNK:(k + 1) * CHUNK], k * 20)
        found += [k for e in events if isinstance(e, VadSpeechStarted)]
    return found


async def one_pass(mode: str, pcm: np.ndarray, deciding: list[int]) -> tuple[list[float], int]:
    """Seconds from the deciding chunk's submit to the event, per onset, and
    the most chunks ever queued for the worker thread (0 inline)."""
    stage = SileroVadStage(clock=MonotonicClock(), inline=mode == "inline")
    fence = Fence("bench", 0, 0)
    port = stage.port("bench")
    await port.open(fence)
    started: list[float] = []

    async def read() -> None:
        async for out in port.outputs():
            if isinstance(out.payload, VadSpeechStarted):
                started.append(time.perf_counter())

    reader = asyncio.create_task(read())
    submitted = []
    backlog = 0
    t0 = time.perf_counter()
    for k in range(len(pcm) // CHUNK):
        # Every chunk in a turn of the loop of its own, as a socket's frames
        # come (behind time, at once).
        await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.perf_counter()))
        submitted.append(time.perf_counter())
        backlog = max(backlog, getattr(port, "_inbox", asyncio.Queue()).qsize())
        await port.submit(StageInput(fence, f"r{k}", AudioIn(pcm[k * CHUNK:(k + 1) * CHUNK], k * 20)))
    await port.drained()
    await asyncio.sleep(0.3)
    await port.close()
    await reader
    await stage.close()
    if len(started) != len(deciding):
        raise RuntimeError(f"{mode}: {len(started)} onsets live, {len(deciding)} offline")
    return [s - submitted[k] for s, k in zip(started, deciding)], backlog


def gil_worker(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(i * i for i in range(2000))


def whisper_worker(stop: threading.Event, pcm: np.ndarray) -> None:
    from vllm_duplex.assets.locate import whisper_model_dir
    from vllm_duplex.stages.listening.whisper_model import load

    model = load(whisper_model_dir("whisper-tiny.en"), threads=1)
    audio = pcm[:3 * RATE]
    while not stop.is_set():
        model.transcribe(audio)


async def loop_busy(ms: float) -> None:
    while True:
        end = time.perf_counter() + ms / 1000
        while time.perf_counter() < end:
            pass
        await asyncio.sleep((10 - ms) / 1000)


def figures(xs: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in xs)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 2),
            "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 2), "max_ms": round(ms[-1], 2),
            "over_10_ms": sum(x > 10 for x in ms), "over_50_ms": sum(x > 50 for x in ms)}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--onsets", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--whisper", type=int, default=1)
    ap.add_argument("--gil-threads", type=int, default=0)
    ap.add_argument("--loop-busy", type=float, default=2.0, help="ms of every 10 ms")
    ap.add_argument("--hogs", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    load0 = os.getloadavg()
    pcm = stream(args.onsets)
    deciding = deciding_chunks(pcm)
    stop = threading.Event()
    threads = [threading.Thread(target=gil_worker, args=(stop,), daemon=True)
               for _ in range(args.gil_threads)]
    threads += [threading.Thread(target=whisper_worker, args=(stop, pcm), daemon=True)
                for _ in range(args.whisper)]
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    busy = asyncio.create_task(loop_busy(args.loop_busy)) if args.loop_busy > 0 else None
    for t in threads:
        t.start()
    results: dict[str, list[float]] = {m: [] for m in MODES}
    backlogs = {m: 0 for m in MODES}
    try:
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                lags, backlog = await one_pass(mode, pcm, deciding)
                results[mode] += lags
                backlogs[mode] = max(backlogs[mode], backlog)
    finally:
        stop.set()
        for h in hogs:
            h.kill()
            h.wait()
        if busy is not None:
            busy.cancel()
    print(f"load: {args.whisper} Whisper threads, {args.gil_threads} GIL threads, loop busy {args.loop_busy} ms of 10, "
          f"{args.hogs} hog processes; {args.onsets} onsets x {args.rounds} rounds")
    print(machine_line(load0))
    print(f"{'mode':8} {'n':>3} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8} {'>10 ms':>7} {'>50 ms':>7} {'queued':>6}")
    out = {}
    for mode in MODES:
        f = figures(results[mode])
        f["most_queued"] = backlogs[mode]
        out[mode] = f
        print(f"{mode:8} {f['n']:>3} {f['p50_ms']:>8} {f['p90_ms']:>8} {f['max_ms']:>8} "
              f"{f['over_10_ms']:>7} {f['over_50_ms']:>7} {f['most_queued']:>6}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "figures": out}, indent=1))


if __name__ == "__main__":
    asyncio.run(main())
