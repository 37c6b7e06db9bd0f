"""A residual echo suppressor band by band (after AEC3: ``media/echo.py``),
sans-I/O numpy: ``EchoCanceller(residual="bands")``. The room bench
(``bench/room_echo.py``) measures it beside the broadband one, which stays
the default: this one was not better there and costs over ten times its CPU.

AEC3's linear filter, as the ``livekit`` binding builds it, is short for a
reverberant room: 15-25 dB of the echo's tail remain, and Silero calls that
speech. Turning a whole 10 ms frame down where it could be echo also turns
down the user speaking over the reply, wherever the echo is as loud as
they are. Per band it need not: speech fills a few bands at a time, the
reply's echo others, and a band where the user stands over what the echo
can leave there passes.

Per 10 ms frame, on a 32 ms window ending with it, the band energies of
AEC3's output and of the reference (what the speaker played). The echo can
be at the microphone while the reference is loud or shortly after, so each
band's *envelope* is the reference's energy held ``HOLD_FRAMES`` (the delay
AEC3 allows for), then decaying ``DECAY_DB`` a frame (the room's tail). The
residual's path gain per band (AEC3's output over that envelope) is tracked
as a quantile over the frames that can be echo, starting high (as loud as
the reference: before the room is known, everything of it is echo), so the
user's voice, above the echo, never lifts it. A band's gain is the power
left after taking away the predicted residual (``OVER_DB`` over it: the
quantile is not the peak), floored at ``FLOOR_DB``; it rises at once (an
onset is not clipped) and falls at most ``RELEASE_DB`` a frame. What a band
loses is filled with comfort noise at the background's level (its floor,
tracked): a room turned to digital silence around a faint leak of the echo
would make that leak the loudest thing Silero hears.

The gains are applied by a minimum-phase FIR (``TAPS`` long, from the band
gains by the real cepstrum): no look-ahead, so no delay added to the
microphone. Between frames the filters cross-fade: no clicks. Where every
gain is 1 (no reference, or after the tail) the output is the input, bit
for bit.
"""

from __future__ import annotations

import numpy as np

from vllm_duplex.domain.payloads import INTERNAL_RATE

FRAME = INTERNAL_RATE // 100  # AEC3's step: 10 ms

WINDOW = 512  # 32 ms at 16 kHz: the analysis window (and the cepstrum's length)
BINS = WINDOW // 2 + 1
# band edges in bins of 31.25 Hz: narrow at the bottom (voicing), wider at the top
EDGES = np.array([1, 3, 5, 7, 9, 11, 13, 15, 18, 21, 24, 28, 32, 38, 44, 52, 60, 72,
                  84, 100, 116, 140, 170, 210, BINS])
BANDS = EDGES.size - 1
_HANN = np.hanning(WINDOW + 1)[:WINDOW].astype(np.float64)
_NORM = 2.0 / (WINDOW * float(np.sum(_HANN ** 2)))  # band energies in mean square per sample
_BAND_OF = np.zeros((BINS, BANDS))  # bins -> band energies
for _b in range(BANDS):
    _BAND_OF[EDGES[_b]:EDGES[_b + 1], _b] = 1.0
_CENTRES = (EDGES[:-1] + EDGES[1:] - 1) / 2.0
_INTERP = np.stack([np.interp(np.arange(BINS), _CENTRES, np.eye(BANDS)[b])
                    for b in range(BANDS)])  # band values -> bins, linear between centres
