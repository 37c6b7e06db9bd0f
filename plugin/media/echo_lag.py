"""How late the echo comes after the modelled playback, and the reference
held back to meet it, sans-I/O.

The reference (``session/echo.py``) is when the server says the client's
speaker played the reply; the echo reaches the microphone later by the
client's own buffers, its device and the air. The cancellers expect it
soon after: Speex's linear filter spans 250 ms, the residual echo
suppressor holds its prediction for 200 ms, and AEC3, which finds a delay
itself, did not find one of 500 ms in the room bench's medium room (4 dB
taken out of the echo after its first second, against 20 dB at 60 ms). A
client whose player holds more (a jitter buffer, a player that ran dry and
waits to refill, an event loop that reads the socket late) puts its echo
that late, and the reply's own voice reaches the VAD.

``EchoLag`` finds the lag where the echo first rises: after a reply starts
from silence (the reference silent longer than any echo and its room's
tail, then loud), the first two frames of the microphone 6 dB over its
floor (its loudest of the 200 ms before) are the echo of the reply's start.
Nothing earlier can be (the echo is not there yet), so the rise is never
past the lag unless the reply's start is too soft to hear. A correlation of
the frames' log-energy changes (microphone against the reference at every
lag up to a second) found the lag within 2 frames in most replies after a
second, but speech's syllables (some 4 a second) leave side peaks a
syllable either side of the echo's (true 7 -> 34 for a second, 31 ->
56-58), and a reference held back past its echo cancels nothing: here the
correlation only checks the rise, moving the lag earlier where, for a
second, it holds a lag well under the rise's much more strongly (the rise
came late: the reply began too softly to hear). No rise is watched over a
floor that is not steady (someone still speaking when the reply starts:
the echo would be heard first at a louder syllable, later than its lag).
Not handled: someone who starts speaking within a second of a reply's
start where its echo is too quiet to rise first (a far speaker; a headset
has no echo to misplace) gives a lag too long, which the correlation takes
back only after some two seconds.

``EchoAligner`` holds the reference back by that lag less ``LEAD_FRAMES``
(it must still lead its echo: the cancellers are causal) once the lag is
past ``FAR_FRAMES`` (400 ms) -- nearer, the reference goes on as it came,
the same array, so the cancellers' outputs are those of the code before,
bit for bit (the room bench's replies at 60 and 300 ms, -10 and 0 dB) --
and moves it only when the lag moved ``MOVE_FRAMES``. ``EchoCanceller``
starts AEC3 again when it moves: it has had the reference it now gets
again, locked onto the echo's match with that first copy, and lost the
echo when the copy ended (room bench, ``--corpus-voices``, at 500 / 700 ms
and 0 dB: 2 / 3 of 9 replies interrupted themselves, 0 / 1 with the
restart).

Measured (``bench/room_echo.py --lags``; 2-core AMD EPYC, AVX2, 24 GiB, load 2-3):
self-interruptions of 9 replies at -10 / 0 dB, the reference as it came ->
held back: 60 ms 0 / 0 -> 0 / 0 (identical outputs), 300 ms 0 / 2 -> 0 / 2
(identical), 500 ms 5 / 5 -> 0 / 3, 700 ms 9 / 9 -> 0 / 2 (left: the large
room at 0 dB, which interrupts itself at 300 ms too); in the corpus' voices
60 ms 1 / 1, 300 ms 2 / 1 (identical), 500 ms 6 / 6 -> 0 / 0, 700 ms 9 / 9
-> 0 / 1. The aligner's
CPU, 20 ms chunks: 0.06 % of a core where the echo is near (the rise
alone), 0.15-0.17 % where it is held back (the correlation), against 2.5-2.9
% for the whole canceller.
"""

from __future__ import annotations

import math

import numpy as np

from vllm_duplex.domain.payloads import INTERNAL_RATE

