"""GPT-Live audio fixtures and initial history on a real server (scripted
stages), driven by the ``openai`` SDK's own live client; every raw frame is
validated against the SDK's model of its type.

The scripted LLM here recalls (``recall``): its reply ends with the user's
message before the last ("You said before: ..."), so a reply that quotes the
history's user message shows the session started with it."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
import pytest
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    b64,
    chunks,
    module_server,
    no_leaked_tasks,
    recall_config,
    silence,
    utterance,
)
from support.live_kit import live, started

pytestmark = pytest.mark.asyncio(loop_scope="module")


server = module_server(recall_config())


def fixture_pcm(seconds: float) -> bytes:
    t = np.arange(int(seconds * 24000)) / 24000
    return (np.sin(2 * np.pi * 523 * t) * 6000).astype("<i2").tobytes()


def heard(events, after: int, before: int | None = None) -> bytes:
    """The output audio the client got between two events (indexes)."""
    return b"".join(base64.b64decode(e.delta) for e in events.events[after:before]
                    if e.type == "session.output_audio.delta")


def index(events, kind: str) -> int:
    return next(i for i, e in enumerate(events.events) if e.type == kind)


async def test_the_client_hears_the_fixture_then_played(server):
    pcm = fixture_pcm(0.8)
    async with live(server) as conn:
        events, _ = await started(conn)
        await conn.session.output_audio.fixture.play(audio=base64.b64encode(pcm).decode(),
                                                      event_id="fx1")
        playing = await events.until("session.output_audio.fixture.playing")
        t0 = time.monotonic()
        played = await events.until("session.output_audio.fixture.played")
        elapsed = time.monotonic() - t0
    assert playing.client_event_id == played.client_event_id == "fx1"
    got = heard(events, index(events, "session.output_audio.fixture.playing"),
                index(events, "session.output_audio.fixture.played"))
    assert got == pcm  # the fixture, whole, in the session's format (PCM16 24 kHz here)
    # played when the output drained, not when the bytes left: paced at playback speed
    assert elapsed >= 0.8 - 0.3 - 0.05


async def test_a_fixture_stops_the_reply_and_input_meanwhile_is_not_heard(server):
    pcm = fixture_pcm(1.2)
    async with live(server) as conn:
        events, _ = await started(conn)
        for chunk in chunks(utterance() + silence(0.5)):
            await conn.session.input_audio.append(audio=b64(chunk))
        await events.until("session.output_audio.delta")  # the reply is speaking
        await conn.session.output_audio.fixture.play(audio=base64.b64encode(pcm).decode(),
                                                      event_id="fx1")
        await events.until("session.output_audio.fixture.playing")
        await conn.session.output_audio.fixture.play(audio=base64.b64encode(pcm).decode(),
                                                      event_id="fx2")
        err = await events.until("error")
        assert (err.error.code, err.client_event_id) == ("fixture_already_playing", "fx2")
        for chunk in chunks(utterance() + silence(0.3)):  # spoken over the fixture: dropped
            await conn.session.input_audio.append(audio=b64(chunk))
        await events.until("session.output_audio.fixture.played")
        await asyncio.sleep(1.0)
        await conn.session.update(session={}, event_id="sync")  # a round trip past all of it
        await events.until("session.updated")
    start = index(events, "session.output_audio.fixture.playing")
    end = index(events, "session.output_audio.fixture.played")
    assert heard(events, start, end) == pcm  # only the fixture while it plays
    assert not heard(events, end)  # the cut reply does not come back; nothing was heard to answer
    assert not [e for e in events.events[start:] if e.type == "session.output_transcript.delta"]


async def test_a_bad_fixture_is_refused_and_nothing_stops(server):
    async with live(server) as conn:
        events, _ = await started(conn)
        await conn.session.output_audio.fixture.play(audio=base64.b64encode(b"\x01" * 3).decode(),
                                                      event_id="odd")
        err = await events.until("error")
        assert (err.error.code, err.client_event_id) == ("invalid_audio", "odd")
        for chunk in chunks(utterance() + silence(0.5)):  # still heard, still answered
            await conn.session.input_audio.append(audio=b64(chunk))
        await events.until("session.output_audio.delta")
    assert not events.of("session.output_audio.fixture.playing")


async def test_the_answer_uses_the_initial_history(server):
    # The scripted pipeline hears no words (an energy VAD, no ASR), so the
    # spoken turn adds no user text: the user text before the last one the
    # reply can quote is the history's.
    history = [{"role": "developer", "content": [{"text": "Be brief."}]},
               {"role": "user", "content": [{"text": "My flight is BA 117."}]},
               {"role": "assistant", "content": [{"type": "output_text", "text": "Noted."}]},
               {"role": "user", "content": [{"text": "Which gate?"}]}]
    async with live(server) as conn:
        events, _ = await started(conn, input=history)
        for chunk in chunks(utterance() + silence(0.5)):
            await conn.session.input_audio.append(audio=b64(chunk))
        await events.until("session.usage.updated")  # the reply is done
    said = "".join(e.delta for e in events.of("session.output_transcript.delta"))
    assert "You said before: My flight is BA 117." in said


async def test_a_history_we_cannot_honour_refuses_the_start(server):
    async with live(server) as conn:
        from test_live_socket import Reader

        events = Reader(conn)
        await conn.session.start(session={"model": "gpt-live-1", "input": [
            {"role": "user", "content": [{"text": "a"}, {"text": "b"}]}]}, event_id="s1")
        err = await events.until("error")
        assert (err.error.code, err.error.param) == ("invalid_value", "session.input[0].content")
        await conn.session.start(session={"model": "gpt-live-1"})  # the socket waits for a good one
        await events.until("session.started")


# ---- stored sessions and forks ----------------------------------------------------------

async def test_a_fork_remembers_the_stored_conversation(server):
    from openai import AsyncOpenAI
    from test_live_socket import Reader

    history = [{"role": "user", "content": [{"text": "My seat is 12A."}]},
               {"role": "user", "content": [{"text": "Is there wifi?"}]}]
    async with live(server) as conn:
        events, started_ev = await started(conn, input=history, store=True)
        assert started_ev.session.store is True
        for chunk in chunks(utterance() + silence(0.5)):
            await conn.session.input_audio.append(audio=b64(chunk))
        await events.until("session.usage.updated")  # saved after the reply
        await conn.session.close()
        await events.until("session.closed")
    stored_id = started_ev.session.id
    async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1") as client:
        async with client.live.forks.connect(session_id=stored_id) as fork:
            events = Reader(fork)
            await fork.session.start(session={}, event_id="fork_1")
            forked = await events.until("session.started")
            assert forked.client_event_id == "fork_1"
            assert forked.session.id != stored_id and forked.session.model == "gpt-live-1"
            assert forked.session.store is True  # inherited
            for chunk in chunks(utterance() + silence(0.5)):
                await fork.session.input_audio.append(audio=b64(chunk))
            await events.until("session.usage.updated")
    said = "".join(e.delta for e in events.of("session.output_transcript.delta"))
    assert "You said before: My seat is 12A." in said


async def test_a_session_not_stored_cannot_be_forked(server):
    from openai import AsyncOpenAI
    from test_live_socket import Reader

    async with live(server) as conn:
        _, started_ev = await started(conn)  # store: false (the default)
    async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1") as client:
        async with client.live.forks.connect(session_id=started_ev.session.id) as fork:
            err = await Reader(fork).until("error")
    assert (err.error.code, err.error.param) == ("session_not_found", "session_id")
