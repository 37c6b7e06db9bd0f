"""The typed payloads that flow into and out of stages, and their envelopes.

Policies, sessions and stages all speak these types, so they live in the
core: a policy can plan a submission without importing any stage. Every
submission and every output carries the session ``Fence`` it was made under;
stages never decide staleness (the session's fence gate does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.truncation import Truncation

INTERNAL_RATE = 16000  # Hz, mono int16: what VAD/ASR consume and TTS produce
# Idle input audio kept beyond a turn's prefix padding while nobody speaks: the
# VAD still needs it to detect an onset (the input buffer and the omni policy trim to it).
IDLE_SLACK_MS = 1000


# ---- payloads into stages --------------------------------------------------


@dataclass(frozen=True)
class AudioIn:
    """Input PCM (int16, mono, INTERNAL_RATE); ``start_ms`` is its offset in
    the session's input audio stream."""

    pcm: np.ndarray
    start_ms: int
    # With the server cancelling the echo (``audio.input.echo_cancellation``):
    # the same samples with what is left of the reply's echo turned down as
    # well, for the VAD's speech onsets. ``pcm`` (what the ASR transcribes and
    # the turn keeps) has the echo taken out but is not gated with it: a
    # suppressor that turns frames down whole takes the user's words spoken
    # over the echo down too. None: the VAD hears ``pcm``.
    vad_pcm: np.ndarray | None = field(default=None, compare=False, repr=False)

    def for_vad(self) -> AudioIn:
        """What a VAD stage is given of this chunk."""
        return self if self.vad_pcm is None else AudioIn(self.vad_pcm, self.start_ms)


@dataclass(frozen=True)
class TextIn:
    """Words appended to the live model context (``append_tokens``)."""

    text: str


@dataclass(frozen=True)
class ContextMessage:
    role: str  # system | user | assistant | tool
    text: str
    # The conversation item it came from: truncation remembers what it left
    # out by item, so a client deleting or inserting items moves nothing else.
    item_id: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class GenerateRequest:
    response_id: str
    context: tuple[ContextMessage, ...]
    sampling: SamplingConfig
    tools: tuple[dict[str, Any], ...] = ()
    # OpenAI semantics: "auto" (the model may call), "none" (it may not),
    # "required" (it must call one), {"type": "function", "name": N} (must call N).
    tool_choice: str | dict[str, Any] = "auto"
    truncation: Truncation = Truncation()  # when the context outgrows the model's

    def callable_tools(self) -> tuple[dict[str, Any], ...]:
        """The tools the model may call under ``tool_choice``."""
        if self.tool_choice == "none":
            return ()
        if isinstance(self.tool_choice, dict):
            name = self.tool_choice.get("name") or (self.tool_choice.get("function") or {}).get("name")
            return tuple(t for t in self.tools
                         if (t.get("name") or (t.get("function") or {}).get("name")) == name)
        return self.tools

    @property
    def must_call(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, dict)


@dataclass(frozen=True)
class VadConfig:
    """Turn-detection tuning for a VAD stage (what ``session.update`` sets).

    ``threshold`` is 0..1, higher meaning "needs more evidence of speech";
    each VAD documents how it maps the number onto its own detector.
    """

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    # Report a pause (``VadPaused``) after this much silence, before the end of
    # speech, and ``VadResumed`` if speech comes back first: the session
    # prepares the reply while the silence accrues. 0: no pause reports.
    pause_ms: int = 0
    # Whether an onset may be decided on a second grid of windows, half a
    # window later (Silero; sooner barge-ins). Off where the server cancels
    # the echo: the residual's sure windows would start speech twice as
    # often (bench/room_echo.py: 0 -> 2 of 20 replies at -10 dB).
    half_window_onsets: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be within 0..1, got {self.threshold}")
        if self.prefix_padding_ms < 0 or self.silence_duration_ms < 0 or self.pause_ms < 0:
            raise ValueError("prefix_padding_ms, silence_duration_ms and pause_ms must be >= 0")


@dataclass(frozen=True)
class AsrConfig:
    """What the session's ``audio.input.transcription`` asks of an ASR stage.

    ``prompt``: text the user's speech follows -- names, spellings, terms --
    which the ASR uses as its context where it can (Whisper takes it as its
    previous text, as OpenAI's transcription ``prompt``); None: none.
    ``language``: the language spoken (ISO-639-1), which a multilingual ASR
    then need not guess; None: the stage's own."""

    prompt: str | None = None
    language: str | None = None


@dataclass(frozen=True)
class EndOfUtterance:
    """The current utterance is over (manual turn end, no VAD): an ASR stage
    decodes what it heard and emits exactly one ``TranscriptFinal``."""


@dataclass(frozen=True)
class ResetContext:
    """Rebuild the model state from canonical history (rollback / re-encode):
    abort the live request and prefill ``context``; generate nothing yet."""

    context: tuple[ContextMessage, ...]
    truncation: Truncation = Truncation()  # when the context outgrows the model's


@dataclass(frozen=True)
class EndOfText:
    """No more text for this response: TTS flushes its last sentence."""

    response_id: str


@dataclass(frozen=True, eq=False)
class VideoFrame:
    """One decoded camera frame: RGB ``uint8`` ``(height, width, 3)`` at
    ``timestamp_ms`` on the session's video clock (``source``: ``frame`` — an
    image event, ``chunk`` — decoded from a WebM/MP4 fragment, ``image`` — an
    ``input_image`` content part)."""

    rgb: np.ndarray
    timestamp_ms: int
    source: str = "frame"


