"""Admission at the ceiling on the real default pipeline: two people talk at
once to a server that holds two voice sessions; a third caller, while they
talk, is refused before the upgrade (429 ``at_capacity``, retry hint), and the
two admitted conversations are answered right and heard whole -- refusing
the third is what keeps them at their figures (``bench/capacity.py``
measures those; a test does not time them)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from support.speech_fixtures import RATE, cascade_runtime, recognize, say, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_the_admitted_talk_and_are_answered_while_the_one_past_the_ceiling_is_refused(
        vllm_stage):
    async with BackgroundServer(cascade_runtime(vllm_stage, max_voice_sessions=2)) as srv:
        async with await RealtimeClient.connect(srv.ws_url) as a, \
                await RealtimeClient.connect(srv.ws_url) as b:

            async def ask(client: RealtimeClient, question: str, voice: str):
                await say(client, speak(question, voice=voice))
                return await client.collect_response(timeout=120)

            talking = asyncio.gather(ask(a, "What is the capital of France?", "slt"),
                                     ask(b, "What is the capital of Italy?", "rms"))
            await asyncio.sleep(1.0)  # both are mid-question
            with pytest.raises(RealtimeError) as refused:
                await RealtimeClient.connect(srv.ws_url)
            assert refused.value.code == "at_capacity" and refused.value.retry_after_s == 5
            france, italy = await talking
    assert france.status == italy.status == "completed"
    assert "Paris" in france.transcript and "Rome" in italy.transcript
    assert "paris" in recognize(np.frombuffer(france.audio, "<i2"), RATE).split()
    assert "rome" in recognize(np.frombuffer(italy.audio, "<i2"), RATE).split()
