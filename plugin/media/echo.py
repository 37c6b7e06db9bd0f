"""Acoustic echo cancellation (``audio.input.echo_cancellation``), sans-I/O.

A device that plays the reply on a speaker and streams its microphone over
the socket (a Raspberry Pi, a kiosk, a Python client on a laptop) sends the
reply back to us as echo; nothing on its side removes it, so VAD would hear
the assistant and interrupt it. ``EchoCanceller`` removes it with WebRTC's
AEC3 (the ``livekit`` package's ``AudioProcessingModule``, Apache-2.0, a
self-contained native library: no network), given the *reference*: what the
client's speaker played for each microphone sample (``session/echo.py``
models that timeline from what the server sent).

AEC3 finds the echo path itself -- the delay and the room's response -- so
the reference only has to lead the echo, never lag it; where it leads by
more than the cancellers reach (a client playing 400 ms and more behind the
model: AEC3 did not find 500 ms in a reverberant room), it is held back to
meet the echo (``media/echo_lag.py``). Its high-pass filter runs too (the
reference's as well as the microphone's low rumble is no voice); its noise
suppressor and gain control do not: noise reduction is
``audio.input.noise_reduction``'s, after this.

So the canceller gives two views of the same samples (``Cancelled``), from
AEC3 and from a linear canceller beside it (``media/echo_linear.py``,
Speex's adaptive filter and its residual echo suppressor). AEC3 takes more
of the echo out, but its non-linear stage ducks a voice over the echo 10-12
dB:

* the ASR's view (``words``) is the linear canceller's: less of the echo
  taken out, the residual turned down band by band, little of the user's
  words lost;
* the VAD's (``speech``) goes through a residual echo suppressor, the
  classic non-linear processor (``ResidualEchoSuppressor``,
  ``media/echo_gate.py``; whole frames: what is left of the echo must not
  start a turn): what passes its gate is
  AEC3's output, or the linear canceller's once that has learned the room
  (AEC3 ducks and colours the first hundreds of ms of a voice over the echo,
  where a barge-in is decided). It judges whole frames: where the user
  speaks over the echo and neither canceller's output stands well over what
  it leaves of the echo, their frames are turned down with it -- right for
  an onset (the echo must not start one), wrong for the words. Measured beside
  it in the room and onset benches (bench/README.md): ``"bands"``, band by
  band (``media/echo_bands.py``), and ``"linear"``, the linear filter's
  output through ``LinearResidualSuppressor`` (onsets over the echo sooner,
  not yet steady over a live socket).

Stateful per stream (the echo path it learned): one per session input.
``livekit`` is an optional dependency (the ``echo`` extra), and libspeexdsp a
system library; both are loaded when a session first asks for echo
cancellation; without either the ask is refused (``capability_unsupported``),
not failed later.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import INTERNAL_RATE
from vllm_duplex.media.echo_bands import BandResidualSuppressor
from vllm_duplex.media.echo_gate import (LinearResidualSuppressor, ResidualEchoSuppressor,
                                         frame_energies)
from vllm_duplex.media.echo_lag import EchoAligner
from vllm_duplex.media.echo_linear import FILTER_MS, LinearEchoCanceller

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


@dataclass(frozen=True)
class Cancelled:
    """The microphone without the echo, sample for sample, two ways."""

    words: np.ndarray  # the linear canceller's output (AEC3's till it has the room): for the ASR
    speech: np.ndarray  # AEC3's output with the residual echo turned down: for the VAD


class EchoCanceller:
    """Mono int16 PCM at 16 kHz: the microphone and, sample for sample, what
    the speaker played (the reference) in; the microphone without the echo
    out (``Cancelled``). ``process`` takes whole 10 ms frames of both, the
    same length. The VAD's view goes through the residual echo suppressor
    ``residual`` names (``RESIDUAL_SUPPRESSORS``: ``"linear"`` over the
    linear filter's output, the others over AEC3's; None: AEC3's output as
    it is); the ASR's is ``words``'s (``WORDS_VIEWS``): the linear
    canceller's (its filter ``filter_ms`` long, with Speex's residual echo
    suppressor after it; without it where ``residual="linear"``, as that
    was measured), or AEC3's output (the code before, as the room bench
    compares). ``align``: the reference held
    back where the echo comes later than the cancellers reach
    (``EchoAligner``); False: the reference as it came."""

    def __init__(self, *, residual: str | None = "broadband", words: str = "linear",
                 filter_ms: int = FILTER_MS, align: bool = True) -> None:
        if words not in WORDS_VIEWS:
            raise ValueError(f"words: one of {WORDS_VIEWS}, not {words!r}")
        self._frame, apm = _apm_class()
        # Speex's residual echo suppressor after its filter, for the ASR; the
        # VAD's view from the linear filter (measured beside it) is the
        # filter's output alone, as it was measured.
        self._linear = (LinearEchoCanceller(filter_ms=filter_ms,
                                            suppress_residual=residual != "linear")
                        if "linear" in (words, residual) else None)
        self._words_linear = words == "linear"
        self._new_apm = lambda: apm(echo_cancellation=True, noise_suppression=False,
                                    high_pass_filter=True, auto_gain_control=False)
        self._apm = self._new_apm()
        # One frame each way, filled in place: a new frame per 10 ms (its
        # buffer copied twice more by the binding) cost a fifth of AEC3's time.
        self._played = self._frame(bytearray(_FRAME_BYTES), INTERNAL_RATE, 1, FRAME)
        self._heard = self._frame(bytearray(_FRAME_BYTES), INTERNAL_RATE, 1, FRAME)
        self._residual = RESIDUAL_SUPPRESSORS[residual]() if residual else None
        # A reference that leads its echo further than the cancellers reach
        # is held back to meet it (``media/echo_lag.py``); off: as it came.
        self._aligner = EchoAligner() if align else None

    def process(self, mic: np.ndarray, reference: np.ndarray) -> Cancelled:
        if mic.size % FRAME or mic.size != reference.size:
            raise ValueError(f"{mic.size} microphone and {reference.size} reference samples: "
                             f"not the same whole {FRAME}-sample frames")
        near = np.ascontiguousarray(mic, dtype=np.int16)
        reference = np.ascontiguousarray(reference, dtype=np.int16)
        if self._aligner is not None:
            shift = self._aligner.shift
            reference = self._aligner.align(near, reference)
            if self._aligner.shift != shift:
                # AEC3 starts again: the reference it has is the one it gets
                # again now, and it locked onto the echo's match with the
                # first copy, a lag ago, and lost the echo when that ended.
                self._apm = self._new_apm()
        cancelled = np.empty_like(near)
        played, heard = self._played.data, self._heard.data
        for i in range(0, near.size, FRAME):
            played[:] = reference[i:i + FRAME]
            self._apm.process_reverse_stream(self._played)  # the speaker first, then the mic
            heard[:] = near[i:i + FRAME]
            self._apm.process_stream(self._heard)  # in place
            cancelled[i:i + FRAME] = heard
        linear = cancelled if self._linear is None else self._linear.process(mic, reference)
        # The four signals' frames and energies, once.
        frames = np.stack((mic, cancelled, linear, reference)).reshape(4, -1, FRAME).astype(
            np.float32)
        energy = frame_energies(frames)
        residual = self._residual
        if residual is None:
            speech = cancelled
        elif isinstance(residual, LinearResidualSuppressor):
            speech = residual.on_frames(linear, frames[2], energy[2], energy[2], energy[3])
        elif isinstance(residual, ResidualEchoSuppressor):
            beside = (frames[2], energy[2]) if self._linear is not None else None
            speech = residual.on_frames(cancelled, frames[1], energy[0], energy[1], energy[3],
                                        beside)
        else:
            speech = residual.process(mic, cancelled, reference)
        words = linear if self._words_linear else cancelled
        return Cancelled(words, speech)


RESIDUAL_SUPPRESSORS = {"bands": BandResidualSuppressor, "broadband": ResidualEchoSuppressor,
                        "linear": LinearResidualSuppressor}
WORDS_VIEWS = ("linear", "aec3")  # the ASR's: Speex's linear canceller, or AEC3's output
