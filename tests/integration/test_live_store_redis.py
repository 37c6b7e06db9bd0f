"""Stored GPT-Live sessions in Redis (the fleet's session store): saved
again after each reply, found by their key, through the store's
allow-listed encoding -- what a fork on another worker reads."""

from __future__ import annotations

import pytest
import pytest_asyncio
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.durable import live_sessions
from vllm_duplex.durable.redis_store import RedisStore
from vllm_duplex.durable.store import Bounds
from vllm_duplex.fleet.redis_server import RedisServer

pytestmark = pytest.mark.asyncio(loop_scope="module")

CONFIG = {"model": "gpt-live-1", "store": True, "instructions": "Be brief."}
ITEMS = [{"type": "message", "role": "user",
          "content": [{"type": "input_text", "text": "My seat is 12A."}]}]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def store():
    server = RedisServer()
    await server.start()
    s = RedisStore(server.url, Bounds(keep_s=60))
    yield s
    await s.close()
    await server.stop()


async def test_a_stored_session_is_saved_again_and_found_by_its_key(store):
    await live_sessions.keep(store, "w1#1", "sess_r1", config=CONFIG, items=[], api_key="sk-a")
    await live_sessions.keep(store, "w1#1", "sess_r1", config=CONFIG, items=ITEMS,
                             api_key="sk-a")  # after a reply: the latest conversation
    record = await live_sessions.find(store, "sess_r1", "sk-a")
    assert record.config == CONFIG and list(record.items) == ITEMS
    with pytest.raises(DuplexError) as err:
        await live_sessions.find(store, "sess_r1", "sk-b")
    assert err.value.code == "session_not_found"


async def test_a_recording_is_kept_with_its_session_in_redis(store):
    from vllm_duplex.domain.session_config import AudioFormat
    from vllm_duplex.media.recording import Recording

    rec = Recording(AudioFormat(), AudioFormat(), started_at=0.0)
    rec.heard(b"\x10\x00" * 24000, at=1.0)  # a second of the caller
    wav = rec.wav()
    await live_sessions.keep(store, "w1#1", "sess_r2", config=CONFIG, items=ITEMS,
                             api_key="sk-a", recording=wav)
    assert (await live_sessions.find(store, "sess_r2", "sk-a")).recording == wav
    with pytest.raises(DuplexError):  # the same owner as its session
        await live_sessions.find(store, "sess_r2", "sk-b")
