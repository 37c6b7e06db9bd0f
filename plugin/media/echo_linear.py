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
words, and Whisper heard them in the user's (WER over a 0 dB echo 21 %
against 5 % with no reply, 18 real recordings). After the filter comes
Speex's own residual echo suppressor (``speex_preprocess_run`` given the
filter's state, ``SPEEX_PREPROCESS_SET_ECHO_STATE``: its estimate of the
echo the filter left, band by band), with its noise suppression off (that
is ``noise_reduction``'s): it turns down the bands where the echo is left,
to -40 dB, and to -15 dB where someone speaks over it, and leaves the bands
the user's voice holds. The same bench: WER 4.8 / 4.8 / 7.0 / 16.7 % at
-20 / -10 / 0 / +6 dB against 6.6 / 14.9 / 21.1 / 29.8 % with the filter
alone (5.3 % with no reply). It is per band, unlike the VAD's suppressor
(``ResidualEchoSuppressor``, whole frames), so a voice over the echo keeps
the bands it is louder in; the words lose little where no echo is left
(the suppressor changes nothing with no reference playing).

The filter is causal: the reference (``session/echo.py``'s modelled
playback) must lead the echo, and the filter spans that lead (the device's
own latency, 60 ms in the bench) plus the room's tail that matters.
``FILTER_MS`` was chosen in the room bench on the tune recordings only
(bench/README.md, ``room_echo.py``).

Only while the filter has the room: where the reference leads the echo by
more than the filter spans (a client's long playback buffer, a slow
network) it takes nothing out, and AEC3, which finds the delay itself (up
to about a second), does. ``WordsChooser`` watches, frame by frame, how far
under the microphone the filter's output is where only the echo is there
(AEC3's output far under the microphone), and gives the ASR AEC3's output
until the linear filter takes the echo down ``LEARNED_DB`` (a session's
first second or so; always, where the echo is out of the filter's reach).

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
from typing import NamedTuple

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


class LinearOut(NamedTuple):
    """The same frames two ways: the filter's output, which says how much of
    the echo the filter has (``WordsChooser``), and the ASR's view."""

    filtered: np.ndarray  # the microphone less the filter's estimate of the echo
    suppressed: np.ndarray  # that with the residual echo suppressed (the same array without)


class LinearEchoCanceller:
    """Mono int16 PCM at 16 kHz: the microphone and, sample for sample, what
    the speaker played (the reference) in, whole 10 ms frames of both; the
    microphone less the linear filter's estimate of the echo out, the same
    length, then, with ``suppress_residual``, Speex's residual echo
    suppressor over it (band by band; no noise suppression, no gain
    control); without, nothing else is done to it (``residual="linear"``,
    the VAD's view from the filter measured beside the product)."""

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
            # No noise suppression (that is noise_reduction's, after this);
            # the residual echo down to Speex's own -40 dB, -15 dB where
            # someone speaks over it.
            for request, value in ((_SET_NOISE_SUPPRESS, 0), (_SET_ECHO_SUPPRESS, -40),
                                   (_SET_ECHO_SUPPRESS_ACTIVE, -15)):
                v = ctypes.c_int(value)
                lib.speex_preprocess_ctl(pre, request, ctypes.byref(v))
            lib.speex_preprocess_ctl(pre, _SET_ECHO_STATE, ctypes.c_void_p(state))
            self._residual = pre

    def process(self, mic: np.ndarray, reference: np.ndarray) -> LinearOut:
        if mic.size % FRAME or mic.size != reference.size:
            raise ValueError(f"{mic.size} microphone and {reference.size} reference samples: "
                             f"not the same whole {FRAME}-sample frames")
        near = np.ascontiguousarray(mic, dtype=np.int16)
        far = np.ascontiguousarray(reference, dtype=np.int16)
        out = np.empty_like(near)
        cancel, state = self._lib.speex_echo_cancellation, self._state
        a, b, c = near.ctypes.data, far.ctypes.data, out.ctypes.data
        residual = self._residual
        if residual is None:
            for i in range(0, 2 * near.size, 2 * FRAME):  # bytes
                cancel(state, a + i, b + i, c + i)
            return LinearOut(out, out)
        suppressed = np.empty_like(near)
        d, copy, suppress = suppressed.ctypes.data, ctypes.memmove, self._lib.speex_preprocess_run
        for i in range(0, 2 * near.size, 2 * FRAME):
            cancel(state, a + i, b + i, c + i)
            copy(d + i, c + i, 2 * FRAME)
            suppress(residual, d + i)  # in place, from the filter's state for this very frame
        return LinearOut(out, suppressed)

    def close(self) -> None:
        """Free the filter now rather than when this is collected."""
        if self._residual is not None:
            self._free_residual()
        self._free()


class WordsChooser:
    """Which canceller's output the ASR hears, frame by frame: the linear
    filter's where it has learned the room, AEC3's until then.

    ``erle_db`` tracks the median of the linear output's energy
    against the microphone's, over the frames where only the echo is there:
    the reference playing (``ACTIVE``) and AEC3's output at least
    ``ECHO_ONLY_DB`` under the microphone (a user speaking over the echo
    keeps AEC3's output near their level, so their frames never move it).
    Starting at 0 dB (nothing learned), it falls as the filter converges;
    under ``LEARNED_DB`` the ASR hears the linear filter, and AEC3's again
    only over ``LOST_DB`` (the filter no longer reaches the echo: the
    playback delay grew). The margin between them keeps a room where the
    filter takes out 4-8 dB (the large room in the room bench) from
    changing view back and forth within an utterance. Low, because even
    there the linear filter's output loses fewer words than AEC3's ducked
    one (bench/README.md, ``room_echo.py``). The filter is judged on its
    own output, before the residual echo suppressor: the suppressor turns
    down even an echo the filter does not reach, and the ASR would hear
    that rather than AEC3's. A change of view ramps over one frame: no
    click."""

    LEARNED_DB = -4.0
    LOST_DB = -2.0
    ECHO_ONLY_DB = -15.0
    ACTIVE = 1e4  # reference frames under this energy (-50 dBFS) are not playing
    UP_DB, DOWN_DB = 0.5, 0.5  # the quantile tracker's steps: the median

    _ECHO_ONLY = 10 ** (ECHO_ONLY_DB / 10)
    _RAMP = np.arange(1, FRAME + 1, dtype=np.float32) / FRAME  # a change of view over a frame

    def __init__(self) -> None:
        self.erle_db = 0.0
        self.linear = False  # the view of the last frame

    def choose(self, mic: np.ndarray, aec3: np.ndarray, linear: LinearOut,
               reference: np.ndarray) -> np.ndarray:
        """Whole 10 ms frames, all the same length: the ASR's view."""
        frames = np.stack((mic, aec3, linear.filtered, reference, linear.suppressed)).reshape(
            5, -1, FRAME).astype(np.float32)
        return self.on_frames(aec3, linear.suppressed, frames,
                              np.einsum("kij,kij->ki", frames, frames) / FRAME)

    def on_frames(self, aec3: np.ndarray, words: np.ndarray, frames: np.ndarray,
                  energy: np.ndarray) -> np.ndarray:
        """``choose`` given AEC3's output, the linear canceller's view for
        the ASR (``words``), and, as float frames (signals, frames, FRAME)
        and their frame energies (mean squares), the microphone, AEC3's
        output, the filter's own, the reference and ``words``."""
        n = frames.shape[1]
        # +1: a silent frame is -90 dBFS, not log(0)
        m, a, lin, r = energy[:4] + 1.0
        echo_only = (r > self.ACTIVE) & (a < m * self._ECHO_ONLY)
        views = np.full(n + 1, self.linear, np.float32)
        if echo_only.any():  # else nothing is learned: the view stays
            ratio_db = (10 * np.log10(lin / m)).tolist()
            for i, learn in enumerate(echo_only.tolist()):
                if learn:
                    step = self.UP_DB if ratio_db[i] > self.erle_db else -self.DOWN_DB
                    self.erle_db = min(10.0, max(-60.0, self.erle_db + step))
                    if self.erle_db < self.LEARNED_DB:
                        self.linear = True
                    elif self.erle_db > self.LOST_DB:
                        self.linear = False
                views[i + 1] = self.linear
        if views.min() == views.max():  # one view throughout
            return words if views[0] else aec3
        w = views[:-1, None] + (views[1:] - views[:-1])[:, None] * self._RAMP  # the linear's weight
        mixed = frames[4] * w + frames[1] * (1 - w)
        return np.round(mixed).astype(np.int16).reshape(-1)
