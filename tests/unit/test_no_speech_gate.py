"""The no-speech gate, by value: the decodes bench/no_speech.py measured."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from vllm_duplex.stages.listening.no_speech import DEFAULT_GATE, NoSpeechGate, is_hallucination


@dataclass(frozen=True)
class D:
    text: str
    no_speech_prob: float
    avg_logprob: float


@pytest.mark.parametrize("decoded, why", [
    (D("you", 0.96, -0.75), "no_speech"),  # tiny.en, a quiet room (kept by faster-whisper's rule)
    (D("Thank you.", 0.82, -1.03), "no_speech"),  # base, music at -50 dBFS
    (D("I feel at least ready to do it.", 0.46, -0.87), "unsure"),  # base, babble, AVX2 oneDNN
    (D("Thank you very much.", 0.35, -0.4), "hallucination"),
    (D("Thanks for watching!", 0.31, -0.2), "hallucination"),
])
def test_noise_decodes_are_silence(decoded, why):
    assert DEFAULT_GATE.silence(decoded) == why


@pytest.mark.parametrize("decoded", [
    D("Please turn on the kitchen lights.", 0.16, -0.11),  # 40 dB down
    D("What is the capital of France?", 0.39, -0.36),  # over babble, +10 dB SNR
    D("Thank you.", 0.15, -0.45),  # a user who says it
    D("Okay.", 0.18, -0.71),  # short and unsure, but speech
    D("You will not betray Romeo and Juliet.", 0.11, -0.92),  # misheard is still heard
])
def test_speech_decodes_are_kept(decoded):
    assert DEFAULT_GATE.silence(decoded) is None


def test_hallucinations_are_matched_as_spoken_words():
    assert is_hallucination("Thank you.") and is_hallucination("  YOU ") and is_hallucination("Bye-bye!")
    assert not is_hallucination("Thank you, see you tomorrow.")


def test_thresholds_are_checked():
    with pytest.raises(ValueError, match="no_speech must be within"):
        NoSpeechGate(no_speech=0.0)
