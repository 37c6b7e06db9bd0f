"""The residual echo suppressor (``ResidualEchoSuppressor``, the VAD's view
of the microphone with echo cancellation on) in a pause of the reply, in a
large reverberant room: the room keeps ringing with the reply while the
reference is silent, and AEC3's short linear filter leaves that ring. The
VAD must hear silence there (it would start a turn on the assistant's own
voice), and the user starting to speak in the pause must come through from
their first frame. Frames made to measure, no AEC3."""

from __future__ import annotations

import numpy as np
from support.echo_frames import frames_db, room_response, speechy, suppressed
from vllm_duplex.media.echo import FRAME

RATE = 16000
DELAY = RATE * 80 // 1000  # the reply's trip to the microphone


def _a_reply_then_a_pause(user_at: float | None = None):
    """Three seconds of the reply at -20 dBFS, then a second's pause; the echo
    at -6 dB through a room ringing 60 dB in 0.9 s. AEC3's output (as in the
    room bench's large room): 18 dB under the echo while the reply plays, and
    in the pause the ring it leaves, 2 dB under the microphone; the user (as
    loud as the reply, ducked 8 dB) from ``user_at`` on."""
    talk, pause = 3.0, 1.0
    reference = np.concatenate([speechy(talk, -20, seed=1), np.zeros(int(pause * RATE))])
    h = room_response(0.9, -6)
    n = reference.size
    echo = np.convolve(reference, np.concatenate([np.zeros(DELAY), h]))[:n]
    playing = np.arange(n) < talk * RATE + DELAY
    residual = np.where(playing, echo * 10 ** (-18 / 20), echo * 10 ** (-2 / 20))
    noise = np.random.default_rng(3).normal(0, 30, n)  # about -60 dBFS
    user = np.zeros(n)
    if user_at is not None:
        user[int(user_at * RATE):] = speechy(talk + pause - user_at, -20, seed=2)
    pre = echo + user + noise
    post = residual + user * 10 ** (-8 / 20) + noise
    # the frames of the pause where the ring is over the room's noise by 10 dB or more
    ringing = np.flatnonzero(frames_db(echo) > frames_db(noise) + 10)
    return pre, post, reference, ringing[ringing >= int(talk * 100)]


def test_the_room_ringing_in_a_pause_of_the_reply_is_silence_to_the_vad():
    pre, post, reference, ring = _a_reply_then_a_pause()
    assert ring.size > 30  # it rings for 300 ms and more over the room's noise
    heard = frames_db(post)[ring]
    assert heard.max() > 50, heard.max()  # and AEC3's output passes it (over -40 dBFS)
    out = suppressed(pre, post, reference)
    frames = out[:out.size - out.size % FRAME].reshape(-1, FRAME)[ring]
    loud = ring[np.flatnonzero(np.abs(frames).max(axis=1))] - ring[0]
    assert loud.size == 0, f"the ring came through {loud * 10} ms into the pause"


def test_the_user_speaking_in_the_pause_comes_through_from_the_first_frame():
    onset = 3.3  # 300 ms into the pause, while the room still rings
    pre, post, reference, _ = _a_reply_then_a_pause(user_at=onset)
    out = suppressed(pre, post, reference)
    loss = frames_db(out) - frames_db(post[:out.size])
    first = int(onset * 100)
    # the gain opens within the first frame (a ramp: no click), and stays open
    assert loss[first] > -6.0, loss[first:first + 5]
    syllable = slice(first + 1, first + 25)  # the rest of the first syllable (250 ms)
    assert np.all(loss[syllable] > -1.0), np.sort(loss[syllable])[:5]
