"""Real speech for end-to-end tests: questions spoken by Flite, and answers
checked by ear -- Whisper base (the default pipeline's final ASR, loaded once
per test session) listening to the reply."""

from __future__ import annotations

import re
import subprocess

import numpy as np
import soxr
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


def recognize(pcm: np.ndarray, rate: int) -> str:
    """What Whisper hears in ``pcm``: lowercase words, no punctuation."""
    from vllm_duplex.assets.locate import whisper_model_dir
    from vllm_duplex.stages.listening.whisper_model import load

    audio = soxr.resample(pcm.astype(np.int16), rate, 16000) if rate != 16000 else pcm
    text = load(whisper_model_dir("whisper-base"), threads=2).transcribe(audio.astype(np.int16)).text
    return " ".join(re.sub(r"[^\w' ]", " ", text.lower()).split())
