"""What the residual echo suppressor (the VAD's view with server echo
cancellation) learns in a session's first reply, and what it must not take
for someone speaking there: the echo of the reply alone stays silence to the
VAD, and the user interrupting later still passes from their first strong
frames. Frames made to measure (``support/echo_frames.py``), after what the
server's own streams showed in ``bench/echo_live.py`` at 0 dB."""

from __future__ import annotations

import numpy as np
import pytest
from support.echo_frames import RATE, frames_db, room_response, speechy, suppressed
from vllm_duplex.media.echo import FRAME

ONSET = 3.5  # s: the user starts speaking


def _noise(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 30, n)  # about -61 dBFS


def _user(seed: int, n: int, over_echo_db: float) -> np.ndarray:
    user = speechy(n / RATE, -20 + over_echo_db, seed=10 * seed + 1)
    user[:int(ONSET * RATE)] = 0
    return user


def _echo_alone_opened(out: np.ndarray) -> np.ndarray:
    """The frames from 1.1 s (the reply's first words under way) to the user's
    onset that let more than a sample or two through: the echo, heard."""
    n = out.size // FRAME
    alone = np.abs(out[:n * FRAME].reshape(n, FRAME)[110:int(ONSET * 100)]).max(1)
    return np.flatnonzero(alone > 2) / 100 + 1.1


def _user_first_frames_loss(out: np.ndarray, heard: np.ndarray, user: np.ndarray) -> float:
    """The most the user's strong frames 20-250 ms into their speech lost
    against ``heard`` (what the canceller the gate passes gave it): at most
    the gain's ramp in, where the frame before was turned down."""
    loss = frames_db(out) - frames_db(heard[:out.size])
    frame = np.arange(loss.size)
    first = (frame >= int(ONSET * 100) + 2) & (frame < int(ONSET * 100) + 25)
    strong = frames_db(user[:out.size]) > frames_db(user).max() - 10
    return float(loss[strong & first].min())


@pytest.mark.parametrize("seed", [1, 2])
def test_the_first_word_s_fading_tail_does_not_teach_the_room_quieter_than_it_is(seed):
    """A first reply (1 s of quiet, then a word, a pause, and more words)
    plays into a room ringing 60 dB in 0.45 s, its echo as loud as the
    reference (0 dB). The echo path is learned against the reference's
    energy held 200 ms: over a word's fading tail the microphone falls
    faster than that hold, and learned at four times its pace over the
    first word and its tail (the fast start's steps) it came out well under
    the room (live, 9 dB). As the next word begins, AEC3 lets go of the echo for 100 ms
    (3 dB out) and the linear filter, not yet holding the room, takes 8 dB
    out: judged against the path learned too low, that echo was someone
    speaking (live, a reply cut itself off 0.9 s in). At its own pace the
    path still holds the room there: turned down. The user 10 dB over the
    echo from 3.5 s passes from their first strong frames."""
    reference = speechy(4.5, -20, seed=10 * seed)
    reference[:RATE] = 0  # the microphone's noise learned first, as before a reply
    reference[int(1.3 * RATE):int(1.8 * RATE)] = 0  # the first word, then a pause
    n = reference.size
    h = np.concatenate([np.zeros(RATE * 60 // 1000), room_response(0.45)])  # 60 ms later
    echo = np.convolve(reference, h)[:n]
    user = _user(seed, n, over_echo_db=10)
    pre = echo + user + _noise(3, n)
    post = echo * 10 ** (-30 / 20) + user * 10 ** (-8 / 20) + _noise(4, n)
    let_go = slice(int(1.85 * RATE), int(1.95 * RATE))
    post[let_go] = pre[let_go] * 10 ** (-3 / 20)
    linear = echo * 10 ** (-8 / 20) + user + _noise(5, n)
    out = suppressed(pre, post, reference, linear)
    opened = _echo_alone_opened(out)
    assert opened.size == 0, f"the echo alone came through at {opened} s"
    assert _user_first_frames_loss(out, post, user) > -3.0


@pytest.mark.parametrize("seed", [1, 2])
def test_a_canceller_s_own_noise_is_no_one_where_the_other_lets_go(seed):
    """AEC3 takes the echo (10 dB under the reference) down to its noise, and
    under the echo turns that noise down 2 dB, so what it is tracked to leave
    of the echo is next to nothing. At 3 s the linear filter loses the room
    for 200 ms (2 dB out) and AEC3's noise is back at its level: that noise
    alone stood "10 dB over what AEC3 leaves" beside the filter's echo, and
    the gate passed the filter's output -- the echo -- as someone speaking
    (live at 0 dB, a reply heard speech 4 s in). Each output must also stand
    6 dB over its own steady noise: turned down. The user as loud as the
    reference (10 dB over its echo) from 3.5 s passes from their first
    strong frames."""
    reference = speechy(4.5, -20, seed=10 * seed)
    reference[:RATE] = 0
    n = reference.size
    echo = np.concatenate([np.zeros(RATE * 80 // 1000), reference])[:n] * 10 ** (-10 / 20)
    user = _user(seed, n, over_echo_db=10)
    noise = _noise(3, n)
    pre = echo + user + noise
    t = np.arange(n) / RATE
    turned_down = np.where((t > 1.0) & (t < 3.0), 10 ** (-2 / 20), 1.0)
    post = user * 10 ** (-8 / 20) + _noise(4, n) * turned_down
    linear = echo * 10 ** (-20 / 20) + user + _noise(5, n)
    lost = slice(int(3.0 * RATE), int(3.2 * RATE))
    linear[lost] = echo[lost] * 10 ** (-2 / 20) + noise[lost]
    out = suppressed(pre, post, reference, linear)
    opened = _echo_alone_opened(out)
    assert opened.size == 0, f"the echo alone came through at {opened} s"
    assert _user_first_frames_loss(out, linear, user) > -3.0
