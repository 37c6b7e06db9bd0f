"""Frames made to measure for the residual echo suppressor's rules
(``media/echo_gate.py``): speech-like noise, each 10 ms frame's level, and
the suppressor run over a microphone, the cancellers' outputs and the
reference in a client's chunks. No AEC3: each test says what the
cancellers leave."""

from __future__ import annotations

import numpy as np
from vllm_duplex.media.echo import FRAME, ResidualEchoSuppressor

RATE = 16000


def speechy(seconds: float, level_db: float, seed: int) -> np.ndarray:
    """Noise in syllables (a 4 Hz envelope, 60 ms gaps), ``level_db`` dBFS."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    envelope = np.clip(np.sin(2 * np.pi * 4 * np.arange(n) / RATE), 0.1, 1.0)
    x = rng.normal(0, 1, n) * envelope
    return x / np.sqrt(np.mean(x ** 2)) * 32768 * 10 ** (level_db / 20)


def frames_db(x: np.ndarray) -> np.ndarray:
    """Each whole 10 ms frame's level (dB over a sample of 1)."""
    x = np.asarray(x, np.float64)
    n = x.size // FRAME
    return 10 * np.log10((x[:n * FRAME].reshape(n, FRAME) ** 2).mean(1) + 1.0)


def room_response(rt60: float, level_db: float = 0.0) -> np.ndarray:
    """A room's response: noise decaying 60 dB in ``rt60`` seconds, its
    energy ``level_db`` against what the speaker played."""
    t = np.arange(int(1.5 * rt60 * RATE)) / RATE
    h = np.random.default_rng(7).normal(0, 1, t.size) * 10 ** (-3 * t / rt60)
    return h / np.sqrt(np.sum(h ** 2)) * 10 ** (level_db / 20)


def suppressed(pre: np.ndarray, post: np.ndarray, reference: np.ndarray,
               linear: np.ndarray | None = None, *, step: int = 2 * FRAME) -> np.ndarray:
    """The VAD's view: ``ResidualEchoSuppressor`` over the microphone
    (``pre``), AEC3's output (``post``), the reference and the linear
    canceller's output, in ``step``-sample chunks (20 ms: a client's)."""
    s = ResidualEchoSuppressor()
    n = pre.size - pre.size % step
    signals = [x for x in (pre, post, reference, linear) if x is not None]
    as16 = [np.clip(np.round(x), -32768, 32767).astype(np.int16) for x in signals]
    return np.concatenate([s.process(*(x[i:i + step] for x in as16)) for i in range(0, n, step)])
