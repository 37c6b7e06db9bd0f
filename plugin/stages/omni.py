"""The native omni contract: what a policy sends to an audio+video model stage,
and a scripted stage that honours it on CPU.

A native omni model (MiniCPM-o, Qwen-Omni) hears and sees in **units**: a
stretch of audio (``unit_ms``, typically one second) together with the camera
frames seen during it. The policy (``models/omni``) forms the units; the stage
appends each one to the session's live model context as it arrives, so at end
of turn only the assistant prefix is left to prefill.

Payloads into an omni stage:

* ``OmniUnit``        -- one unit (``append_audio_chunk``)
* ``OmniInstructions`` -- the system prompt the live context starts with
* ``TextIn``          -- typed user words (``append_tokens``)
* ``GenerateRequest`` -- end of turn: answer now (the session sends it)

Out: ``TextDelta`` ... ``GenerationDone`` (speech through a ``tts`` stage
after it), or, for a stage that speaks natively, also ``AudioOut`` and
``SpeechDone``.

``ScriptedOmniStage`` (type ``scripted_omni``) replies deterministically with
what it received since the last reply, word by word, e.g. "I heard 2.0 s of
audio in 2 units and saw 2 frames, the last 64x48." -- so tests can check the
contract end to end without a model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..clock import Clock
from .base import (
    INTERNAL_RATE,
    GenerateRequest,
    GenerationDone,
    StageInput,
    StagePort,
    TextDelta,
    TextIn,
)
from .scripted import ScriptedPort, ScriptedStage, split_tokens

log = logging.getLogger(__name__)


# ---- payloads ---------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class OmniUnit:
    """One unit of input for a native omni model.

    ``audio``: mono PCM at ``INTERNAL_RATE`` (16 kHz), ``int16`` or
    ``float32`` in [-1, 1]; it may be empty (a unit of frames only, e.g. an
    ``input_image`` content part). ``frames``: RGB ``uint8`` ``(h, w, 3)``
    images, oldest first (a tile of several frames counts as one).
    ``frame_ms``: each frame's timestamp on the session's video clock.
    ``start_ms``: offset of ``audio[0]`` in the session's input audio stream.
    ``final``: the last unit of a user turn (a partial unit flushed at the end
    of the turn; complete units are ``unit_ms`` long).
    """

    audio: np.ndarray
    frames: tuple[np.ndarray, ...] = ()
    start_ms: int = 0
    frame_ms: tuple[int, ...] = ()
    final: bool = False

    def __post_init__(self) -> None:
        audio = np.asarray(self.audio)
        if audio.ndim != 1 or audio.dtype not in (np.int16, np.float32):
            raise ValueError(f"unit audio must be 1-D int16 or float32, got {audio.dtype} {audio.shape}")
        for f in self.frames:
            if f.dtype != np.uint8 or f.ndim != 3 or f.shape[2] != 3:
                raise ValueError(f"unit frames must be uint8 (h, w, 3), got {f.dtype} {f.shape}")
        object.__setattr__(self, "audio", audio)

    @property
    def samples(self) -> int:
        return int(self.audio.size)

    @property
    def duration_ms(self) -> int:
        return self.samples * 1000 // INTERNAL_RATE

    def audio_f32(self) -> np.ndarray:
        """The audio as ``float32`` in [-1, 1] (what model processors take)."""
        if self.audio.dtype == np.float32:
            return self.audio
        return (self.audio.astype(np.float32) / 32768.0).astype(np.float32)


@dataclass(frozen=True)
class OmniInstructions:
    """The system prompt the session's live model context starts with. The
    policy sends it before the first unit, and again when the session's
    instructions change (the stage then rebuilds its context)."""

    text: str


# ---- the scripted stage -------------------------------------------------------


@dataclass
class Heard:
    """What an omni port received since its last reply."""

    units: int = 0
    samples: int = 0
    frames: int = 0
    last_frame: tuple[int, int] | None = None  # (width, height)
    words: int = 0
    instructions: str = ""

    def add_unit(self, unit: OmniUnit) -> None:
        self.units += 1
        self.samples += unit.samples
        for f in unit.frames:
            self.frames += 1
            self.last_frame = (int(f.shape[1]), int(f.shape[0]))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def describe(heard: Heard) -> str:
    """The scripted reply: e.g. "I heard 2.0 s of audio in 2 units and saw
    2 frames, the last 64x48." (plus "You typed 3 words." for text)."""
    seconds = heard.samples / INTERNAL_RATE
    text = f"I heard {seconds:.1f} s of audio in {_plural(heard.units, 'unit')}"
    if heard.frames:
        w, h = heard.last_frame or (0, 0)
        text += f" and saw {_plural(heard.frames, 'frame')}, the last {w}x{h}."
    else:
        text += " and saw no frames."
    if heard.words:
        text += f" You typed {_plural(heard.words, 'word')}."
    return text


class ScriptedOmniStage(ScriptedStage):
    """``OmniUnit`` / ``OmniInstructions`` / ``TextIn`` / ``GenerateRequest``
    in; a deterministic description of the turn's input out, as
    ``TextDelta`` words and one ``GenerationDone`` (``token_interval_s``
    apart, on the injected clock)."""

    accepted = (OmniUnit, OmniInstructions, TextIn, GenerateRequest)

    def __init__(self, name: str = "omni", *, clock: Clock, token_interval_s: float = 0.02) -> None:
        super().__init__(name, clock)
        if token_interval_s < 0:
            raise ValueError("token_interval_s must be >= 0")
        self.token_interval_s = token_interval_s

    def port(self, session_id: str) -> StagePort:
        return _OmniPort(self, session_id)


class _OmniPort(ScriptedPort):
    _stage: ScriptedOmniStage

    def __init__(self, stage: ScriptedOmniStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self.heard = Heard()
        self.replies: list[str] = []  # every reply started (for tests)

    async def _handle(self, item: StageInput) -> None:
        p: Any = item.payload
        if isinstance(p, OmniUnit):
            self.heard.add_unit(p)
        elif isinstance(p, TextIn):
            self.heard.words += len(p.text.split())
        elif isinstance(p, OmniInstructions):
            self.heard.instructions = p.text
        else:  # GenerateRequest: answer what was heard; input after it is the next turn's
            heard, self.heard = self.heard, Heard(instructions=self.heard.instructions)
            reply = describe(heard)
            self.replies.append(reply)
            self._spawn(item, lambda: self._reply(item, p, reply, heard))

    async def _reply(self, item: StageInput, req: GenerateRequest, reply: str, heard: Heard) -> None:
        tokens = split_tokens(reply)
        finish = "stop"
        limit = req.sampling.max_tokens if req.sampling is not None else None
        if limit is not None and limit < len(tokens):
            tokens, finish = tokens[: max(0, limit)], "length"
        for i, token in enumerate(tokens):
            if i:
                await self._clock.sleep(self._stage.token_interval_s)
            await self._emit(item.fence, item.request_id, TextDelta(req.response_id, token))
        done = GenerationDone(req.response_id, finish, input_tokens=heard.units + heard.frames + heard.words,
                              output_tokens=len(tokens))
        await self._emit(item.fence, item.request_id, done)
