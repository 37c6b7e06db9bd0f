"""What a stored GPT-Live session's recording costs (issue 45): offline, in
this process, on the session's virtual timeline (no wall-clock pacing).

- The mixer (``media/recording.py``): CPU per caller chunk (20 ms of 24 kHz
  PCM16, as a microphone sends it) and per reply delta (100 ms), beside the
  baseline of decoding the same chunk alone (``AudioDecoder``, what the
  session's input path does to every chunk anyway).
- A save (``durable/live_sessions.keep``) of a session with 1 and 5 minutes
  recorded (the cap), beside the same save with no recording: the WAV built
  and the record written, into the in-memory store and a private
  redis-server (``fleet/redis_server.py``), with the WAV's size.

    .venv/bin/python bench/live_recording.py [--minutes 1,5] [--saves 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import numpy as np
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.durable import live_sessions
from vllm_duplex.durable.memory import MemoryStore
from vllm_duplex.durable.redis_store import RedisStore
from vllm_duplex.fleet.redis_server import RedisServer
from vllm_duplex.media.audio import AudioDecoder
from vllm_duplex.media.recording import Recording

RATE = 24000
CONFIG = {"model": "gpt-live-1", "store": True}
ITEMS = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}]


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def recorded(minutes: float) -> Recording:
    """A session of ``minutes``: the caller throughout, the voice half the time."""
    rec = Recording(AudioFormat(), AudioFormat(), started_at=0.0)
    rng = np.random.default_rng(0)
    mic = (rng.standard_normal(RATE // 50) * 3000).astype("<i2").tobytes()
    voice = (rng.standard_normal(RATE // 10) * 3000).astype("<i2").tobytes()
    for i in range(int(minutes * 60 * 50)):
        t = (i + 1) / 50
        rec.heard(mic, t)
        if (i // 250) % 2 and i % 5 == 0:  # 5 s of reply every 10 s, 100 ms deltas
            rec.played(voice, t)
    return rec


def per_chunk_us(minutes: float) -> dict[str, float]:
    rng = np.random.default_rng(1)
    mic = (rng.standard_normal(RATE // 50) * 3000).astype("<i2").tobytes()
    voice = (rng.standard_normal(RATE // 10) * 3000).astype("<i2").tobytes()
    n = int(minutes * 60 * 50)
    decoder = AudioDecoder(AudioFormat(), 16000)  # the input path's own decode, the baseline
    t0 = time.process_time()
    for _ in range(n):
        decoder.decode(mic)
    base = (time.process_time() - t0) / n * 1e6
    rec = Recording(AudioFormat(), AudioFormat(), started_at=0.0)
    t0 = time.process_time()
    for i in range(n):
        rec.heard(mic, (i + 1) / 50)
    heard = (time.process_time() - t0) / n * 1e6
    t0 = time.process_time()
    for i in range(n // 5):
        rec.played(voice, (i + 1) / 10)
    played = (time.process_time() - t0) / (n // 5) * 1e6
    return {"baseline_decode_us": base, "heard_us": heard, "played_us": played}


async def saves(store, minutes: float, count: int) -> dict[str, float]:
    rec = recorded(minutes)
    out: dict[str, list[float]] = {"no_recording_ms": [], "with_recording_ms": [], "wav_ms": []}
    for i in range(count):
        t0 = time.perf_counter()
        await live_sessions.keep(store, "bench#1", f"bare_{i}", config=CONFIG, items=ITEMS,
                                 api_key="sk")
        out["no_recording_ms"].append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        wav = rec.snapshot().wav()  # the product builds it on a thread (live/stored.py)
        out["wav_ms"].append((time.perf_counter() - t0) * 1e3)
        await live_sessions.keep(store, "bench#1", f"rec_{i}", config=CONFIG, items=ITEMS,
                                 api_key="sk", recording=wav)
        out["with_recording_ms"].append((time.perf_counter() - t0) * 1e3)
    return {**{k: statistics.median(v) for k, v in out.items()}, "wav_mb": len(wav) / 1e6}


async def main(minutes: list[float], count: int) -> None:
    print(f"CPU: {os.cpu_count()} cores ({_cpu()}); load average {os.getloadavg()[0]:.2f}")
    chunk = per_chunk_us(1.0)
    print(f"mixer, CPU per chunk (process time, 1 min of chunks): caller 20 ms "
          f"{chunk['heard_us']:.1f} us, voice 100 ms {chunk['played_us']:.1f} us; "
          f"baseline: the input path's own decode of a 20 ms chunk "
          f"{chunk['baseline_decode_us']:.1f} us")
    redis = RedisServer()
    await redis.start()
    stores = {"memory": MemoryStore(MonotonicClock()), "redis": RedisStore(redis.url)}
    try:
        for name, store in stores.items():
            for m in minutes:
                r = await saves(store, m, count)
                print(f"{name}: a save with {m:g} min recorded ({r['wav_mb']:.1f} MB WAV): "
                      f"{r['with_recording_ms']:.1f} ms (of which the WAV, built on a thread, "
                      f"{r['wav_ms']:.1f} ms); "
                      f"baseline, the same save without: {r['no_recording_ms']:.2f} ms "
                      f"(median of {count})")
    finally:
        await stores["redis"].close()
        await redis.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", default="1,5")
    ap.add_argument("--saves", type=int, default=5)
    args = ap.parse_args()
    asyncio.run(main([float(m) for m in args.minutes.split(",")], args.saves))
