"""The engine's own backchannels: short acknowledgements ("Mm-hmm.", "Right.")
it speaks while the user holds the floor at length (duplex extension
``session.audio.output.backchannels``; docs/turn-taking.md "The engine's
backchannels"). Off by default; the decision is ``session/backchannel.py``'s.

Not to be confused with ``Interruption.backchannels``: the *user's*
acknowledgements, which an adaptive interruption forgives.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PHRASES: tuple[str, ...] = ("Mm-hmm.", "Right.", "I see.")

MAX_PHRASES = 16  # entries
MAX_PHRASE_CHARS = 32  # per entry: an acknowledgement, not a sentence
MAX_AFTER_SPEECH_MS = 60_000
MIN_PAUSE_MS, MAX_PAUSE_MS = 200, 2_000  # into the silence: never mid-word, before the turn ends
MAX_INTERVAL_MS = 120_000


@dataclass(frozen=True)
class Backchanneling:
    """When the engine may say one of ``phrases``: at a pause ``pause_ms``
    into the silence, once the user's turn has gone on for ``after_speech_ms``
    and ``min_words`` words, the words so far judged unfinished (not a
    question's end), no reply under way, and at least ``min_interval_ms``
    since the last one. The phrases are said in turn."""

    phrases: tuple[str, ...] = DEFAULT_PHRASES
    after_speech_ms: int = 3_000
    min_words: int = 6
    pause_ms: int = 400
    min_interval_ms: int = 5_000

    def wire(self) -> dict:
        return {"phrases": list(self.phrases), "after_speech_ms": self.after_speech_ms,
                "min_words": self.min_words, "pause_ms": self.pause_ms,
                "min_interval_ms": self.min_interval_ms}
