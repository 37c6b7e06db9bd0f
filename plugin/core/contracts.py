"""Contracts between the control plane and model policies.

Policies return these plain, immutable values; the session executes them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


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


@dataclass(frozen=True)
class OutputDecision:
    """A policy's answer to one stage output."""

    emit: bool = True  # render as client events
    # The stage (by its name in the pipeline, e.g. "tts") that takes the
    # output next, with its fence and request id (text deltas -> TTS while
    # the LLM still writes); None: no stage.
    forward: str | None = None
    # Render this payload instead of the output's own (e.g. a transcript delta
    # computed from a revised ASR hypothesis); None: render the output itself.
    render: Any = None
    # Input the output causes (e.g. newly stable words pushed into the live
    # LLM request, or a rollback when ASR revised a pushed word); executed
    # after rendering, before commit/response handling.
    plan: AppendPlan | None = None
    commit_turn: bool = False  # server VAD end of turn: commit the input buffer
    create_response: bool = False  # ... and answer it
    interrupt: InterruptReason | None = None  # cancel the active response, bump epoch
    finish_response: bool = False  # the active response is complete
    # Adaptive interruptions (core/interruption.py): speech over the reply
    # pauses its output until the policy decides; ``dismiss`` ("backchannel"
    # or "noise") resumes it and forgets that speech.
    pause_output: bool = False
    dismiss: str | None = None


DROP = OutputDecision(emit=False)
EMIT = OutputDecision()


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
