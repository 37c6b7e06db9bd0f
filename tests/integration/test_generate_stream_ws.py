"""``WS /v1/generate/stream`` with raw ``websockets`` against the real engine:
one start, ordered input chunks (duplicates acknowledged, gaps refused),
explicit end, exactly one terminal outcome; cancel, deadline, disconnect and
abort stop the engine work (the vLLM request is aborted)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
import websockets
from support.text_fixtures import INSTRUCTIONS, KEYS, MODEL, auth  # noqa: F401
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")

OUTPUT = {"text-delta", "reasoning-delta", "tool-call-delta", "tool-call", "finish"}


def url(server) -> str:
    return server.http_url.replace("http", "ws", 1) + "/v1/generate/stream"


async def connect(server, key=KEYS[0]):
    return await websockets.connect(url(server), additional_headers=auth(key))


async def send(ws, **frame: Any) -> None:
    await ws.send(json.dumps(frame))


async def recv(ws) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), 120))


async def rest(ws) -> list[dict[str, Any]]:
    """Every frame until the server closes the socket."""
    out = []
    try:
        while True:
            out.append(await recv(ws))
    except websockets.ConnectionClosed:
        return out


async def engine_idle(server) -> bool:
    stage = server.runtime.text.generator.stage
    for _ in range(200):
        if stage.engine.get_num_unfinished_requests() == stage.active_requests == \
                server.runtime.text.sessions.resident():
            return True
        await asyncio.sleep(0.02)
    return False


async def test_chunks_in_order_then_end_gives_one_answer(text_server):
    stage = text_server.runtime.text.generator.stage
    async with await connect(text_server) as ws:
        await send(ws, type="start", model=MODEL, request_id="ws-1", instructions=INSTRUCTIONS,
                   options={"max_tokens": 24})
        started = await recv(ws)
        assert started == {"type": "started", "request_id": "ws-1", "session_id": None,
                           "early_output": False}
        fast, rebuilds = stage.fast_paths, stage.rebuilds
        before_end = []
        for seq, text in enumerate(["What is the ca", "pital of ", "France?"], start=1):
            await send(ws, type="input", seq=seq, text=text)
            before_end.append(await recv(ws))
        await send(ws, type="input", seq=2, text="pital of ")  # a retry of a lost ack
        before_end.append(await recv(ws))
        await send(ws, type="input", seq=7, text="nonsense")
        before_end.append(await recv(ws))
        assert before_end[:4] == [{"type": "ack", "seq": 1, "duplicate": False},
                                  {"type": "ack", "seq": 2, "duplicate": False},
                                  {"type": "ack", "seq": 3, "duplicate": False},
                                  {"type": "ack", "seq": 2, "duplicate": True}]
        gap = before_end[4]
        assert gap["type"] == "error" and gap["terminal"] is False
        assert gap["error"]["code"] == "sequence_gap" and gap["error"]["expected_seq"] == 4
        # no output before end-of-input (early_output is false)
        assert not OUTPUT & {f["type"] for f in before_end}
        await send(ws, type="end", last_seq=3)
        frames = await rest(ws)
        assert ws.close_code == 1000
    kinds = [f["type"] for f in frames]
    assert kinds[-1] == "finish" and kinds.count("finish") == 1 and set(kinds[:-1]) == {"text-delta"}
    assert "Paris" in "".join(f["delta"] for f in frames if f["type"] == "text-delta")
    # the words went into the live request while they arrived: at end only the rest was appended
    assert (stage.fast_paths - fast, stage.rebuilds - rebuilds) == (1, 0)
    assert await engine_idle(text_server)


async def test_frame_errors_are_typed_and_not_terminal(text_server):
    async with await connect(text_server) as ws:
        await ws.send("{oops")
        assert (await recv(ws))["error"]["code"] == "invalid_json"
        await send(ws, type="input", seq=1, text="hi")
        err = await recv(ws)
        assert (err["error"]["code"], err["terminal"]) == ("invalid_event", False)  # start first
        await send(ws, type="start", model="gpt-4o")
        assert (await recv(ws))["error"]["code"] == "model_not_found"
        await send(ws, type="start", model=MODEL, options={"max_tokens": 8})
        assert (await recv(ws))["type"] == "started"
        await send(ws, type="start", model=MODEL)
        assert (await recv(ws))["error"]["code"] == "invalid_event"  # one generation per stream
        await send(ws, type="input", seq=1, text=123)
        assert (await recv(ws))["error"]["param"] == "text"
        await send(ws, type="input", seq=1, text="x" * (70 << 10))
        assert (await recv(ws))["error"]["code"] == "payload_too_large"
        await send(ws, type="wiggle")
        assert (await recv(ws))["error"]["code"] == "unknown_event"
        await send(ws, type="input", seq=1, text="Say hello.")
        assert (await recv(ws))["type"] == "ack"
        await send(ws, type="end")
        await send(ws, type="input", seq=2, text="late")
        frames = await rest(ws)
    late = [f for f in frames if f["type"] == "error"]
    assert [f["error"]["code"] for f in late] == ["input_after_end"] and not late[0]["terminal"]
    assert [f["type"] for f in frames].count("finish") == 1


async def test_cancel_before_end_is_the_one_terminal_outcome(text_server):
    async with await connect(text_server) as ws:
        await send(ws, type="start", model=MODEL)
        await recv(ws)
        await send(ws, type="input", seq=1, text="Tell me a long story about ")
        await recv(ws)
        await send(ws, type="cancel")
        frames = await rest(ws)
    assert [f["type"] for f in frames] == ["finish"] and frames[0]["finish_reason"] == "cancelled"
    assert await engine_idle(text_server)


async def test_deadline_and_disconnect_stop_the_engine_work(text_server):
    async with await connect(text_server) as ws:
        await send(ws, type="start", model=MODEL, deadline_ms=300)
        await recv(ws)
        await send(ws, type="input", seq=1, text="Hello there ")
        frames = await rest(ws)
    assert frames[-1]["type"] == "error" and frames[-1]["terminal"] is True
    assert frames[-1]["error"]["code"] == "deadline_exceeded"
    assert await engine_idle(text_server)

    ws = await connect(text_server)
    await send(ws, type="start", model=MODEL, options={"max_tokens": 400})
    await recv(ws)
    await send(ws, type="input", seq=1, text="Tell me a long story about a dragon.")
    await recv(ws)
    await send(ws, type="end")
    while (await recv(ws))["type"] != "text-delta":
        pass
    await ws.close()  # gone mid-reply
    assert await engine_idle(text_server)


async def test_abort_by_request_id_mid_reply(text_server):
    async with await connect(text_server) as ws, \
            httpx.AsyncClient(base_url=text_server.http_url, headers=auth()) as http:
        await send(ws, type="start", model=MODEL, request_id="ws-abort", options={"max_tokens": 400})
        await recv(ws)
        await send(ws, type="input", seq=1, text="Tell me a long story about a dragon.")
        await recv(ws)
        await send(ws, type="end")
        assert (await recv(ws))["type"] == "text-delta"
        r = await http.post("/v1/requests/ws-abort/abort", headers=auth(KEYS[1]))
        assert r.status_code == 404  # another key's request is invisible
        assert (await http.post("/v1/requests/ws-abort/abort")).status_code == 200
        frames = await rest(ws)
    assert frames[-1]["type"] == "finish" and frames[-1]["finish_reason"] == "cancelled"
    assert await engine_idle(text_server)


async def test_a_bound_session_continues_and_survives_cancel(text_server):
    async with httpx.AsyncClient(base_url=text_server.http_url, headers=auth(), timeout=60) as http:
        sid = (await http.post("/v1/sessions", json={"model": MODEL, "instructions": INSTRUCTIONS})
               ).json()["id"]
        async with await connect(text_server) as ws:
            await send(ws, type="start", session_id=sid, options={"max_tokens": 24})
            assert (await recv(ws))["session_id"] == sid
            for seq, text in enumerate(["What is the capital ", "of France?"], start=1):
                await send(ws, type="input", seq=seq, text=text)
                await recv(ws)
            await send(ws, type="end")
            frames = await rest(ws)
        assert "Paris" in "".join(f.get("delta", "") for f in frames)
        info = (await http.get(f"/v1/sessions/{sid}", params={"messages": "true"})).json()
        assert [m["content"] for m in info["history"] if m["role"] == "user"] == [
            "What is the capital of France?"]
        assert info["turns"] == 1 and info["generating"] is None

        # another key cannot bind it; a cancelled stream leaves it open (unless asked)
        async with await connect(text_server, KEYS[1]) as ws:
            await send(ws, type="start", session_id=sid)
            assert (await recv(ws))["error"]["code"] == "session_not_found"
        async with await connect(text_server) as ws:
            await send(ws, type="start", session_id=sid, model="gpt-4o")
            assert (await recv(ws))["error"]["code"] == "model_mismatch"
            await send(ws, type="start", session_id=sid)
            await recv(ws)
            await send(ws, type="cancel")
            await rest(ws)
        assert (await http.get(f"/v1/sessions/{sid}")).json()["state"] == "detached"
        async with await connect(text_server) as ws:
            await send(ws, type="start", session_id=sid)
            await recv(ws)
            await send(ws, type="cancel", close_session=True)
            await rest(ws)
        assert (await http.get(f"/v1/sessions/{sid}")).json()["state"] == "closed"


async def test_a_reply_that_fails_after_end_is_terminal_and_closes(text_server):
    async with await connect(text_server) as ws:
        await send(ws, type="start", model=MODEL, deadline_ms=1500, options={"max_tokens": 400})
        await recv(ws)
        await send(ws, type="input", seq=1, text="Tell me a long story about a dragon.")
        await recv(ws)
        await send(ws, type="end")
        frames = await rest(ws)
        assert ws.close_code == 1000
    kinds = [f["type"] for f in frames]
    assert "text-delta" in kinds and kinds[-1] == "error" and "finish" not in kinds
    assert frames[-1]["terminal"] is True and frames[-1]["error"]["code"] == "deadline_exceeded"
    assert await engine_idle(text_server)
