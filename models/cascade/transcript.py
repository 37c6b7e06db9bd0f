"""Which ASR words are stable enough to act on (pure).

PocketSphinx revises its hypothesis as audio arrives. A word is *stable* when
it stood at the same position in the previous hypothesis too and is not the
last word (the last word is the one still being heard). Stable words are what
we show as transcription deltas and push into the live LLM request.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def words(text: str) -> list[str]:
    return text.split()


def stable_prefix(previous: list[str], current: list[str]) -> list[str]:
    """The longest common prefix of two hypotheses, minus the current last word."""
    n = 0
    for a, b in zip(previous, current):
        if a != b:
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
        return hypothesis[: len(self.pushed)] != self.pushed
