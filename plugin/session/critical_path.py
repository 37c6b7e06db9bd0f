"""Which stage a turn's gap waited on, millisecond by millisecond (sans-I/O).

The gap -- the user's last word to the reply's first sound -- is the end of
two chains that run at once: the *decision* (the VAD hears the pause, the ASR
the words up to it, the LLM judges them, the silence is waited out, the final
transcript confirms them, the reply is released) and the *reply* (its request
starts, the LLM writes the first token and the first phrase, the TTS speaks
it). ``TurnTrace`` stamps each step on the session's clock as it happens and,
when the first audio goes out, walks back from it: each step waited on the
latest of the steps it depends on, so the walk is the critical path, and each
segment's milliseconds say what the user waited on.

Steps (``STEPS``), by the segment named after them:

===============  ===========================================================
``speech_end``   the audio at the end of the user's speech arrived (the start)
``vad``          the VAD reported the pause (or, under server VAD, the end)
``asr_pause``    the ASR's words up to the pause
``p_end``        the LLM's P(end) of those words
``decision``     the turn was committed (the silence the words needed)
``asr_final``    the final transcript
``release``      the reply was made the response (``response.created``)
``llm_request``  the reply's request went to the LLM
``llm_first``    its first token (text delta) arrived
``llm_phrase``   the token after which the TTS spoke (the first phrase)
``tts``          the first audio of the reply came from the TTS
``pacing``       the first audio was sent to the client
===============  ===========================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

STEPS = ("speech_end", "vad", "asr_pause", "p_end", "decision", "asr_final", "release",
         "llm_request", "llm_first", "llm_phrase", "tts", "pacing")

# What each step can wait on; the critical one is the latest that happened
# before it. (The LLM's request starts after whichever of the decision's
# steps triggered it: the P(end) of a speculated reply, or the final.)
_DEPENDS: dict[str, tuple[str, ...]] = {
    "vad": ("speech_end",),
    "asr_pause": ("vad",),
    "p_end": ("asr_pause", "vad"),
    "decision": ("p_end", "asr_pause", "vad"),
    "asr_final": ("decision",),
    "release": ("asr_final", "decision"),
    "llm_request": ("release", "asr_final", "decision", "p_end", "asr_pause", "vad"),
    "llm_first": ("llm_request",),
    "llm_phrase": ("llm_first",),
    "tts": ("llm_phrase", "llm_first"),
    "pacing": ("release", "tts"),
}


@dataclass
class TurnTrace:
    """The stamps of one user turn and of the reply that answers it."""

    at: dict[str, float] = field(default_factory=dict)
    reply_id: str | None = None
    tokens: list[float] = field(default_factory=list)  # text deltas of the reply, before its audio

    def stamp(self, step: str, now: float, *, again: bool = False) -> None:
        """``step`` happened at ``now`` (the first time, unless ``again``: a
        step that can repeat, e.g. a newer P(end), keeps the last)."""
        if again or step not in self.at:
            self.at[step] = now

    def reply_started(self, response_id: str, now: float) -> None:
        """A reply's request went to the LLM: its outputs are traced from now
        (a reply discarded before it is replaced by this one)."""
        self.reply_id = response_id
        self.tokens = []
        for step in ("llm_first", "llm_phrase", "tts"):
            self.at.pop(step, None)
        self.stamp("llm_request", now, again=True)

    def text(self, response_id: str, now: float) -> None:
        if response_id == self.reply_id and "tts" not in self.at:
            self.tokens.append(now)
            self.stamp("llm_first", now)
            self.stamp("llm_phrase", now, again=True)

    def audio(self, response_id: str, now: float) -> None:
        if response_id == self.reply_id:
            self.stamp("tts", now)

    def path(self) -> list[tuple[str, float]]:
        """The critical path to the first audio sent, as (segment, seconds)
        from the speech's end; empty when it is not known (no end of speech,
        no audio)."""
        at = self.at
        if "pacing" not in at or "speech_end" not in at:
            return []
        walk, step = [], "pacing"
        while step != "speech_end":
            before = [d for d in _DEPENDS.get(step, ()) if d in at and at[d] <= at[step] + 1e-9]
            if not before:
                # a step with none of its own: it waited on the speech itself
                walk.append((step, max(0.0, at[step] - at["speech_end"])))
                break
            prev = max(before, key=lambda d: at[d])
            walk.append((step, max(0.0, at[step] - at[prev])))
            step = prev
        return walk[::-1]

    def first_phrase_ms(self) -> list[int]:
        """When each token of the first phrase came, ms after the first one."""
        return [round((t - self.tokens[0]) * 1000) for t in self.tokens] if self.tokens else []


def describe(path: list[tuple[str, float]]) -> str:
    """``"vad 120, asr_pause 210, ..."``: the path in whole ms, as metadata carries it."""
    return ", ".join(f"{step} {round(s * 1000)}" for step, s in path)
