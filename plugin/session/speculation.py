"""Speculative replies: start answering at a pause, before the turn is sure.

Under ``semantic_vad``, when the user pauses and the model already finds the
words a complete turn (``P(end) >= SPECULATE_P``), the session asks for the
reply at once -- the user's words are already in the live request, so only
the assistant prefix is prefilled -- and its output (the text and, through
the TTS, the audio) goes into a *held* buffer instead of to the client:

* **used**: the turn commits and the reply the client asks for has exactly
  the context that was speculated on (the final transcript says the same
  words): the response starts, bound to the speculative request, and what
  was held is released at once, in order; the rest streams as usual.
* **discarded**: the user goes on speaking, the final transcript says other
  words, or anything else is answered first: one epoch bump (the fence gate
  drops whatever of it is still on the way, and the ``Cancel`` aborts its
  vLLM request); nothing of it ever reached the client.

Sans-I/O like the rest of the core: effects through ``core``; counted in
``duplex_speculations_total{outcome=started|used|discarded}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vllm_duplex.core import commands as cmd
from vllm_duplex.core.conversation import context_messages
from vllm_duplex.core.payloads import (
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    StageFailed,
    StageOutput,
    TextDelta,
)
from vllm_duplex.session.effects import Forward, Submit

if TYPE_CHECKING:
    from vllm_duplex.session.core import SessionCore

SPECULATE_P = 0.1  # P(end) from which a pause is worth answering ahead

_NOT_SPOKEN = re.compile(r"[^\w' ]+")


def spoken_words(text: str) -> list[str]:
    """Words as heard: case and punctuation do not matter ("France?" is "france")."""
    return _NOT_SPOKEN.sub(" ", text).casefold().split()


@dataclass
class Held:
    """A speculative reply in flight and what it produced so far."""

    response_id: str
    request_id: str
    words: str  # the user's words it answers
    context: tuple[ContextMessage, ...]
    outputs: list[StageOutput] = field(default_factory=list)
    committed: bool = False  # the turn it answers was committed: the next reply is it


class Speculation:
    def __init__(self) -> None:
        self.held: Held | None = None

    def start(self, core: SessionCore, words: str) -> None:
        """Answer ``words`` (the user's turn so far) ahead of the commit."""
        td = core.config.turn_detection
        if (self.held is not None or core.response is not None or not words.strip()
                or not core.config.responds or td is None or not td.create_response or core.generator not in core.stage_names):
            return
        options = cmd.ResponseOptions()
        context = _answering(core, words)
        fence = core.fence
        held = Held(core.make_id("resp"), fence.request_id("llm"), words, context)
        sampling = core.policy.configure_sampling_params(core, options)
        request = GenerateRequest(response_id=held.response_id, context=context, sampling=sampling,
                                  tools=core.config.tools, tool_choice=core.config.tool_choice)
        self.held = held
        core.metrics.speculations.inc(outcome="started")
        core.effect(Submit(core.generator, fence, "llm", request))

    def hold(self, core: SessionCore, out: StageOutput) -> bool:
        """Keep ``out`` when it belongs to the speculative reply; True: taken."""
        held = self.held
        if held is None:
            return False
        p = out.payload
        if getattr(p, "response_id", None) != held.response_id:
            if type(p) is StageFailed and out.request_id == held.request_id and not p.error.spec.terminal:
                self.discard(core)  # it failed before anyone asked for it: quietly
                return True
            return False
        held.outputs.append(out)
        if type(p) in (TextDelta, GenerationDone) and "audio" in core.config.output_modalities:
            core.effect(Forward(out))  # synthesized now, into the held buffer
        return True

    def release(self, core: SessionCore) -> None:
        """The turn was committed: the speculation becomes the reply now (its
        held output goes out at once) -- unless the conversation changed under
        it, then it is discarded and the reply waits for the transcript.
        The final transcript still checks it (the policy cancels a reply to
        words the final revised)."""
        held = self.held
        if held is None or core.response is not None:
            return
        if _answering(core, held.words) != held.context:
            self.discard(core)
            return
        held.committed = True
        core.create_response(cmd.ResponseOptions())

    def claim(self, core: SessionCore, context: tuple[ContextMessage, ...]) -> Held | None:
        """The speculation a reply with ``context`` may use (its words are the
        ones heard, or its turn was just committed), else None -- and any
        other speculation is discarded."""
        held = self.held
        if held is None:
            return None
        if held.committed or _same_context(held.context, context):
            self.held = None
            core.metrics.speculations.inc(outcome="used")
            return held
        self.discard(core)
        return None

    def discard(self, core: SessionCore) -> bool:
        """One epoch bump: nothing of it reaches the client, its request is
        aborted. False: there was none."""
        if self.held is None:
            return False
        self.held = None
        core.metrics.speculations.inc(outcome="discarded")
        core.bump_epoch()
        return True


def _answering(core: SessionCore, words: str) -> tuple[ContextMessage, ...]:
    """The context of a reply to ``words`` after the conversation so far."""
    messages = (*context_messages(core.conversation, core.config.instructions),
                ContextMessage("user", words))
    return core.policy.shape_context(core, messages)


def _same_context(a: tuple[ContextMessage, ...], b: tuple[ContextMessage, ...]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.role != y.role:
            return False
        if x.text != y.text and not (x.role == "user" and spoken_words(x.text) == spoken_words(y.text)):
            return False
    return True