FRAME = INTERNAL_RATE // 100  # 10 ms
MAX_LAG_FRAMES = 100  # 1 s: AEC3's reach
HELD = MAX_LAG_FRAMES * FRAME  # the reference held: a second
ACTIVE = 1e3  # reference energy under this (-65 dBFS) is silence
# A reply starts where it is loud (-40 dBFS): recordings and synthesis lead in
# with their own noise at -60 dBFS or so, and its echo is under the room's.
LOUD = 1e5
# A reply starts from silence once the reference was silent this long: longer
# than the farthest echo and its room's tail, which would lift the floor.
QUIET_FRAMES = MAX_LAG_FRAMES + 30
FLOOR_FRAMES = 20  # the microphone's floor: its loudest of the last 200 ms of silence
RISE = 4.0  # 6 dB over that floor, two frames running: the echo has come
STEADY = 10.0  # a floor whose loudest frame is 10 dB over its quietest is someone speaking
SLACK_FRAMES = 3  # the correlation's lag may be this much past the echo's first rise
LEARNED_FRAMES = 100  # a second of the reply heard before the correlation may move the lag
STEADY_FRAMES = 100  # ... and its best lag within FLICKER_FRAMES of one place this long
FLICKER_FRAMES = 2
STRONGER = 1.5  # and its peak this much over the correlation at the rise
RATE = 0.005  # the average's weight of each new frame, in the end (a time constant of 2 s)


class EchoLag:
    """Feed frame energies (mean squares) of the microphone and the
    reference, frame by frame; ``lag`` is the echo's delay in frames. The
    correlation, which only ever moves the lag earlier, is kept only while
    the echo's rise is awaited or was past ``far`` frames (``EchoAligner``:
    nearer, nothing is held back, and that is most sessions: they pay for
    little more than the rise)."""

    def __init__(self, far: int = 0) -> None:
        self._far = far
        # the reference's log-energy changes, twice over (a ring read newest first, no copies)
        self._change = np.zeros(2 * MAX_LAG_FRAMES)
        self._at = 0
        self._ref_level = self._mic_level = 0.0
        self._since_loud = MAX_LAG_FRAMES  # frames since the reference last played
        self._quiet = QUIET_FRAMES  # frames the reference has been silent (as if long before)
        self._armed = True
        self._floor: list[float] = []  # the microphone's last energies in that silence
        self._watch = -1  # frames since the reply started from silence, while its echo is awaited
        self._floor_at = 0.0
        self._rising = 0
        self.first = -1  # the echo's first rise after the last reply's start (frames); -1: none
        self._corr = np.zeros(MAX_LAG_FRAMES)
        self._learned = 0
        self._anchor, self._steady = -1, 0
        self.lag = 0

    def update(self, mic: float, reference: float) -> int:
        """One frame; returns ``lag``."""
        self._onset(mic, reference)
        level = math.log10(reference + 1.0)
        at = self._at = (self._at - 1) % MAX_LAG_FRAMES
        self._change[at] = self._change[at + MAX_LAG_FRAMES] = level - self._ref_level
        self._ref_level = level
        level = math.log10(mic + 1.0)
        change, self._mic_level = level - self._mic_level, level
        self._since_loud = 0 if reference > ACTIVE else self._since_loud + 1
        if self._since_loud >= MAX_LAG_FRAMES:
            return self.lag  # nothing played within reach: nothing to learn
        if self._watch < 0 and self.first <= self._far:
            return self.lag  # the echo is near: no need
        self._learned += 1
        rate = max(RATE, 1.0 / self._learned)  # the mean of all, until that is the window's
        corr = self._corr
        corr *= 1.0 - rate
        corr += (rate * change) * self._change[at:at + MAX_LAG_FRAMES]
        if self._learned < LEARNED_FRAMES:
            return self.lag
        # The echo's first rise is the lag, unless the correlation holds, for
        # a second, a lag well under it that is clearly stronger than the
        # rise's (the rise came late: the reply began too softly to hear).
        # Never later than the rise: speech's syllables (some 4 a second)
        # leave side peaks a syllable either side of the echo's, and a
        # reference held back past its echo cancels nothing.
        near = corr[max(0, self.first - FLICKER_FRAMES):self.first + FLICKER_FRAMES + 1].max()
        best = int(np.argmax(corr[:self.first + SLACK_FRAMES + 1]))
        if best >= self.first - FLICKER_FRAMES or corr[best] < STRONGER * near:
            best = self.first
        if abs(best - self._anchor) <= FLICKER_FRAMES:
            self._steady += 1
        else:
            self._anchor, self._steady = best, 0
        if self._steady >= STEADY_FRAMES:
            self.lag = self._anchor
        return self.lag

    def _onset(self, mic: float, reference: float) -> None:
        """The echo's first rise over the microphone's floor after a reply
        starts from silence: the echo cannot be earlier than its lag, nor,
        if the reply is loud enough to hear, much later."""
        self._floor.append(mic)
        del self._floor[:-FLOOR_FRAMES]
        if reference <= ACTIVE:
            self._quiet += 1
            if self._quiet >= QUIET_FRAMES:
                self._armed = True  # the next loud frame starts a reply from silence
        else:
            self._quiet = 0
        if self._armed and reference > LOUD:  # a reply from silence: await its echo
            self._armed = False
            floor = self._floor[:-1] or [0.0]
            # ... over a steady floor: over someone still speaking, the echo
            # would be heard first at a louder syllable, later than its lag.
            if max(floor) <= STEADY * min(floor) + ACTIVE:
                self._watch, self._rising = 0, 0
                self._floor_at = RISE * max(floor)
        if self._watch < 0:
            return
        if mic > self._floor_at:
            self._rising += 1
            if self._rising == 2:
                self.first = self.lag = self._watch - 1
                self._anchor, self._steady = self.first, 0
                self._watch = -1
                return
        else:
            self._rising = 0
        self._watch += 1
        if self._watch > MAX_LAG_FRAMES + 1:
            self._watch = -1  # no echo heard (a headset, a quiet room): the lag stays


