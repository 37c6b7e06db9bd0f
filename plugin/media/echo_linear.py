"""A linear echo canceller for the ASR's view (``Cancelled.words``), sans-I/O.

AEC3 (``media/echo.py``) removes the echo deeply, but where the user speaks
over it its non-linear stage ducks them too: some 10-12 dB of their level
where the echo is about as loud (issue 44, ``bench/room_echo.py``), and
Whisper loses the words with it. The `livekit` binding exposes no AEC3
setting to turn that off nor its linear filter's output. What the ASR needs
is the opposite trade: the echo taken down, the user's voice kept. That is
Speex's MDF adaptive filter (``speex_echo_cancellation``, Xiph's
libspeexdsp, BSD): a frequency-domain filter whose output is the microphone
minus its estimate of the echo. Its step size falls when the output carries
more than the echo it predicts (double talk), so a voice over the echo is
not turned down and barely moves the filter.

What the filter leaves of a reverberant room's echo (5-10 dB taken out in
the room bench's large room, 10-25 in the others) still carries the reply's
words. After the filter comes Speex's own residual echo suppressor
(``speex_preprocess_run`` given the filter's state,
``SPEEX_PREPROCESS_SET_ECHO_STATE``: its estimate, band by band, of the echo
the filter left, which is large while the filter is still learning the
room), with its noise suppression off (that is ``noise_reduction``'s): it
turns down the bands where echo is left, to -30 dB, and to -10 dB where
someone speaks over it, and leaves the bands the user's voice holds. Per
band, unlike the VAD's suppressor (``ResidualEchoSuppressor``, whole
frames), so a voice over the echo keeps the bands it is louder in.

The ASR hears this from the first frame. Until 2026-12-07 it heard AEC3's
output until the filter had learned the room, judged on the frames of echo
alone; but AEC3 ducks a user speaking over the echo so far that their frames
passed for echo alone, and the user's own words switched the ASR back to
AEC3's ducked view mid-utterance. Room bench, 18 real recordings 2 s into a
reply, WER at -20 / -10 / 0 / +6 dB (5.3 % with no reply): 6.6 / 14.9 /
21.1 / 29.8 % with that switch, 5.3 / 5.3 / 7.9 / 18.0 % on the filter alone
throughout, 4.8 / 4.8 / 7.5 / 18.0 % with the residual suppressor at its
depths below; 0.5 s into a session's first reply, where the filter has
barely begun, 14.0 / 28.1 % with the switch at -20 / -10 dB, 5.3 / 7.0 %
now.

The filter is causal: the reference (``session/echo.py``'s modelled
playback) must lead the echo, and the filter spans that lead (the device's
own latency, 60 ms in the bench) plus the room's tail that matters.
``FILTER_MS`` was chosen in the room bench on the tune recordings only
(bench/README.md, ``room_echo.py``). Where the reference leads the echo by
more than the filter spans (a client's long playback buffer), the canceller
holds the reference back to meet it (``media/echo_lag.py``); an echo later
than a second, or before that lag is known, is out of the filter's reach
and the ASR hears it.

libspeexdsp is a system library (Debian's ``libspeexdsp1``; its C API has not
changed since 2008), loaded through ctypes when a session first asks for
echo cancellation; without it the ask is refused (``capability_unsupported``),
as without ``livekit``. Stateful per stream (the echo path it learned): one
per session input, freed with it.
"""

from __future__ import annotations

import ctypes
import weakref
from functools import cache

import numpy as np

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import INTERNAL_RATE

FRAME = INTERNAL_RATE // 100  # the filter's block: 10 ms, AEC3's frame
FILTER_MS = 250  # the reference's lead (60 ms device latency) and the room's tail
_SET_SAMPLING_RATE = 24  # speex_echo.h's SPEEX_ECHO_SET_SAMPLING_RATE
# speex_preprocess.h's requests
_SET_NOISE_SUPPRESS, _SET_ECHO_SUPPRESS, _SET_ECHO_SUPPRESS_ACTIVE, _SET_ECHO_STATE = 18, 20, 22, 24
_LIBRARY = "libspeexdsp.so.1"


