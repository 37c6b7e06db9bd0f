"""LiveKit Agents 1.8.9's GPT-Live model (``GPTLiveModel``), unmodified and with
its defaults, against ``/v1/live/sessions`` on the scripted pipeline (tone TTS,
a scripted LLM): only ``base_url`` and the API key point it here. The driver is
``drivers/livekit_live_driver.py``."""

from __future__ import annotations

import pytest
import pytest_asyncio
from support.clients import run_driver, scenario, write_wav
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks: the module loop's leak check)
    SCRIPTED_REPLY,
    no_leaked_tasks,
    serve,
    utterance,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def results(tmp_path_factory):
    wav = write_wav(tmp_path_factory.mktemp("livekit_live") / "utterance.wav", utterance())
    async with serve() as server:
        return await run_driver("livekit_live_driver", server.http_url, "--audio", str(wav),
                                "--scenarios", "conversation,mute")


async def test_its_defaults_start_a_session(results):
    """Model ``gpt-live-1``, voice ``marin`` and ``responses`` delegation (its
    default) are accepted: ``session.started``, no error."""
    seen = scenario(results, "conversation")
    assert seen["server_errors"] == [] and seen["client_errors"] == []
    session = seen["started"]["session"]
    assert session["model"] == "gpt-live-1" and session["id"] == seen["session_id"]
    assert session["audio"]["output"]["voice"] == "marin"
    assert session["delegation"]["type"] == "responses"


async def test_a_spoken_turn_is_answered_in_audio_and_transcript(results):
    seen = scenario(results, "conversation")
    assert seen["output_transcript"].strip() == SCRIPTED_REPLY
    assert seen["audio_ms"] > 500  # the frames its audio_stream played
    assert "response.create" not in seen["server_events"]


async def test_mute_is_honoured_at_once(results):
    seen = scenario(results, "mute")
    assert seen["server_errors"] == [] and seen["client_errors"] == []
    assert seen["while_muted"] == {"input_transcript": "", "audio_ms": 0.0}
    assert "session.input_audio.muted" in seen["server_events"]
    assert "session.input_audio.unmuted" in seen["server_events"]
