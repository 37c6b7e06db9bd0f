"""A signal's steady noise from its frame energies, sans-I/O: what the
residual echo suppressor (``media/echo.py``) takes off the microphone's and
the cancellers' outputs before judging them, so a loud hum or engine under
everything is not someone speaking over the echo."""

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
        self._off = frames <= 0
        self.floor = 0.0  # none until a block is whole

    def over(self, energy: float, learn: bool) -> float:
        """``energy`` less the floor, never under 0; ``learn``: no echo can be
        in it (``frames`` 0: no floor)."""
        if self._off:
            return energy
        if learn:
            self._sum += energy
            self._n += 1
            if self._n == self.BLOCK:
                self._blocks.append(self._sum / self.BLOCK)
                self._sum, self._n = 0.0, 0
                self.floor = min(self._blocks)
        return max(0.0, energy - self.floor)