@cache
def _speexdsp() -> ctypes.CDLL:
    """libspeexdsp with the four echo functions typed, or a refusal."""
    try:
        lib = ctypes.CDLL(_LIBRARY)
        init = lib.speex_echo_state_init
    except (OSError, AttributeError) as err:
        raise DuplexError("capability_unsupported",
                          "echo cancellation needs libspeexdsp "
                          "(Debian: apt-get install libspeexdsp1)",
                          param="session.audio.input.echo_cancellation") from err
    init.restype, init.argtypes = ctypes.c_void_p, [ctypes.c_int, ctypes.c_int]
    lib.speex_echo_ctl.restype = ctypes.c_int
    lib.speex_echo_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.speex_echo_cancellation.restype = None
    # int16 buffers by address: a cast to a typed pointer per frame cost a sixth of the filter
    lib.speex_echo_cancellation.argtypes = [ctypes.c_void_p] * 4
    lib.speex_echo_state_destroy.restype = None
    lib.speex_echo_state_destroy.argtypes = [ctypes.c_void_p]
    lib.speex_preprocess_state_init.restype = ctypes.c_void_p
    lib.speex_preprocess_state_init.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.speex_preprocess_ctl.restype = ctypes.c_int
    lib.speex_preprocess_ctl.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.speex_preprocess_run.restype = ctypes.c_int
    lib.speex_preprocess_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.speex_preprocess_state_destroy.restype = None
    lib.speex_preprocess_state_destroy.argtypes = [ctypes.c_void_p]
    return lib


class LinearEchoCanceller:
    """Mono int16 PCM at 16 kHz: the microphone and, sample for sample, what
    the speaker played (the reference) in, whole 10 ms frames of both; the
    microphone less the linear filter's estimate of the echo out, the same
    length, then, with ``suppress_residual``, Speex's residual echo
    suppressor over it (band by band; no noise suppression, no gain
    control); without, nothing else is done to it (``residual="linear"``,
    the VAD's view from the filter measured beside the product)."""

    # How far the residual echo suppressor turns the echo down, and where
    # someone speaks over it. Speex's defaults (-40 / -15 dB) left one long
    # sentence's lead-in so near silence that Whisper's no-speech gate
    # dropped the whole sentence (room bench, the small room at -20 dB);
    # -30 / -10 dB was no worse anywhere in the bench's 18 recordings (WER
    # over the echo 4.8 / 4.8 / 7.5 % at -20 / -10 / 0 dB, against 4.8 /
    # 4.8 / 7.9 and, at -25 / -6, 5.3 / 4.8 / 7.9).
    ECHO_SUPPRESS_DB = -30
    ECHO_SUPPRESS_ACTIVE_DB = -10

    def __init__(self, *, filter_ms: int = FILTER_MS, suppress_residual: bool = True) -> None:
        lib = _speexdsp()
        taps = INTERNAL_RATE * filter_ms // 1000
        state = lib.speex_echo_state_init(FRAME, taps)
        if not state:
            raise MemoryError(f"speex_echo_state_init({FRAME}, {taps}) failed")
        rate = ctypes.c_int(INTERNAL_RATE)
        lib.speex_echo_ctl(state, _SET_SAMPLING_RATE, ctypes.byref(rate))
        self._lib, self._state = lib, state
        self._free = weakref.finalize(self, lib.speex_echo_state_destroy, state)
        self._residual = None
        if suppress_residual:
            pre = lib.speex_preprocess_state_init(FRAME, INTERNAL_RATE)
            if not pre:
                raise MemoryError(f"speex_preprocess_state_init({FRAME}) failed")
            self._free_residual = weakref.finalize(self, lib.speex_preprocess_state_destroy, pre)
            # No noise suppression (that is noise_reduction's, after this).
            for request, value in ((_SET_NOISE_SUPPRESS, 0),
                                   (_SET_ECHO_SUPPRESS, self.ECHO_SUPPRESS_DB),
                                   (_SET_ECHO_SUPPRESS_ACTIVE, self.ECHO_SUPPRESS_ACTIVE_DB)):
                v = ctypes.c_int(value)
                lib.speex_preprocess_ctl(pre, request, ctypes.byref(v))
            lib.speex_preprocess_ctl(pre, _SET_ECHO_STATE, ctypes.c_void_p(state))
            self._residual = pre

    def process(self, mic: np.ndarray, reference: np.ndarray) -> np.ndarray:
        if mic.size % FRAME or mic.size != reference.size:
            raise ValueError(f"{mic.size} microphone and {reference.size} reference samples: "
                             f"not the same whole {FRAME}-sample frames")
        near = np.ascontiguousarray(mic, dtype=np.int16)
        far = np.ascontiguousarray(reference, dtype=np.int16)
        out = np.empty_like(near)
        cancel, state = self._lib.speex_echo_cancellation, self._state
        residual, suppress = self._residual, self._lib.speex_preprocess_run
        a, b, c = near.ctypes.data, far.ctypes.data, out.ctypes.data
        for i in range(0, 2 * near.size, 2 * FRAME):  # bytes
            cancel(state, a + i, b + i, c + i)
            if residual is not None:  # in place, from the filter's state for this very frame
                suppress(residual, c + i)
        return out

    def close(self) -> None:
        """Free the filter now rather than when this is collected."""
        if self._residual is not None:
            self._free_residual()
        self._free()
