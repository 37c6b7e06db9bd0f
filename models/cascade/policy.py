"""``CascadePolicy``: the embedded default (docs/turn-taking.md).

Pure: functions of (session view, input) with no I/O and no awaits; what it
must remember per session is a ``CascadeState`` in ``view.policy_state``.

While the user speaks, ASR partials become transcription deltas, and each word
that stayed stable is pushed into the live vLLM request (``append_tokens``),
so at end of turn only the assistant prefix is left to prefill. When the ASR
revises a word already pushed, the policy plans ``rollback_to_checkpoint``:
a new incarnation, the model context rebuilt from the conversation as it was
at the start of the turn, and the stable words pushed again. Sentences stream
into TTS as the LLM writes them; speech onset during a reply interrupts it.

Stage names: ``vad``, ``asr``, ``llm``, ``tts`` (configs/cascade-cpu.yaml), and
``vision`` with ``policy_options: {vision: true}`` (configs/cascade-video-cpu.yaml):
camera frames go to it, and its newest scene description is the model's
camera context.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_duplex.domain.commands import DuplexInput, ResponseOptions
from vllm_duplex.domain.contracts import (
    DROP,
    SHOW,
    AppendPlan,
    Capabilities,
    CommitTurn,
    Dismiss,
    FenceBump,
    FinishReply,
    ForwardTo,
    InputMode,
    Interrupt,
    InterruptReason,
    PauseReply,
    PolicyStep,
    Respond,
    SamplingConfig,
    Show,
    StageNeeds,
    StageSubmission,
    TurnCommitted,
)
from vllm_duplex.domain.conversation import context_messages
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.interruption import is_backchannel
from vllm_duplex.domain.payloads import (
    AsrConfig,
    AudioIn,
    AudioOut,
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    ResetContext,
    SceneDescription,
    SpeechDone,
    StageFailed,
    StageOutput,
    TextDelta,
    TextIn,
    ToolCall,
    TranscriptDelta,
    TranscriptFinal,
    TranscriptPartial,
    UserPaused,
    UserResumed,
    VadConfig,
    VadSpeechStarted,
    VadSpeechStopped,
    VideoFrame,
)
from vllm_duplex.models.cascade.transcript import (
    Utterance,
    extends,
    same_words,
    unclosed,
    words,
)
from vllm_duplex.policy import PolicyBase, SessionView

VAD, ASR, LLM, TTS, VISION = "vad", "asr", "llm", "tts", "vision"


@dataclass
class CascadeState:
    """What the cascade remembers of one session. None of it copies the
    session's phase (the policy reads that: ``view.active_response_id``,
    ``view.output_paused``, ``view.user_speaking``): ``turn_open`` is the live
    LLM request's content; ``paused`` lasts from the pause to the final
    transcript, past the session's pause (closed at the end of speech), so a
    late answer of the ASR to the pause is still taken whole;
    ``awaiting_final`` is a VAD commit only (a client's commit gets no reply
    from the policy); ``deferred_commit`` is speech that ended over a paused
    reply, not committed yet."""

    utterance: Utterance = field(default_factory=Utterance)  # the user's words in flight
    turn_open: bool = False  # the live LLM request holds the start of a user turn
    awaiting_final: bool = False  # committed by VAD; respond when the transcript lands
    paused: bool = False  # semantic_vad: the user is in a pause (no word is still being heard)
    # Speech over a paused reply ended: commit (or dismiss) when the final
    # transcript says whether it was a turn (adaptive interruptions).
    deferred_commit: bool = False
    scene: str | None = None  # the newest scene description (camera context)


View = SessionView[CascadeState]

_CAPABILITIES = Capabilities(
    input_modes=frozenset({
        InputMode.APPEND_AUDIO_CHUNK,
        InputMode.APPEND_TOKENS,
        InputMode.TURN_COMMIT_ONLY,
        InputMode.ROLLBACK_TO_CHECKPOINT,
        InputMode.REENCODE_CONTEXT,
    }),
    input_modalities=frozenset({"audio", "text"}),
    output_modalities=frozenset({"audio", "text"}),
    turn_detection=frozenset({"server_vad", "semantic_vad"}),
    early_output=True,
    tools=True,
)

# A spoken reply should be short; the client can ask for more.
DEFAULT_MAX_TOKENS = 96


class CascadePolicy(PolicyBase[CascadeState]):
    name = "cascade"

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS, vision: bool = False, **_: Any) -> None:
        self.max_tokens = max_tokens
        # With a ``vision`` stage in the pipeline: camera frames and images are
        # described by it, and the newest description rides along as context.
        self.vision = vision
        self._caps = _CAPABILITIES if not vision else replace(
            _CAPABILITIES, input_modes=_CAPABILITIES.input_modes | {InputMode.REPLACE_LATEST_CHUNK},
            input_modalities=_CAPABILITIES.input_modalities | {"video", "image"})

    def capabilities(self) -> Capabilities:
        return self._caps

    def stage_needs(self) -> StageNeeds:
        sends: dict[str, tuple[type, ...]] = {
            VAD: (AudioIn, VadConfig),
            ASR: (AudioIn, AsrConfig, VadSpeechStarted, VadSpeechStopped, UserPaused),
            LLM: (TextIn, ResetContext, GenerateRequest),
            TTS: (TextDelta, GenerationDone),
        }
        if self.vision:
            sends[VISION] = (VideoFrame,)
        return StageNeeds(generator=LLM, others=tuple(n for n in sends if n != LLM), sends=sends)

    def new_state(self) -> CascadeState:
        return CascadeState()

    def shape_context(self, view: View,
                      messages: tuple[ContextMessage, ...]) -> tuple[ContextMessage, ...]:
        """The model sees the newest scene after the conversation: appended
        last, it never changes the prefix the live request already holds, and
        an older scene never reaches the model (``replace_latest_chunk``)."""
        scene = view.policy_state.scene
        if not scene:
            return messages
        return (*messages, ContextMessage("system", f"The user's camera shows: {scene}."))

    def configure_sampling_params(self, view: View, options: ResponseOptions) -> SamplingConfig:
        limit = options.max_output_tokens or view.config.max_output_tokens or self.max_tokens
        return SamplingConfig(temperature=view.config.temperature, max_tokens=limit)

    # ---- input ---------------------------------------------------------------

    def plan_append(self, view: View, payload: Any) -> AppendPlan:
        if isinstance(payload, AudioIn):
            # The ASR hears everything; it cuts utterances at the VAD's events.
            # With echo cancellation the VAD hears the chunk with what is left
            # of the echo turned down (AudioIn.vad_pcm); the ASR the user's words
            # ungated (media/echo.py: the linear filter's view).
            asr = (StageSubmission(ASR, payload, "in"),)
            if view.config.turn_detection is None:
                return AppendPlan(InputMode.APPEND_AUDIO_CHUNK, asr)
            return AppendPlan(InputMode.APPEND_AUDIO_CHUNK,
                              (StageSubmission(VAD, payload.for_vad(), "in"), *asr))
        if isinstance(payload, VadConfig):
            return AppendPlan(InputMode.APPEND_AUDIO_CHUNK, (StageSubmission(VAD, payload, "in"),))
        if isinstance(payload, AsrConfig):
            return AppendPlan(InputMode.APPEND_AUDIO_CHUNK, (StageSubmission(ASR, payload, "in"),))
        if isinstance(payload, VideoFrame):
            if not self.vision:
                raise DuplexError("capability_unsupported", "this deployment takes no video "
                                  "(no vision stage)", param="type")
            # Only the newest frame matters: the vision stage replaces any
            # frame still waiting with it.
            return AppendPlan(InputMode.REPLACE_LATEST_CHUNK, (StageSubmission(VISION, payload, "in"),))
        if isinstance(payload, TextIn):
            # A typed user message: it is already an item, so the next
            # GenerateRequest carries it; nothing to stream ahead.
            return AppendPlan(InputMode.APPEND_TOKENS)
        if isinstance(payload, TurnCommitted):
            return AppendPlan(InputMode.TURN_COMMIT_ONLY)
        if isinstance(payload, DuplexInput) and payload.mode in (
                InputMode.REENCODE_CONTEXT, InputMode.ROLLBACK_TO_CHECKPOINT):
            # Rebuild the model context from the canonical conversation.
            view.policy_state.turn_open = False
            return AppendPlan(payload.mode, (self._reset(view),), bump=FenceBump.INCARNATION,
                              checkpoint=payload.checkpoint)
        raise DuplexError("capability_unsupported",
                          f"policy {self.name!r} cannot take {type(payload).__name__} input")

    def _reset(self, view: View) -> StageSubmission:
        """Make the live LLM request hold exactly the conversation so far."""
        context = context_messages(view.items, view.config.instructions)
        return StageSubmission(LLM, ResetContext(context, view.config.truncation), "llm")

    # ---- output --------------------------------------------------------------

    def decide_output(self, view: View, output: StageOutput) -> Sequence[PolicyStep]:
        decide = _OUTPUTS.get(type(output.payload))
        return decide(self, view, output.payload) if decide is not None else DROP

    def _on_speech_started(self, view: View, p: VadSpeechStarted) -> Sequence[PolicyStep]:
        td = view.config.turn_detection
        if td is None:
            return DROP
        state = view.policy_state
        state.utterance = Utterance()
        state.awaiting_final = state.paused = False
        state.deferred_commit = False
        barge_in = td.interrupt_response and view.active_response_id is not None
        if barge_in and view.config.interruption.mode == "adaptive":
            # pause now; the words (or how long it lasts) decide
            return [Show(), PauseReply(), ForwardTo(ASR)]
        if barge_in:
            return [Show(), Interrupt(InterruptReason.TURN_DETECTED), ForwardTo(ASR)]
        return [Show(), ForwardTo(ASR)]

    def _on_speech_stopped(self, view: View, p: VadSpeechStopped) -> Sequence[PolicyStep]:
        if view.config.turn_detection is None:
            return DROP
        state = view.policy_state
        state.awaiting_final = True
        if view.output_paused:
            state.deferred_commit = True  # a backchannel must not become a turn
            return [Show(), ForwardTo(ASR)]
        # Commit now (OpenAI order: speech_stopped, committed); the reply
        # waits for the final transcript, which the ASR sends next.
        return [Show(), ForwardTo(ASR), CommitTurn()]

    def _on_scene(self, view: View, p: SceneDescription) -> Sequence[PolicyStep]:
        view.policy_state.scene = p.text
        return SHOW

    def _on_resumed(self, view: View, p: UserResumed) -> Sequence[PolicyStep]:
        view.policy_state.paused = False
        plan = self._rehold(view) if p.speculation_discarded else None
        return [plan] if plan is not None else DROP

    def _on_text(self, view: View, p: TextDelta) -> Sequence[PolicyStep]:
        return self._spoken(view)

    def _on_generation_done(self, view: View, p: GenerationDone) -> Sequence[PolicyStep]:
        view.policy_state.turn_open = False  # the reply closed the turn in the live request
        return self._spoken(view) + ([] if self._speaks(view) else [FinishReply()])

    def _shown(self, view: View, p: Any) -> Sequence[PolicyStep]:
        return SHOW  # a tool call, the reply's audio, a stage failure: shown as is

    def _on_speech_done(self, view: View, p: SpeechDone) -> Sequence[PolicyStep]:
        return [Show(), FinishReply()]

    @staticmethod
    def _speaks(view: View) -> bool:
        return "audio" in view.output_modalities

    @classmethod
    def _spoken(cls, view: View) -> list[PolicyStep]:
        """Reply text shown, and sent on to the TTS when the reply is spoken."""
        return [Show(), ForwardTo(TTS)] if cls._speaks(view) else [Show()]

    def _on_partial(self, view: View, p: TranscriptPartial) -> Sequence[PolicyStep]:
        utt = view.policy_state.utterance
        hypothesis = words(p.text)
        stable = utt.update(hypothesis)
        paused = view.policy_state.paused
        if paused:  # in a pause every word was heard whole
            stable = hypothesis = unclosed(hypothesis)
        return self._on_stable(view, utt, hypothesis, stable, extend=not paused or _judged(view))

    def _on_stable(self, view: View, utt: Utterance, hypothesis: list[str],
                   stable: list[str], *, extend: bool = True,
                   also: tuple[StageSubmission, ...] = ()) -> list[PolicyStep]:
        """Show the words that became stable, push them (``also``: more to
        submit with the push), and cut a paused reply that real words are
        spoken over."""
        steps: list[PolicyStep] = []
        if extends(utt.shown, stable):
            new_words = stable[len(utt.shown):]
            steps.append(Show(TranscriptDelta((" " if utt.shown else "") + " ".join(new_words))))
            utt.shown = stable
        plan = self._push(view, utt, hypothesis, stable, extend=extend)
        if also:
            plan = (AppendPlan(InputMode.APPEND_AUDIO_CHUNK, also) if plan is None
                    else replace(plan, submissions=(*plan.submissions, *also)))
        if plan is not None:
            steps.append(plan)
        # Words over a paused reply that are not a backchannel: a real turn.
        if (view.output_paused and stable
                and not is_backchannel(stable, view.config.interruption.backchannels)):
            steps.append(Interrupt(InterruptReason.TURN_DETECTED))
        return steps

    def _on_pause(self, view: View, pause: UserPaused) -> Sequence[PolicyStep]:
        """The VAD heard a pause: the last word is no longer being heard, so
        the whole newest hypothesis is stable. Under semantic_vad it is pushed
        now: the model judges the whole phrase (its P(end) decides how long
        the session waits) and a reply would start from all of it. Under
        server_vad nothing is judged, so nothing is pushed (a revised word is
        still rolled back): the reply started in the pause carries the last
        words with its assistant prefix (one vLLM step, where a push first
        was two). The ASR is asked for every
        word up to the pause as well: the newest hypothesis may be older than
        the last word (a busy CPU's partials lag), and the session judges the
        pause on the ASR's answer (a partial ``at_pause``, taken the same way)."""
        state = view.policy_state
        state.paused = True
        hypothesis = unclosed(state.utterance.previous)
        td = view.config.turn_detection
        if td is not None and not td.semantic:
            # The turn ends only after server_vad's silence: time enough for
            # the ASR to hear the words again with the audio after them.
            pause = replace(pause, turn_end_silence_ms=td.silence_duration_ms)
        return self._on_stable(view, state.utterance, hypothesis, hypothesis,
                               extend=_judged(view), also=(StageSubmission(ASR, pause, "in"),))

    def _rehold(self, view: View) -> AppendPlan | None:
        """A reply started at a pause was discarded, and the live request with
        it: make the model hold the conversation and the words pushed so far
        again, so the turn goes on as if nothing had been said."""
        state = view.policy_state
        pushed = state.utterance.pushed
        state.turn_open = bool(pushed)
        if not pushed:
            return None
        return AppendPlan(InputMode.APPEND_TOKENS,
                          (self._reset(view), StageSubmission(LLM, TextIn(" ".join(pushed)), "llm")))

    def _push(self, view: View, utt: Utterance, hypothesis: list[str],
              stable: list[str], *, extend: bool = True) -> AppendPlan | None:
        """Stream stable words into the live LLM request; roll back if the ASR
        revised one that was already pushed (``extend`` False: only that --
        the words the model holds must be the heard ones before a reply
        starts from them, or the final's rollback would void that reply)."""
        state = view.policy_state
        if not view.config.responds:
            return None  # a transcription session never asks the LLM
        if utt.pushed and utt.revised(hypothesis):
            if view.active_response_id is not None:
                # A response is being made (e.g. one the client asked for
                # mid-turn): rolling the live request back would void it. The
                # final transcript, which the revision will reach, rolls back.
                return None
            utt.rollbacks += 1
            utt.pushed = list(stable)
            state.turn_open = bool(stable)
            subs = [self._reset(view)]
            if stable:
                subs.append(StageSubmission(LLM, TextIn(" ".join(stable)), "llm"))
            return AppendPlan(InputMode.ROLLBACK_TO_CHECKPOINT, tuple(subs),
                              bump=FenceBump.INCARNATION, checkpoint="turn-start")
        new = stable[len(utt.pushed):] if same_words(stable[: len(utt.pushed)], utt.pushed) else []
        if not extend or not new or view.active_response_id is not None:
            return None  # nothing new, or the model is busy answering
        subs = []
        if not state.turn_open:
            subs.append(self._reset(view))  # the turn starts on exactly the history
            state.turn_open = True
        subs.append(StageSubmission(LLM, TextIn(" ".join(new)), "llm"))
        utt.pushed = utt.pushed + new
        return AppendPlan(InputMode.APPEND_TOKENS, tuple(subs))

    def _on_final(self, view: View, p: TranscriptFinal) -> Sequence[PolicyStep]:
        state = view.policy_state
        utt = state.utterance
        final = words(p.text)
        state.utterance = Utterance()
        state.paused = False
        awaiting, state.awaiting_final = state.awaiting_final, False
        deferred, state.deferred_commit = state.deferred_commit, False
        td = view.config.turn_detection
        if deferred and view.output_paused:
            if not final or is_backchannel(final, view.config.interruption.backchannels):
                return [Dismiss("backchannel" if final else "noise")]
            respond = bool(td is not None and td.create_response)
            return [Show(), Interrupt(InterruptReason.TURN_DETECTED), CommitTurn(),
                    *([Respond()] if respond else [])]
        steps: list[PolicyStep] = [Show()]
        revised = bool(utt.pushed) and utt.revised(final)
        if revised:
            # The last revision came with the final transcript: the request
            # that answers will rebuild from the corrected conversation.
            state.turn_open = False
            steps.append(AppendPlan(InputMode.ROLLBACK_TO_CHECKPOINT, (),
                                    bump=FenceBump.INCARNATION, checkpoint="turn-start"))
        if revised and view.active_response_id is not None:
            # A reply released at the commit (semantic_vad) answered words the
            # final transcript revised: it is cancelled and the final answered.
            steps.append(Interrupt(InterruptReason.TURN_DETECTED))
        if deferred:
            steps.append(CommitTurn())  # a deferred commit whose reply was cancelled meanwhile
        # Silence or noise that the VAD took for speech: no words, no reply.
        if awaiting and final and td is not None and td.create_response:
            steps.append(Respond())
        return steps


def _judged(view: View) -> bool:
    """The session weighs the user's words to end the turn (semantic_vad)."""
    td = view.config.turn_detection
    return td is not None and td.semantic


# What the cascade does with each stage output, by its exact type (anything
# else is dropped).
_OUTPUTS: dict[type, Callable[[CascadePolicy, View, Any], Sequence[PolicyStep]]] = {
    VadSpeechStarted: CascadePolicy._on_speech_started,
    VadSpeechStopped: CascadePolicy._on_speech_stopped,
    SceneDescription: CascadePolicy._on_scene,
    TranscriptPartial: CascadePolicy._on_partial,
    UserPaused: CascadePolicy._on_pause,
    UserResumed: CascadePolicy._on_resumed,
    TranscriptFinal: CascadePolicy._on_final,
    TextDelta: CascadePolicy._on_text,
    GenerationDone: CascadePolicy._on_generation_done,
    ToolCall: CascadePolicy._shown,
    AudioOut: CascadePolicy._shown,
    StageFailed: CascadePolicy._shown,
    SpeechDone: CascadePolicy._on_speech_done,
}
