"""GPT-Live's sideband (``WS /v1/live/sessions/{id}/attach``) on a primary
WebSocket session, both driven by the ``openai`` SDK's own clients
(``client.live.connect()`` and ``client.live.sideband.connect()``) against
the scripted engine. Every raw frame either side gets is validated against
the SDK's model of its type (``support/live_shapes.py``). The sideband of a
SIP call (DTMF both ways) is ``test_live_sip.py``."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
import pytest
import pytest_asyncio
import websockets
from openai import AsyncOpenAI
from support.live_shapes import live_event
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    b64,
    chunks,
    no_leaked_tasks,
    scripted_config,
    serve,
    silence,
    utterance,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEY, OTHER_KEY = "sk-live-owner", "sk-someone-else"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server():
    async with serve(scripted_config(api_keys=(KEY, OTHER_KEY))) as srv:
        yield srv


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def nothing_left(server):
    yield
    lines = server._server.config.app.state.live_lines
    for _ in range(300):
        if not (len(lines) or len(server.runtime.manager)):
            break
        await asyncio.sleep(0.01)
    assert len(lines) == 0, "a live session outlived its socket"
    assert len(server.runtime.manager) == 0, "a session outlived its test"


def client(server, key: str = KEY) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=key, base_url=server.http_url + "/v1")


class Reader:
    """Server events through the SDK, each raw frame validated by its model."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.events: list = []

    async def next(self, timeout: float = 20.0):
        event = live_event((await asyncio.wait_for(self.conn.recv_bytes(), timeout)).decode())
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float = 20.0):
        async def read():
            while (event := await self.next()).type != kind:
                pass
            return event
        return await asyncio.wait_for(read(), timeout)

    def of(self, kind: str) -> list:
        return [e for e in self.events if e.type == kind]


@asynccontextmanager
async def primary(server) -> AsyncIterator[tuple[object, Reader, str]]:
    async with client(server) as c, c.live.connect() as conn:
        events = Reader(conn)
        await conn.session.start(session={"model": "gpt-live-1", "instructions": "Be brief."})
        started = await events.until("session.started")
        yield conn, events, started.session.id


@asynccontextmanager
async def sideband(server, session_id: str, key: str = KEY) -> AsyncIterator[tuple[object, Reader]]:
    async with client(server, key) as c, c.live.sideband.connect(session_id=session_id) as side:
        yield side, Reader(side)


async def test_a_sideband_follows_the_session_and_hears_the_microphone(server):
    async with primary(server) as (conn, events, session_id), \
            sideband(server, session_id) as (side, seen):
        first = await seen.next()  # attached: the session as it is now
        assert first.type == "session.started" and first.session.id == session_id
        assert first.session.instructions == "Be brief."
        spoken = utterance() + silence(0.5)
        for chunk in chunks(spoken):
            await conn.session.input_audio.append(audio=b64(chunk))
        said = await seen.until("session.output_transcript.delta")
        await seen.until("session.usage.updated")  # the reply is over
        await events.until("session.usage.updated")
        reflected = b"".join(base64.b64decode(e.audio)
                             for e in seen.of("session.input_audio.append"))
    # The sideband heard the microphone itself (24 kHz PCM16, as it was sent)...
    assert reflected == spoken
    # ... and the very events the primary got: the same event, the same id.
    assert said.event_id in {e.event_id for e in events.of("session.output_transcript.delta")}
    assert_reflected_reply(seen.of("session.output_audio.delta"),
                           b"".join(base64.b64decode(e.delta)
                                    for e in events.of("session.output_audio.delta")))


def assert_reflected_reply(deltas: list, played: bytes | None = None) -> None:
    """The reply's audio as a sideband gets it: PCM16 at 24 kHz, each chunk
    with its range on the session timeline, in order, its length its audio's
    (``played``: what the primary got, in the same 24 kHz PCM)."""
    assert deltas, "no reply audio reached the sideband"
    ends = 0
    for d in deltas:
        pcm = base64.b64decode(d.delta)
        assert d.start_ms is not None and d.end_ms is not None  # required on a sideband
        assert d.start_ms >= ends and d.end_ms - d.start_ms == len(pcm) // 2 * 1000 // 24000
        ends = d.end_ms
    if played is not None:
        assert b"".join(base64.b64decode(d.delta) for d in deltas) == played


