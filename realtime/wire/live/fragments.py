"""GPT-Live's input transcript fragments: what the last one says.

GPT-Live's input transcript is fragments only (``session.input_transcript.delta``,
no "completed", no revision); the codec sends the partial decode's stable
words as they come, and at the final transcript what they left out
(``final_rest``)."""

from __future__ import annotations


def final_rest(sent: str, final: str) -> str:
    """What of the final transcript the fragments sent did not say.

    GPT-Live's input transcript is fragments only (no "completed", no
    revision), and ours are the partial decode's stable words: the words the
    final alone hears (the turn's last ones, typically) would never reach the
    client. They follow as one more fragment: the final's text after what was
    sent when it goes on from it, else its words after as many words as were
    sent (a fragment cannot take back a word the final heard otherwise)."""
    if final.startswith(sent):
        return final[len(sent):]
    n = len(sent.split())
    rest = final.split()[n:]
    return (" " if n else "") + " ".join(rest) if rest else ""
