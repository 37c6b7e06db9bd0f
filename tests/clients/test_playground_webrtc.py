"""The playground's default transport, WebRTC, in headless Chromium (Playwright,
``drivers/browser_driver.py``) on the scripted pipeline: the page mints an
ephemeral key with the API key typed into it, offers a call, streams the fake
microphone on its Opus track, hears the reply on the answer's track, and the
server stops that track when the user talks over the reply; a refused key is
shown. The WebSocket transport's tests are ``test_playground.py``."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
import pytest_asyncio
from support.clients import BUILD, run_driver, scenario, write_wav
from support.realtime_fixtures import LONG_REPLY, no_leaked_tasks, scripted_config, serve  # noqa: F401
from support.speech_fixtures import speak

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium: scripts/setup.sh")]

KEY = "sk-playground"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def talked(tmp_path_factory):
    pcm = np.concatenate([speak("Hello there, how are you today?", tail_s=1.5),
                          speak("Wait, stop.", lead_s=0.0, tail_s=2.0)])
    wav = write_wav(tmp_path_factory.mktemp("rtc") / "barge-in.wav", pcm.astype("<i2").tobytes())
    BUILD.mkdir(exist_ok=True)
    async with serve(scripted_config(reply=LONG_REPLY, api_keys=(KEY,))) as server:
        results = await run_driver(
            "browser_driver", server.http_url, "--out", str(BUILD), "--audio", str(wav),
            "--key", KEY, "--scenarios", "talk,refused_key", "--shot", "webrtc",
            "--until", "d.received.includes('output_audio_buffer.cleared')", "--timeout", "60",
            timeout=150)
        for _ in range(500):  # the page hung up: the call's end reaches the server
            if len(server.runtime.manager) == 0:
                break
            await asyncio.sleep(0.01)
        results["sessions_after"] = len(server.runtime.manager)
        results["calls_after"] = len(server._server.config.app.state.calls)
    return results


async def test_the_page_calls_over_webrtc_with_an_ephemeral_key(talked):
    seen = scenario(talked, "talk")
    paths = [u.split("?")[0].split("/", 3)[-1] for u in seen["requests"]]
    assert "v1/realtime/client_secrets" in paths and "v1/realtime/calls" in paths
    assert not any(u.startswith("ws") for u in seen["requests"])  # no socket
    state = seen["state"]
    assert state["callId"].startswith("rtc_")
    assert state["received"][:2] == ["session.created", "session.updated"]


async def test_the_reply_is_heard_on_the_track_and_its_gap_shown(talked):
    seen = scenario(talked, "talk")
    state = seen["state"]
    assert seen["heard"] and state["playedSamples"] > 0
    assert "output_audio_buffer.started" in state["received"]
    assert "response.output_audio.delta" not in state["received"]
    assert state["gapMs"] > 0 and seen["shown"]["gap"].endswith(" ms")


async def test_talking_over_the_reply_stops_its_track(talked):
    seen = scenario(talked, "talk")
    assert seen["done"], seen["state"]["received"]
    received = seen["state"]["received"]
    assert received.index("output_audio_buffer.started") < received.index("output_audio_buffer.cleared")


async def test_a_refused_key_is_shown(talked):
    seen = scenario(talked, "refused_key")
    assert "refused the API key" in seen["problem_visible"]


async def test_hanging_up_ends_the_call(talked):
    assert talked["sessions_after"] == 0 and talked["calls_after"] == 0
