"""``NoiseFloor``: a signal's steady noise, learned where no echo can be,
taken off its frame energies (the residual echo suppressor's first step)."""

from __future__ import annotations

import numpy as np
from vllm_duplex.media.noise_floor import NoiseFloor


def test_a_steady_noise_comes_off_and_a_voice_over_it_stays():
    floor = NoiseFloor(150)
    rng = np.random.default_rng(0)
    hum = 1e6 * (1 + 0.05 * rng.standard_normal(200))  # a loud steady noise, frame by frame
    over = [floor.over(e, learn=True) for e in hum]
    assert max(over[10:]) < 0.2e6  # what is left of the noise: its wobble
    voice = 4e6
    assert floor.over(hum[0] + voice, learn=True) > 0.9 * voice


def test_frames_where_echo_can_be_teach_nothing():
    floor = NoiseFloor(150)
    for _ in range(20):
        floor.over(1e4, learn=True)
    for _ in range(300):  # a reply playing: loud, and echo
        floor.over(1e7, learn=False)
    assert floor.floor == 1e4
    assert floor.over(1e4 + 5e5, learn=False) == 5e5


def test_a_louder_noise_is_followed_within_the_window_and_a_voice_never_lifts_it():
    floor = NoiseFloor(150)
    for _ in range(150):
        floor.over(1e4, learn=True)
    # someone speaking in syllables, 100 ms loud and 100 ms between them at the noise
    for k in range(150):
        floor.over(1e7 if (k // 10) % 2 == 0 else 1e4, learn=True)
    assert floor.floor == 1e4
    for _ in range(160):  # a fan switched on: 20 dB louder, steady
        floor.over(1e6, learn=True)
    assert floor.floor == 1e6

