"""Words as heard: the one normaliser for everything that compares what was said.

ASR writes the same speech in many ways -- "What is the capital?" in one
hypothesis, "what is the capital of France" in the next; "Mm-hmm.", "mm hmm",
"MMHMM" for one closed-mouth hum -- so words are compared in their *spoken*
form: casefolded, the punctuation around a word dropped, hyphens splitting words. The
transcript's stable-word logic (``models/cascade/transcript.py``), the
speculative reply's check that its words are the ones heard
(``session/speculation.py``) and backchannel matching (``domain/interruption.py``)
all use these functions, so they never disagree about what a word is.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_SPLIT = re.compile(r"[\s\-\u2010-\u2015]+")  # white space and hyphens/dashes split words
_EDGES = re.compile(r"^[^\w']+|[^\w']+$")  # punctuation around a word is not heard
# A hum: a word of nothing but m and h, with an m ("mhm", "mmhmm", "hmm", "hm"),
# or one letter of a spelled-out hum ("M-M-H-M"): how ASR writes a closed-mouth
# "mm-hmm" in many ways; no English word is made of these letters only.
_HUM = re.compile(r"h*m[mh]*|h")


def spoken_words(text: str) -> list[str]:
    """The words of ``text`` as heard: "Mm-hmm, France?" -> ["mm", "hmm", "france"]
    (punctuation inside a word stays: "3.5", "what's")."""
    return [w for w in (_EDGES.sub("", part) for part in _SPLIT.split(text.casefold())) if w]


def spoken(word: str) -> str:
    """One written word's spoken form ("France?" -> "france"; "" for "-" or "...")."""
    return " ".join(spoken_words(word))


def written_words(text: str) -> list[str]:
    """``text``'s words as written, without tokens that are only punctuation."""
    return [w for w in text.split() if spoken(w)]


def same_spoken(a: str | Sequence[str], b: str | Sequence[str]) -> bool:
    """Whether two texts (or written word lists) say the same words."""
    return _flat(a) == _flat(b)


def is_hum(word: str) -> bool:
    """A spoken word that is a hum ("mm", "hmm", "mhm") or a letter of one."""
    return _HUM.fullmatch(word) is not None


def _flat(text: str | Sequence[str]) -> list[str]:
    return spoken_words(text if isinstance(text, str) else " ".join(text))
