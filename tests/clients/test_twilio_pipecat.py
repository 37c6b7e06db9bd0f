"""Our Twilio Media Stream against a third-party implementation of the same
protocol: Pipecat 1.14's ``TwilioFrameSerializer``, unmodified, in the
clients' virtualenv (``drivers/twilio_pipecat_driver.py``). The caller's
audio reaches the scripted pipeline as the ``media`` messages Pipecat writes,
and every ``media`` message the server sends back is read by Pipecat into 8
kHz audio frames: the whole reply, with no message it could not read."""

from __future__ import annotations

import dataclasses
import json

import pytest
import pytest_asyncio
from support.clients import run_driver, scenario, write_wav
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks: the module loop's leak check)
    SCRIPTED_REPLY,
    no_leaked_tasks,
    scripted_config,
    serve,
    utterance,
)
from vllm_duplex.host.twilio import Twilio
from vllm_duplex.realtime.server.telephony import twilio_codec as tw

pytestmark = pytest.mark.asyncio(loop_scope="module")

REPLY_MS = 120.0 * len(SCRIPTED_REPLY.split())  # the tone TTS: 120 ms a word
STREAM_SID = "MZpipecat0000000000000000000000000"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def seen(tmp_path_factory):
    wav = write_wav(tmp_path_factory.mktemp("twilio") / "utterance.wav", utterance())
    config = dataclasses.replace(scripted_config(), twilio=Twilio())
    async with serve(config) as server:
        results = await run_driver("twilio_pipecat_driver", server.http_url, "--audio", str(wav))
        assert len(server.runtime.manager) == 0  # the stop ended the session
    return scenario(results, "interop")


async def test_pipecat_reads_every_media_message_we_send_as_the_whole_reply(seen):
    assert seen["ours_rejected"] == [] and seen["ours_parsed"] > 0
    assert seen["decoded_rates"] == [8000]
    assert seen["decoded_bytes"] / 2 / 8 == pytest.approx(REPLY_MS, abs=20)
    assert seen["peak"] > 3000  # the reply's tones, not silence
    assert seen["marks"] == seen["ours_parsed"]  # a mark after each piece
    assert seen["closed"] == [1000, "hangup"]


async def test_we_read_the_media_pipecat_writes_and_send_what_it_writes(seen):
    # the reply above was to a turn spoken in Pipecat's media messages; and
    # its own messages are the ones our codec reads and writes
    theirs = tw.parse(seen["pipecat_media"])
    assert isinstance(theirs, tw.Media) and theirs.stream_sid == STREAM_SID
    assert len(theirs.audio) == 160 and set(theirs.audio) <= {0xFF, 0x7F}  # 20 ms of μ-law silence
    assert json.loads(seen["pipecat_clear"]) == json.loads(tw.clear(STREAM_SID))
    ours = json.loads(tw.media(STREAM_SID, theirs.audio))
    assert ours == json.loads(seen["pipecat_media"])
    assert seen["media_keys"] == ["media/payload"]
