"""A CPU vision stage: camera frames in, a short scene description out.

Two real detectors, both shipped inside their wheels (nothing downloaded):
RapidOCR (PP-OCRv4 detection + recognition, ONNX Runtime) reads visible
text, and OpenCV's Haar frontal-face cascade counts faces. The result is one
sentence of context for the model, e.g. ``visible text: OPEN 24 HOURS; 1
face`` or ``no text; no face``.

Only the newest frame matters (``replace_latest_chunk``): a port holds at
most one pending frame; a frame that arrives while another is analysed
replaces the pending one, so a burst never builds a backlog. A description
is emitted only when its text differs from the port's previous one (the
first always goes out). ``SceneDescription`` is an ``InputObservation``:
like VAD and ASR output it describes the user's input, so ``cancel`` aborts
nothing and the fence gate never drops it.

The models load once per process (per thread setting) at stage
construction, so a missing model fails at start-up. Analysis runs on the
stage's worker threads (one by default); each model is behind its own lock
because neither RapidOCR nor ``CascadeClassifier`` promises thread safety.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import numpy as np
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import (
    SceneDescription,
    StageFailed,
    StageInput,
    VideoFrame,
)
from vllm_duplex.stages.listening.base import ListeningStage, ObservationPort
from vllm_duplex.stages.port import StagePort
from vllm_duplex.stages.scheduler import Urgency

log = logging.getLogger(__name__)

MAX_TEXTS = 8  # text lines in one description, in reading order
FACE_CASCADE = "haarcascade_frontalface_default.xml"


class _Ocr:
    """RapidOCR with our settings, serialised by a lock."""

    def __init__(self, threads: int) -> None:
        from rapidocr_onnxruntime import RapidOCR

        # limit_type "max": never upscale the frame (the default "min" blows
        # a 640x480 frame up to 981x736 and triples the detection time).
        self._engine = RapidOCR(det_limit_type="max", intra_op_num_threads=threads,
                                inter_op_num_threads=1)
        self._lock = threading.Lock()

    def read(self, bgr: np.ndarray, min_score: float) -> list[tuple[str, float]]:
        with self._lock:
            result, _ = self._engine(bgr, text_score=min_score)
        return [(str(text), float(score)) for _box, text, score in result or ()]


class _Faces:
    def __init__(self) -> None:
        import cv2

        path = cv2.data.haarcascades + FACE_CASCADE
        self._cascade = cv2.CascadeClassifier(path)
        if self._cascade.empty():
            raise RuntimeError(f"cannot load the face cascade {path}")
        self._lock = threading.Lock()

    def count(self, gray: np.ndarray, min_size: int) -> int:
        with self._lock:
            found = self._cascade.detectMultiScale(
                gray, scaleFactor=1.1, minNeighbors=5, minSize=(min_size, min_size))
        return len(found)


_MODELS: dict[Any, Any] = {}
_MODELS_LOCK = threading.Lock()


def _shared(key: Any, make: Any) -> Any:
    with _MODELS_LOCK:
        if key not in _MODELS:
            _MODELS[key] = make()
        return _MODELS[key]


def describe(texts: tuple[str, ...] | None, faces: int | None) -> str:
    """The sentence for the model; ``None`` means that detector is off."""
    parts = []
    if texts is not None:
        parts.append("visible text: " + " / ".join(texts) if texts else "no text")
    if faces is not None:
        parts.append("no face" if faces == 0 else f"{faces} face" + ("s" if faces > 1 else ""))
    return "; ".join(parts)


class SceneAnalyzer:
    """Synchronous frame analysis (thread-safe; runs on a worker thread)."""

    def __init__(self, *, ocr: bool, faces: bool, min_text_score: float, max_side: int,
                 min_face: int, threads: int) -> None:
        if not (ocr or faces):
            raise ValueError("a vision stage needs ocr or faces (or both)")
        if not 0.0 <= min_text_score <= 1.0 or max_side < 32 or min_face < 8 or threads < 1:
            raise ValueError("need 0 <= min_text_score <= 1, max_side >= 32, min_face >= 8, "
                             "threads >= 1")
        self.min_text_score = min_text_score
        self.max_side = max_side
        self.min_face = min_face
        self.ocr = _shared(("ocr", threads), lambda: _Ocr(threads)) if ocr else None
        self.faces = _shared("faces", _Faces) if faces else None

    def analyze(self, frame: VideoFrame) -> SceneDescription:
        import cv2

        rgb = frame.rgb
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise ValueError(f"frame must be uint8 (h, w, 3), got {rgb.dtype} {rgb.shape}")
        h, w = rgb.shape[:2]
        scale = self.max_side / max(h, w)
        if scale < 1:  # downscale first: both detectors cost ~ pixels
            rgb = cv2.resize(rgb, (round(w * scale), round(h * scale)),
                             interpolation=cv2.INTER_AREA)
        texts: list[str] = []
        if self.ocr is not None:
            bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
            for text, _score in self.ocr.read(bgr, self.min_text_score):
                text = " ".join(text.split())
                if any(c.isalnum() for c in text) and text not in texts:
                    texts.append(text)
        faces = None
        if self.faces is not None:
            gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)  # (equalizing lost real faces)
            min_face = max(8, round(self.min_face * min(scale, 1.0)))
            faces = self.faces.count(gray, min_face)
        found = tuple(texts[:MAX_TEXTS])
        return SceneDescription(
            text=describe(found if self.ocr is not None else None, faces),
            timestamp_ms=frame.timestamp_ms, texts=found, faces=faces or 0)


class VisionStage(ListeningStage):
    """``VideoFrame`` in, ``SceneDescription`` out (see the module docstring).

    Options: ``ocr`` / ``faces`` switch the detectors; ``min_text_score``
    drops uncertain text (0..1); ``max_side`` downscales frames before
    analysis; ``min_face`` is the smallest face side in pixels of the
    original frame; ``threads`` is ONNX Runtime's per-call thread count;
    ``workers`` the threads that carry frames (default: enough for every
    session at once). How many frames are analysed at once, and when, is
    the CPU scheduler's: a frame is background work (nobody waits on it),
    never dropped -- the port already keeps only the newest.
    """

    accepted = (VideoFrame,)

    def __init__(
        self,
        name: str = "vision",
        *,
        clock: Clock,
        ocr: bool = True,
        faces: bool = True,
        min_text_score: float = 0.5,
        max_side: int = 640,
        min_face: int = 40,
        threads: int = 1,
        workers: int | None = None,
    ) -> None:
        self.analyzer = SceneAnalyzer(ocr=ocr, faces=faces, min_text_score=min_text_score,
                                      max_side=max_side, min_face=min_face, threads=threads)
        super().__init__(name, clock, workers=workers)
        self.replaced_frames = 0  # frames superseded before analysis (all ports)

    def port(self, session_id: str) -> StagePort:
        return _VisionPort(self, session_id)


class _VisionPort(ObservationPort):  # cancel aborts nothing: a scene is an observation
    _stage: VisionStage

    def __init__(self, stage: VisionStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self._latest: StageInput | None = None  # the one pending frame
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # nothing pending, nothing being analysed
        self._idle.set()
        self._worker: asyncio.Task[None] | None = None
        self._said: str | None = None  # text of the last description emitted

    async def _handle(self, item: StageInput) -> None:
        if self._latest is not None:
            self._stage.replaced_frames += 1
        self._latest = item
        self._idle.clear()
        self._wake.set()
        if self._worker is None:
            self._worker = self._spawn(item, self._analyse_latest)

    async def _analyse_latest(self) -> None:
        """The port's one worker: always the newest pending frame."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            item, self._latest = self._latest, None
            if item is not None:
                await self._analyse(item)
            if self._latest is None:
                self._idle.set()

    def _analyze(self, frame: VideoFrame) -> SceneDescription:
        with self._stage.scheduler.work(Urgency.BACKGROUND, self.name):
            return self._stage.analyzer.analyze(frame)

    async def _analyse(self, item: StageInput) -> None:
        try:
            scene = await self._stage.run(self._analyze, item.payload)
        except Exception as exc:  # one bad frame must not stop the stage
            log.exception("stage %s failed on %s", self.name, item.request_id)
            self._stage.failed_requests += 1
            error = DuplexError("stage_failed", f"stage {self.name!r} failed: {exc!r}")
            await self._emit(item.fence, item.request_id, StageFailed(error))
            return
        self._stage.completed_requests += 1
        if scene.text != self._said:
            self._said = scene.text
            await self._emit(item.fence, item.request_id, scene)

    async def idle(self) -> None:
        """Wait until no frame is pending or being analysed and every output
        is queued (for tests and benchmarks; not part of ``StagePort``)."""
        await self._idle.wait()
