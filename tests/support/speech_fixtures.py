"""Real speech for end-to-end tests: questions spoken by Flite, and answers
checked by ear -- our own PocketSphinx ASR listening to the reply. (Flite's
voices are the ones PocketSphinx understands; eSpeak NG's it mostly does not.)"""

from __future__ import annotations

import subprocess

import numpy as np
import soxr
from vllm_duplex.stages.listening.pocketsphinx import DecoderPool, clean_hypothesis
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


_POOL: DecoderPool | None = None


def recognize(pcm: np.ndarray, rate: int) -> str:
    """What our PocketSphinx hears in ``pcm`` (lowercase words)."""
    global _POOL
    _POOL = _POOL or DecoderPool(max_idle=1)
    audio = soxr.resample(pcm.astype(np.int16), rate, 16000) if rate != 16000 else pcm
    decoder = _POOL.acquire()
    try:
        decoder.start_utt()
        decoder.process_raw(audio.astype("<i2").tobytes(), full_utt=True)
        decoder.end_utt()
        hyp = decoder.hyp()
        return clean_hypothesis(hyp.hypstr) if hyp is not None else ""
    finally:
        _POOL.release(decoder)
