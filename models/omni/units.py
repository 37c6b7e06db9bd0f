"""Forming omni units: ``unit_ms`` of audio plus the frames seen during it.

Pure and clock-free: positions come from sample counts, never from arrival
times, so the units do not depend on how the audio was chunked ("streaming
equals batch"). A unit is divided into ``frames_per_unit`` equal slots of
audio time; a frame lands in the slot of the audio position at which it
arrived, and a newer frame in the same slot replaces the older one
(``replace_latest_chunk``). With ``tile``, a unit's frames are stacked into
one grid image, for models that take one image per unit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from vllm_duplex.domain.omni import OmniUnit
from vllm_duplex.domain.payloads import INTERNAL_RATE, VideoFrame

SAMPLES_PER_MS = INTERNAL_RATE // 1000


def tile(frames: Sequence[np.ndarray], cols: int, cell: tuple[int, int]) -> np.ndarray:
    """Frames in a ``cols``-wide grid (row-major), one image for models that
    take one image per unit. ``cell`` is ``(width, height)``; each frame is
    scaled to fit its cell keeping its aspect ratio, centred on black."""
    import cv2  # OpenCV, imported on first use

    cw, ch = cell
    if not frames or cols < 1 or cw < 1 or ch < 1:
        raise ValueError("tile needs frames, cols >= 1 and a positive cell size")
    rows = math.ceil(len(frames) / cols)
    out = np.zeros((rows * ch, min(cols, len(frames)) * cw, 3), dtype=np.uint8)
    for i, frame in enumerate(frames):
        h, w = frame.shape[:2]
        scale = min(cw / w, ch / h)
        sw, sh = max(1, round(w * scale)), max(1, round(h * scale))
        interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
        small = cv2.resize(frame, (sw, sh), interpolation=interp)
        y = (i // cols) * ch + (ch - sh) // 2
        x = (i % cols) * cw + (cw - sw) // 2
        out[y : y + sh, x : x + sw] = small
    return out


def tile_frames(frames: Sequence[np.ndarray], cell: tuple[int, int] | None = None) -> np.ndarray:
    """``frames`` in a near-square grid (row-major, ``ceil(sqrt(n))`` columns),
    each scaled into a ``cell`` of ``(width, height)`` (default: the first
    frame's size). One frame is returned as it is."""
    if len(frames) == 1 and cell is None:
        return frames[0]

    h, w = frames[0].shape[:2]
    return tile(frames, math.ceil(math.sqrt(len(frames))), cell or (w, h))


class UnitBuilder:
    """Audio and frames in, complete ``OmniUnit``s out."""

    def __init__(self, unit_ms: int = 1000, frames_per_unit: int = 1, *, tile: bool = False,
                 tile_cell: tuple[int, int] | None = None) -> None:
        if not 20 <= unit_ms <= 30_000:
            raise ValueError(f"unit_ms must be within 20..30000, got {unit_ms}")
        if not 1 <= frames_per_unit <= 64:
            raise ValueError(f"frames_per_unit must be within 1..64, got {frames_per_unit}")
        if tile_cell is not None and (len(tile_cell) != 2 or min(tile_cell) < 1):
            raise ValueError(f"tile_cell must be (width, height) > 0, got {tile_cell}")
        self.unit_ms = unit_ms
        self.unit_samples = unit_ms * SAMPLES_PER_MS
        self.frames_per_unit = frames_per_unit
        self.tile = tile
        self.tile_cell = tuple(tile_cell) if tile_cell is not None else None
        self._audio: list[np.ndarray] = []
        self._samples = 0
        self._start_ms: int | None = None
        self._next_ms = 0  # where the audio seen so far ends
        self._slots: dict[int, VideoFrame] = {}

    @property
    def empty(self) -> bool:
        return not self._samples and not self._slots

    @property
    def samples(self) -> int:
        """Audio samples in the unit being formed."""
        return self._samples

    def add_audio(self, pcm: np.ndarray, start_ms: int) -> list[OmniUnit]:
        """Append ``pcm`` (int16, 16 kHz) that starts at ``start_ms``; returns
        the units it completed."""
        pcm = np.asarray(pcm, dtype=np.int16).ravel()
        done: list[OmniUnit] = []
        offset = 0
        while offset < pcm.size:
            if self._start_ms is None:
                self._start_ms = start_ms + offset // SAMPLES_PER_MS
            take = min(self.unit_samples - self._samples, pcm.size - offset)
            self._audio.append(pcm[offset : offset + take])
            self._samples += take
            offset += take
            if self._samples == self.unit_samples:
                done.append(self._cut(final=False))
        self._next_ms = start_ms + pcm.size // SAMPLES_PER_MS
        return done

    def slot(self) -> int:
        """The frame slot of the current audio position."""
        return min(self.frames_per_unit - 1, self._samples * self.frames_per_unit // self.unit_samples)

    def add_frame(self, frame: VideoFrame) -> bool:
        """Place ``frame`` in the current slot; True when it replaced an
        earlier frame there."""
        slot = self.slot()
        replaced = slot in self._slots
        self._slots[slot] = frame
        return replaced

    def flush(self) -> OmniUnit | None:
        """The partial unit (end of turn), or None when nothing is pending."""
        return None if self.empty else self._cut(final=True)

    def _cut(self, *, final: bool) -> OmniUnit:
        audio = np.concatenate(self._audio) if self._audio else np.zeros(0, np.int16)
        seen = [self._slots[k] for k in sorted(self._slots)]
        frames = tuple(f.rgb for f in seen)
        stamps = tuple(f.timestamp_ms for f in seen)
        if self.tile and (len(frames) > 1 or (frames and self.tile_cell is not None)):
            frames, stamps = (tile_frames(frames, self.tile_cell),), (stamps[-1],)
        start = self._start_ms if self._start_ms is not None else self._next_ms
        unit = OmniUnit(audio=audio, frames=frames, start_ms=start, frame_ms=stamps, final=final)
        self._audio, self._samples, self._start_ms, self._slots = [], 0, None, {}
        return unit


def units_of_turn(builder: UnitBuilder, audio: np.ndarray, start_ms: int,
                  frames: Sequence[tuple[int, VideoFrame]]) -> list[OmniUnit]:
    """A whole turn at once (``turn_commit_only``): ``audio`` cut into units,
    each ``(sample position, frame)`` placed where it arrived. Frames past
    the end of the audio go into the last unit."""
    audio = np.asarray(audio, dtype=np.int16).ravel()
    units: list[OmniUnit] = []
    at = 0
    for pos, frame in sorted(frames, key=lambda pf: pf[0]):
        pos = max(at, min(pos, audio.size - 1)) if audio.size else 0
        units += builder.add_audio(audio[at:pos], start_ms + at // SAMPLES_PER_MS)
        at = pos
        builder.add_frame(frame)
    units += builder.add_audio(audio[at:], start_ms + at // SAMPLES_PER_MS)
    last = builder.flush()
    if last is not None:
        units.append(last)
    elif units:
        units[-1] = OmniUnit(units[-1].audio, units[-1].frames, units[-1].start_ms,
                             units[-1].frame_ms, final=True)
    return units
