"""A signal's steady noise from its frame energies, sans-I/O: what the
residual echo suppressor (``media/echo_gate.py``) takes off the microphone's and
both cancellers' outputs before judging them.

A steady noise under everything -- mains hum, an engine, a fridge -- is in
the microphone and in both outputs, and no canceller takes it out (the reply
never played it). Loud, it stood over the echo the suppressor's rules allow,
every frame was someone speaking, and Silero heard the residual echo riding
on it (bench/noise_turns.py, live: a reply over a -25 dBFS hum cut itself
off, and once the assistant answered its own echo; offline, 12 of 20 replies
over such a hum, 5 of 20 at -35 dBFS). So each signal's floor, learned where
the reference is silent (no echo can be in it), comes off its energies
before any rule; and where the gate held the noise back through a reply, it
lets it back ``ResidualEchoSuppressor.RETURN_DB`` a frame once the reply's
echo is gone, not at once (a hum let in at once after a second of silence
was a voice to Silero), and at once where the microphone stands 3 dB over
its floor (someone speaking). Over a -25 dBFS hum 12 -> 0 of 20 replies cut
in (-35 dBFS 5 -> 1); over a quiet room's noise nothing changes
(bench/vad_onset_echo.py, room_echo.py --replay, recorded live replies)."""

from __future__ import annotations

from collections import deque


class NoiseFloor:
    """A signal's steady noise, from its frame energies where no echo can be
    (the reference silent past its room's tail: before a reply, between
    replies): the quietest mean of a block of ``BLOCK`` frames (100 ms) among
    the last ``frames`` such frames (minimum statistics: a user speaking
    there pauses between words, a noise does not). Blocks, not frames:
    single frames of a noise dip under its level now and then."""

    BLOCK = 10

    def __init__(self, frames: int) -> None:
        self._blocks: deque[float] = deque(maxlen=max(1, frames // self.BLOCK))
        self._sum = 0.0  # the current block's energy so far
        self._n = 0
        self.floor = 0.0  # none until a block is whole

    def over(self, energy: float, learn: bool) -> float:
        """``energy`` less the floor, never under 0; ``learn``: no echo can be
        in it."""
        if learn:
            self._sum += energy
            self._n += 1
            if self._n == self.BLOCK:
                self._blocks.append(self._sum / self.BLOCK)
                self._sum, self._n = 0.0, 0
                self.floor = min(self._blocks)
        return max(0.0, energy - self.floor)
