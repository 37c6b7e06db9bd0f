"""One road for a stage output: ``OutputChain``, the steps every output
walks.

Every stage output that reaches the session goes through the steps, in
their order, until one takes it:

==============  ===============================================================
``gate``        an output of an older fence is dropped and counted: the one
                place stale outputs die
``fatal``       a terminal stage failure (``engine_dead``) is shown, then the
                session ends, whatever the policy would have decided
``speculation`` phase ``ANSWER_HELD``, an output of the held reply: the policy
                decides it now (its text goes on to the TTS); the ``Reply``
                keeps it until it is claimed (``SessionCore.create_response``)
``turn_end``    semantic_vad: the VAD's end of speech is held while the pause is
                judged; ``P(end)`` and the words up to the pause are judged here
                (``pauses.py``; ``turn_end.py`` is the judge)
``policy``      everything else: the policy decides, the core applies it
==============  ===============================================================

Each step is given what it reads (the gate, the floor's phase and held
reply, the pause) and returns what the output asks for (``asks.py``: the
policy's steps, the held reply's keeping, a failure) or None to pass it on;
the core carries the asks out. The policy answers an output -- a stage
output, a pause observation the turn-end step hands it (``UserPaused``,
``UserResumed``), a speculated reply's output -- with steps in the session's
own vocabulary (``domain/contracts.py``: show, pause the reply, a plan,
interrupt, forward, commit, respond, dismiss, finish), which ``carry``
carries out in the order the policy gave them, by the same table as every
part's asks (``carrying.py``). A held output's ``ForwardTo`` is carried out
at once (its text must reach the TTS while the reply is held, so its audio
is ready at release; ``Hold``) and at release the rest of its steps
(``SessionCore.release``).
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.gate import FenceGate
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.payloads import AudioOut, StageFailed, StageOutput, TextDelta, ToolCall
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.session.asks import Decide, Discard, Fail, Hold, Steps
from vllm_duplex.session.effects import Close
from vllm_duplex.session.floor import Floor
from vllm_duplex.session.pauses import Pauses
from vllm_duplex.session.phase import Phase

# A step: what the output asks for, or None to pass it on.
Step = Callable[[StageOutput, SessionConfig, float], "Steps | None"]


class OutputChain:
    def __init__(self, gate: FenceGate, floor: Floor, pauses: Pauses, *, metrics: Metrics) -> None:
        self._gate = gate
        self._floor = floor
        self._pauses = pauses
        self._metrics = metrics
        self.steps: tuple[tuple[str, Step], ...] = (
            ("gate", self._admit),
            ("fatal", self._fatal),
            ("speculation", self._speculation),
            ("turn_end", pauses.take),
            ("policy", self._policy),
        )

    def walk(self, out: StageOutput, config: SessionConfig, now: float) -> Steps:
        """What ``out`` asks for, from the first step that takes it."""
        for _, step in self.steps:
            steps = step(out, config, now)
            if steps is not None:
                return steps
        raise AssertionError("the policy step takes every output")

    # ---- the steps ------------------------------------------------------------------

    def _admit(self, out: StageOutput, config: SessionConfig, now: float) -> Steps | None:
        if self._gate.admit(out):
            self._trace(out.payload, now)
            return None
        self._metrics.stale_dropped.inc(stage=out.stage)
        return []

    def _trace(self, p: object, now: float) -> None:
        """The reply's output as it arrives, held or not: its critical path's
        steps, in its trace (``critical_path.py``). (An output of a reply
        that ended is not traced: a void one's is dropped before this, and a
        completed or failed one's figures went out with its end.)"""
        kind = type(p)
        reply = self._floor.reply
        if reply is None or getattr(p, "response_id", None) != reply.id:
            return
        if kind is TextDelta or kind is ToolCall:
            reply.trace.text(reply.id, now)
        elif kind is AudioOut and p.pcm.size:  # type: ignore[attr-defined]
            reply.trace.audio(reply.id, now)

    @staticmethod
    def _fatal(out: StageOutput, config: SessionConfig, now: float) -> Steps | None:
        p = out.payload
        if type(p) is not StageFailed or not p.error.spec.terminal:
            return None
        return [Fail(p.error), Close(CloseReason(p.error.code))]

    def _speculation(self, out: StageOutput, config: SessionConfig, now: float) -> Steps | None:
        reply = self._floor.held
        if self._floor.phase.value is not Phase.ANSWER_HELD or reply is None or not reply.owns(out):
            return None
        if type(out.payload) is StageFailed:
            return [Discard()]  # it failed before anyone asked for it: quietly
        return [Hold(out)]

    @staticmethod
    def _policy(out: StageOutput, config: SessionConfig, now: float) -> Steps:
        return [Decide(out)]
