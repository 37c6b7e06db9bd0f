"""Does a CPU stage stall the event loop of other sessions? (issue 13, item 4)

Decodes Flite speech with PocketSphinx in 20 ms chunks, as fast as it can,
in ``--decoders`` decoders at once, while the main thread's event loop ticks
every 1 ms; reports how late the ticks were (the stall a session's ingest
sees). The decoders run in threads of this process (today's stage: a
thread pool), or in a process pool (the same work, another interpreter).

    .venv/bin/python bench/gil_hold.py [--seconds 10] [--decoders 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import threading
import time
import wave
from concurrent.futures import ProcessPoolExecutor

import numpy as np

PHRASE = "what is the capital of france and how many people live there today"


def speech_16k() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "q.wav")
        subprocess.run(["flite", "-t", PHRASE, "-o", path], check=True)
        with wave.open(path) as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
            rate = w.getframerate()
    if rate != 16000:
        import soxr

        pcm = soxr.resample(pcm, rate, 16000).astype("<i2")
    return pcm.tobytes()


def decode_for(seconds: float, pcm: bytes) -> tuple[int, float]:
    """Chunks decoded and the longest single process_raw call (s)."""
    import pocketsphinx

    decoder = pocketsphinx.Decoder(loglevel="FATAL", fwdflat=False)
    step = 320 * 2
    chunks, longest = 0, 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        decoder.start_utt()
        for i in range(0, len(pcm), step):
            t = time.perf_counter()
            decoder.process_raw(pcm[i:i + step], False, False)
            longest = max(longest, time.perf_counter() - t)
            chunks += 1
        decoder.end_utt()
    return chunks, longest


async def loop_lag(seconds: float) -> np.ndarray:
    lags = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - t - 0.001)
    return np.array(lags)


async def run(mode: str, seconds: float, decoders: int, pcm: bytes) -> dict:
    results: list = []
    if mode == "threads":
        threads = [threading.Thread(target=lambda: results.append(decode_for(seconds, pcm)))
                   for _ in range(decoders)]
        for t in threads:
            t.start()
        lags = await loop_lag(seconds)
        for t in threads:
            t.join()
    elif mode == "processes":
        with ProcessPoolExecutor(decoders) as pool:
            futs = [asyncio.wrap_future(pool.submit(decode_for, seconds, pcm))
                    for _ in range(decoders)]
            await asyncio.sleep(1.0)  # the pool's start-up is not part of the steady state
            lags = await loop_lag(seconds - 1.0)
            results = list(await asyncio.gather(*futs))
    else:
        lags = await loop_lag(seconds)
    chunks = sum(c for c, _ in results)
    return {"mode": mode, "p50_ms": 1e3 * np.quantile(lags, 0.5),
            "p99_ms": 1e3 * np.quantile(lags, 0.99), "max_ms": 1e3 * lags.max(),
            "chunks_per_s": chunks / seconds,
            "longest_call_ms": 1e3 * max((x for _, x in results), default=0.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--decoders", type=int, default=2)
    args = ap.parse_args()
    pcm = speech_16k()
    print(f"{len(pcm) / 32000:.2f} s of speech; {args.decoders} decoders; loop ticks every 1 ms")
    print(f"{'mode':10} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} {'chunks/s':>9} {'longest call':>13}")
    for mode in ("idle", "threads", "processes"):
        r = asyncio.run(run(mode, args.seconds, args.decoders, pcm))
        print(f"{r['mode']:10} {r['p50_ms']:7.2f}ms {r['p99_ms']:7.2f}ms {r['max_ms']:7.2f}ms "
              f"{r['chunks_per_s']:9.0f} {r['longest_call_ms']:11.2f}ms")


if __name__ == "__main__":
    main()
