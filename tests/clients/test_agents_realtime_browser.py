"""The official browser SDK ``@openai/agents-realtime`` in headless Chromium
(``drivers/agents_realtime_driver.py``): its WebRTC transport, then its
WebSocket transport, against this server with only the URL changed and an
ephemeral client key minted by the "backend" (the driver). On the scripted
pipeline whose LLM calls a tool first (``tools_config``): the tool call
round-trips, the spoken answer is heard, ``interrupt()`` is answered, and
``close()`` ends the session."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import pytest_asyncio
from support.clients import AGENTS_RT_BUNDLE, run_driver, scenario, tools_config, write_wav
from support.realtime_fixtures import LONG_REPLY, no_leaked_tasks, serve  # noqa: F401
from support.speech_fixtures import speak
from vllm_duplex.host.deploy import StageSpec

pytestmark = [pytest.mark.asyncio(loop_scope="module"),
              pytest.mark.skipif(shutil.which("chromium") is None or not AGENTS_RT_BUNDLE.exists(),
                                 reason="no chromium or @openai/agents-realtime: scripts/setup.sh")]

KEY = "sk-app-backend"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def results(tmp_path_factory):
    wav = write_wav(tmp_path_factory.mktemp("sdk") / "ask.wav",
                    speak("What is the weather in Paris?", tail_s=6.0).astype("<i2").tobytes())
    config = tools_config()
    stages = tuple(StageSpec(s.type, {**s.options, "reply": LONG_REPLY})
                   if s.type == "scripted_llm" else s for s in config.stages)
    config = dataclasses.replace(config, stages=stages, api_keys=(KEY,))
    async with serve(config) as server:
        out = await run_driver("agents_realtime_driver", server.http_url, "--audio", str(wav),
                               "--api-key", KEY, "--timeout", "40", timeout=240)
        out["sessions_after"] = len(server.runtime.manager)
        out["calls_after"] = len(server._server.config.app.state.calls)
    return out


@pytest.mark.parametrize("transport", ["webrtc", "websocket"])
async def test_the_sdk_connects_and_its_session_config_is_accepted(results, transport):
    seen = scenario(results, transport)
    assert seen["events"][:2] == ["session.created", "session.updated"], seen["events"][:5]
    assert not seen["errors"], seen["errors"]
    assert not [c for c in seen["console"] if "pageerror" in c], seen["console"]


@pytest.mark.parametrize("transport", ["webrtc", "websocket"])
async def test_a_tool_call_round_trips(results, transport):
    seen = scenario(results, transport)
    assert seen["tool_called"] and seen["tools"] == ["Paris"]
    calls = [h for h in seen["history"] if h["type"] == "function_call"]
    assert calls and calls[0]["name"] == "get_weather" and calls[0]["output"] == "sunny in Paris"
    assert seen["answer_started"]


async def test_over_webrtc_the_answer_is_heard_on_the_track(results):
    seen = scenario(results, "webrtc")
    assert seen["heard"] and seen["audio_energy"] > 0
    assert seen["audio_bytes"] == 0  # no base64 audio on the data channel
    assert "output_audio_buffer.started" in seen["events"]
    assert any(r.endswith("/v1/realtime/calls") for r in seen["requests"])


async def test_over_the_websocket_the_answer_arrives_as_audio(results):
    seen = scenario(results, "websocket")
    assert seen["heard"] and seen["audio_bytes"] > 9600


@pytest.mark.parametrize("transport", ["webrtc", "websocket"])
async def test_interrupt_cancels_the_reply_and_keeps_what_was_heard(results, transport):
    """interrupt(): response.cancel, then (WebRTC) output_audio_buffer.clear or
    (WebSocket) conversation.item.truncate with what the SDK played."""
    seen = scenario(results, transport)
    after = seen["after_interrupt"]
    assert seen["interrupted"], after
    assert {"type": "response.done", "status": "cancelled"} in after, after
    assert any(e["type"] == "conversation.item.truncated" for e in after), after


async def test_close_ends_every_session_and_call(results):
    assert results["sessions_after"] == 0 and results["calls_after"] == 0