_FOLD = np.zeros(WINDOW)  # the real cepstrum folded onto its causal half: minimum phase
_FOLD[0] = _FOLD[WINDOW // 2] = 1.0
_FOLD[1:WINDOW // 2] = 2.0
_PER_BIN = (BINS - 1) / np.diff(EDGES)  # a band's power over its bins (white noise: 1/256 a bin)
_RAMP = (np.arange(1, FRAME + 1) / FRAME)[None, :]


class BandResidualSuppressor:
    """Whole 10 ms frames of AEC3's output and of the reference in, AEC3's
    output with the residual echo turned down band by band out."""

    HOLD_FRAMES = 20  # 200 ms: the reference leads its echo by up to this (device, air)
    DECAY_DB = 1.0  # then the tail: 60 dB in 0.6 s
    OVER_DB = 12.0  # the residual taken away: this over its tracked quantile
    FLOOR_DB = -40.0  # how far echo is turned down
    RELEASE_DB = 10.0  # a band's gain falls this much a frame; rises at once
    PATH_START_DB = 0.0  # before it has heard the room: the residual as loud as the reference
    PATH_UP_DB, PATH_DOWN_DB = 0.3, 0.1  # the path gain's quantile tracker (the 75th percentile)
    LEARN_DB = 0.0  # frames over the predicted residual by more than this are the user's
    LOUD = 1e5 / BANDS  # a band is learned from only where the reference held is over this
    ACTIVE = 1e3 / BANDS  # a band whose envelope is under this (-65 dBFS in all) has no echo
    TAPS = 128  # the gain filter's length (8 ms)
    NOISE_SMOOTHING = 0.1  # the floor is that of the band energies smoothed over ~100 ms
    NOISE_BIAS_DB = 6.0  # a floor lies under the mean: comfort noise this over it
    NOISE_RISE_DB = 0.01  # the background's floor follows a quieter frame at once, a louder 1 dB/s

    def __init__(self) -> None:
        self._past = np.zeros((3, WINDOW - FRAME))  # AEC3's output, the reference, the microphone
        self._recent = np.zeros((self.HOLD_FRAMES, BANDS))  # the reference's band energies
        self._at = 0
        self._tail = np.zeros(BANDS)
        self.path_db = np.full(BANDS, self.PATH_START_DB)  # AEC3's output over the envelope
        self.echo_db = np.full(BANDS, self.PATH_START_DB)  # the microphone's over the envelope
        self.gain = np.ones(BANDS)
        self._filter: tuple[np.ndarray, np.ndarray] | None = None  # the last frame's gain and
        # comfort noise filters; None: it passes as it is
        self.noise = np.full(BANDS, 1e12)  # the microphone's band energies' floor: the background
        self._noise_at = np.zeros((0, BANDS))
        self._mic: np.ndarray | None = None  # the microphone's band energies, smoothed
        self._rng = np.random.default_rng(0)
        self._noise_past = np.zeros(self.TAPS - 1)

    def process(self, pre: np.ndarray, post: np.ndarray, reference: np.ndarray) -> np.ndarray:
        """Whole 10 ms frames of the microphone before AEC3 (``pre``: the
        room's background), after it, and the reference: ``post`` with what
        is left of the echo turned down."""
        n = post.size // FRAME
        if n == 0:
            return post
        x = np.concatenate([self._past, np.stack([post[:n * FRAME], reference[:n * FRAME],
                                                  pre[:n * FRAME]]).astype(np.float64)], axis=1)
        self._past = x[:, -(WINDOW - FRAME):]
        step = x.strides[1]
        windows = np.lib.stride_tricks.as_strided(  # (3, n, WINDOW), each ending with a frame
            x, (3, n, WINDOW), (x.strides[0], FRAME * step, step), writeable=False)
        spectra = np.fft.rfft(windows * _HANN, axis=-1)
        energy = (spectra.real ** 2 + spectra.imag ** 2) @ _BAND_OF * _NORM  # (3, n, BANDS)
        gains = self._gains(*energy)
        return self._apply(x[0], gains, post[:n * FRAME])

    def _gains(self, out: np.ndarray, ref: np.ndarray, mic: np.ndarray) -> np.ndarray:
        """Per frame, per band: the amplitude gain (1 where nothing is echo)."""
        gains = np.empty_like(out)
        self._noise_at = np.empty_like(out)
        rise = 10 ** (self.NOISE_RISE_DB / 10)
        bias = 10 ** (self.NOISE_BIAS_DB / 10)
        decay = 10 ** (-self.DECAY_DB / 10)
        floor = 10 ** (self.FLOOR_DB / 10)
        release = 10 ** (-self.RELEASE_DB / 20)
        over = 10 ** (self.OVER_DB / 10)
        learn_over = 10 ** (self.LEARN_DB / 10)
        for i in range(out.shape[0]):
            self._recent[self._at] = ref[i]
            self._at = (self._at + 1) % self.HOLD_FRAMES
            held = self._recent.max(axis=0)
            self._tail = np.maximum(self._tail * decay, self._recent[self._at])  # the oldest leaves
            envelope = np.maximum(self._tail, held)
            # AEC3 takes echo away, never adds it: the residual is no louder than the echo
            residual = envelope * 10 ** (np.minimum(self.path_db, self.echo_db) / 10)
            power = np.clip(1.0 - over * residual / np.maximum(out[i], 1e-9), floor, 1.0)
            power[envelope < self.ACTIVE] = 1.0  # the reference's tail is over: exactly as it is
            self.gain = np.maximum(np.sqrt(power), self.gain * release)
            learn = (held > self.LOUD) & (out[i] <= residual * learn_over)
            if learn.any():
                self.path_db = _quantile_step(self.path_db, learn, out[i] > residual,
                                              self.PATH_UP_DB, self.PATH_DOWN_DB)
                self.echo_db = _quantile_step(self.echo_db, learn,
                                              mic[i] > envelope * 10 ** (self.echo_db / 10),
                                              self.PATH_UP_DB, self.PATH_DOWN_DB)
            self._mic = mic[i] if self._mic is None else (
                self._mic + (mic[i] - self._mic) * self.NOISE_SMOOTHING)
            self.noise = np.minimum(self.noise * rise, self._mic)
            self._noise_at[i] = self.noise * bias
            gains[i] = self.gain
        return gains

    def _apply(self, x: np.ndarray, gains: np.ndarray, post: np.ndarray) -> np.ndarray:
        """``x``: AEC3's output with ``WINDOW - FRAME`` samples of history
        before the frames; each frame through its gains' filter, cross-faded
        from the last frame's, and comfort noise where it was turned down."""
        n = gains.shape[0]
        identity = np.all(gains == 1.0, axis=1)
        if identity.all() and self._filter is None:
            return post
        comfort = np.sqrt(np.maximum(self._noise_at * (1.0 - gains ** 2), 1e-6) * _PER_BIN)
        filters, comfort = _minimum_phase(np.stack([gains, comfort]), self.TAPS)
        noise = np.concatenate([self._noise_past, self._rng.standard_normal(n * FRAME)])
        self._noise_past = noise[-(self.TAPS - 1):]
        out = post.astype(np.float64).reshape(n, FRAME)  # identity frames stay as they are
        start = x.size - n * FRAME
        for i in range(n):
            now = None if identity[i] else (filters[i], comfort[i])
            before, self._filter = self._filter, now
            if before is None and now is None:
                continue
            seg = x[start + i * FRAME - self.TAPS + 1:start + (i + 1) * FRAME]
            hiss = noise[i * FRAME:(i + 1) * FRAME + self.TAPS - 1]
            new = out[i] if now is None else (np.convolve(seg, now[0], "valid")
                                              + np.convolve(hiss, now[1], "valid"))
            old = out[i] if before is None else (np.convolve(seg, before[0], "valid")
                                                 + np.convolve(hiss, before[1], "valid"))
            out[i] = old + (new - old) * _RAMP[0]
        return np.clip(np.round(out.reshape(-1)), -32768, 32767).astype(np.int16)


def _quantile_step(db: np.ndarray, learn: np.ndarray, above: np.ndarray,
                   up: float, down: float) -> np.ndarray:
    """A quantile tracker's step (up / (up + down)): up where the frame was
    above the estimate, down where not, only where ``learn``."""
    return np.where(learn, np.where(above, db + up, db - down), db)


def _minimum_phase(gains: np.ndarray, taps: int) -> np.ndarray:
    """(..., BANDS) amplitude gains -> (..., taps) minimum-phase FIR filters
    whose response follows them (in dB, linear between band centres)."""
    cepstrum = np.fft.irfft(np.log(gains) @ _INTERP, WINDOW, axis=-1) * _FOLD
    return np.fft.irfft(np.exp(np.fft.rfft(cepstrum, axis=-1)), WINDOW, axis=-1)[..., :taps]
