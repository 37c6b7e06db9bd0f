"""``ScriptedPolicy``: a cascade policy over the scripted stages.

Pure: every method is a function of (session view, input) with no I/O and no
awaits; it keeps no per-session state. Stage names follow the scripted
pipeline: ``vad``, ``llm`` (answers responses), ``tts``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_duplex.domain.commands import ResponseOptions
from vllm_duplex.domain.contracts import (
    DROP,
    SHOW,
    AppendPlan,
    Capabilities,
    CommitTurn,
    FinishReply,
    ForwardTo,
    InputMode,
    Interrupt,
    InterruptReason,
    PolicyStep,
    Respond,
    SamplingConfig,
    Show,
    StageNeeds,
    StageSubmission,
    TurnCommitted,
)
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import (
    AudioIn,
    AudioOut,
    GenerateRequest,
    GenerationDone,
    SpeechDone,
    StageFailed,
    StageOutput,
    TextDelta,
    TextIn,
    ToolCall,
    TranscriptDelta,
    TranscriptFinal,
    VadConfig,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.policy import NoState, PolicyBase, SessionView

VAD_STAGE, LLM, TTS = "vad", "llm", "tts"
_NEEDS = StageNeeds(generator=LLM, others=(VAD_STAGE, TTS),
                    sends={VAD_STAGE: (AudioIn, VadConfig), LLM: (GenerateRequest,),
                           TTS: (TextDelta, GenerationDone)})

_CAPABILITIES = Capabilities(
    input_modes=frozenset(
        {InputMode.APPEND_AUDIO_CHUNK, InputMode.APPEND_TOKENS, InputMode.TURN_COMMIT_ONLY}
    ),
    input_modalities=frozenset({"audio", "text"}),
    output_modalities=frozenset({"audio", "text"}),
    turn_detection=frozenset({"server_vad"}),
    early_output=True,
    tools=False,
)


class ScriptedPolicy(PolicyBase[NoState]):
    name = "scripted"

    def __init__(self, **options: Any) -> None:
        # Deployment configs may pass options meant for other policies of the
        # same pipeline; unknown ones are ignored rather than fatal.
        self.reply: str | None = options.get("reply")
        self.options = dict(options)

    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    def stage_needs(self) -> StageNeeds:
        return _NEEDS

    def configure_sampling_params(
        self, view: SessionView, options: ResponseOptions
    ) -> SamplingConfig:
        max_tokens = options.max_output_tokens
        if max_tokens is None:
            max_tokens = view.config.max_output_tokens
        return SamplingConfig(temperature=view.config.temperature, max_tokens=max_tokens)

    def plan_append(self, view: SessionView, payload: Any) -> AppendPlan:
        if isinstance(payload, AudioIn):
            if view.config.turn_detection is None:
                # Manual turns: audio only accumulates in the session buffer
                # until input_audio_buffer.commit.
                return AppendPlan(InputMode.APPEND_AUDIO_CHUNK)
            return AppendPlan(
                InputMode.APPEND_AUDIO_CHUNK, (StageSubmission(VAD_STAGE, payload, "audio"),)
            )
        if isinstance(payload, VadConfig):
            return AppendPlan(
                InputMode.APPEND_AUDIO_CHUNK, (StageSubmission(VAD_STAGE, payload, "vad-config"),)
            )
        if isinstance(payload, TextIn):
            return AppendPlan(InputMode.APPEND_TOKENS)
        if isinstance(payload, TurnCommitted):
            return AppendPlan(InputMode.TURN_COMMIT_ONLY)
        raise DuplexError(
            "capability_unsupported",
            f"policy {self.name!r} cannot take {type(payload).__name__} input",
        )

    def decide_output(self, view: SessionView, output: StageOutput) -> Sequence[PolicyStep]:
        payload = output.payload
        speaks = "audio" in view.output_modalities
        td = view.config.turn_detection
        if isinstance(payload, VadSpeechStarted):
            if td is None:
                return DROP  # turn detection was switched off: a leftover event
            barge_in = td.interrupt_response and view.active_response_id is not None
            return [Show(), Interrupt(InterruptReason.TURN_DETECTED)] if barge_in else SHOW
        if isinstance(payload, VadSpeechStopped):
            if td is None:
                return DROP
            return [Show(), CommitTurn(), *([Respond()] if td.create_response else [])]
        if isinstance(payload, TextDelta):
            return [Show(), ForwardTo(TTS)] if speaks else SHOW
        if isinstance(payload, GenerationDone):
            # Text-only responses end with the text; spoken ones end when TTS
            # has spoken the last sentence (SpeechDone).
            return [Show(), ForwardTo(TTS)] if speaks else [Show(), FinishReply()]
        if isinstance(payload, SpeechDone):
            return [Show(), FinishReply()]
        if isinstance(payload, (AudioOut, StageFailed, TranscriptDelta, TranscriptFinal, ToolCall)):
            return SHOW
        return DROP