async def test_a_sidebands_mute_gates_the_primarys_microphone(server):
    async with primary(server) as (conn, events, session_id), \
            sideband(server, session_id) as (side, seen):
        await seen.until("session.started")
        await side.session.input_audio.mute(event_id="side_mute")
        mine = await seen.until("session.input_audio.muted")
        theirs = await events.until("session.input_audio.muted")  # announced to the primary too
        assert mine.client_event_id == theirs.client_event_id == "side_mute"
        spoken = utterance() + silence(0.5)
        for chunk in chunks(spoken):
            await conn.session.input_audio.append(audio=b64(chunk))
        await side.session.update(session={}, event_id="side_sync")  # past all the audio
        assert (await seen.until("session.updated")).client_event_id == "side_sync"
        await side.session.input_audio.unmute(event_id="side_unmute")
        await events.until("session.input_audio.unmuted")
        await asyncio.sleep(0.5)
        await conn.session.update(session={}, event_id="sync")
        await events.until("session.updated")
        # Reflected before the mute (the sideband hears the caller), but not heard by the session.
        reflected = b"".join(base64.b64decode(e.audio)
                             for e in seen.of("session.input_audio.append"))
    assert np.abs(np.frombuffer(reflected, "<i2")).max() > 1000
    assert not events.of("session.output_audio.delta")
    assert not events.of("session.input_transcript.delta")


async def test_a_sideband_is_refused_what_belongs_to_the_primary_or_a_phone(server):
    async with primary(server) as (conn, events, session_id), \
            sideband(server, session_id) as (side, seen):
        await seen.until("session.started")
        await side.transport.dtmf.send(event="5", event_id="d1")
        err = await seen.until("error")
        assert (err.error.code, err.error.client_event_id) == ("capability_unsupported", "d1")
        assert "SIP" in err.error.message
        await side.send_raw(json.dumps({"type": "session.start", "event_id": "s1",
                                        "session": {"model": "gpt-live-1"}}))
        err = await seen.until("error")
        assert (err.error.code, err.client_event_id) == ("invalid_event", "s1")
        await side.send_raw(json.dumps({"type": "session.input_audio.append",
                                        "audio": b64(silence(0.02)), "event_id": "a1"}))
        assert (await seen.until("error")).error.code == "invalid_event"
        # The primary may not press keys either: it is no phone line.
        await conn.send_raw(json.dumps({"type": "transport.dtmf.send", "event": "5",
                                        "event_id": "p1"}))
        err = await events.until("error")
        assert (err.error.code, err.client_event_id) == ("capability_unsupported", "p1")
        await side.session.update(session={}, event_id="still")  # the sideband is still served
        assert (await seen.until("session.updated")).client_event_id == "still"


async def test_detaching_leaves_the_session_and_its_end_closes_the_sideband(server):
    async with primary(server) as (conn, events, session_id):
        async with sideband(server, session_id) as (side, seen):
            await seen.until("session.started")
        await conn.session.update(session={}, event_id="alone")  # the session went on
        assert (await events.until("session.updated")).client_event_id == "alone"
        async with sideband(server, session_id) as (side, seen):  # and may be attached again
            await seen.until("session.started")
            await side.session.close(event_id="bye")  # a sideband may end it
            closed = await seen.until("session.closed")
            assert closed.reason == "close_requested" and closed.session.id == session_id
            with pytest.raises(websockets.ConnectionClosed) as ended:
                await side.recv_bytes()
            assert ended.value.rcvd.code == 1000
        assert (await events.until("session.closed")).reason == "close_requested"


async def test_only_the_sessions_key_attaches(server):
    async with primary(server) as (conn, events, session_id):
        for key, sid in ((OTHER_KEY, session_id), (KEY, "sess_nobody")):
            async with sideband(server, sid, key) as (side, seen):
                err = await seen.next()
                assert err.type == "error" and err.error.code == "session_not_found"
                with pytest.raises(websockets.ConnectionClosed) as refused:
                    await side.recv_bytes()
                assert refused.value.rcvd.code == 1008
        await conn.session.update(session={}, event_id="unharmed")
        assert (await events.until("session.updated")).client_event_id == "unharmed"


async def test_a_dropped_sideband_is_reattached_by_the_sdk_and_follows_on(server):
    """GPT-Live's resume form: the SDK reconnects a sideband whose connection
    dropped (1006) to the same attach URL; it follows the session from then."""
    drops = []
    async with primary(server) as (conn, events, session_id), client(server) as c:
        manager = c.live.sideband.connect(session_id=session_id, initial_delay=0.05,
                                          on_reconnecting=lambda e: drops.append(e) or None)
        async with manager as side:
            stream = side.__aiter__()
            seen = lambda event: live_event(event.to_json())  # noqa: E731  (the SDK's model, strictly)
            assert seen(await anext(stream)).type == "session.started"
            side._connection.transport.abort()  # the network drops
            again = seen(await asyncio.wait_for(anext(stream), 20))
            assert again.type == "session.started" and again.session.id == session_id
            await conn.session.update(session={}, event_id="after")
            while (event := seen(await asyncio.wait_for(anext(stream), 20))).type \
                    != "session.updated":
                pass
            assert event.client_event_id == "after"
    assert [d.close_code for d in drops] == [1006]
