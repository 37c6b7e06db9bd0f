"""Which ASR words are stable enough to act on, and when the final transcript
revised what was acted on (pure).

The ASR's partial hypotheses change as audio arrives. A word is *stable* when
it stood at the same position in the previous hypothesis too and is not the
last word (the last word is the one still being heard). Stable words are what
we show as transcription deltas and push into the live LLM request.

Words are compared in their *spoken* form (``vllm_duplex.domain.words``: case
and punctuation ignored) because Whisper writes "What is the capital?" in one
hypothesis and "What is the capital of France?" in the next: "capital?" and
"capital" are the same word heard. A word is kept in the form of the newest
hypothesis. The final transcript *revises* the pushed words only when a word
differs in that spoken form; then the policy rolls the model context back so
the model answers what the final says. (Spelling alone -- "France." pushed,
"France," final -- needs no rollback: the vLLM stage sees the text differ
from what it holds and re-prefills the turn by itself.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from vllm_duplex.domain.words import spoken
from vllm_duplex.domain.words import written_words as words

__all__ = ["Utterance", "extends", "same_words", "spoken", "stable_prefix", "unclosed", "words"]

_CLOSING = re.compile(r"[.?!,;:]+$")


def unclosed(hypothesis: list[str]) -> list[str]:
    """``hypothesis`` without the punctuation that closes its last word. At
    the end of the audio heard so far Whisper tends to close the sentence
    ("What is the capital?"): that is its guess, not the user's words, and
    pushed into the model it would make an unfinished phrase look like a
    complete turn (P(end) follows a "?" almost surely)."""
    if not hypothesis:
        return []
    last = _CLOSING.sub("", hypothesis[-1])
    return [*hypothesis[:-1], last] if last else list(hypothesis[:-1])


def same_words(a: list[str], b: list[str]) -> bool:
    return len(a) == len(b) and all(spoken(x) == spoken(y) for x, y in zip(a, b))


def extends(prefix: list[str], hypothesis: list[str]) -> bool:
    """Does ``hypothesis`` start with ``prefix`` and go further?"""
    return len(hypothesis) > len(prefix) and same_words(hypothesis[: len(prefix)], prefix)


def stable_prefix(previous: list[str], current: list[str]) -> list[str]:
    """The longest common prefix of two hypotheses (in ``current``'s spelling),
    minus the current last word."""
    n = 0
    for a, b in zip(previous, current):
        if spoken(a) != spoken(b):
            break
        n += 1
    return current[: min(n, max(0, len(current) - 1))]


@dataclass
class Utterance:
    """What one user utterance has produced so far."""

    previous: list[str] = field(default_factory=list)  # last partial hypothesis
    shown: list[str] = field(default_factory=list)  # words sent as transcription deltas
    pushed: list[str] = field(default_factory=list)  # words appended to the LLM request
    rollbacks: int = 0

    def update(self, hypothesis: list[str]) -> list[str]:
        """Feed a partial hypothesis; returns the stable words."""
        stable = stable_prefix(self.previous, hypothesis)
        self.previous = hypothesis
        return stable

    def revised(self, hypothesis: list[str]) -> bool:
        """Did the ASR change (or drop) a word already pushed to the LLM?"""
        return not same_words(hypothesis[: len(self.pushed)], self.pushed)
