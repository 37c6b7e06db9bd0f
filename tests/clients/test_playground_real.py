"""The playground in Chromium against the real CPU pipeline (one vLLM engine
for the test session): the fake microphone asks a question, and the page shows
the user's transcript, the assistant's answer, and plays it; on the video
config the fake camera (a Y4M of a shop sign) reaches the answer. The first
screenshot is the README's (build/playground.png)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont
from support.clients import BUILD, run_driver, scenario, write_wav
from support.speech_fixtures import cascade_runtime, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401  (vllm_stage: tests/conftest.py)
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = [pytest.mark.asyncio(loop_scope="session"),
              pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium: scripts/setup.sh")]


def y4m(path, sign: str, seconds: float = 1.0, fps: int = 10) -> str:
    """A still camera picture of a shop sign as a Y4M (4:2:0) for Chromium's fake camera."""
    img = Image.new("RGB", (640, 480), (40, 60, 80))
    draw = ImageDraw.Draw(img)
    draw.rectangle((120, 30, 520, 150), fill=(250, 250, 240))
    draw.text((190, 50), sign, font=ImageFont.load_default(size=80), fill=(200, 0, 0))
    rgb = np.asarray(img).astype(np.float32)
    y = 0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]
    u = 128 + (rgb[..., 2] - y) * 0.564
    v = 128 + (rgb[..., 0] - y) * 0.713
    planes = [np.clip(p, 0, 255).astype(np.uint8) for p in (y, u[::2, ::2], v[::2, ::2])]
    frame = b"FRAME\n" + b"".join(p.tobytes() for p in planes)
    with open(path, "wb") as f:
        f.write(f"YUV4MPEG2 W640 H480 F{fps}:1 Ip A1:1 C420jpeg\n".encode())
        f.write(frame * int(seconds * fps))
    return str(path)


async def test_a_spoken_question_in_the_browser(vllm_stage, tmp_path):
    wav = write_wav(tmp_path / "q.wav", speak("What is the capital of France?", tail_s=4.0)
                    .astype("<i2").tobytes())
    BUILD.mkdir(exist_ok=True)
    async with BackgroundServer(cascade_runtime(vllm_stage)) as server:
        results = await run_driver(
            "browser_driver", server.http_url, "--out", str(BUILD), "--path", "/?transport=websocket",
            "--audio", str(wav),
            "--scenarios", "talk", "--shot", "real", "--wait", "60", "--timeout", "150",
            "--until", "d.userFinal.length > 0 && d.playedSamples > 12000", timeout=200)
    seen = scenario(results, "talk")
    shutil.copy(seen["screenshot"], BUILD / "playground.png")
    state = seen["state"]
    assert seen["done"], state
    # Whisper hears the browser's processed microphone; what matters here is
    # that the page shows what it heard.
    [heard] = state["userFinal"]
    assert heard.lower().startswith("what is the capital of"), heard
    [answer] = [a["text"] for a in state["assistant"].values()]
    assert answer.strip()
    assert heard in seen["shown"]["user"] and answer.strip() in seen["shown"]["assistant"]
    assert state["playedSamples"] > 12000 and state["gapMs"] > 0
    assert seen["shown"]["gap"].endswith(" ms") and seen["shown"]["ttfa"].endswith(" ms")


async def test_the_camera_sign_reaches_the_answer(vllm_stage, tmp_path):
    wav = write_wav(tmp_path / "q.wav", speak("What does the sign say?", lead_s=3.0, tail_s=4.0)
                    .astype("<i2").tobytes())
    video = y4m(tmp_path / "sign.y4m", "OPEN")
    async with BackgroundServer(cascade_runtime(vllm_stage, "cascade-video-cpu")) as server:
        results = await run_driver(
            "browser_driver", server.http_url, "--out", str(BUILD), "--path", "/?transport=websocket",
            "--audio", str(wav),
            "--video", video, "--camera", "--scenarios", "talk", "--shot", "video",
            "--wait", "60", "--timeout", "150",
            "--until", "Object.values(d.assistant).some(a => /open/i.test(a.text))", timeout=200)
    seen = scenario(results, "talk")
    state = seen["state"]
    assert "open" in (state["scene"] or "").lower(), state
    assert "OPEN" in seen["shown"]["scene"]
    assert any("open" in a["text"].lower() for a in state["assistant"].values()), state["assistant"]
    assert 1 <= state["sent"].count("duplex.video.frame") <= 20  # about one a second
    assert "duplex.video.scene" in state["received"]
