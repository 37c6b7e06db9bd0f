"""Real speech for end-to-end tests: questions spoken by Flite into a socket at
real time, answered by a real pipeline on the test session's vLLM stage, and
checked by ear -- Whisper base (the default pipeline's final ASR, loaded once
per test session) listening to the reply."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import time
from typing import Any

import numpy as np
import soxr
from vllm_duplex.host.deploy import load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.stages.speech.subprocess_tts import parse_wav

RATE = 24000  # the Realtime default input rate


def speak(text: str, *, rate: int = RATE, lead_s: float = 0.3, tail_s: float = 1.2,
          voice: str = "slt") -> np.ndarray:
    """``text`` spoken by Flite, with silence around it, as int16 at ``rate``."""
    wav = subprocess.run(["flite", "-voice", voice, "-t", text, "-o", "/dev/stdout"],
                         capture_output=True, check=True, timeout=30).stdout
    pcm, src_rate = parse_wav(wav)
    pcm = soxr.resample(pcm, src_rate, rate) if src_rate != rate else pcm
    lead, tail = np.zeros(int(rate * lead_s), np.int16), np.zeros(int(rate * tail_s), np.int16)
    return np.concatenate([lead, pcm.astype(np.int16), tail])


def chunks(pcm: np.ndarray, *, rate: int = RATE, ms: int = 20) -> list[bytes]:
    step = rate * ms // 1000
    return [pcm[i:i + step].astype("<i2").tobytes() for i in range(0, len(pcm), step)]


async def say(client: RealtimeClient, pcm: np.ndarray) -> float:
    """Stream ``pcm`` in 20 ms chunks at real time (as a microphone would);
    returns when it started."""
    start = time.monotonic()
    for i, chunk in enumerate(chunks(pcm)):
        await client.append_audio(chunk)
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))
    return start


def cascade_runtime(vllm_stage: Any, name: str = "cascade-cpu", **limits: Any) -> Runtime:
    """A config of ``configs/`` on the test session's vLLM stage. A dropped
    socket ends its session (``resume_grace_s=0``): a detached session would
    outlive its test."""
    config = load_config(name)
    limits = {"resume_grace_s": 0, **limits}
    config = dataclasses.replace(config, limits=dataclasses.replace(config.limits, **limits))
    return Runtime(config, shared_stages={"vllm": vllm_stage})


def recognize(pcm: np.ndarray, rate: int) -> str:
    """What Whisper hears in ``pcm``: lowercase words, no punctuation."""
    from vllm_duplex.assets.locate import whisper_model_dir
    from vllm_duplex.stages.listening.whisper_model import load

    audio = soxr.resample(pcm.astype(np.int16), rate, 16000) if rate != 16000 else pcm
    text = load(whisper_model_dir("whisper-base"), threads=2).transcribe(audio.astype(np.int16)).text
    return " ".join(re.sub(r"[^\w' ]", " ", text.lower()).split())
