"""How soon Silero VAD starts speech (issue 44 item 3: a barge-in heard within
100 ms of its onset): its windows are 32 ms, so a second phase of windows,
half a window later with its own recurrent state, decides the onset on
whichever phase is first -- and noise must start nothing either way.

Sans-I/O: the VAD's clock is the audio timeline (sample counts), fed in the
socket's 20 ms chunks; "when" is the chunk whose arrival made the event.
Figures (how many onsets within 100 ms, over many placements and voices)
are ``bench/vad_onset.py``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from support.speech_fixtures import speak
from vllm_duplex.domain.payloads import VadConfig, VadSpeechStarted, VadSpeechStopped
from vllm_duplex.stages.listening.silero_vad import HALF, WINDOW, SileroVad, load_model
from vllm_duplex.testing import noise

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from lib.real_corpus import RECORDINGS  # noqa: E402

RATE = 16000
CHUNK = 320  # 20 ms
ONSET_DBFS = -40.0


class WholeWindowSilero:
    """Silero's interface, scoring ``p`` a window whose every sample is
    sound (0.9: sure) and 0 otherwise: which window decides is then known
    to the sample."""

    def __init__(self, p: float = 0.9) -> None:
        self.p = p

    def new_state(self) -> np.ndarray:
        return np.zeros(1, np.float32)

    def infer(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        return (self.p if np.all(x[0, -WINDOW:] != 0) else 0.0), state


def heard(vad: SileroVad, pcm: np.ndarray) -> list[tuple[int, object]]:
    """(chunk index whose arrival made it, event), fed in 20 ms chunks."""
    out = []
    for k, i in enumerate(range(0, pcm.size, CHUNK)):
        out += [(k, e) for e in vad.feed(pcm[i:i + CHUNK], i // 16)]
    return out


def test_the_second_phase_decides_half_a_window_sooner():
    sound_at = 4 * WINDOW + HALF  # the main grid's window holding it is half silent
    pcm = np.zeros(sound_at + RATE + RATE, np.int16)
    pcm[sound_at:sound_at + RATE] = 1000  # one second of sound, then a second of silence
    config = VadConfig(prefix_padding_ms=0, silence_duration_ms=500)
    one = heard(SileroVad(WholeWindowSilero(), config=config, onset_phases=1), pcm)
    two = heard(SileroVad(WholeWindowSilero(), config=config, onset_phases=2), pcm)
    # one phase: the first whole window of sound is the main grid's next one
    assert one[0] == ((sound_at + HALF + WINDOW) // CHUNK,
                      VadSpeechStarted(audio_ms=(sound_at + HALF) // 16))
    # two: the second phase's window starts where the sound does, 16 ms sooner
    assert two[0] == ((sound_at + WINDOW) // CHUNK, VadSpeechStarted(audio_ms=sound_at // 16))
    # the end of speech is the main phase's alone
    assert [e for _, e in one[1:]] == [e for _, e in two[1:]]
    assert [type(e) for _, e in two] == [VadSpeechStarted, VadSpeechStopped]


def test_the_second_phase_starts_speech_only_on_a_window_it_is_sure_of():
    # Voiced but unsure windows (typing scores up to ~0.76) start speech on
    # the main phase's two in a row alone: a second phase would give a
    # click twice the chances.
    sound_at = 4 * WINDOW + HALF
    pcm = np.zeros(sound_at + RATE, np.int16)
    pcm[sound_at:] = 1000
    config = VadConfig(prefix_padding_ms=0)
    one = heard(SileroVad(WholeWindowSilero(0.6), config=config, onset_phases=1), pcm)
    two = heard(SileroVad(WholeWindowSilero(0.6), config=config, onset_phases=2), pcm)
    assert two[0] == one[0] == ((sound_at + HALF + 2 * WINDOW) // CHUNK,
                                VadSpeechStarted(audio_ms=(sound_at + HALF) // 16))


def test_where_the_server_cancels_the_echo_the_main_grid_alone_decides():
    # the echo's residual scores sure windows too: a second grid would
    # give it twice the chances (bench/room_echo.py)
    sound_at = 4 * WINDOW + HALF
    pcm = np.zeros(sound_at + RATE, np.int16)
    pcm[sound_at:] = 1000
    one = heard(SileroVad(WholeWindowSilero(), config=VadConfig(prefix_padding_ms=0),
                          onset_phases=1), pcm)
    off = heard(SileroVad(WholeWindowSilero(), config=VadConfig(
        prefix_padding_ms=0, half_window_onsets=False)), pcm)
    assert off[0] == one[0]


def onset_chunk(pcm: np.ndarray) -> int:
    floor = 32768.0 * 10 ** (ONSET_DBFS / 20)
    loud = [k for k, i in enumerate(range(0, pcm.size, CHUNK))
            if np.sqrt(np.mean(pcm[i:i + CHUNK].astype(np.float64) ** 2)) > floor]
    return loud[0]


def first_started(phases: int, pcm: np.ndarray) -> int:
    return next(k for k, e in heard(SileroVad(load_model(), onset_phases=phases), pcm)
                if isinstance(e, VadSpeechStarted))


def spoken() -> list[tuple[str, np.ndarray]]:
    people = {r.name: r for r in RECORDINGS}
    said = [(n, people[n].audio()[:3 * RATE])
            for n in ("cmu-cards-001", "cmu-goforward", "ami-ES2011a-headset0", "fsdd-jackson-7")]
    said += [(t, speak(t, rate=RATE, lead_s=0.0, tail_s=0.2, voice=v)) for t, v in
             (("Stop, wait a moment please.", "slt"), ("Wait, wait.", "awb"),
              ("Hold on a second.", "rms"))]
    return said


@pytest.mark.parametrize("lead_ms", [300, 308, 316, 324])  # the window grid over the onset
def test_recorded_speech_is_heard_within_a_few_chunks_of_its_onset(lead_ms):
    for name, voice in spoken():
        pcm = np.concatenate([np.zeros(lead_ms * 16, np.int16), voice, np.zeros(RATE // 2, np.int16)])
        onset = onset_chunk(pcm)
        one, two = first_started(1, pcm) - onset, first_started(2, pcm) - onset
        assert two <= one, name  # a second phase only ever decides sooner
        assert 0 <= two <= 5, (name, two * 20)  # within 100 ms of the first loud chunk


@pytest.mark.parametrize("kind", ["fan", "line_hiss", "music", "keyboard"])
def test_noise_starts_no_speech(kind):
    maker = noise.makers([])[kind]
    for level in (-35, -25, -15):
        pcm = maker(20.0, level)
        events = heard(SileroVad(load_model()), pcm)
        assert not any(isinstance(e, VadSpeechStarted) for _, e in events), (kind, level)


def test_after_a_gap_or_a_new_stream_the_second_phase_starts_over():
    sound_at = 4 * WINDOW + HALF
    pcm = np.zeros(sound_at + RATE // 2, np.int16)
    pcm[sound_at:sound_at + RATE // 4] = 1000
    config = VadConfig(prefix_padding_ms=0, silence_duration_ms=100)
    vad = SileroVad(WholeWindowSilero(), config=config)
    first = heard(vad, pcm)
    # the same audio again, 10 s later on the timeline (a gap), then rewound to 0
    later = [(k, e) for k, i in enumerate(range(0, pcm.size, CHUNK))
             for e in vad.feed(pcm[i:i + CHUNK], 10_000 + i // 16)]
    again = heard(vad, pcm)
    assert [e for _, e in again] == [e for _, e in first]
    assert [(k, type(e)) for k, e in later] == [(k, type(e)) for k, e in first]
    assert later[0][1] == VadSpeechStarted(audio_ms=10_000 + sound_at // 16)
