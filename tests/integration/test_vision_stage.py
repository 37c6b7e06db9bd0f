"""The CPU vision stage on real pixels: RapidOCR reads a rendered sign, the
OpenCV Haar cascade finds the face in scikit-image's bundled astronaut
portrait (public domain, no download)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
import skimage.data as skimage_data
from PIL import Image, ImageDraw, ImageFont
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    InputObservation,
    SceneDescription,
    StageFailed,
    StageInput,
    VideoFrame,
)
from vllm_duplex.host.deploy import StageSpec
from vllm_duplex.host.stage_types import build_stage
from vllm_duplex.stages.port import StagePort
from vllm_duplex.stages.vision.scene import VisionStage, describe

SESSION = "s1"
FENCE = Fence(SESSION)


def scene(*, sign: bool = False, face: bool = False) -> np.ndarray:
    """A 640x480 camera frame: a shop sign reading OPEN 24 HOURS at the top,
    the astronaut's portrait below."""
    img = Image.new("RGB", (640, 480), (40, 60, 80))
    draw = ImageDraw.Draw(img)
    if sign:
        draw.rectangle((40, 40, 600, 170), fill=(250, 250, 240))
        font = ImageFont.load_default(size=60)
        x = 60
        for word in ("OPEN", "24", "HOURS"):
            draw.text((x, 70), word, font=font, fill=(200, 0, 0))
            x += draw.textlength(word, font=font) + 30
    if face:
        img.paste(Image.fromarray(skimage_data.astronaut()).resize((256, 256)), (200, 210))
    return np.asarray(img)


@pytest.fixture(scope="module")
def frames() -> dict[str, np.ndarray]:
    return {"sign": scene(sign=True), "face": scene(face=True),
            "both": scene(sign=True, face=True), "empty": scene()}


@pytest.fixture
def stage():
    stage = VisionStage(clock=MonotonicClock())
    yield stage
    stage.shutdown_workers()
    stage._executor.shutdown(wait=True)
    assert not [t for t in threading.enumerate() if t.name.startswith("duplex-vision")]


async def opened(stage: VisionStage, session: str = SESSION) -> StagePort:
    port = stage.port(session)
    await port.open(Fence(session))
    return port


async def submit(port: StagePort, rgb: np.ndarray, ts: int, fence: Fence = FENCE) -> None:
    await port.submit(StageInput(fence, f"frame-{ts}", VideoFrame(rgb, ts)))


async def closed_outputs(port) -> list:
    """Everything the port emitted, once all it was given is analysed."""
    await asyncio.wait_for(port.idle(), 30)
    await port.close()
    return [out.payload async for out in port.outputs()]


# ---- the analysis ----------------------------------------------------------


def test_reads_the_sign_and_counts_the_face(stage, frames):
    analyze = stage.analyzer.analyze
    sign = analyze(VideoFrame(frames["sign"], 10))
    assert any("OPEN" in t.upper() for t in sign.texts) and sign.faces == 0
    assert sign.text.startswith("visible text: ") and "OPEN" in sign.text.upper()
    assert sign.text.endswith("; no face") and sign.timestamp_ms == 10
    face = analyze(VideoFrame(frames["face"], 20))
    assert face == SceneDescription("no text; 1 face", 20, (), 1)
    both = analyze(VideoFrame(frames["both"], 30))
    assert "OPEN" in both.text.upper() and both.text.endswith("; 1 face")
    assert analyze(VideoFrame(frames["empty"], 40)).text == "no text; no face"


def test_the_bare_astronaut_portrait_has_one_face(stage):
    portrait = np.ascontiguousarray(skimage_data.astronaut())  # 512x512
    assert stage.analyzer.analyze(VideoFrame(portrait, 0)).faces == 1


def test_large_frames_are_downscaled_and_still_read(stage, frames):
    big = np.asarray(Image.fromarray(frames["both"]).resize((1920, 1440)))
    out = stage.analyzer.analyze(VideoFrame(big, 0))
    assert "OPEN" in out.text.upper() and out.faces == 1


def test_detectors_can_be_switched_off(frames):
    faces_only = VisionStage(clock=MonotonicClock(), ocr=False)
    text_only = VisionStage(clock=MonotonicClock(), faces=False)
    try:
        assert faces_only.analyzer.analyze(VideoFrame(frames["both"], 0)).text == "1 face"
        out = text_only.analyzer.analyze(VideoFrame(frames["both"], 0))
        assert out.text.startswith("visible text:") and "face" not in out.text
    finally:
        faces_only.shutdown_workers()
        text_only.shutdown_workers()
    with pytest.raises(ValueError):
        VisionStage(clock=MonotonicClock(), ocr=False, faces=False)
    with pytest.raises(ValueError):
        VisionStage(clock=MonotonicClock(), min_text_score=2)


