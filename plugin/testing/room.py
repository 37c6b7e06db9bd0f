"""A speaker and a microphone in one room, for the echo canceller's tests and
bench (``audio.input.echo_cancellation``).

A raw-socket client that plays the reply on a speaker and streams its
microphone: ``Room.play`` puts the reply's audio on the speaker as it
arrives (it plays at real time after what the speaker holds, as an OpenAI
client plays), ``Room.stop`` stops it (the client truncates), and
``Room.mic`` is what the microphone hears over any stretch of the client's
clock: the speaker through the room (an impulse response: a delay, a level,
a reverberant tail), the user's own voice, the room's noise. Everything is
on the client's clock in samples at ``rate``, so a test may drive it at
real time (through a socket) or at once.

``impulse_response`` is a simple room (a direct path and an exponentially
decaying diffuse tail); the bench builds image-method rooms with
pyroomacoustics and passes their response instead.
"""

from __future__ import annotations

import numpy as np


def impulse_response(rate: int, *, delay_ms: float = 120.0, gain_db: float = -10.0,
                     tail_ms: float = 150.0, seed: int = 0) -> np.ndarray:
    """A speaker ``delay_ms`` away (the device's own output and input
    latency included) at ``gain_db`` (the direct path), then a diffuse tail
    10 dB under it decaying by 60 dB over ``tail_ms``."""
    rng = np.random.default_rng(seed)
    delay = int(rate * delay_ms / 1000)
    tail = max(1, int(rate * tail_ms / 1000))
    ir = np.zeros(delay + tail, np.float64)
    ir[delay] = 1.0
    decay = np.exp(-np.arange(tail) * (6.9 / tail))  # -60 dB at tail_ms
    diffuse = rng.standard_normal(tail) * decay
    diffuse *= 10 ** (-10 / 20) / np.sqrt(np.sum(diffuse ** 2))
    ir[delay:] += diffuse
    return ir * 10 ** (gain_db / 20)


class Room:
    """The client's speaker and microphone, ``seconds`` long at most."""

    def __init__(self, ir: np.ndarray, rate: int, *, seconds: float = 180.0,
                 noise: np.ndarray | None = None) -> None:
        self.ir = np.asarray(ir, np.float64)
        self.rate = rate
        self.played = np.zeros(int(seconds * rate), np.float64)  # what the speaker played, when
        self.play_end = 0  # sample where the speaker runs dry
        self._noise = noise  # looped under everything

    def play(self, pcm: np.ndarray, at: int) -> int:
        """``pcm`` arrived at sample ``at``: it plays after what the speaker
        holds. Returns where it starts."""
        start = max(at, self.play_end)
        end = min(self.played.size, start + pcm.size)
        self.played[start:end] = pcm[:end - start]
        self.play_end = max(self.play_end, end)
        return start

    def stop(self, at: int) -> None:
        """The client stops its playback at sample ``at`` (drops what it held)."""
        self.played[at:] = 0.0
        self.play_end = min(self.play_end, at)

    def echo(self, start: int, n: int) -> np.ndarray:
        """What the microphone hears of the speaker over ``[start, start+n)``."""
        taps = self.ir.size
        lo = start - taps + 1
        seg = self.played[max(0, lo):start + n]
        if lo < 0:
            seg = np.concatenate([np.zeros(-lo), seg])
        size = 1 << int(seg.size + taps - 1).bit_length()
        full = np.fft.irfft(np.fft.rfft(seg, size) * np.fft.rfft(self.ir, size), size)
        return full[taps - 1:taps - 1 + n]  # the "valid" part: every sample heard its whole tail

    def mic(self, start: int, n: int, voice: np.ndarray | None = None) -> np.ndarray:
        """The microphone over ``[start, start+n)``: the echo, the user's
        ``voice`` (the same stretch of it, or None) and the room's noise, int16."""
        out = self.echo(start, n)
        if voice is not None:
            out = out + voice[:n]
        if self._noise is not None and self._noise.size:
            idx = (np.arange(start, start + n)) % self._noise.size
            out = out + self._noise[idx]
        return np.clip(np.round(out), -32768, 32767).astype(np.int16)
