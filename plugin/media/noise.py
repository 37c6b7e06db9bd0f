"""Input noise reduction (``audio.input.noise_reduction``), sans-I/O.

The GA session field takes ``{"type": "near_field"}`` (a close-talking
microphone: a headset, a phone at the ear) or ``{"type": "far_field"}`` (a
laptop's or a room's microphone: the voice arrives weaker beside the room's
noise), or ``null`` (off, OpenAI's default). Both run Speex's preprocessor
(``pyspeex-noise``, the suppressor Home Assistant's voice pipeline uses) on
the session's internal 16 kHz PCM, 10 ms at a time, before VAD and ASR see
it; they differ in how deep the noise is pushed down: -15 dB for a close
microphone (Speex's default: the voice is far above the noise, keep it
untouched), -30 dB for a far one. Speex's automatic gain is not used: in
pyspeex-noise 2.0.1 it returns silence.

``NoiseSuppressor`` is stateful per stream (its noise estimate adapts over
the first second): one per session input, never shared.
"""

from __future__ import annotations

import numpy as np
from pyspeex_noise import AudioProcessor

from vllm_duplex.domain.payloads import INTERNAL_RATE
from vllm_duplex.domain.session_config import NOISE_REDUCTION_TYPES

FRAME = INTERNAL_RATE // 100  # Speex's step here: 10 ms at 16 kHz
_SUPPRESSION_DB = {"near_field": -15, "far_field": -30}
assert set(_SUPPRESSION_DB) == set(NOISE_REDUCTION_TYPES)

assert INTERNAL_RATE == 16000, "pyspeex-noise takes 16 kHz audio"


class NoiseSuppressor:
    """Mono int16 PCM at 16 kHz in, the same with less noise out, sample for
    sample. ``process`` takes whole 10 ms frames (the caller keeps the rest
    for the next call); ``finish`` takes a stream's last partial frame."""

    def __init__(self, kind: str) -> None:
        if kind not in _SUPPRESSION_DB:
            raise ValueError(f"noise reduction {kind!r}: one of {NOISE_REDUCTION_TYPES}")
        self.kind = kind
        self._speex = AudioProcessor(0, _SUPPRESSION_DB[kind])

    def process(self, pcm: np.ndarray) -> np.ndarray:
        if pcm.size % FRAME:
            raise ValueError(f"{pcm.size} samples: not whole {FRAME}-sample frames")
        data = pcm.astype(np.int16, copy=False).tobytes()
        step = 2 * FRAME
        out = b"".join(self._speex.process_10ms(data[i:i + step]) for i in range(0, len(data), step))
        return np.frombuffer(out, dtype=np.int16).copy()

    def finish(self, pcm: np.ndarray) -> np.ndarray:
        """A last, partial frame: padded with silence, cut back to its length."""
        if pcm.size == 0:
            return pcm
        padded = np.zeros(-(-pcm.size // FRAME) * FRAME, np.int16)
        padded[:pcm.size] = pcm
        return self.process(padded)[:pcm.size]
