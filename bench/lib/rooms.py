"""The rooms of the echo benches (issue 44): pyroomacoustics image-method
shoeboxes, three sizes and reverberation times, the speaker 0.5 / 1 / 2 m from
the microphone, and the device's own output-to-input latency before them.
Used by ``room_echo.py`` and ``barge_in_hops.py``."""

from __future__ import annotations

import numpy as np

RATE = 16000
DEVICE_MS = 60  # the device's output + input buffers
ROOMS = (  # name, size (m), RT60 (s), speaker-microphone distance (m)
    ("small", (3.0, 3.0, 2.5), 0.25, 0.5),
    ("medium", (5.0, 4.0, 3.0), 0.45, 1.0),
    ("large", (8.0, 6.0, 3.5), 0.7, 2.0),
)


def impulse(room: tuple, level_db: float, device_ms: int | None = None) -> np.ndarray:
    """An image-method room's response at ``RATE``, the device's latency
    (``device_ms``, ``DEVICE_MS`` unless given: more where the client's
    playback runs behind the server's model of it, ``room_echo.py --lags``)
    before it, scaled so the echo's
    energy is ``level_db`` against the reply as played (the echo return
    loss: the direct path and the reverberation together)."""
    import pyroomacoustics as pra

    _, dims, rt60, dist = room
    absorption, order = pra.inverse_sabine(rt60, list(dims))
    shoebox = pra.ShoeBox(list(dims), fs=RATE, materials=pra.Material(absorption),
                          max_order=min(order, 30))
    mic = np.array([dims[0] / 2, dims[1] / 2, 1.2])
    shoebox.add_source(list(mic + [dist, 0.0, 0.0]))
    shoebox.add_microphone(list(mic))
    shoebox.compute_rir()
    rir = np.asarray(shoebox.rir[0][0], np.float64)
    rir = rir / np.sqrt(np.sum(rir ** 2)) * 10 ** (level_db / 20)
    device_ms = DEVICE_MS if device_ms is None else device_ms
    return np.concatenate([np.zeros(RATE * device_ms // 1000), rir])
