"""A stored GPT-Live session's recording (``GET /v1/live/sessions/{id}/content``,
the SDK's ``client.live.sessions.download_recording``) on a real server
(scripted stages), from a session the SDK's live client talked to at real
time: the WAV opens, lasts as long as the session, and holds the caller
left where they spoke (silence where they were muted) and the engine's
voice right where it was played."""

from __future__ import annotations

import asyncio
import base64
import io
import time
import wave

import numpy as np
import openai
import pytest
from openai import AsyncOpenAI
from support.live_kit import Microphone, live, started
from support.realtime_fixtures import module_server, no_leaked_tasks, utterance  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="module")

server = module_server()
RATE = 24000
QUESTION = np.frombuffer(utterance(silence_s=0.0), "<i2")  # 0.8 s of tone


def opened(wav: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, RATE)
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)


def loud(channel: np.ndarray, threshold: int = 1000) -> np.ndarray:
    """Seconds (from the start) of the 20 ms windows louder than ``threshold``."""
    n = len(channel) // 480
    peaks = np.abs(channel[:n * 480].astype(np.int32)).reshape(n, 480).max(axis=1)
    return np.flatnonzero(peaks > threshold) * 0.02


async def download(server, session_id: str, key: str = "sk-local") -> bytes:
    async with AsyncOpenAI(api_key=key, base_url=server.http_url + "/v1",
                           max_retries=0) as client:
        return (await client.live.sessions.download_recording(session_id)).read()


async def test_the_recording_holds_the_caller_left_and_the_voice_right_on_one_timeline(server):
    async with live(server) as conn:
        _, start = await started(conn, store=True)
        t0 = time.monotonic()  # the session's start, as the client saw it
        async with Microphone(conn) as mic:
            await asyncio.sleep(0.6)
            said_at = mic.say(QUESTION) - t0
            await mic.until(lambda: mic.quiet(1.0), 20)
            reply_s = len(mic.audio()) / 2 / RATE
            replied_at = mic.events[[e.type for _, e in mic.events].index(
                "session.output_audio.delta")][0] - t0
            await mic.until(lambda: mic.of("session.usage.updated"), 5)  # saved after the reply
            so_far = opened(await download(server, start.session.id))
            await conn.session.input_audio.mute(event_id="m")
            await mic.until(lambda: mic.of("session.input_audio.muted"), 5)
            muted_at = mic.say(QUESTION) - t0
            await asyncio.sleep(1.5)
            await conn.session.input_audio.unmute(event_id="u")
            await mic.until(lambda: mic.of("session.input_audio.unmuted"), 5)
            await conn.session.close(event_id="bye")
            await mic.until(lambda: mic.of("session.closed"), 10)
            ended_at = time.monotonic() - t0
    frames = opened(await download(server, start.session.id))
    # As long as the session (the microphone streamed until it closed).
    assert abs(len(frames) / RATE - ended_at) < 0.5, (len(frames) / RATE, ended_at)
    caller, voice = loud(frames[:, 0]), loud(frames[:, 1])
    # The question, left, where and as long as it was spoken; nothing else.
    assert abs(caller[0] - said_at) < 0.25, (caller[0], said_at)
    assert abs(len(caller) * 0.02 - 0.8) < 0.1 and caller[-1] < said_at + 1.0
    # Muted: silence there (and no reply to it).
    assert not ((caller > muted_at - 0.1) & (caller < muted_at + 1.0)).any()
    # The voice, right, from when it was played, as long as the client got it.
    assert abs(voice[0] - replied_at) < 0.3, (voice[0], replied_at)
    assert voice[0] > caller[-1]  # after the question, not over it
    assert abs(len(voice) * 0.02 - reply_s) < 0.3, (len(voice) * 0.02, reply_s)
    assert not ((voice > muted_at) & (voice < muted_at + 1.5)).any()
    # A session still running gave its recording up to its last reply.
    assert replied_at + reply_s - 0.3 < len(so_far) / RATE < muted_at
    assert abs(loud(so_far[:, 0])[0] - said_at) < 0.25 and len(loud(so_far[:, 1])) > 0


async def test_no_recording_for_an_unknown_unstored_or_other_keys_session(server):
    async with live(server) as conn:
        _, kept = await started(conn, store=True)
    async with live(server) as conn:
        _, plain = await started(conn)  # store: false (the default)
    for session_id, key in ((kept.session.id, "sk-other"), (plain.session.id, "sk-local"),
                            ("sess_never", "sk-local")):
        with pytest.raises(openai.NotFoundError) as missing:
            await download(server, session_id, key)
        assert (missing.value.body["code"], missing.value.body["param"]) == (
            "session_not_found", "session_id")
    assert len(opened(await download(server, kept.session.id))) >= 0  # its owner's


async def test_an_audio_fixture_is_recorded_as_the_client_played_it(server):
    t = np.arange(int(0.8 * RATE)) / RATE
    fixture = (np.sin(2 * np.pi * 523 * t) * 6000).astype("<i2").tobytes()
    async with live(server) as conn:
        _, start = await started(conn, store=True)
        t0 = time.monotonic()
        async with Microphone(conn) as mic:
            await asyncio.sleep(0.4)
            played_at = time.monotonic() - t0
            await conn.session.output_audio.fixture.play(
                audio=base64.b64encode(fixture).decode(), event_id="fx")
            await mic.until(lambda: mic.of("session.output_audio.fixture.played"), 10)
            await conn.session.close(event_id="bye")
            await mic.until(lambda: mic.of("session.closed"), 10)
    frames = opened(await download(server, start.session.id))
    voice = loud(frames[:, 1])
    assert abs(voice[0] - played_at) < 0.3 and abs(len(voice) * 0.02 - 0.8) < 0.1, voice
    assert len(loud(frames[:, 0])) == 0  # the caller said nothing
