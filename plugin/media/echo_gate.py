"""The VAD's view after echo cancellation: what the cancellers leave of
the echo, turned down frame by frame, so that Silero hears the user and not
the reply (``ResidualEchoSuppressor``, the product's; ``LinearResidualSuppressor``
on the linear filter's output, measured beside it). Sans-I/O, one per
session input (``media/echo.py``'s ``EchoCanceller`` runs it)."""

from __future__ import annotations

import math

import numpy as np

from vllm_duplex.media.echo_linear import FRAME
from vllm_duplex.media.noise_floor import NoiseFloor

_RAMP = np.arange(1, FRAME + 1, dtype=np.float32) / FRAME  # a gain's change over a frame


def frame_energies(frames: np.ndarray) -> np.ndarray:
    """Each frame's mean square: ``frames`` (signals, frames, FRAME) float32."""
    return np.einsum("kij,kij->ki", frames, frames) / FRAME


class ResidualEchoSuppressor:
    """The "non-linear processor" after AEC3: turns down what is left of
    the echo, frame by frame, where AEC3's linear filter was too short for
    the room (its reverberation: 15-25 dB remain in a room with RT60 0.45 s
    and more, and Silero calls that speech).

    Per 10 ms frame it knows the microphone before AEC3 (``pre``), after it
    (``post``) and the reference. The echo can be at the microphone while the
    reference is loud or shortly after: ``envelope`` is the reference's energy
    held for ``HOLD_FRAMES`` (the delay AEC3 allows for) and then decaying by
    ``DECAY_DB`` a frame (the room's tail). The echo path's gain (``path_db``:
    the microphone before AEC3 against that envelope) is tracked as the 75th
    percentile of pre / envelope over the frames judged echo, starting high
    (as loud as the reference), so the user's voice never lifts it. A frame
    whose ``post`` is under the echo that can be there (envelope x path gain,
    ``MARGIN_DB`` over it) is echo: its gain falls to ``FLOOR_DB`` within a
    few frames; a frame over it (the user, louder than what is left of the
    echo could be) opens the gain at once, so an onset is not clipped. In a
    pause of the reply (the envelope in its tail) that prediction is short of
    a large room's reverberation, which keeps ringing from all the reply
    before the pause, and AEC3 passes most of it: there a frame is the user
    only if the microphone is also louder than the loudest echo it heard
    lately (``heard_echo``: frames judged echo and no more than
    ``HEARD_OVER_DB`` over the echo that can be, so the user's voice hardly
    lifts it; decaying ``HEARD_DECAY_DB`` a frame) -- a room in a pause only
    decays, so what rises over its ring is someone new. With no reference, or
    after the tail, the gain is 1: nothing changes without echo. Broadband,
    not per band: the user's voice passes where it is some 9 dB over the
    echo; where it is not (the echo at 0 dB and over in
    ``bench/room_echo.py``) the words over the echo are turned down with it
    -- which is why only the VAD hears its output (``Cancelled``). About a
    quarter of AEC3's CPU.

    What is left of the echo is judged on the lower of ``post`` and the linear
    canceller's output (Speex's filter and its residual echo suppressor,
    ``media/echo_linear.py``) where there is one: AEC3 now and then stops
    taking the echo out for some tens of milliseconds, its output suddenly as
    loud as the microphone while the microphone has not risen (its own
    double-talk detector fooled by a large room's tail, the room bench's large
    room 2-3 s into a first reply), and the linear canceller, which has no
    such detector, still takes the echo down there. A voice over the echo is
    in both, and AEC3 ducks it more than the linear canceller's band-by-band
    suppressor does, so the lower is mostly AEC3's wherever someone speaks;
    where the linear canceller's is lower, the echo AEC3 let through no
    longer helps an onset over (room bench: 0 / 0 / 1 / 5 self-interruptions
    of 60 replies at -20 / -10 / 0 / +6 dB against 1 / 3 / 4 / 8; the
    onsets over a -10 dB echo the same, some at 0 dB a Silero window
    later).

    Against the whole echo, a voice AEC3 ducks (10-16 dB in its first
    hundreds of ms of double talk) passes late or not at all. So, with the
    linear canceller beside it, a frame is also someone speaking where *both*
    outputs stand ``BOTH_OVER_DB`` over what each canceller leaves of the
    echo (``left_db``: tracked on the frames judged echo, as ``path_db``):
    the two fail apart (AEC3 letting go, the filter losing the room when the
    echo's delay moves), a voice raises both. And what passes the gate is the
    linear canceller's output once it takes ``LINEAR_VIEW_DB`` out of the
    echo (``path_db - left_db``): it keeps the voice as it was said, where
    Silero decides later on AEC3's; before that, and whenever its residual
    rises again, AEC3's. Measured on bench/vad_onset_echo.py and
    room_echo.py --replay (bench/README.md).

    Until a canceller has the room, what it leaves is now and then the whole
    echo: early in a session (nothing learned yet; in a large room at 0 dB
    Speex's 250 ms filter is short of the 0.7 s tail and AEC3 lets go for
    hundreds of ms at a time) its output stands as near the echo as a voice
    would, and either rule above passed it (bench/echo_live.py, the large
    room at 0 dB: 10 of 12 replies heard speech in themselves). So while
    neither canceller takes ``HAS_ROOM_DB`` out of the echo (``path_db -
    left_db``, the 75th percentiles), a frame is someone speaking only where
    one output also stands ``OVER_LEFT_DB`` over the most its canceller
    leaves (``left_high_db``: the 95th percentile, tracked on the same
    frames, never counted over the whole echo). Once one has the room this
    changes nothing (2 s into a first reply, bench/vad_onset_echo.py: 86 of
    160 onsets over a -10 dB echo heard within 130 ms, as before; 33 over
    a 0 dB echo, before 35); the cost is in a session's first second or
    two (a second into it 69, before 73).

    Late in a long reply in a large room both cancellers let go at once:
    after words louder than those that follow, the room rings on past what
    either filter spans, and for a hundred milliseconds or so both outputs
    stand within a few dB of the microphone -- far over what each usually
    leaves -- while the reference still plays, so it is no pause; both rules
    above passed them (bench/echo_live.py, the large room at 0 dB: 3 of 12
    replies heard speech in their last words; their recorded streams,
    replayed, 3 of 11 -> 0 now). So where both outputs are within
    ``LET_GO_DB`` of the microphone, a frame is someone speaking only if the
    microphone is also louder than the echo it heard lately (``heard_echo``,
    the pause's rule; a frame judged echo counts up to ``HEARD_OVER_DB`` over
    the echo that can be there, as the ring stands over that prediction). A
    voice the cancellers keep stands well clear of the microphone's echo, so
    onsets hardly move
    (bench/vad_onset_echo.py, 160 onsets within 130 ms: over a -10 dB echo 86
    as before, a second into the reply 69 as before, over a 0 dB echo 33 as
    before, the large room at -10 dB 59 against 61; room_echo.py --replay:
    replies cutting in at +6 dB 2 -> 0 of 60, one onset of 39 over -10 dB
    lost).

    Where no echo reaches the microphone (a headset; a speaker far off or
    turned low) a voice has nothing to stand over, but the path kept its
    start (a quiet frame teaches it nothing: stepping it down a frame let a
    loud hum's ripple through after a reply), and AEC3, with a reference
    playing and no echo heard, ducks the voice 40 dB and more. So the path
    is bounded at once where the microphone stayed quiet through a whole
    hold after a loud frame of the reply (that frame's echo has come, and
    was quieter); and where the echo it predicts is within ``UNHEARD_DB`` of
    ``QUIET`` (-50 dBFS), a frame where the linear canceller's output stands
    ``UNHEARD_DB`` over ``QUIET`` (and over its noise) is someone speaking,
    and what passes is that output (bench/vad_onset_echo.py, 80 onsets
    within 130 ms (never heard), the code before -> now: a headset 2 s into
    the reply 2 (51) -> 54 (0), 0.6 s into it 0 (59) -> 53 (2); the small
    room with its echo at -40 dB 8 (43) -> 56 (0), at -30 dB 42 (4) -> 50
    (1); at -20 dB and the medium room at -10 and 0 dB as before;
    room_echo.py --replay: no self-interruption in 60 replies a level
    either way, one onset in a pause at 0 dB of 37 lost).

    Every rule weighs what the echo and the user add to a steady noise: each
    signal's noise floor comes off its energies first, and a noise the gate
    held back through a reply comes back gradually (``media/noise_floor.py``
    says why)."""

    HOLD_FRAMES = 20  # 200 ms: the reference leads its echo by up to this (device, air)
    DECAY_DB = 1.0  # then the tail: 60 dB in 0.6 s
    MARGIN_DB = -4.0  # post over envelope x path gain by this: not echo
    # How far echo is turned down: under any room's background, to silence.
    # Silero hears speech in a residual turned down 30 dB (a -35 dBFS echo at
    # -65 dBFS is still the reply's voice to it); the ASR never hears this
    # output, so nothing of the user's is lost by going deeper (room bench,
    # replies 0-9: self-interruptions at 0 / +6 dB 3 / 5 of 10 at -30 dB, 1 / 1
    # at -80 dB).
    FLOOR_DB = -80.0
    RELEASE_DB = 10.0  # the gain falls this much a frame; rises at once
    # The room's ring in a pause: 60 dB in 1.2 s, slower than the rooms' own
    # decay (RT60 up to 0.7 s in the room bench), since the quieter reply in
    # the pause keeps feeding it. Chosen on replies 0-9 in every room (0.7 dB:
    # more self-interruptions; slower: later onsets in a pause).
    HEARD_DECAY_DB = 0.5
    HEARD_OVER_DB = 2.0  # the echo heard: at most this over the echo that can be there
    PATH_START_DB = 0.0  # before it has heard the room: the echo as loud as the reference
    PATH_UP_DB, PATH_DOWN_DB = 0.6, 0.2  # the path gain's quantile tracker (the 75th percentile)
    # From that start the trackers of what each canceller leaves took 1-1.5 s
    # of a first reply to come down to the room at 0.2 dB a frame, and till
    # then a voice had to stand over an echo as loud as the reply. So their
    # steps are FAST_START times larger at first, back to 1 over the first
    # FAST_FRAMES frames learned, while the echo the path predicts stands
    # FAST_CLEAR_DB over the microphone's steady noise (over a -35 dBFS hum
    # or fan, fast steps near the noise let the path fall under the echo: 3
    # -> 4 and 6 -> 7 of 20 replies heard speech at 10 dB, as before at 20).
    # Chosen on bench/vad_onset_echo.py 0.6-1.4 s into a first reply and
    # room_echo.py --replay: x4 (x8, or only the step down, cut in on the
    # reply's own echo). A quiet hold's bound ends it: no echo to speak of, a
    # voice's frames are all it would learn from. Not the path itself: its
    # envelope holds each word 200 ms, so a word's fading tail teaches it
    # low, and fast steps over a first reply's first words and their tails
    # took the path 9 dB under the room's (a 0 dB echo learned at -9 dB);
    # the louder words that followed, both cancellers not yet holding them,
    # stood that far over it (bench/echo_live.py at 0 dB: 1 of 40 recorded
    # replies cut in; one other, of 120, is now cut in 0.7 s in where it was
    # 2.3 s; the onsets the fast start won are the same with the path slow).
    FAST_START, FAST_FRAMES, FAST_CLEAR_DB = 4.0, 100, 20.0
    # AEC3's view: a quiet frame teaches the path nothing (a step down a frame let a
    # hum's ripple through after a reply), a quiet hold's worth bounds it at once
    LEARN_FROM_QUIET = False
    # With the linear canceller beside AEC3: each one's output over what it
    # leaves of the echo (tracked as ``path_db`` is) by this, both at once,
    # is someone speaking; and once the linear canceller takes this much of
    # the echo out, what passes is its output, not AEC3's (chosen on
    # bench/vad_onset_echo.py's onsets, checked on room_echo.py --replay).
    BOTH_OVER_DB = 10.0
    # ... and each output this far over its own steady noise: a canceller
    # that takes the echo down to the room's noise leaves a "left" tracked at
    # that noise's ripple, and the ripple alone stood BOTH_OVER_DB over it
    # where the other canceller let go (bench/echo_live.py at 0 dB, recorded:
    # AEC3 at the noise, Speex's filter losing the room, 1 of 40 replies cut
    # in); a voice lifts both far over their noise.
    BOTH_OVER_NOISE_DB = 6.0
    LINEAR_VIEW_DB = 12.0
    # Until one canceller takes this much out of the echo (75th percentiles),
    # an output must stand this far over the most its canceller leaves (the
    # 95th percentile of it, ``LEFT_HIGH_UP_DB / (up + down)``) as well
    # (chosen on bench/echo_live.py's recorded large room at 0 dB and
    # bench/vad_onset_echo.py's onsets 1 and 2 s into a first reply: 20 dB
    # kept 0 of 12 replies' cut-ins against 1, and lost 2 more onsets over a
    # -10 dB echo; 3 dB over, not 6, kept fewer out. The tracker's steps are
    # large so that it learns within a second: with 1.9 / 0.1 dB, 60 of 160
    # onsets a second into the reply within 130 ms, now 69, the code before 73).
    HAS_ROOM_DB = 15.0
    OVER_LEFT_DB = 6.0
    LEFT_HIGH_UP_DB, LEFT_HIGH_DOWN_DB = 3.8, 0.2
    # Both outputs within this of the microphone: both cancellers let go of the
    # echo (chosen on bench/echo_live.py's recorded large room at 0 dB: 3 dB
    # kept 1 of its 3 cut-ins out, 6 dB 2, and 6 dB with HEARD_OVER_DB all 3;
    # later a ring with AEC3 9 dB and Speex's filter 5 dB under the microphone
    # cut in: 10 dB, no onset of bench/vad_onset_echo.py's lost).
    LET_GO_DB = 10.0
    # Where the echo the path predicts is within this of QUIET, the linear
    # canceller's output this far over QUIET is someone speaking (and heard).
    UNHEARD_DB = 6.0
    # Each signal's steady noise: over the last this many frames where no echo can be.
    NOISE_FLOOR_FRAMES = 150
    # After a reply the gain comes back this much a frame (-80 dB to 0 in 1.6 s):
    # a hum let in at once, or at 1-4 dB a frame, was a voice to Silero.
    RETURN_DB = 0.5
    ACTIVE = 1e3  # reference energy under this (-65 dBFS) is silence
    QUIET = 1e4  # microphone frames under this (-50 dBFS) are not used to learn the path,
    LOUD = 1e5  # nor frames without a reference over this (-40 dBFS) in the hold

    def __init__(self) -> None:
        self._recent: list[float] = [0.0] * self.HOLD_FRAMES  # the reference's frame energies
        self._at = 0
        self._tail = 0.0  # the envelope after the hold
        self.path_db = self.PATH_START_DB
        # what AEC3 and the linear canceller leave of the echo, over the envelope
        self.left_db = [self.PATH_START_DB, self.PATH_START_DB]
        self.left_high_db = [self.PATH_START_DB, self.PATH_START_DB]  # ... at most, lately
        self.heard_echo = 0.0  # the microphone's loudest echo lately (energy), decaying
        self._quiet_run = 0  # frames the microphone has been under QUIET, in a row
        self._learned = 0  # frames learned from (the fast start's count)
        self.gain = 1.0
        # the microphone's, AEC3's and the linear canceller's steady noise
        self._floors = [NoiseFloor(self.NOISE_FLOOR_FRAMES) for _ in range(3)]

    def process(self, pre: np.ndarray, post: np.ndarray, reference: np.ndarray,
                linear: np.ndarray | None = None) -> np.ndarray:
        """Whole 10 ms frames: ``post`` with the echo left in it turned down;
        ``linear``: the linear canceller's output for the same frames, where
        there is one (judged beside AEC3's, and heard once it has the room)."""
        n = post.size // FRAME
        if n == 0:
            return post
        signals = (pre, post, reference) if linear is None else (pre, post, reference, linear)
        frames = np.stack([x[:n * FRAME] for x in signals]).reshape(
            len(signals), n, FRAME).astype(np.float32)
        energy = frame_energies(frames)
        beside = None if linear is None else (frames[3], energy[3])
        return self.on_frames(post[:n * FRAME], frames[1], energy[0], energy[1], energy[2],
                              beside)

    def on_frames(self, post: np.ndarray, post_frames: np.ndarray, pre_energy: np.ndarray,
                  post_energy: np.ndarray, reference_energy: np.ndarray,
                  linear: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """``process`` given ``post`` as float frames, the frame energies of
        the microphone, of ``post`` and of the reference, and ``linear``'s
        frames and energies (``EchoCanceller`` has them already)."""
        n = post_frames.shape[0]
        beside = linear is not None
        outputs = post_energy if linear is None else linear[1]
        energy = (pre_energy, reference_energy, post_energy, outputs)
        gains = np.empty(n + 1, np.float32)
        gains[0] = self.gain
        heard_linear = np.zeros(n, bool)
        decay = 10 ** (-self.DECAY_DB / 10)
        floor = 10 ** (self.FLOOR_DB / 20)
        release = 10 ** (-self.RELEASE_DB / 20)
        ringing = 10 ** (-self.HEARD_DECAY_DB / 10)
        both_over = 10 ** (self.BOTH_OVER_DB / 10)
        over_noise = 10 ** (self.BOTH_OVER_NOISE_DB / 10) - 1  # less the floor taken off
        has_room = self.HAS_ROOM_DB
        over_left = 10 ** (self.OVER_LEFT_DB / 10)
        let_go = 10 ** (-self.LET_GO_DB / 10)
        heard_over = 10 ** (self.HEARD_OVER_DB / 10)
        back = 10 ** (self.RETURN_DB / 20)
        unheard_at = self.QUIET * 10 ** (self.UNHEARD_DB / 10)
        fast_clear = 10 ** (self.FAST_CLEAR_DB / 10)
        mic, aec3, linear_out = self._floors
        for i, (p, r, a, s) in enumerate(zip(*(x.tolist() for x in energy))):
            self._recent[self._at] = r
            self._at = (self._at + 1) % self.HOLD_FRAMES
            self._tail = max(self._tail * decay, self._recent[self._at])  # the oldest held leaves
            held = max(self._recent)
            envelope = max(self._tail, held)
            # Each over its own steady noise, learned where no echo can be: what
            # the echo and the user add to it; ``e``: the lower of the two outputs.
            quiet = envelope < self.ACTIVE
            p, a = mic.over(p, quiet), aec3.over(a, quiet)
            self._quiet_run = self._quiet_run + 1 if p <= self.QUIET else 0
            oldest = self._recent[self._at]
            if self._quiet_run >= self.HOLD_FRAMES and oldest > self.LOUD:
                # The echo of the oldest frame held has come (the hold is the
                # longest it takes), and the microphone stayed quiet all the
                # while: the path is no louder than that (a headset's, 200 ms
                # into the reply's first loud words).
                self.path_db = min(self.path_db, 10 * math.log10(self.QUIET / oldest))
                self._learned = max(self._learned, self.FAST_FRAMES)
            s = linear_out.over(s, quiet) if beside else a
            e = min(a, s)
            self.heard_echo *= ringing
            unheard = False
            if quiet:
                # nothing of the reply left to hear: the gain returns, at once where
                # the microphone stands 3 dB over its noise (someone speaking)
                speaking = p > self.QUIET and p > mic.floor
                self.gain = 1.0 if speaking else min(1.0, self.gain * back)
            else:
                at_most = envelope * 10 ** (self.path_db / 10)  # the echo at the microphone
                over = e > at_most * 10 ** (self.MARGIN_DB / 10)
                # No echo to speak of (a headset; a speaker far off or turned low):
                # AEC3, a reference playing and no echo heard, ducks a voice 40 dB
                # and more, and the rules below judge that; the linear canceller's
                # output is the microphone as it was. Over its noise as the gain's
                # return asks (a loud hum's ripple is no one).
                unheard = (beside and at_most <= unheard_at
                           and s > max(unheard_at, linear_out.floor))
                if beside and not over:
                    # AEC3 ducks a voice over the echo 10 dB and more for its first
                    # hundreds of ms: over the whole echo it comes late. Over what
                    # each canceller leaves of it, both at once, it does not; and
                    # the two fail apart (AEC3 letting go, the filter losing the room).
                    over = (a > envelope * 10 ** (self.left_db[0] / 10) * both_over
                            and s > envelope * 10 ** (self.left_db[1] / 10) * both_over
                            and a > aec3.floor * over_noise and s > linear_out.floor * over_noise)
                over = over or unheard
                if (over and beside and not unheard
                        and max(self.path_db - x for x in self.left_db) < has_room):
                    # Neither canceller has the room yet: what it leaves may be
                    # the whole echo. Someone speaking stands over the most it leaves.
                    over = (a > envelope * 10 ** (min(self.left_high_db[0], self.path_db) / 10)
                            * over_left
                            or s > envelope * 10 ** (min(self.left_high_db[1], self.path_db) / 10)
                            * over_left)
                if over and beside and a > p * let_go and s > p * let_go and (
                        p <= self.heard_echo):
                    # Both cancellers let go of the echo at once, and the microphone
                    # is no louder than the echo it heard lately: the room's ring.
                    over = False
                in_pause = self._tail > held
                if over and not (in_pause and p <= self.heard_echo):
                    self.gain = 1.0
                else:
                    self.gain = max(floor, self.gain * release)
                    if p <= at_most * heard_over:  # a voice louder than the echo can be
                        self.heard_echo = max(self.heard_echo, p)  # must not lift the ring
                # the user, or the ring alone over the prediction: neither lifts the path
                learn = not over and held > self.LOUD  # the reply playing, not its tail
                if learn and p > self.QUIET:
                    clear = at_most > mic.floor * fast_clear
                    early = max(0.0, 1 - self._learned / self.FAST_FRAMES) if clear else 0.0
                    fast = 1 + (self.FAST_START - 1) * early
                    self._learned += 1
                    up, down = self.PATH_UP_DB * fast, self.PATH_DOWN_DB * fast
                    self.path_db = _quantile_step(self.path_db, p / envelope,
                                                  self.PATH_UP_DB, self.PATH_DOWN_DB)
                    if beside:
                        self.left_db = [_quantile_step(db, x / envelope, up, down)
                                        for db, x in zip(self.left_db, (a, s))]
                        self.left_high_db = [
                            _quantile_step(db, x / envelope, self.LEFT_HIGH_UP_DB,
                                           self.LEFT_HIGH_DOWN_DB)
                            for db, x in zip(self.left_high_db, (a, s))]
                elif (learn and self.LEARN_FROM_QUIET
                      and self.QUIET / envelope < 10 ** (self.path_db / 10)):
                    # A quiet microphone while the reply plays loud: the path is
                    # no louder than that (a headset, a well-cancelled echo).
                    # Without this the path kept its start (as loud as the
                    # reference) and the user had to outshout the reply itself.
                    self.path_db -= self.PATH_DOWN_DB
            gains[i + 1] = self.gain
            # The linear canceller keeps a voice over the echo as it was said, where
            # AEC3 ducks and colours it (Silero decides later on AEC3's): once the
            # filter has the room, what passes the gate is its output.
            heard_linear[i] = beside and (self.path_db - self.left_db[1] > self.LINEAR_VIEW_DB
                                          or unheard)
        if heard_linear.any():
            post_frames = np.where(heard_linear[:, None], linear[0], post_frames)
        elif np.all(gains == 1.0):
            return post
        # a ramp within each frame from the last gain to this one: no clicks
        g = gains[:-1, None] + (gains[1:] - gains[:-1])[:, None] * _RAMP
        return np.round(post_frames * g).astype(np.int16).reshape(-1)  # |gain| <= 1: no clipping


def _quantile_step(db: float, ratio: float, up: float, down: float) -> float:
    """A quantile tracker's step (the up / (up + down) quantile) of ``ratio`` in dB."""
    return db + up if 10 * math.log10(max(ratio, 1e-12)) > db else db - down


class LinearResidualSuppressor(ResidualEchoSuppressor):
    """The VAD's view from the linear filter (``media/echo_linear.py``)
    instead of AEC3 (``residual="linear"``; measured, not the default).
    AEC3's non-linear stage ducks a voice over the echo (and, with a
    reference playing and no echo heard -- a headset -- the voice itself)
    for the first hundreds of milliseconds of double talk, which is where a
    barge-in is decided; the linear filter leaves the voice as it was. What
    it leaves of the echo is larger than AEC3's and varies, so the path this
    learns is the filter's *output* on the frames that are echo alone
    (``process(linear, linear, reference)``; a quiet microphone teaches it
    too): the residual the filter leaves, and the whole echo where it cannot
    reach it. A frame is the user's where it is ``MARGIN_DB`` over that.

    bench/vad_onset_echo.py (160 onsets of real people and our voices over a
    reply, 2-core AMD EPYC AVX2), within 130 ms of the voice's onset, AEC3's
    view -> this one: medium room at -10 dB 67 -> 109, at 0 dB 24 -> 39
    (never heard 28 -> 61), large room at -10 dB 48 -> 104, a headset 8 ->
    115; room bench self-interruptions 1 / 0 / 2 / 3 -> 0 / 0 / 1 / 1 of 20
    at -20 / -10 / 0 / +6 dB. Not the default: over a live socket it
    interrupted its own reply in 2 of 9 runs of tests/integration/
    test_echo_e2e.py (load 2-6; AEC3's view passed the runs beside it). The
    suspect, not yet shown: the echo's delay moving while the reply plays
    (a player that ran dry starting again), which AEC3 follows and a 250 ms
    linear filter must learn again, its residual rising over what this
    learned."""

    MARGIN_DB = 12.0
    LEARN_FROM_QUIET = True
    FAST_START = 1.0  # measured without it
    # The room's ring in a pause (``ResidualEchoSuppressor``) was chosen and
    # measured on AEC3's output, not on this view: off here until it is.
    HEARD_DECAY_DB = float("inf")
