"""Speculative replies: start answering at a pause, before the turn is sure.

When the user pauses and the words up to the pause are heard (under
``semantic_vad``: and the model finds them a complete turn, ``P(end) >=
SPECULATE_P``), the session asks for the reply at once -- the user's words
are already in the live request, so only the assistant prefix is prefilled
-- and its outputs are *held* instead of shown. The policy decides each of
them as they come, like any other (its text goes on to the TTS, so the audio
is made too); what the client would see of them waits in the reply:

* **used**: the turn commits, its final transcript says the same words, and
  the reply then asked for has exactly the context that was speculated on:
  the response starts, bound to the speculative request, and what was held
  is carried out at once, in order; the rest streams as usual.
* **discarded**: the user goes on speaking, the final transcript says other
  words, or anything else is answered first: one epoch bump (the fence gate
  drops whatever of it is still on the way, and the ``Cancel`` aborts its
  vLLM request); nothing of it ever reached the client.

A speculated reply is a ``Reply`` not yet shown (``reply.py``): the floor
starts it (``Floor.speculate``, asked by ``pauses.py`` through the core, which
builds its request), claims it (``Floor.respond``) or ends it unseen
(``End.DISCARDED``), and counts it in
``duplex_speculations_total{outcome=started|used|discarded}``. This module
holds the rule of when a pause is worth answering ahead, and when a reply
asked for may be the one speculated.
"""

from __future__ import annotations

from vllm_duplex.domain.payloads import ContextMessage
from vllm_duplex.domain.words import same_spoken

# P(end) from which a pause is worth answering ahead: the LLM is idle while
# the user pauses, and a held reply costs nothing the client sees, so any
# likely ending starts one ("what is the largest ocean": 0.04 with SmolLM2;
# a thinking pause, "what is the capital of": < 0.001). Below it the pause
# waits 650 ms or more (turn_end.needed_silence_ms).
SPECULATE_P = 0.01


def same_context(a: tuple[ContextMessage, ...], b: tuple[ContextMessage, ...]) -> bool:
    """Two contexts that ask the same: the user's words may differ in
    spelling, not in what was said."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.role != y.role:
            return False
        if x.text != y.text and not (x.role == "user" and same_spoken(x.text, y.text)):
            return False
    return True