def test_describe():
    assert describe(("OPEN 24 HOURS",), 1) == "visible text: OPEN 24 HOURS; 1 face"
    assert describe((), 0) == "no text; no face"
    assert describe(("A", "B"), 3) == "visible text: A / B; 3 faces"
    assert describe(None, 2) == "2 faces" and describe((), None) == "no text"


def test_the_registry_builds_it():
    stage = build_stage(StageSpec("vision", {"max_side": 320, "min_text_score": 0.6}),
                        MonotonicClock())
    try:
        assert isinstance(stage, VisionStage) and stage.analyzer.max_side == 320
    finally:
        stage.shutdown_workers()


# ---- the port --------------------------------------------------------------


async def test_port_emits_a_description_only_when_it_changes(stage, frames):
    port = await opened(stage)
    for ts, name in enumerate(["sign", "sign", "face", "face", "sign"]):
        await submit(port, frames[name], ts)
        await asyncio.wait_for(port.idle(), 30)  # each frame analysed: no replacement
    outs = await closed_outputs(port)
    assert [o.timestamp_ms for o in outs] == [0, 2, 4]
    assert [o.faces for o in outs] == [0, 1, 0]
    assert all(isinstance(o, InputObservation) for o in outs)
    assert stage.completed_requests == 5 and stage.replaced_frames == 0


async def test_newest_frame_wins_under_a_burst(stage, frames):
    port = await opened(stage)
    await submit(port, frames["sign"], 0)
    await asyncio.sleep(0)  # the worker takes frame 0 ...
    for ts in range(1, 20):  # ... while a burst arrives: each replaces the last
        await submit(port, frames["empty"], ts)
        await asyncio.sleep(0)
    await submit(port, frames["face"], 20)
    outs = await closed_outputs(port)
    assert stage.completed_requests <= 2 and stage.replaced_frames >= 18
    assert stage.completed_requests + stage.replaced_frames == 21
    assert outs[-1] == SceneDescription("no text; 1 face", 20, (), 1)


async def test_sessions_share_the_stage_but_not_their_scenes(stage, frames):
    a, b = await opened(stage, "a"), await opened(stage, "b")
    await submit(a, frames["sign"], 1, Fence("a"))
    await submit(b, frames["face"], 2, Fence("b"))
    out_a, out_b = await asyncio.gather(closed_outputs(a), closed_outputs(b))
    assert [o.faces for o in out_a] == [0] and "OPEN" in out_a[0].text.upper()
    assert [o.text for o in out_b] == ["no text; 1 face"]


async def test_cancel_aborts_nothing_and_a_bad_frame_does_not_stop_it(stage, frames):
    port = await opened(stage)
    await submit(port, frames["face"], 0)
    await asyncio.sleep(0)
    await port.cancel(FENCE.next_epoch())  # a barge-in: what was seen stands
    with pytest.raises(ValueError):
        await port.cancel(Fence("other"))
    await asyncio.wait_for(port.idle(), 30)
    await submit(port, np.zeros((4, 4), np.float32), 1, FENCE.next_epoch())  # not RGB uint8
    await asyncio.wait_for(port.idle(), 30)
    await submit(port, frames["face"], 2, FENCE.next_epoch())
    outs = await closed_outputs(port)
    assert outs[0] == SceneDescription("no text; 1 face", 0, (), 1)
    assert isinstance(outs[1], StageFailed) and outs[1].error.code == "stage_failed"
    assert outs[2:] == []  # the same scene again: nothing new to say
    assert stage.completed_requests == 2
    assert stage.failed_requests == 1


async def test_port_contract(stage, frames):
    port = await opened(stage)
    assert port.accepts(VideoFrame(frames["empty"], 0)) and not port.accepts(b"jpeg")
    with pytest.raises(TypeError):
        await port.submit(StageInput(FENCE, "x", "not a frame"))
    await port.close()
    await port.close()  # idempotent
    with pytest.raises(RuntimeError):
        await submit(port, frames["empty"], 0)
    assert [o async for o in port.outputs()] == []


async def test_close_while_analysing_leaves_no_task(stage, frames):
    port = await opened(stage)
    await submit(port, frames["both"], 0)
    await asyncio.sleep(0)
    await port.close()  # the worker task is cancelled and awaited
    assert [o async for o in port.outputs()] == []
