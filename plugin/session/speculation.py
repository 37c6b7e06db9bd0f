"""Speculative replies: start answering at a pause, before the turn is sure.

When the user pauses and the words up to the pause are heard (under
``semantic_vad``: and the model finds them a complete turn, ``P(end) >=
SPECULATE_P``), the session asks for the reply at once -- the user's words
are already in the live request, so only the assistant prefix is prefilled
-- and its output goes into a *held* buffer instead of to the client. The policy decides each of its outputs as
they come, like any other (its text goes on to the TTS, so the audio is made
too); what the client would see of them waits here:

* **used**: the turn commits, its final transcript says the same words, and
  the reply then asked for has exactly the context that was speculated on:
  the response starts, bound to the speculative request, and what was held
  is carried out at once, in order; the rest streams as usual.
* **discarded**: the user goes on speaking, the final transcript says other
  words, or anything else is answered first: one epoch bump (the fence gate
  drops whatever of it is still on the way, and the ``Cancel`` aborts its
  vLLM request); nothing of it ever reached the client.

Pure state: the session core starts, claims and discards it
(``core.py``), and counts it in
``duplex_speculations_total{outcome=started|used|discarded}``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm_duplex.core.contracts import OutputDecision
from vllm_duplex.core.payloads import ContextMessage, StageFailed, StageOutput
from vllm_duplex.core.words import same_spoken

# P(end) from which a pause is worth answering ahead: the LLM is idle while
# the user pauses, and a held reply costs nothing the client sees, so any
# likely ending starts one ("what is the largest ocean": 0.04 with SmolLM2;
# a thinking pause, "what is the capital of": < 0.001). Below it the pause
# waits 650 ms or more (turn_end.needed_silence_ms).
SPECULATE_P = 0.01


@dataclass
class Held:
    """A speculative reply in flight and what it produced so far, each output
    with the policy's decision about it."""

    response_id: str
    request_id: str
    words: str  # the user's words it answers
    context: tuple[ContextMessage, ...]
    outputs: list[tuple[StageOutput, OutputDecision]] = field(default_factory=list)


class Speculation:
    """At most one held reply per session."""

    def __init__(self) -> None:
        self.held: Held | None = None

    def owns(self, out: StageOutput) -> bool:
        """``out`` belongs to the held reply: its text, audio and end, or the
        failure of its request."""
        held = self.held
        if held is None:
            return False
        p = out.payload
        return (getattr(p, "response_id", None) == held.response_id
                or (type(p) is StageFailed and out.request_id == held.request_id))

    def keep(self, out: StageOutput, decision: OutputDecision) -> None:
        assert self.held is not None
        self.held.outputs.append((out, decision))

    def claim(self, context: tuple[ContextMessage, ...]) -> Held | None:
        """The held reply, taken, when a reply with ``context`` may use it (the
        same conversation, and the words it answers are the ones heard); else None."""
        held = self.held
        if held is not None and same_context(held.context, context):
            self.held = None
            return held
        return None

    def drop(self) -> bool:
        """Forget the held reply; False: there was none."""
        held, self.held = self.held, None
        return held is not None


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
