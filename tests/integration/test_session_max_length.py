"""A realtime session's maximum length on a real server (the scripted
pipeline, limits.max_session_s 3 s, warned 1 s before): the session object
says when it expires, the warning comes, then the typed error and the close
1000 ``max_duration`` -- and no session stays behind."""

from __future__ import annotations

import asyncio
import time

import pytest
from support.realtime_fixtures import scripted_config, serve
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_session_is_warned_then_ends_at_its_maximum_length():
    config = scripted_config(max_session_s=3.0, session_end_warning_s=1.0)
    async with serve(config) as server:
        opened = time.time()
        client = await RealtimeClient.connect(server.ws_url)
        expires_at = client.session["expires_at"]
        assert abs(expires_at - (opened + 3)) <= 1.5  # seconds since the epoch, as OpenAI's
        t0 = time.monotonic()
        warning = await client.wait_for("duplex.session.expiring", timeout=10)
        warned_after = time.monotonic() - t0
        assert warning["seconds_left"] == 1 and 1.5 <= warned_after <= 2.6
        error = await client.wait_for("error", timeout=10)
        assert error["error"]["code"] == "session_expired"
        assert "3 s" in error["error"]["message"]
        closed = await client.wait_for("session.closed", timeout=5)
        assert closed["reason"] == "max_duration"
        await client.ws.wait_closed()
        assert client.ws.close_code == 1000 and client.ws.close_reason == "max_duration"
        for _ in range(50):
            if not server.runtime.manager.stats()["live"]:
                break
            await asyncio.sleep(0.05)
        assert server.runtime.manager.stats()["live"] == 0
