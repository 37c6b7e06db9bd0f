"""The residual echo suppressor (``ResidualEchoSuppressor``, the VAD's view
of the microphone with echo cancellation on) in a pause of the reply, in a
large reverberant room: the room keeps ringing with the reply while the
reference is silent, and AEC3's short linear filter leaves that ring. The
VAD must hear silence there (it would start a turn on the assistant's own
voice), and the user starting to speak in the pause must come through from
their first frame. Frames made to measure, no AEC3."""

from __future__ import annotations

import numpy as np
from vllm_duplex.media.echo import FRAME, ResidualEchoSuppressor

RATE = 16000
DELAY = RATE * 80 // 1000  # the reply's trip to the microphone


def _speechy(seconds: float, level_db: float, seed: int) -> np.ndarray:
    """Noise in syllables (a 4 Hz envelope, 60 ms gaps), ``level_db`` dBFS."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    envelope = np.clip(np.sin(2 * np.pi * 4 * np.arange(n) / RATE), 0.1, 1.0)
    x = rng.normal(0, 1, n) * envelope
    return x / np.sqrt(np.mean(x ** 2)) * 32768 * 10 ** (level_db / 20)


def _frames_db(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    n = x.size // FRAME
    return 10 * np.log10((x[:n * FRAME].reshape(n, FRAME) ** 2).mean(1) + 1.0)


def _room(rt60: float, level_db: float) -> np.ndarray:
    """A large room's response: noise decaying 60 dB in ``rt60`` seconds, its
    energy ``level_db`` against what the speaker played."""
    t = np.arange(int(1.5 * rt60 * RATE)) / RATE
    h = np.random.default_rng(7).normal(0, 1, t.size) * 10 ** (-3 * t / rt60)
    return h / np.sqrt(np.sum(h ** 2)) * 10 ** (level_db / 20)


def _suppressed(pre: np.ndarray, post: np.ndarray, reference: np.ndarray) -> np.ndarray:
    s = ResidualEchoSuppressor()
    step = 2 * FRAME  # 20 ms chunks, as a client sends them
    n = pre.size - pre.size % step
    as16 = [np.clip(np.round(x), -32768, 32767).astype(np.int16) for x in (pre, post, reference)]
    return np.concatenate([s.process(*(x[i:i + step] for x in as16)) for i in range(0, n, step)])


def _a_reply_then_a_pause(user_at: float | None = None):
    """Three seconds of the reply at -20 dBFS, then a second's pause; the echo
    at -6 dB through a room ringing 60 dB in 0.9 s. AEC3's output (as in the
    room bench's large room): 18 dB under the echo while the reply plays, and
    in the pause the ring it leaves, 2 dB under the microphone; the user (as
    loud as the reply, ducked 8 dB) from ``user_at`` on."""
    talk, pause = 3.0, 1.0
    reference = np.concatenate([_speechy(talk, -20, seed=1), np.zeros(int(pause * RATE))])
    h = _room(0.9, -6)
    n = reference.size
    echo = np.convolve(reference, np.concatenate([np.zeros(DELAY), h]))[:n]
    playing = np.arange(n) < talk * RATE + DELAY
    residual = np.where(playing, echo * 10 ** (-18 / 20), echo * 10 ** (-2 / 20))
    noise = np.random.default_rng(3).normal(0, 30, n)  # about -60 dBFS
    user = np.zeros(n)
    if user_at is not None:
        user[int(user_at * RATE):] = _speechy(talk + pause - user_at, -20, seed=2)
    pre = echo + user + noise
    post = residual + user * 10 ** (-8 / 20) + noise
    # the frames of the pause where the ring is over the room's noise by 10 dB or more
    ringing = np.flatnonzero(_frames_db(echo) > _frames_db(noise) + 10)
    return pre, post, reference, ringing[ringing >= int(talk * 100)]


def test_the_room_ringing_in_a_pause_of_the_reply_is_silence_to_the_vad():
    pre, post, reference, ring = _a_reply_then_a_pause()
    assert ring.size > 30  # it rings for 300 ms and more over the room's noise
    heard = _frames_db(post)[ring]
    assert heard.max() > 50, heard.max()  # and AEC3's output passes it (over -40 dBFS)
    out = _suppressed(pre, post, reference)
    frames = out[:out.size - out.size % FRAME].reshape(-1, FRAME)[ring]
    loud = ring[np.flatnonzero(np.abs(frames).max(axis=1))] - ring[0]
    assert loud.size == 0, f"the ring came through {loud * 10} ms into the pause"


def test_the_user_speaking_in_the_pause_comes_through_from_the_first_frame():
    onset = 3.3  # 300 ms into the pause, while the room still rings
    pre, post, reference, _ = _a_reply_then_a_pause(user_at=onset)
    out = _suppressed(pre, post, reference)
    loss = _frames_db(out) - _frames_db(post[:out.size])
    first = int(onset * 100)
    # the gain opens within the first frame (a ramp: no click), and stays open
    assert loss[first] > -6.0, loss[first:first + 5]
    syllable = slice(first + 1, first + 25)  # the rest of the first syllable (250 ms)
    assert np.all(loss[syllable] > -1.0), np.sort(loss[syllable])[:5]
