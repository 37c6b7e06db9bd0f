"""How a session takes speech over its own reply, and how its audio is paced
(duplex extensions of ``session.update``; docs/api.md "Interruptions and
pacing").

``interruption``: ``immediate`` is OpenAI's behaviour (speech onset cancels the
reply). ``adaptive`` pauses the reply at onset and decides from what follows:
real words, or speech longer than ``min_speech_ms``, cancel it
(``turn_detected``, the heard part kept); a backchannel ("okay", "mm-hmm")
or a noise burst is dismissed and the reply resumes where it paused.

``pacing``: ``none`` (the socket's default) sends audio as fast as it is
made, as OpenAI does: the client plays it and truncates what it did not play.
``realtime`` sends audio at playback speed plus at most ``lead_ms`` ahead, so
the server knows what was heard and an interruption has little already-sent
audio to take back: the default where the server itself plays the audio (a
WebRTC track, a phone call: ``PACED``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from vllm_duplex.domain.words import is_hum, spoken_words

INTERRUPTION_MODES = ("adaptive", "immediate")
PACING_TYPES = ("realtime", "none")

# Listener feedback that is not a turn (LiveKit's and Pipecat's lists agree
# on these); multi-word entries match as a whole ("i see").
DEFAULT_BACKCHANNELS: tuple[str, ...] = (
    "okay", "ok", "uh-huh", "mm-hmm", "mhm", "mm", "hmm", "yeah", "yes", "yep", "yup",
    "right", "sure", "alright", "i see", "got it", "cool", "nice", "wow", "oh", "ah",
)

MAX_BACKCHANNELS = 64  # entries
MAX_BACKCHANNEL_CHARS = 32  # per entry
MAX_MIN_SPEECH_MS = 10_000
MAX_LEAD_MS = 5_000


@dataclass(frozen=True)
class Interruption:
    mode: str = "adaptive"
    min_speech_ms: int = 800  # speech this long cancels the reply even without words
    backchannels: tuple[str, ...] = DEFAULT_BACKCHANNELS

    def wire(self) -> dict:
        return {"mode": self.mode, "min_speech_ms": self.min_speech_ms,
                "backchannels": list(self.backchannels)}


@dataclass(frozen=True)
class OutputPacing:
    type: str = "none"
    lead_ms: int = 300  # with "realtime": the most audio the client may hold unplayed

    def wire(self) -> dict:
        return {"type": self.type, "lead_ms": self.lead_ms}


# Where the server plays the reply itself (WebRTC's track, SIP's RTP, Twilio's
# media stream), it paces it: the call's player knows what was heard, and an
# adaptive interruption's pause holds audio that was not yet sent.
PACED = OutputPacing("realtime")


def is_backchannel(text: str | Sequence[str], backchannels: Iterable[str]) -> bool:
    """Whether ``text`` (or its words) is nothing but backchannels and hums,
    e.g. "Okay.", "yeah, right" or "MMHMM" -- not "okay stop" and not "" (no
    words is noise, not a backchannel)."""
    words = spoken_words(text if isinstance(text, str) else " ".join(text))
    if not words or all(w == "h" for w in words):
        return False
    phrases = sorted({tuple(spoken_words(b)) for b in backchannels if spoken_words(b)},
                     key=len, reverse=True)
    i = 0
    while i < len(words):
        if is_hum(words[i]):
            i += 1
            continue
        for phrase in phrases:
            if tuple(words[i:i + len(phrase)]) == phrase:
                i += len(phrase)
                break
        else:
            return False
    return True
