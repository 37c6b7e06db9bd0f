"""The native omni contract: what a policy sends to an audio+video model stage.

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from vllm_duplex.domain.payloads import INTERNAL_RATE


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
