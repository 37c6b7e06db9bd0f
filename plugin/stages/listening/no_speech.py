"""The no-speech gate: when Whisper's words came from no one.

Whisper was trained on subtitled video, so for a window of silence, a fan or
music it often writes what subtitles say over such stretches: "you",
"Thank you.", "Thanks for watching!". On a live session that is a user turn
nobody spoke, and the assistant answers the room. faster-whisper's own rule
(no-speech probability over 0.6 *and* average log-probability under -1) lets
these through: tiny.en writes "you" for a quiet room with no-speech
probability 0.96 and log-probability -0.75, and base heard crowd babble at
-20 dBFS as "I feel at least ready to do it." (0.58, -0.87).

Measured on this project's noise set (``bench/no_speech.py``: silence, fan,
babble, music, keyboard, line hiss at -50 to -15 dBFS, two seeds; speech at
-40 dB, "Thank you.", "You.", "Okay." and a question over each noise at
+10 dB SNR; both models; MKL and oneDNN GEMMs at AVX-512 and capped at AVX2),
faster-whisper's rule kept words from 12-15 of the 82 noise windows. The
no-speech probability of every noise window but crowd babble was 0.58 or
more, of every speech window 0.39 or less. Babble is speech to both Silero
and Whisper (0.46-0.61) but Whisper is unsure of its words there (average
log-probability -0.87 to -1.06), while real speech it doubts (0.34-0.39) it
is sure of (-0.36), and real speech it is unsure of ("Okay.", -0.71) it does
not doubt (0.18 or less). So a window is silence when:

- its no-speech probability is at least ``no_speech`` (0.5), or
- its words are one of Whisper's known hallucinations (``HALLUCINATIONS``,
  compared as spoken words) and its no-speech probability is at least
  ``hallucination_no_speech`` (0.3: a user who says "thank you" scores
  0.02-0.15), or
- it is unsure of its words (average log-probability under ``log_prob``,
  -0.6) and doubts there is speech (no-speech probability at least
  ``unsure_no_speech``, 0.3): faster-whisper's pair, both bars moved to the
  middle of the measured gaps.

Every noise window is then silent and every speech window kept, on each
ISA and GEMM library.

Upstream of this, the VAD's verdict gates what Whisper hears at all: a
VAD-gated utterance is only the audio the VAD called speech (and its
pre-roll); this gate is what stands when the VAD is fooled (babble is speech
to Silero) or absent (manual commits hear the whole buffer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from vllm_duplex.domain.words import spoken_words

# What Whisper writes for silence and noise (its training subtitles), as
# spoken words. A user may say any of them: the gate drops them only when
# Whisper also doubts there was speech.
HALLUCINATIONS = frozenset({
    "you", "thank you", "thank you very much", "thanks", "thanks for watching",
    "thank you for watching", "thank you so much for watching", "bye", "bye bye",
    "please subscribe", "subscribe", "subtitles by the amara org community",
    "so", "oh", "okay", "hmm", "uh", "um", "ah", "the end", "music", "applause",
})


class Decoded(Protocol):
    text: str
    no_speech_prob: float
    avg_logprob: float


@dataclass(frozen=True)
class NoSpeechGate:
    no_speech: float = 0.5
    hallucination_no_speech: float = 0.3
    unsure_no_speech: float = 0.3
    log_prob: float = -0.6

    def __post_init__(self) -> None:
        for name in ("no_speech", "hallucination_no_speech", "unsure_no_speech"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within (0, 1]")

    def silence(self, decoded: Decoded) -> str | None:
        """Why ``decoded`` is no one's words (``no_speech``, ``hallucination``,
        ``unsure``), or None when it is speech."""
        p = decoded.no_speech_prob
        if p >= self.no_speech:
            return "no_speech"
        if p >= self.hallucination_no_speech and is_hallucination(decoded.text):
            return "hallucination"
        if p >= self.unsure_no_speech and decoded.avg_logprob < self.log_prob:
            return "unsure"
        return None


def is_hallucination(text: str) -> bool:
    return " ".join(spoken_words(text)) in HALLUCINATIONS


DEFAULT_GATE = NoSpeechGate()

# The gate of a decode in Whisper's own 30 s window (``whisper_model.py``'s
# second look at words a shorter window's gate dropped). There every noise of
# the set above scored a no-speech probability of 0.64 or more (tiny.en beam
# 5, 41 windows, babble's lowest), while people's short phrases that the 10 s
# window doubted (0.3-0.7) scored 0.1-0.41 with log-probabilities down to
# -1.0 (FSDD's 8 kHz digits, bench/real_hearing.py). So the "unsure" pair,
# which was only there for babble's 0.46-0.61 in the short window, is off;
# the no-speech bar and the known hallucinations stay.
WHOLE_WINDOW_GATE = NoSpeechGate(unsure_no_speech=1.0)
