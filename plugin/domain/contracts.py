"""Contracts between the control plane and model policies.

Policies return these plain, immutable values; the session carries them out:
an ``AppendPlan`` for each input (``plan_append``), a sequence of steps
(``Show``, ``ForwardTo``, ``AppendPlan``, ``PauseReply``, ``Interrupt``,
``CommitTurn``, ``Respond``, ``Dismiss``, ``FinishReply``) for each stage
output (``decide_output``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:  # (domain/commands.py imports this module)
    from vllm_duplex.domain.commands import ResponseOptions


class InputMode(str, enum.Enum):
    """How an input reaches the model (docs/architecture.md "Input modes")."""

    APPEND_TOKENS = "append_tokens"
    APPEND_AUDIO_CHUNK = "append_audio_chunk"
    REPLACE_LATEST_CHUNK = "replace_latest_chunk"
    REENCODE_CONTEXT = "reencode_context"
    ROLLBACK_TO_CHECKPOINT = "rollback_to_checkpoint"
    TURN_COMMIT_ONLY = "turn_commit_only"


class FenceBump(str, enum.Enum):
    NONE = "none"
    EPOCH = "epoch"  # outputs in flight become stale
    INCARNATION = "incarnation"  # model state rebuilt: old stage requests are aborted


class InterruptReason(str, enum.Enum):
    """``status_details.reason`` of a cancelled response."""

    CLIENT_CANCELLED = "client_cancelled"
    TURN_DETECTED = "turn_detected"


@dataclass(frozen=True)
class StageSubmission:
    """Send ``payload`` to the stage called ``stage``; ``role`` names the
    request in its fenced request id."""

    stage: str
    payload: Any
    role: str = "in"


@dataclass(frozen=True)
class AppendPlan:
    """A policy's answer to one input: which mode, what to submit, and
    whether the fence must move first."""

    mode: InputMode
    submissions: tuple[StageSubmission, ...] = ()
    bump: FenceBump = FenceBump.NONE
    checkpoint: str | None = None


# ---- what a policy decides about a stage output -------------------------------------
#
# ``decide_output`` answers with a sequence of the steps below, carried out in
# the order given; an empty one drops the output. The session's own parts ask
# for the same things with the same steps (``Interrupt``, ``CommitTurn``,
# ``Respond``: plugin/session/asks.py), so one table carries them all out
# (plugin/session/carrying.py). What a step may do depends on where the
# session is (is a reply shown? is it paused by speech?); the session checks
# that, so a policy states what the output means and never mirrors the phase.


@dataclass(frozen=True, slots=True)
class Show:
    """Show the output to the client as its events (``render``: show this
    payload instead, e.g. a transcript delta computed from a revised ASR
    hypothesis)."""

    render: Any = None


@dataclass(frozen=True, slots=True)
class ForwardTo:
    """Send the output on to the stage called ``stage`` (e.g. ``"tts"``: text
    deltas are spoken while the LLM still writes), under its fence and
    request id."""

    stage: str


@dataclass(frozen=True, slots=True)
class PauseReply:
    """Speech over the reply: stop its output until an ``Interrupt`` or a
    ``Dismiss`` (adaptive interruptions, ``domain/interruption.py``)."""


@dataclass(frozen=True, slots=True)
class Interrupt:
    """Cut the reply shown (``reason``: its ``status_details.reason``); the
    fence moves, so nothing more of it reaches the client. Nothing when no
    reply is shown."""

    reason: InterruptReason


@dataclass(frozen=True, slots=True)
class CommitTurn:
    """The input buffer becomes a user item (server VAD's end of turn); the
    policy hears of it (``TurnCommitted``). Nothing when the buffer is empty."""


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the conversation with a response (``options``: None, the
    session's defaults). A policy's is skipped where a reply is shown already
    or the session only transcribes; the client's (``response.create``,
    ``client=True``) is refused there with an error event."""

    options: ResponseOptions | None = None
    client: bool = False


@dataclass(frozen=True, slots=True)
class Dismiss:
    """The speech that paused the reply was no turn (``reason``:
    ``"backchannel"`` or ``"noise"``): forget it and resume the reply where
    it was heard."""

    reason: str


@dataclass(frozen=True, slots=True)
class FinishReply:
    """The reply shown is generated to its end: ``response.done`` follows
    its last audio (and the end of any MCP call it made)."""


# One step of a policy's answer (``AppendPlan`` too: input the output causes,
# e.g. stable words pushed into the live LLM request, or a rollback).
PolicyStep: TypeAlias = (Show | ForwardTo | AppendPlan | PauseReply | Interrupt | CommitTurn
                         | Respond | Dismiss | FinishReply)

DROP: tuple[PolicyStep, ...] = ()  # the output is dropped: nothing shown, nothing caused
SHOW: tuple[PolicyStep, ...] = (Show(),)  # shown as it is, nothing else


@dataclass(frozen=True)
class TurnCommitted:
    """Policy input: the user's input buffer became conversation item
    ``item_id``; ``audio`` is that turn's PCM (int16, mono, 16 kHz) for
    turn-based models (``turn_commit_only``)."""

    item_id: str
    audio: Any = None


@dataclass(frozen=True)
class Capabilities:
    input_modes: frozenset[InputMode]
    input_modalities: frozenset[str] = frozenset({"audio", "text"})
    output_modalities: frozenset[str] = frozenset({"audio", "text"})
    turn_detection: frozenset[str] = frozenset({"server_vad"})
    early_output: bool = True  # partial transcripts / audio before the reply is complete
    tools: bool = False

    def supports(self, mode: InputMode) -> bool:
        return mode in self.input_modes

    def wire(self) -> dict[str, Any]:
        return {
            "input_modes": sorted(m.value for m in self.input_modes),
            "input_modalities": sorted(self.input_modalities),
            "output_modalities": sorted(self.output_modalities),
            "turn_detection": sorted(self.turn_detection),
            "early_output": self.early_output,
            "tools": self.tools,
        }


@dataclass(frozen=True)
class StageNeeds:
    """The stages a policy addresses, by name (a stage's role in the
    pipeline: ``vad``, ``asr``, ``llm``, ``tts``...). ``generator`` answers
    the session's ``GenerateRequest`` (every response); ``others`` are the
    rest. ``sends`` says what the policy hands each of them (submissions and
    forwarded outputs). A deployment whose pipeline lacks one of them, has
    two stages of one name, or has a stage that does not take what is sent
    to it is refused when it loads, not at a session's first audio chunk."""

    generator: str
    others: tuple[str, ...] = ()
    sends: Mapping[str, tuple[type, ...]] = field(default_factory=dict)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.generator, *(n for n in self.others if n != self.generator))

    def missing(self, present: Iterable[str]) -> list[str]:
        have = set(present)
        return [name for name in self.names if name not in have]


@dataclass(frozen=True)
class SamplingConfig:
    """Engine-neutral sampling parameters; the vLLM stage maps them onto
    ``SamplingParams``."""

    temperature: float = 0.0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
