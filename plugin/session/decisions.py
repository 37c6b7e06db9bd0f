"""One road for a stage output: the chain every output walks, and the one
applier of the policy's ``OutputDecision``.

Every stage output that reaches the session goes through ``CHAIN``, in its
order, until a step takes it:

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
``policy``      everything else: the policy decides, ``apply`` carries it out
==============  ===============================================================

``apply`` carries out an ``OutputDecision`` -- for stage outputs, for the
pause observations the turn-end step hands the policy (``UserPaused``,
``UserResumed``) and for a speculated reply's outputs at release -- in one
fixed order: show, pause the output, the plan, interrupt, forward, commit,
respond, dismiss, finish. One part is carried out elsewhere: the speculation
step forwards a held output at once (its text must reach the TTS while the
reply is held, so its audio is ready at release) and keeps the decision;
at release ``apply`` does all the rest of it (``forwarded=True``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from vllm_duplex.core.close_reason import CloseReason
from vllm_duplex.core.contracts import OutputDecision
from vllm_duplex.core.payloads import AudioOut, StageFailed, StageOutput, TextDelta, ToolCall
from vllm_duplex.session import pauses
from vllm_duplex.session.effects import Close, Forward
from vllm_duplex.session.phase import Phase

if TYPE_CHECKING:
    from vllm_duplex.session.core import SessionCore

Step = Callable[["SessionCore", StageOutput], bool]  # True: the output was taken


def walk(core: SessionCore, out: StageOutput) -> None:
    """Hand ``out`` down the chain until a step takes it."""
    for _, step in CHAIN:
        if step(core, out):
            return


def decide(core: SessionCore, out: StageOutput) -> OutputDecision:
    """Ask the policy about ``out`` and carry out its answer."""
    decision = core.policy.decide_output(core, out)
    core.apply(out, decision)
    return decision


# ---- the steps ------------------------------------------------------------------


def _gate(core: SessionCore, out: StageOutput) -> bool:
    if core.gate.admit(out):
        _trace(core, out.payload)
        return False
    core.metrics.stale_dropped.inc(stage=out.stage)
    return True


def _trace(core: SessionCore, p: object) -> None:
    """A reply's output as it arrives, held or not: its critical path's
    steps (``critical_path.py``)."""
    kind = type(p)
    if kind is TextDelta or kind is ToolCall:
        core.latency.reply_text(p.response_id, core.now)  # type: ignore[attr-defined]
    elif kind is AudioOut and p.pcm.size:  # type: ignore[attr-defined]
        core.latency.reply_audio(p.response_id, core.now)  # type: ignore[attr-defined]


def _fatal(core: SessionCore, out: StageOutput) -> bool:
    p = out.payload
    if type(p) is not StageFailed or not p.error.spec.terminal:
        return False
    core.fail(p.error)
    core.effect(Close(CloseReason(p.error.code)))
    return True


def _speculation(core: SessionCore, out: StageOutput) -> bool:
    reply = core.floor.held
    if core.floor.phase.value is not Phase.ANSWER_HELD or reply is None or not reply.owns(out):
        return False
    if type(out.payload) is StageFailed:
        core.floor.discard()  # it failed before anyone asked for it: quietly
        return True
    decision = core.policy.decide_output(core, out)
    reply.keep(out, decision)
    if decision.forward is not None:  # e.g. its text is synthesized now, into the held buffer
        core.effect(Forward(out, decision.forward))
    return True


def _policy(core: SessionCore, out: StageOutput) -> bool:
    decide(core, out)
    return True


CHAIN: tuple[tuple[str, Step], ...] = (
    ("gate", _gate),
    ("fatal", _fatal),
    ("speculation", _speculation),
    ("turn_end", pauses.take),
    ("policy", _policy),
)