# ---- payloads out of stages ------------------------------------------------


class InputObservation:
    """Marker for outputs that describe the user's input (VAD, ASR), not a
    reply. Fence bumps void what was going to be *said*, never what was
    *heard*: an interruption (epoch) or a rebuilt model context (incarnation,
    e.g. a rollback because the ASR revised a word) leaves the user's words
    standing, so the fence gate never drops these."""

    __slots__ = ()


@dataclass(frozen=True)
class VadSpeechStarted(InputObservation):
    audio_ms: int


@dataclass(frozen=True)
class VadSpeechStopped(InputObservation):
    audio_ms: int


@dataclass(frozen=True)
class VadPaused(InputObservation):
    """``VadConfig.pause_ms`` of silence after speech that ended at
    ``audio_ms``, before the VAD's end of speech (``VadSpeechStopped``)."""

    audio_ms: int


@dataclass(frozen=True)
class VadResumed(InputObservation):
    """Speech again at ``audio_ms`` after a ``VadPaused``: the same speech goes on."""

    audio_ms: int


@dataclass(frozen=True)
class UserPaused(InputObservation):
    """Policy input under ``semantic_vad``: the VAD heard a pause after speech
    that ended at ``audio_ms``, which may or may not end the turn (the session
    decides, ``session/turn_end.py``). The policy may push the words it held
    back as still being heard, so the model judges the whole phrase, and
    submit this to its ASR stage, which then answers with every word heard up
    to the pause (``TranscriptPartial(at_pause=True)``): the session then
    judges the pause on that answer, not on an older hypothesis."""

    audio_ms: int
    # Under server_vad the VAD ends the turn only after this much silence (its
    # ``silence_duration_ms``), so the ASR has that long to hear the words up to
    # the pause again with the audio after them; None: the session may end the
    # turn at any moment (semantic_vad).
    turn_end_silence_ms: int | None = None


@dataclass(frozen=True)
class UserResumed(InputObservation):
    """Policy input under ``semantic_vad``: the user spoke on after a pause
    (it did not end the turn). ``speculation_discarded``: a reply started at
    that pause was discarded, and the live request with it, so the policy may
    make the model context hold the user's words again."""

    speculation_discarded: bool = False


@dataclass(frozen=True)
class TurnEndProbability:
    """From the LLM stage, for each chunk of user words it prefilled: ``p``,
    the probability that the user's turn ends after ``text`` (the turn's
    words so far), read from the sampled-and-dropped token's distribution
    (the chat template's end-of-turn token plus sentence-final punctuation).
    Fenced like a reply: a rebuilt context voids it."""

    p: float
    text: str


@dataclass(frozen=True)
class TranscriptDelta(InputObservation):
    text: str


@dataclass(frozen=True)
class TranscriptPartial(InputObservation):
    """The ASR's whole current hypothesis for the ongoing utterance; a later
    partial may revise earlier words. ``at_pause``: the answer to a
    ``UserPaused``, covering all the audio up to the pause (sent even when it
    says nothing new)."""

    text: str
    at_pause: bool = False


@dataclass(frozen=True)
class TranscriptFinal(InputObservation):
    """The final transcript of one utterance. ``onset_ms``: where on the
    session's input timeline the utterance began (None: the ASR does not
    say), so the session puts it on the item that holds that speech even when
    another commit came between (``UserTurn.transcript_item``)."""

    text: str
    onset_ms: int | None = None


@dataclass(frozen=True)
class SceneDescription(InputObservation):
    """What a vision stage sees in the newest frame, as context for the model:
    ``text`` is the sentence the model gets (e.g. ``visible text: OPEN 24
    HOURS; 1 face``). A newer one replaces the older (``replace_latest_chunk``)."""

    text: str
    timestamp_ms: int
    texts: tuple[str, ...] = ()
    faces: int = 0


@dataclass(frozen=True)
class TextDelta:
    response_id: str
    text: str


@dataclass(frozen=True)
class GenerationDone:
    response_id: str
    finish_reason: str
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class ToolCall:
    """A complete function call the model made (arguments are JSON text)."""

    response_id: str
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class AudioOut:
    """Synthesized PCM (int16, mono, ``rate`` Hz) for a response."""

    response_id: str
    pcm: np.ndarray
    rate: int = INTERNAL_RATE
    text: str = ""  # the words this audio speaks (for transcript deltas)


@dataclass(frozen=True)
class SpeechDone:
    """TTS has spoken everything it was given for this response."""

    response_id: str


@dataclass(frozen=True)
class BackchannelText:
    """To a TTS stage: the clip of a backchannel phrase ("Mm-hmm."), made once
    per voice and kept (session/backchannel.py). ``play``: answer with
    ``BackchannelAudio``; False only makes sure the clip is ready."""

    text: str
    play: bool = True


@dataclass(frozen=True)
class BackchannelAudio:
    """A TTS stage's clip of a backchannel phrase: int16 PCM at ``rate``."""

    text: str
    pcm: np.ndarray
    rate: int = INTERNAL_RATE


@dataclass(frozen=True)
class StageFailed:
    error: DuplexError


# ---- envelopes -------------------------------------------------------------


@dataclass(frozen=True)
class StageInput:
    fence: Fence
    request_id: str
    payload: Any


@dataclass(frozen=True)
class StageOutput:
    fence: Fence
    request_id: str
    stage: str
    payload: Any
    created_at: float = field(default=0.0, compare=False)
