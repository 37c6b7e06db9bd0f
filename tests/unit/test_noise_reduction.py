"""Input noise reduction (``audio.input.noise_reduction``): Speex's suppressor
pushes a steady noise down and leaves the voice, and the session's input
buffer runs it on every chunk without losing or shifting a sample."""

from __future__ import annotations

import numpy as np
import pytest
from support.speech_fixtures import speak
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.noise import FRAME, NoiseSuppressor
from vllm_duplex.session.input_buffer import InputBuffer

RATE = 16000


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))


def db(after: float, before: float) -> float:
    return 20 * np.log10(after / before)


@pytest.fixture(scope="module")
def noisy_question() -> tuple[np.ndarray, np.ndarray]:
    """A question after 1 s of noise (the suppressor learns the noise there),
    white noise ~18 dB under the voice, and where the voice is loud."""
    voice = speak("What is the capital of France?", rate=RATE, lead_s=1.0, tail_s=0.5).astype(np.float64)
    noise = np.random.default_rng(7).normal(0, 700, voice.size)
    return np.clip(voice + noise, -32768, 32767).astype(np.int16), np.abs(voice) > 2000


def suppressed(kind: str, pcm: np.ndarray) -> np.ndarray:
    whole = pcm.size - pcm.size % FRAME
    ns = NoiseSuppressor(kind)
    return np.concatenate([ns.process(pcm[:whole]), ns.finish(pcm[whole:])])


def test_noise_is_pushed_down_and_the_voice_kept(noisy_question):
    pcm, loud = noisy_question
    noise_only = slice(RATE // 2, RATE)  # after half a second of adapting
    found = {}
    for kind in ("near_field", "far_field"):
        out = suppressed(kind, pcm)
        assert out.size == pcm.size and out.dtype == np.int16
        found[kind] = db(rms(out[noise_only]), rms(pcm[noise_only]))
        assert found[kind] < -6, found
        assert abs(db(rms(out[loud]), rms(pcm[loud]))) < 2  # the voice, as loud as it was
    assert found["far_field"] < found["near_field"] - 1  # a far microphone: deeper


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError):
        NoiseSuppressor("studio")


def test_whole_frames_only():
    with pytest.raises(ValueError):
        NoiseSuppressor("near_field").process(np.zeros(FRAME + 1, np.int16))


def append_all(buf: InputBuffer, pcm24: np.ndarray, sizes: list[int]) -> list:
    chunks, at = [], 0
    for n in sizes:
        chunk = buf.append(pcm24[at:at + n].astype("<i2").tobytes())
        at += n
        if chunk is not None:
            chunks.append(chunk)
    return chunks


def test_the_input_buffer_loses_and_shifts_nothing():
    """24 kHz chunks of odd sizes (none a whole number of 10 ms frames at
    16 kHz): the turn holds as many samples with noise reduction as without,
    every chunk is stamped where it lies on the timeline, and turning the
    suppressor off mid-turn keeps the audio it held."""
    pcm24 = np.random.default_rng(1).normal(0, 3000, 24000).astype(np.int16)
    sizes = [int(n) for n in np.random.default_rng(2).integers(37, 700, 200)]
    sizes = [n for n in np.cumsum(sizes) if n < pcm24.size]
    sizes = list(np.diff([0, *sizes, pcm24.size]))

    plain = InputBuffer(AudioFormat(), max_ms=5000)
    plain_audio, _ = (append_all(plain, pcm24, sizes), plain.commit())[1]

    buf = InputBuffer(AudioFormat(), max_ms=5000)
    buf.set_noise_reduction("far_field")
    half = len(sizes) // 2
    first = append_all(buf, pcm24, sizes[:half])
    assert all(c.pcm.size % FRAME == 0 for c in first)  # whole frames, the rest held
    buf.set_noise_reduction(None)
    rest = append_all(buf, pcm24[sum(sizes[:half]):], sizes[half:])
    audio, errors = buf.commit()
    assert not errors and audio.size == plain_audio.size
    stamps = [c.start_ms for c in first + rest]
    lengths = np.cumsum([0] + [c.pcm.size for c in first + rest])[:-1]
    assert stamps == [int(n) * 1000 // RATE for n in lengths]
    # Off mid-turn: from there on the audio is the plain decode, sample for sample.
    tail = sum(c.pcm.size for c in rest)
    assert np.array_equal(audio[-tail + FRAME:], plain_audio[-tail + FRAME:])


def test_the_last_partial_frame_of_a_turn_is_committed():
    buf = InputBuffer(AudioFormat(rate=16000), max_ms=5000)
    buf.set_noise_reduction("near_field")
    kept = buf.append(np.full(FRAME + 37, 500, np.int16).tobytes())
    assert kept is not None and kept.pcm.size == FRAME
    audio, _ = buf.commit()
    assert audio.size == FRAME + 37
