"""``OmniPolicy``: native audio+video models (MiniCPM-o, Qwen-Omni style).

Pure: functions of (session view, input) with no I/O and no awaits; what it
remembers per session is an ``OmniState`` in ``view.policy_state``.

**Units.** Input is grouped into units (``models/omni/units.py``): ``unit_ms``
of microphone audio plus the camera frames seen during it, sampled to
``frames_per_unit`` (the newest frame of a slot replaces an older one:
``replace_latest_chunk``), optionally tiled into one image. Each complete
unit is one ``StageSubmission`` of an ``OmniUnit`` to the stage ``omni``
(``append_audio_chunk``), which appends it to the session's live model
context, so at end of turn only the assistant prefix is left to prefill.

**Turn-taking (server VAD, as the cascade).** Audio goes to the ``vad`` stage
first. Between turns the policy keeps only a short pre-roll of audio and the
newest frame; at ``VadSpeechStarted(audio_ms)`` the turn's first unit starts
at ``audio_ms`` (prefix padding included) with that frame, and units stream
while the user speaks. ``VadSpeechStopped`` flushes the partial unit, commits
the turn and asks for a response: the session sends its ``GenerateRequest``
to ``omni``. Speech onset during a reply interrupts it (barge-in). Silence
between turns never reaches the model. Without turn detection
(``turn_commit_only``), nothing streams: at commit the turn's audio (exactly
what the input buffer holds, so a cleared buffer stays cleared) is cut into
units with the frames placed where they arrived.

**Audio out.** ``audio_out: tts`` (default): the omni stage writes text and a
``tts`` stage after it speaks (vLLM serves the *thinker* of Qwen2.5-Omni and
the LLM of MiniCPM-o; their speech decoders are not part of vLLM).
``audio_out: native``: the omni stage speaks itself (``AudioOut`` then
``SpeechDone``); its text is the transcript and is not sent on to a TTS.

Stage names: ``vad``, ``omni`` (answers responses), and ``tts`` after it for
spoken replies with ``audio_out: tts``; configs/omni-gpu.yaml,
configs/omni-scripted.yaml (text replies: no ``tts``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm_duplex.domain.commands import DuplexInput, ResponseOptions
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
from vllm_duplex.domain.omni import OmniInstructions, OmniUnit
from vllm_duplex.domain.payloads import (
    IDLE_SLACK_MS,
    AudioIn,
    AudioOut,
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
    VideoFrame,
)
from vllm_duplex.models.omni.units import SAMPLES_PER_MS, UnitBuilder, units_of_turn
from vllm_duplex.policy import PolicyBase, SessionView

VAD, OMNI, TTS = "vad", "omni", "tts"
# tts is not required: a deployment that only writes text (omni-scripted) has none.
_NEEDS = StageNeeds(generator=OMNI, others=(VAD,))

_CAPABILITIES = Capabilities(
    input_modes=frozenset({
        InputMode.APPEND_AUDIO_CHUNK,
        InputMode.REPLACE_LATEST_CHUNK,
        InputMode.APPEND_TOKENS,
        InputMode.TURN_COMMIT_ONLY,
    }),
    input_modalities=frozenset({"audio", "video", "image", "text"}),
    output_modalities=frozenset({"audio", "text"}),
    turn_detection=frozenset({"server_vad"}),
    early_output=True,
    tools=False,
)

DEFAULT_MAX_TOKENS = 128  # a spoken reply should be short; the client can ask for more
AUDIO_OUT = ("tts", "native")
_NO_AUDIO = np.zeros(0, dtype=np.int16)


@dataclass
class OmniState:
    """One session's input state (``view.policy_state``)."""

    builder: UnitBuilder
    ready: list[OmniUnit] = field(default_factory=list)  # complete units not yet submitted
    idle: deque[AudioIn] = field(default_factory=deque)  # pre-roll between turns
    idle_samples: int = 0
    idle_frame: VideoFrame | None = None  # newest frame between turns
    # turn_commit_only: the frames of the turn, by slot, with their position
    manual_frames: dict[int, tuple[int, VideoFrame]] = field(default_factory=dict)
    manual_samples: int = 0
    manual_start_ms: int | None = None
    instructions: str | None = None  # what the omni stage was last told
    position_ms: int = 0  # where the input audio heard so far ends

    def keep_idle(self, chunk: AudioIn, keep_ms: int) -> None:
        self.idle.append(chunk)
        self.idle_samples += chunk.pcm.size
        keep = keep_ms * SAMPLES_PER_MS
        while self.idle and self.idle_samples - self.idle[0].pcm.size >= keep:
            self.idle_samples -= self.idle.popleft().pcm.size

    def start_turn(self, onset_ms: int) -> None:
        """Speech began at ``onset_ms``: the turn's first unit starts there,
        with the newest frame seen before it."""
        if not self.builder.empty:  # left over (e.g. turn detection switched on mid-turn)
            self.ready.append(self.builder.flush())  # type: ignore[arg-type]
        if self.idle_frame is not None:
            self.builder.add_frame(self.idle_frame)
            self.idle_frame = None
        for chunk in self.idle:
            cut = max(0, (onset_ms - chunk.start_ms) * SAMPLES_PER_MS)
            if cut < chunk.pcm.size:
                self.ready += self.builder.add_audio(chunk.pcm[cut:], chunk.start_ms + cut // SAMPLES_PER_MS)
        self.idle.clear()
        self.idle_samples = 0

    def take(self, *more: OmniUnit | None) -> list[OmniUnit]:
        units = self.ready + [u for u in more if u is not None]
        self.ready = []
        return units


View = SessionView[OmniState]


class OmniPolicy(PolicyBase[OmniState]):
    name = "omni"

    def __init__(self, unit_ms: int = 1000, frames_per_unit: int = 1, tile: bool = False,
                 tile_cell: list[int] | tuple[int, int] | None = None,
                 max_tokens: int = DEFAULT_MAX_TOKENS, audio_out: str = "tts") -> None:
        if audio_out not in AUDIO_OUT:
            raise ValueError(f"audio_out must be one of {AUDIO_OUT}, got {audio_out!r}")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        cell = (int(tile_cell[0]), int(tile_cell[1])) if tile_cell is not None else None
        # Validates the unit options once, at deployment load.
        UnitBuilder(unit_ms, frames_per_unit, tile=tile, tile_cell=cell)
        self.unit_ms = unit_ms
        self.frames_per_unit = frames_per_unit
        self.tile = tile
        self.tile_cell = cell
        self.max_tokens = max_tokens
        self.audio_out = audio_out

    def capabilities(self) -> Capabilities:
        return _CAPABILITIES

    def stage_needs(self) -> StageNeeds:
        return _NEEDS

    def new_state(self) -> OmniState:
        return OmniState(self._builder())

    def configure_sampling_params(self, view: View, options: ResponseOptions) -> SamplingConfig:
        limit = options.max_output_tokens or view.config.max_output_tokens or self.max_tokens
        return SamplingConfig(temperature=view.config.temperature, max_tokens=limit)

    def _builder(self) -> UnitBuilder:
        return UnitBuilder(self.unit_ms, self.frames_per_unit, tile=self.tile, tile_cell=self.tile_cell)

    def _to_omni(self, view: View, st: OmniState, payloads: list[Any]) -> tuple[StageSubmission, ...]:
        """Submissions to the omni stage, led by the instructions when the
        stage has not been told the current ones."""
        if not payloads:
            return ()
        subs = []
        if st.instructions != view.config.instructions:
            st.instructions = view.config.instructions
            subs.append(StageSubmission(OMNI, OmniInstructions(view.config.instructions), "omni"))
        subs += [StageSubmission(OMNI, p, "omni") for p in payloads]
        return tuple(subs)

    # ---- input ---------------------------------------------------------------

    def plan_append(self, view: View, payload: Any) -> AppendPlan:
        st = view.policy_state
        td = view.config.turn_detection
        if isinstance(payload, AudioIn):
            st.position_ms = payload.start_ms + payload.pcm.size // SAMPLES_PER_MS
            if td is None:  # turn_commit_only: the input buffer keeps the audio
                if st.manual_start_ms is None:
                    st.manual_start_ms = payload.start_ms
                st.manual_samples += payload.pcm.size
                return AppendPlan(InputMode.TURN_COMMIT_ONLY)
            vad = (StageSubmission(VAD, payload.for_vad(), "in"),)  # the echo's residual turned down
            if view.user_speaking:  # server VAD: inside a user turn, units stream
                st.ready += st.builder.add_audio(payload.pcm, payload.start_ms)
            else:
                st.keep_idle(payload, td.prefix_padding_ms + IDLE_SLACK_MS)
            return AppendPlan(InputMode.APPEND_AUDIO_CHUNK, vad + self._to_omni(view, st, st.take()))
        if isinstance(payload, VideoFrame):
            return self._frame(view, st, payload)
        if isinstance(payload, VadConfig):
            return AppendPlan(InputMode.APPEND_AUDIO_CHUNK, (StageSubmission(VAD, payload, "in"),))
        if isinstance(payload, TextIn):
            # Typed words follow what was heard so far.
            pending = st.builder.flush() if td is not None else None
            return AppendPlan(InputMode.APPEND_TOKENS,
                              self._to_omni(view, st, [*st.take(pending), payload]))
        if isinstance(payload, TurnCommitted):
            return AppendPlan(InputMode.TURN_COMMIT_ONLY, self._to_omni(view, st, self._commit(view, st, payload)))
        raise DuplexError("capability_unsupported",
                          f"policy {self.name!r} cannot take {type(payload).__name__} input"
                          + (f" in mode {payload.mode.value!r}" if isinstance(payload, DuplexInput) else ""))

    def _frame(self, view: View, st: OmniState, frame: VideoFrame) -> AppendPlan:
        td = view.config.turn_detection
        if frame.source == "image":
            # An input_image content part is a message of its own: it goes to
            # the model now, after what was heard before it.
            pending = st.builder.flush() if td is not None else None
            unit = OmniUnit(audio=_NO_AUDIO, frames=(frame.rgb,), start_ms=st.position_ms,
                            frame_ms=(frame.timestamp_ms,))
            return AppendPlan(InputMode.APPEND_AUDIO_CHUNK, self._to_omni(view, st, st.take(pending, unit)))
        if td is None:
            b = st.builder
            slot = st.manual_samples * b.frames_per_unit // b.unit_samples
            replaced = slot in st.manual_frames
            st.manual_frames[slot] = (st.manual_samples, frame)
        elif view.user_speaking:
            replaced = st.builder.add_frame(frame)
        else:
            replaced, st.idle_frame = st.idle_frame is not None, frame
        return AppendPlan(InputMode.REPLACE_LATEST_CHUNK if replaced else InputMode.APPEND_AUDIO_CHUNK)

    def _commit(self, view: View, st: OmniState, c: TurnCommitted) -> list[OmniUnit]:
        if view.config.turn_detection is not None:
            # Server VAD flushed at speech stop; a manual commit mid-speech
            # ends the turn's units here.
            return st.take(st.builder.flush())
        frames = list(st.manual_frames.values())
        start = st.manual_start_ms if st.manual_start_ms is not None else 0
        st.manual_frames, st.manual_samples, st.manual_start_ms = {}, 0, None
        audio = c.audio if c.audio is not None else _NO_AUDIO
        return st.take(*units_of_turn(self._builder(), audio, start, frames))

    # ---- output --------------------------------------------------------------

    def _spoken(self, speaks: bool) -> list[PolicyStep]:
        """Reply text shown, and sent on to the TTS stage when it speaks the reply."""
        return [Show(), ForwardTo(TTS)] if speaks and self.audio_out == "tts" else [Show()]

    def decide_output(self, view: View, output: StageOutput) -> Sequence[PolicyStep]:
        p = output.payload
        td = view.config.turn_detection
        speaks = "audio" in view.output_modalities
        if isinstance(p, VadSpeechStarted):
            if td is None:
                return DROP  # turn detection was switched off: a leftover event
            st = view.policy_state
            # The user speaks from here (the session shows this event and reads
            # ``view.user_speaking`` true from then on): units stream.
            # Units of the pre-roll wait for the next audio chunk: a barge-in
            # must first cancel the reply they would queue behind.
            st.start_turn(p.audio_ms)
            barge_in = td.interrupt_response and view.active_response_id is not None
            return [Show(), Interrupt(InterruptReason.TURN_DETECTED)] if barge_in else SHOW
        if isinstance(p, VadSpeechStopped):
            if td is None:
                return DROP
            st = view.policy_state
            st.idle_frame = None  # the turn's frames were seen; the next turn starts afresh
            subs = self._to_omni(view, st, st.take(st.builder.flush()))
            return [Show(), *([AppendPlan(InputMode.APPEND_AUDIO_CHUNK, subs)] if subs else []),
                    CommitTurn(), *([Respond()] if td.create_response else [])]
        if isinstance(p, TextDelta):
            return self._spoken(speaks)
        if isinstance(p, GenerationDone):
            # Text-only responses end with the text; spoken ones when the
            # speech ends (SpeechDone, from the TTS or the omni stage itself).
            return self._spoken(speaks) + ([] if speaks else [FinishReply()])
        if isinstance(p, SpeechDone):
            return [Show(), FinishReply()]
        if isinstance(p, (AudioOut, StageFailed, ToolCall, TranscriptDelta, TranscriptFinal)):
            return SHOW
        return DROP
