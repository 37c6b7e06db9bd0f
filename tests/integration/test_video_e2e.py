"""Video input end to end on the real pipeline (issue 6): a synthetic camera
stream (PyAV-encoded WebM: a shop sign and a face) goes in as
``duplex.video.chunk`` fragments while Flite asks about the sign; RapidOCR
reads it, OpenCV finds the face, the scene becomes the model's context, and
vLLM's spoken answer names the sign. Plus still frames, ``input_image``
items, rate limits, corrupt input and policies without video."""

from __future__ import annotations

import asyncio
import io

import av
import numpy as np
import pytest
import pytest_asyncio
import skimage.data as skimage_data
from PIL import Image, ImageDraw, ImageFont
from support.audio import b64
from support.speech_fixtures import cascade_runtime, say, speak
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")


def camera(sign: str | None = "OPEN", face: bool = True) -> np.ndarray:
    img = Image.new("RGB", (640, 480), (40, 60, 80))
    draw = ImageDraw.Draw(img)
    if sign:
        draw.rectangle((120, 30, 520, 150), fill=(250, 250, 240))
        draw.text((190, 50), sign, font=ImageFont.load_default(size=80), fill=(200, 0, 0))
    if face:
        img.paste(Image.fromarray(skimage_data.astronaut()).resize((240, 240)), (200, 220))
    return np.asarray(img)


def webm(frame: np.ndarray, seconds: float = 2.0, fps: int = 10) -> bytes:
    """A live-style WebM (VP8) of a still scene, as a browser's MediaRecorder cuts it."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="webm", options={"live": "1"}) as out:
        stream = out.add_stream("libvpx", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 640, 480, "yuv420p"
        stream.options = {"deadline": "realtime", "cpu-used": "8"}
        for _ in range(int(seconds * fps)):
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def png(frame: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, "PNG")
    return buf.getvalue()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage, "cascade-video-cpu",
                                                video_max_fps=12.0)) as srv:
        yield srv


async def scene_event(rt: RealtimeClient, timeout: float = 60) -> dict:
    return await rt.wait_for("duplex.video.scene", timeout=timeout)


async def test_a_spoken_question_about_the_sign_is_answered_from_the_video(server):
    video = webm(camera("OPEN"))
    async with await RealtimeClient.connect(server.ws_url) as rt:
        # the camera stream, in MediaRecorder-sized fragments
        for i in range(0, len(video), 16 << 10):
            await rt.send({"type": "duplex.video.chunk", "container": "webm",
                           "data": b64(video[i:i + 16 << 10])})
        scene = await scene_event(rt)
        assert "open" in scene["text"].lower() and scene["faces"] == 1, scene
        assert "seq" in scene  # journaled like every other event
        await say(rt, speak("What does the sign say?"))
        reply = await rt.collect_response(timeout=120)
    assert reply.status == "completed"
    assert "open" in reply.transcript.lower(), reply.transcript


async def test_still_frames_and_input_images_update_the_scene(server):
    async with await RealtimeClient.connect(server.ws_url) as rt:
        await rt.send({"type": "duplex.video.frame", "image": b64(png(camera(None, face=True))),
                       "timestamp_ms": 0})
        scene = await scene_event(rt)
        assert scene["faces"] == 1 and scene["texts"] == []
        await rt.send({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Look at this."},
                {"type": "input_image", "image_url": "data:image/png;base64," + b64(png(camera("EXIT", face=False)))}]}})
        added = await rt.wait_for("conversation.item.added")
        assert added["item"]["content"][1]["type"] == "input_image"
        scene = await scene_event(rt)
        assert "exit" in scene["text"].lower() and scene["faces"] == 0


async def test_bad_video_gets_typed_errors_and_the_session_goes_on(server):
    async with await RealtimeClient.connect(server.ws_url) as rt:
        cases = [
            ({"type": "duplex.video.frame", "image": b64(b"not an image at all")}, "invalid_image"),
            ({"type": "duplex.video.frame", "image": "%%%"}, "invalid_image"),
            # not a WebM stream (a stream that merely stops short waits for more data)
            ({"type": "duplex.video.chunk", "container": "webm", "data": b64(bytes(range(256)) * 8)},
             "invalid_image"),
            ({"type": "duplex.video.chunk", "container": "avi", "data": b64(b"x")}, "invalid_value"),
            ({"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
                {"type": "input_image", "image_url": "https://example.com/cat.png"}]}}, "invalid_value"),
        ]
        for event, code in cases:
            await rt.send(event)
            err = await rt.wait_for("error", timeout=30)
            assert err["error"]["code"] == code, (event["type"], err)
        # a new stream after a corrupt one, and a good frame: both still work
        await rt.send({"type": "duplex.video.frame", "image": b64(png(camera("OPEN", face=False))),
                       "timestamp_ms": 10_000})
        scene = await scene_event(rt)
        assert "open" in scene["text"].lower()


async def test_frames_over_the_rate_limit_are_refused(server):
    frame = b64(png(camera(None, face=False)))
    async with await RealtimeClient.connect(server.ws_url) as rt:
        for i in range(30):  # a burst: the limit is 12 frames/s
            await rt.send({"type": "duplex.video.frame", "image": frame, "timestamp_ms": i})
        errors = []
        async with asyncio.timeout(30):
            while len(errors) < 18:
                event = await rt.recv()
                if event["type"] == "error":
                    errors.append(event["error"]["code"])
        assert set(errors) == {"rate_limited"}
        await rt.update_session({"instructions": "still here"})  # the session survives


async def test_a_policy_without_video_says_so():
    from support.realtime_fixtures import scripted_config, serve

    async with serve(scripted_config()) as srv, await RealtimeClient.connect(srv.ws_url) as rt:
        await rt.send({"type": "duplex.video.frame", "image": b64(png(camera()))})
        err = await rt.wait_for("error")
        assert err["error"]["code"] == "capability_unsupported"