class EchoAligner:
    """Whole 10 ms frames of the microphone and the reference in; the
    reference held back ``shift`` frames out (the same length)."""

    FAR_FRAMES = 40  # lags up to 400 ms: the cancellers' own reach
    # Held back, it still leads its echo by 50 ms: the rise can be a frame
    # or two past the lag. 70 ms (the lead at the 60 ms the cancellers were
    # tuned at) did no better: 8 self-interruptions of 72 at 500 and 700 ms
    # against 6, other replies each time (AEC3's convergence decides them).
    LEAD_FRAMES = 5
    MOVE_FRAMES = 3

    def __init__(self) -> None:
        self.estimate = EchoLag(far=self.FAR_FRAMES)
        # The reference's last second, and room for two more before it is
        # moved back to the front: no copy of a second per chunk.
        self._held = np.zeros(3 * HELD, np.int16)
        self._end = HELD
        self.shift = 0

    def align(self, mic: np.ndarray, reference: np.ndarray) -> np.ndarray:
        frames = np.concatenate((mic, reference)).astype(np.float32).reshape(-1, FRAME)
        energy = (np.einsum("ij,ij->i", frames, frames) / FRAME).tolist()  # mean squares
        update, n = self.estimate.update, len(energy) // 2
        for m, r in zip(energy[:n], energy[n:]):
            update(m, r)
        lag = self.estimate.lag
        if lag > self.FAR_FRAMES or self.shift:
            target = max(0, lag - self.LEAD_FRAMES) if lag > self.FAR_FRAMES else 0
            if abs(target - self.shift) >= self.MOVE_FRAMES or not target:
                self.shift = target
        n, held, end = reference.size, self._held, self._end
        if end + n > held.size:  # full: its last second to the front
            last = held[end - HELD:end].copy()
            if HELD + n > held.size:  # a chunk longer than two seconds
                held = self._held = np.zeros(3 * HELD + n, np.int16)
            held[:HELD], end = last, HELD
        held[end:end + n] = reference
        self._end = end = end + n
        if not self.shift:
            return reference  # the cancellers take it as it is, as they were tuned
        end -= self.shift * FRAME
        return held[end - n:end].copy()
