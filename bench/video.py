"""Video ingest figures (issue 6), each against a baseline run in the same
process:

1. **Frames ingested per second per session**: 640x480 JPEG frames sent as
   ``duplex.video.frame`` as fast as the socket takes them, every one
   decoded (sampling off); baseline: ``decode_image`` alone, in a loop.
2. **WebM decode**: a live-style VP8 stream fed as ``duplex.video.chunk``
   fragments; frames decoded per second (baseline: the same stream demuxed
   by PyAV from memory in one go, converted to RGB as well).
3. **Frame → context update**: a frame whose sign changes, until the
   ``duplex.video.scene`` event that describes it (OCR + faces + the
   socket); baseline: ``SceneAnalyzer.analyze`` on the same frame.

The server is the vision half of ``configs/cascade-video-cpu.yaml`` (the
cascade policy with a VAD and its ``vision`` stage: no model to load). Run::

    .venv/bin/python bench/video.py --frames 200
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import io
import statistics
import sys
import time
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageDraw, ImageFont
from vllm_duplex.domain.payloads import VideoFrame
from vllm_duplex.host.deploy import DeployConfig, StageSpec, load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.media.video import decode_image
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.realtime.server.serving import BackgroundServer
from vllm_duplex.stages.vision.scene import SceneAnalyzer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lib import machine  # noqa: E402


def camera(sign: str) -> np.ndarray:
    img = Image.new("RGB", (640, 480), (40, 60, 80))
    draw = ImageDraw.Draw(img)
    draw.rectangle((120, 30, 520, 150), fill=(250, 250, 240))
    draw.text((160, 50), sign, font=ImageFont.load_default(size=80), fill=(200, 0, 0))
    return np.asarray(img)


def jpeg(frame: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, "JPEG", quality=85)
    return buf.getvalue()


def webm(frames: list[np.ndarray], fps: int = 30) -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="webm", options={"live": "1"}) as out:
        stream = out.add_stream("libvpx", rate=fps)
        stream.width, stream.height, stream.pix_fmt = 640, 480, "yuv420p"
        stream.options = {"deadline": "realtime", "cpu-used": "8"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def vision_only(fps: float) -> DeployConfig:
    config = load_config("cascade-video-cpu")
    return dataclasses.replace(
        # The cascade needs vad, asr, llm and tts besides vision (refused at
        # load otherwise); these are the cheap ones, and only vision gets work.
        config, stages=(StageSpec("energy_vad"), StageSpec("pocketsphinx"),
                        StageSpec("scripted_llm"), StageSpec("tone_tts"), StageSpec("vision")),
        limits=dataclasses.replace(config.limits, video_fps=fps, video_max_fps=10_000.0,
                                   video_max_bytes_per_s=1 << 34, resume_grace_s=0))


async def ingest(frames: int) -> None:
    data = jpeg(camera("OPEN 24"))
    decode_image(data)  # warm: the first call imports PIL
    started = time.perf_counter()
    for _ in range(frames):
        decode_image(data)
    alone = frames / (time.perf_counter() - started)
    async with BackgroundServer(Runtime(vision_only(fps=10_000.0))) as server:
        async with await RealtimeClient.connect(server.ws_url) as rt:
            frame = base64.b64encode(data).decode()
            started = time.perf_counter()
            for i in range(frames):
                await rt.send({"type": "duplex.video.frame", "image": frame, "timestamp_ms": i * 1000})
            await rt.update_session({"instructions": "sync"})  # behind every frame in the mailbox
            took = time.perf_counter() - started
            vision = server.runtime.stages[-1]
            await asyncio.sleep(1.0)  # the last analysis
            reached = vision.completed_requests + vision.replaced_frames
    print(f"ingest: {frames / took:.0f} JPEG frames/s into one session (640x480, all decoded) vs "
          f"{alone:.0f} frames/s for decode_image alone ({frames / took / alone:.2f}x); "
          f"{len(data) / 1024:.0f} KiB a frame; {reached} of {frames} frames reached the vision stage")


async def stream_decode(seconds: float) -> None:
    fps = 30
    frames = [camera(f"{i // fps:02d}") for i in range(int(seconds * fps))]
    video = webm(frames, fps)
    with av.open(io.BytesIO(video)) as container:  # warm: codec set-up out of the timing
        next(container.decode(video=0))
    started = time.perf_counter()
    with av.open(io.BytesIO(video)) as container:
        decoded = sum(1 for f in container.decode(video=0) if f.to_ndarray(format="rgb24").size)
    alone = decoded / (time.perf_counter() - started)
    async with BackgroundServer(Runtime(vision_only(fps=float(fps)))) as server:
        async with await RealtimeClient.connect(server.ws_url) as rt:
            session, _ = server.runtime.manager.get(rt.session_id, None)
            started = time.perf_counter()
            for i in range(0, len(video), 32 << 10):
                await rt.send({"type": "duplex.video.chunk", "container": "webm",
                               "data": base64.b64encode(video[i:i + (32 << 10)]).decode()})
            decoder = None
            while decoder is None or decoder.decoded < decoded - 1:
                decoder = session._video.decoder
                await asyncio.sleep(0.005)
            took = time.perf_counter() - started
    print(f"webm: {decoded / took:.0f} frames/s decoded from {len(video) >> 10} KiB of 32 KiB chunks "
          f"(VP8 640x480) vs {alone:.0f} frames/s demuxed from memory ({decoded / took / alone:.2f}x)")


async def context_latency(samples: int) -> None:
    analyzer = SceneAnalyzer(ocr=True, faces=True, min_text_score=0.5, max_side=640, min_face=40,
                             threads=1)  # the stage's defaults
    signs = [f"SIGN {i}" for i in range(samples)]
    direct = []
    for sign in signs:
        frame = VideoFrame(camera(sign), 0)
        started = time.perf_counter()
        analyzer.analyze(frame)
        direct.append(time.perf_counter() - started)
    async with BackgroundServer(Runtime(vision_only(fps=100.0))) as server:
        async with await RealtimeClient.connect(server.ws_url) as rt:
            lat = []
            for i, sign in enumerate(signs):
                image = base64.b64encode(jpeg(camera(sign))).decode()
                started = time.perf_counter()
                await rt.send({"type": "duplex.video.frame", "image": image, "timestamp_ms": i * 1000})
                await rt.wait_for("duplex.video.scene", timeout=30)
                lat.append(time.perf_counter() - started)
    base, med = statistics.median(direct), statistics.median(lat)
    print(f"frame -> context update: {med * 1000:.0f} ms median over {samples} frames "
          f"(p90 {statistics.quantiles(lat, n=10)[8] * 1000:.0f} ms) vs {base * 1000:.0f} ms for "
          f"SceneAnalyzer.analyze alone ({med / base:.2f}x)")


async def main(args: argparse.Namespace) -> None:
    print(machine.line(), flush=True)
    await ingest(args.frames)
    await stream_decode(args.seconds)
    await context_latency(args.samples)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--samples", type=int, default=10)
    asyncio.run(main(parser.parse_args()))
