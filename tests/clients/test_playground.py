"""The browser playground (``GET /``), tested in a real browser: Debian's
Chromium, headless, driven by Playwright with a fake microphone (a WAV the
test writes) -- ``drivers/browser_driver.py``. Against the scripted pipeline:
the page loads only from the engine, streams the microphone, plays the reply
(samples counted in the page's playback worklet), stops playback at once when
the user talks over it and truncates with what it played; a refused key, a
full server, a denied microphone and a dropped socket each show what happened
(the socket resumes). The real pipeline's transcript and the camera's sign
are in ``test_playground_real.py``. Screenshots go to ``build/``."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
import pytest_asyncio
from support.clients import BUILD, run_driver, scenario, write_wav
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks: the module loop's leak check)
    LONG_REPLY,
    no_leaked_tasks,
    scripted_config,
    serve,
)
from support.speech_fixtures import speak
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium: scripts/setup.sh")]

KEY = "sk-playground"


def browser(http_url: str, *args: str, timeout: float = 90) -> asyncio.Future:
    """The page over its WebSocket transport (the WebRTC default: test_playground_webrtc.py)."""
    BUILD.mkdir(exist_ok=True)
    return run_driver("browser_driver", http_url, "--out", str(BUILD), "--path", "/?transport=websocket",
                      *args, timeout=timeout)


@pytest.fixture(scope="module")
def barge_in_wav(tmp_path_factory) -> str:
    """A question, a pause for the reply, then the user talks over the reply."""
    pcm = np.concatenate([speak("Hello there, how are you today?", tail_s=1.0),
                          speak("Wait, stop.", lead_s=0.0, tail_s=2.0)])
    return str(write_wav(tmp_path_factory.mktemp("browser") / "barge-in.wav", pcm.astype("<i2").tobytes()))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def talked(barge_in_wav):
    async with serve(scripted_config(reply=LONG_REPLY, api_keys=(KEY,), resume_grace_s=5.0)) as server:
        results = await browser(server.http_url, "--audio", barge_in_wav, "--key", KEY,
                                "--scenarios", "talk,resume", "--until", "d.stops.some(s => s.item)",
                                "--shot", "scripted", "--timeout", "40")
    return results


async def test_the_page_loads_only_from_the_engine(talked):
    seen = scenario(talked, "talk")
    page = seen["requests"][0].split("?")[0]
    origin = page.rsplit("/", 1)[0]
    assert page.endswith("/")
    assert all(url.startswith(origin + "/") for url in seen["requests"]), seen["requests"]
    assert not [c for c in seen["console"] if c.startswith(("error", "pageerror"))], seen["console"]


async def test_the_microphone_is_streamed_and_the_reply_played(talked):
    seen = scenario(talked, "talk")
    state = seen["state"]
    assert seen["heard"] and seen["problem_visible"] == ""
    update = next(e for e in state["sent"] if isinstance(e, dict) and e["type"] == "session.update")
    assert update["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert state["sent"].count("input_audio_buffer.append") > 100  # 20 ms frames
    received = state["received"]
    assert received.index("input_audio_buffer.speech_started") < received.index("response.created")
    assert list(state["assistant"].values())[0]["text"] == LONG_REPLY
    assert state["playedSamples"] > 2400  # more than 0.1 s came out of the playback worklet
    assert state["gapMs"] is not None and state["ttfaMs"] is not None


async def test_talking_over_the_reply_stops_playback_and_truncates_what_was_played(talked):
    state = scenario(talked, "talk")["state"]
    stop = next(s for s in state["stops"] if s["item"])
    reply_samples = 24000 * 2.9  # LONG_REPLY: 24 words x 120 ms of tone
    assert 0 < stop["played"] < reply_samples
    assert state["playedSamples"] == stop["played"]  # nothing more was played after the stop
    [truncate] = state["truncates"]
    assert truncate == {"item": stop["item"], "audio_end_ms": int(1000 * stop["played"] / 24000)}
    assert state["received"].count("input_audio_buffer.speech_started") == 2
    assert "conversation.item.truncated" in state["received"]


async def test_a_dropped_socket_resumes_the_session(talked):
    seen = scenario(talked, "resume")
    assert seen["resumed"], seen["status_text"]
    assert seen["state"]["sessionId"] == seen["before"]["sessionId"]
    assert "session.resumed" in seen["state"]["received"]
    assert seen["status_text"].startswith("Reconnected")
    assert seen["problem_visible"] == ""


async def test_a_refused_key_is_shown(barge_in_wav):
    async with serve(scripted_config(api_keys=(KEY,))) as server:
        seen = scenario(await browser(server.http_url, "--audio", barge_in_wav,
                                      "--scenarios", "refused_key"), "refused_key")
    assert "refused the API key" in seen["problem_visible"]
    assert not seen["state"]["connected"]


async def test_a_full_server_is_shown(barge_in_wav):
    async with serve(scripted_config(max_sessions=1)) as server:
        async with await RealtimeClient.connect(server.ws_url):  # takes the only place
            seen = scenario(await browser(server.http_url, "--audio", barge_in_wav,
                                          "--scenarios", "full_server"), "full_server")
    assert "server is full" in seen["problem_visible"]


async def test_a_denied_microphone_is_shown(barge_in_wav):
    async with serve(scripted_config()) as server:
        seen = scenario(await browser(server.http_url, "--audio", barge_in_wav,
                                      "--scenarios", "denied_microphone"), "denied_microphone")
    assert "No microphone" in seen["problem_visible"] and "denied" in seen["problem_visible"]
    assert seen["state"]["sessionId"] is None  # nothing was opened without a microphone
