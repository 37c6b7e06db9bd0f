"""Does a CPU stage stall the event loop of other sessions? (issue 13, item 4)

Runs a stage's model as fast as it can, in ``--decoders`` threads at once,
while the main thread's event loop ticks every 1 ms; reports how late the
ticks were (the stall a session's ingest sees). Models: PocketSphinx decoding
Flite speech in 20 ms chunks (the light pipeline's ASR; also in a process
pool, the same work in another interpreter), and the default pipeline's
Whisper base (CTranslate2) transcribing it and Piper (onnxruntime)
speaking a sentence -- both in threads, as their stages run them.

    .venv/bin/python bench/gil_hold.py [--seconds 10] [--decoders 2]
                                       [--models pocketsphinx,whisper,piper]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine  # noqa: E402

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


def repeat_for(seconds: float, call: Callable[[], object]) -> tuple[int, float]:
    """Calls made in ``seconds`` and the longest one (s)."""
    done, longest = 0, 0.0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        call()
        longest = max(longest, time.perf_counter() - t)
        done += 1
    return done, longest


def whisper_for(seconds: float, pcm: bytes) -> tuple[int, float]:
    """Whole-utterance transcriptions done and the longest one (s)."""
    from vllm_duplex.assets.locate import whisper_model_dir
    from vllm_duplex.stages.listening.whisper_model import load

    model = load(whisper_model_dir("whisper-base"), threads=1)
    audio = np.frombuffer(pcm, "<i2")
    return repeat_for(seconds, lambda: model.transcribe(audio))


def piper_for(seconds: float, pcm: bytes) -> tuple[int, float]:
    """Sentences synthesized and the longest one (s)."""
    from vllm_duplex.assets.locate import piper_voice_files
    from vllm_duplex.stages.speech.piper import load_voice
    from vllm_duplex.stages.speech.piper_voice import espeak_argv, ipa_with_punctuation

    voice = load_voice(*piper_voice_files("en_US-joe-medium"), threads=1)
    ipa = subprocess.run(espeak_argv(voice.config.espeak_voice), input=PHRASE.encode(),
                         capture_output=True, check=True).stdout.decode()
    phonemes = ipa_with_punctuation(PHRASE, ipa)
    return repeat_for(seconds, lambda: voice.synthesize(phonemes))


WORK = {"pocketsphinx": decode_for, "whisper": whisper_for, "piper": piper_for}


async def loop_lag(seconds: float) -> np.ndarray:
    lags = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(time.perf_counter() - t - 0.001)
    return np.array(lags)


async def run(mode: str, seconds: float, decoders: int, pcm: bytes,
              model: str = "pocketsphinx") -> dict:
    results: list = []
    work = WORK[model]
    if mode == "threads":
        WORK[model](0.0, pcm)  # load (and warm) the model before the window
        threads = [threading.Thread(target=lambda: results.append(work(seconds, pcm)))
                   for _ in range(decoders)]
        for t in threads:
            t.start()
        lags = await loop_lag(seconds)
        for t in threads:
            t.join()
    elif mode == "processes":
        with ProcessPoolExecutor(decoders) as pool:
            futs = [asyncio.wrap_future(pool.submit(work, seconds, pcm))
                    for _ in range(decoders)]
            await asyncio.sleep(1.0)  # the pool's start-up is not part of the steady state
            lags = await loop_lag(seconds - 1.0)
            results = list(await asyncio.gather(*futs))
    else:
        lags = await loop_lag(seconds)
    chunks = sum(c for c, _ in results)
    return {"mode": mode if mode == "idle" else f"{model} {mode}", "p50_ms": 1e3 * np.quantile(lags, 0.5),
            "p99_ms": 1e3 * np.quantile(lags, 0.99), "max_ms": 1e3 * lags.max(),
            "chunks_per_s": chunks / seconds,
            "longest_call_ms": 1e3 * max((x for _, x in results), default=0.0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--decoders", type=int, default=2)
    ap.add_argument("--models", default="pocketsphinx,whisper,piper")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or set(models) - set(WORK):
        ap.error(f"--models: a comma-separated subset of {sorted(WORK)}")
    print(machine.line(), flush=True)
    pcm = speech_16k()
    print(f"{len(pcm) / 32000:.2f} s of speech; {args.decoders} decoders; loop ticks every 1 ms")
    print(f"{'mode':24} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} {'calls/s':>9} "
          f"{'longest call':>13}")
    plan = [("idle", "pocketsphinx")]
    for model in models:
        plan.append(("threads", model))
        if model == "pocketsphinx":
            plan.append(("processes", model))
    for mode, model in plan:
        r = asyncio.run(run(mode, args.seconds, args.decoders, pcm, model))
        print(f"{r['mode']:24} {r['p50_ms']:7.2f}ms {r['p99_ms']:7.2f}ms {r['max_ms']:7.2f}ms "
              f"{r['chunks_per_s']:9.1f} {r['longest_call_ms']:11.2f}ms")


if __name__ == "__main__":
    main()
