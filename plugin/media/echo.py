"""Acoustic echo cancellation (``audio.input.echo_cancellation``), sans-I/O.

A device that plays the reply on a speaker and streams its microphone over
the socket (a Raspberry Pi, a kiosk, a Python client on a laptop) sends the
reply back to us as echo; nothing on its side removes it, so VAD would hear
the assistant and interrupt it. ``EchoCanceller`` removes it with WebRTC's
AEC3 (the ``livekit`` package's ``AudioProcessingModule``, Apache-2.0, a
self-contained native library: no network), given the *reference*: what the
client's speaker played for each microphone sample (``session/echo.py``
models that timeline from what the server sent).

AEC3 finds the echo path itself -- the delay (up to about a second) and the
room's response -- so the reference only has to lead the echo, never lag
it. Its high-pass filter runs too (the reference's as well as the
microphone's low rumble is no voice); its noise suppressor and gain control
do not: noise reduction is ``audio.input.noise_reduction``'s, after this.

Stateful per stream (the echo path it learned): one per session input.
``livekit`` is an optional dependency (the ``echo`` extra), imported when a
session first asks for echo cancellation; without it the ask is refused
(``capability_unsupported``), not failed later.
"""

from __future__ import annotations

import numpy as np

from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.payloads import INTERNAL_RATE

FRAME = INTERNAL_RATE // 100  # AEC3's step: 10 ms
_FRAME_BYTES = 2 * FRAME


def _apm_class():
    try:
        from livekit.rtc import AudioFrame, AudioProcessingModule
    except ImportError as err:
        raise DuplexError("capability_unsupported",
                          "echo cancellation needs the livekit package "
                          "(pip install 'vllm-duplex[echo]')",
                          param="session.audio.input.echo_cancellation") from err
    return AudioFrame, AudioProcessingModule


class EchoCanceller:
    """Mono int16 PCM at 16 kHz: the microphone and, sample for sample, what
    the speaker played (the reference) in; the microphone without the echo
    out. ``process`` takes whole 10 ms frames of both, the same length."""

    def __init__(self) -> None:
        self._frame, apm = _apm_class()
        self._apm = apm(echo_cancellation=True, noise_suppression=False,
                        high_pass_filter=True, auto_gain_control=False)

    def process(self, mic: np.ndarray, reference: np.ndarray) -> np.ndarray:
        if mic.size % FRAME or mic.size != reference.size:
            raise ValueError(f"{mic.size} microphone and {reference.size} reference samples: "
                             f"not the same whole {FRAME}-sample frames")
        near = mic.astype(np.int16, copy=False).tobytes()
        far = reference.astype(np.int16, copy=False).tobytes()
        out = bytearray(len(near))
        for i in range(0, len(near), _FRAME_BYTES):
            played = self._frame(far[i:i + _FRAME_BYTES], INTERNAL_RATE, 1, FRAME)
            self._apm.process_reverse_stream(played)  # the speaker first, then what the mic heard
            heard = self._frame(near[i:i + _FRAME_BYTES], INTERNAL_RATE, 1, FRAME)
            self._apm.process_stream(heard)  # in place
            out[i:i + _FRAME_BYTES] = heard.data.cast("B")
        return np.frombuffer(bytes(out), dtype=np.int16).copy()
