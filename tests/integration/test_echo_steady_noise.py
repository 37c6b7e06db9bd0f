"""Server echo cancellation over a steady noise (issue 44: "hear the user,
not the room"): a device by a transformer, a fridge or an engine hears a
loud hum under everything. The cancellers cannot take out what the reply did
not play, so their outputs stand over the echo they leave by the hum's whole
level; the residual echo suppressor judged that as someone speaking, let the
residual echo through with the hum, and Silero heard the reply in it
(bench/noise_turns.py: a reply over a -25 dBFS hum cut itself off; offline,
4 of 6 replies). ``ResidualEchoSuppressor`` now takes each signal's noise
floor, learned where no echo can be, off its energies first, and lets a
noise it held back for the reply return gradually.

Sans-I/O: AEC3, Speex and Silero on a virtual clock, fed in the socket's
20 ms chunks, as ``test_echo_vad_view.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.speech_fixtures import speak
from vllm_duplex.domain.payloads import VadConfig, VadSpeechStarted
from vllm_duplex.media.echo import EchoCanceller
from vllm_duplex.stages.listening.silero_vad import SileroVad, load_model
from vllm_duplex.testing import noise
from vllm_duplex.testing.room import Room, impulse_response

RATE = 16000
CHUNK = 320  # 20 ms
LEAD_S, TAIL_S = 1.0, 3.0  # the hum alone before the reply, and after it
REPLY = ("The capital of France is Paris, a city on the river Seine, famous for the "
         "Eiffel Tower, its museums and its cafes.")
SAY_AT = 2.5  # s into the reply


@pytest.fixture(scope="module")
def reply() -> np.ndarray:
    return speak(REPLY, rate=RATE, lead_s=0.0, tail_s=0.0, voice="slt")


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    return speak("Stop, wait a moment please.", rate=RATE, lead_s=0.0, tail_s=0.0, voice="awb")


def onsets(reply: np.ndarray, hum_dbfs: float, voice: np.ndarray | None = None) -> list[float]:
    """Where Silero starts speech on the VAD's view (s from the reply's
    start): the reply through a room at -10 dB echo over a steady hum, and
    ``voice`` (as loud as the reply) ``SAY_AT`` into it."""
    start = int(LEAD_S * RATE)
    n = start + reply.size + int(TAIL_S * RATE)
    n -= n % CHUNK
    room = Room(impulse_response(RATE, gain_db=-10.0, tail_ms=300), RATE, seconds=n / RATE + 1,
                noise=noise.hum(n / RATE + 1, hum_dbfs).astype(np.float64))
    room.play(reply.astype(np.float64), start)
    said = np.zeros(n)
    if voice is not None:
        at = start + int(SAY_AT * RATE)
        said[at:at + voice.size] = voice[:n - at]
    mic = room.mic(0, n, said)
    reference = np.zeros(n, np.int16)
    reference[start:start + reply.size] = reply[:n - start]
    canceller = EchoCanceller()
    vad = SileroVad(load_model(), config=VadConfig(half_window_onsets=False))
    found = []
    for i in range(0, n, CHUNK):
        speech = canceller.process(mic[i:i + CHUNK], reference[i:i + CHUNK]).speech
        found += [e.audio_ms / 1000 - LEAD_S for e in vad.feed(speech, i // 16)
                  if isinstance(e, VadSpeechStarted)]
    return found


@pytest.mark.parametrize("hum_dbfs", [-35.0, -25.0])
def test_a_reply_over_a_steady_hum_never_hears_itself(reply, hum_dbfs):
    """Nothing starts speech: not the echo over the hum while the reply
    plays, not the hum coming back to the VAD after it."""
    assert onsets(reply, hum_dbfs) == []


def test_a_voice_over_the_hum_is_heard_during_the_reply(reply, question):
    """The floor comes off the echo's side of the rules, not the user's: an
    interruption over the hum and the echo starts speech as soon as the
    voice stands over the hum, and once. What the hum masks (the soft "s"
    of "Stop", under a -25 dBFS hum) no energy rule can hear; over a quiet
    room's noise it is heard from there, sooner."""
    found = onsets(reply, -25.0, question)
    assert found, "the interruption was never heard"
    hum = noise.hum(1.0, -25.0).astype(np.float64)
    frames = question[:question.size - question.size % 160].astype(np.float64).reshape(-1, 160)
    over_hum = SAY_AT + np.flatnonzero((frames ** 2).mean(axis=1) > np.mean(hum ** 2))[0] / 100
    # Silero decides 100-220 ms into a voice's first loud frames
    assert SAY_AT - 0.1 <= found[0] <= over_hum + 0.25, (found, over_hum)
    quiet = onsets(reply, -55.0, question)  # the same over a quiet room's noise
    assert quiet and quiet[0] <= found[0], (found, quiet)
    assert found[1:] == [], found  # and the hum coming back after the reply is no one
