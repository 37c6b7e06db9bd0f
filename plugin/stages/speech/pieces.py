"""Cutting a reply's text into speakable pieces as it streams in.

A TTS stage speaks a reply piece by piece, each as soon as it is complete
(``streaming_tts.py``): the reply's first piece is its first phrase -- its
first clause mark or its first ``first_words`` words -- so the first audio
follows the reply's first words, not its first sentence; the pieces after it
are sentences, long ones cut into clauses. Pure functions of the text: what
is ready to speak in a buffer, never how it is spoken.
"""

from __future__ import annotations

import re

# Terminal punctuation (and closing quotes/brackets) followed by whitespace:
# waiting for the whitespace keeps "3.5" and "e.g" in one piece.
_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+")
_WORD = re.compile(r"\S+\s+")
_CLAUSE_PUNCT = (",", ";", ":", "-", "\u2013", "\u2014")


def first_piece(buffer: str, first_words: int, clause_words: int, *, final: bool = False) -> int:
    """Length of the reply's first piece in ``buffer`` (0: none yet): up to its
    first sentence end, or first clause mark with 2+ words before it, else its first
    ``first_words`` complete words -- so the first audio waits for a few words,
    never for the whole first sentence. ``first_words`` 0: no early cut (the
    first piece is cut like the others, ``next_piece``)."""
    if first_words <= 0:
        return next_piece(buffer, clause_words, final=final)
    words = list(_WORD.finditer(buffer))
    for i, w in enumerate(words[:first_words]):
        if _SENTENCE_END.search(w.group()):  # "Yes. ...": a short sentence is a phrase
            return w.end()
        if i >= 1 and w.group().rstrip().endswith(_CLAUSE_PUNCT):
            return w.end()
    if len(words) >= first_words:
        return words[first_words - 1].end()
    return len(buffer) if final else 0


def next_piece(buffer: str, clause_words: int, *, final: bool = False) -> int:
    """Length of the leading part of ``buffer`` that is ready to speak (0: none yet).

    A sentence is ready at its end punctuation. A long one (``clause_words``
    complete words or more) is cut earlier, after its last clause
    punctuation (comma, semicolon, colon, dash) that has 3+ words before it;
    without any, at ``2 * clause_words`` words. ``final``: the text is over,
    so whatever is left is ready.
    """
    m = _SENTENCE_END.search(buffer)
    end = m.end() if m else (len(buffer) if final else 0)
    region = buffer[:end] if end else buffer
    words = list(_WORD.finditer(region))
    if len(words) >= clause_words:
        cuts = [w.end() for i, w in enumerate(words[:-1])
                if i >= 2 and w.group().rstrip().endswith(_CLAUSE_PUNCT)]
        if cuts:
            return cuts[-1]
    if end:
        return end
    if len(words) >= 2 * clause_words:
        return words[-1].end()
    return 0
