"""The realtime client SDK and ``talk`` helpers against a tiny scripted fake server.

This tests the client itself, so the server side is a few lines of
``websockets.asyncio.server.serve`` per test, not the real engine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import wave
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.audio import b64
from vllm_duplex.realtime.client import talk
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

SESSION = {"type": "realtime", "id": "sess_1",
           "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                               "turn_detection": {"type": "server_vad"}},
                     "output": {"format": {"type": "audio/pcm", "rate": 24000}}}}


class Peer:
    """The fake server's side of one connection."""

    def __init__(self, ws: ServerConnection) -> None:
        self.ws = ws
        self.received: list[dict[str, Any]] = []
        self._seq = 0

    async def send(self, type: str, **fields: Any) -> None:
        self._seq += 1
        await self.ws.send(json.dumps({"type": type, "event_id": f"event_{self._seq}",
                                       "seq": self._seq, **fields}))

    async def recv(self) -> dict[str, Any]:
        event = json.loads(await self.ws.recv())
        self.received.append(event)
        return event

    async def hello(self, session: dict[str, Any] = SESSION) -> None:
        await self.send("session.created", session=session, resume_token="rt_1")

    async def drain(self) -> None:
        """Record everything until the client hangs up (so the handler never closes first)."""
        while True:
            await self.recv()


Script = Callable[[Peer], Awaitable[None]]


@asynccontextmanager
async def fake_server(script: Script) -> AsyncIterator[tuple[str, list[Peer]]]:
    peers: list[Peer] = []

    async def handler(ws: ServerConnection) -> None:
        peer = Peer(ws)
        peers.append(peer)
        try:
            await script(peer)
        except ConnectionClosed:
            pass

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        yield f"ws://127.0.0.1:{port}/v1/realtime", peers


async def _response(peer: Peer, rid: str, audio: list[bytes], words: list[str]) -> None:
    await peer.send("response.created", response={"id": rid, "status": "in_progress"})
    ids = {"response_id": rid, "item_id": "item_a", "output_index": 0, "content_index": 0}
    for chunk, word in zip(audio, words):
        await peer.send("response.output_audio_transcript.delta", delta=word, **ids)
        await peer.send("response.output_audio.delta", delta=b64(chunk), **ids)
    await peer.send("response.done", response={"id": rid, "status": "completed"})


async def test_connect_waits_for_session_created_and_sends_auth() -> None:
    async def script(peer: Peer) -> None:
        await peer.send("rate_limits.updated", rate_limits=[])
        await asyncio.sleep(0.05)  # the client must still be waiting here
        await peer.hello()
        await peer.drain()

    async with fake_server(script) as (url, peers):
        async with await RealtimeClient.connect(url, api_key="sk-1", model="m1",
                                                beta=True) as rt:
            assert rt.session_id == "sess_1" and rt.resume_token == "rt_1"
            assert rt.session == SESSION
            assert [e["type"] for e in rt.events] == ["rate_limits.updated", "session.created"]
            assert all("_recv_t" in e for e in rt.events)
        request = peers[0].ws.request
        assert request is not None
        assert request.headers["Authorization"] == "Bearer sk-1"
        assert request.headers["OpenAI-Beta"] == "realtime=v1"
        assert request.path == "/v1/realtime?model=m1"


async def test_connect_raises_on_error_instead_of_session() -> None:
    async def script(peer: Peer) -> None:
        await peer.send("error", error={"type": "invalid_request_error",
                                        "code": "model_not_found", "message": "no"})
        await peer.drain()

    async with fake_server(script) as (url, _):
        with pytest.raises(RealtimeError) as info:
            await RealtimeClient.connect(url, model="nope")
        assert info.value.code == "model_not_found"
        assert info.value.event["type"] == "error"


async def test_send_fills_event_id() -> None:
    async def script(peer: Peer) -> None:
        await peer.hello()
        await peer.drain()

    async with fake_server(script) as (url, peers):
        async with await RealtimeClient.connect(url) as rt:
            minted = await rt.send({"type": "input_audio_buffer.clear"})
            kept = await rt.send({"type": "input_audio_buffer.clear", "event_id": "mine"})
            appended = await rt.append_audio(b"\x01\x02", seq=7)
            while len(peers[0].received) < 3:
                await asyncio.sleep(0.01)
    assert minted.startswith("evt_") and kept == "mine"
    got = peers[0].received
    assert got[-1]["type"] == "session.close"  # leaving the block ends the session
    assert [e["event_id"] for e in got[:-1]] == [minted, "mine", appended]
    assert got[2] == {"type": "input_audio_buffer.append", "audio": b64(b"\x01\x02"),
                      "seq": 7, "event_id": appended}


async def test_wait_for_skips_and_records() -> None:
    async def script(peer: Peer) -> None:
        await peer.hello()
        for t in ("a.one", "b.two", "c.three", "error", "d.four"):
            await peer.send(t, error={"code": "x", "message": "boom"})
        await peer.drain()

    async with fake_server(script) as (url, _):
        async with await RealtimeClient.connect(url) as rt:
            event = await rt.wait_for("c.three", "zzz")
            assert event["type"] == "c.three"
            assert [e["type"] for e in rt.events] == ["session.created", "a.one", "b.two",
                                                      "c.three"]
            stamps = [e["_recv_t"] for e in rt.events]
            assert stamps == sorted(stamps)
            with pytest.raises(RealtimeError):
                await rt.wait_for("d.four", raise_on_error=True)
            assert (await rt.wait_for("d.four"))["seq"] == 6
            with pytest.raises(TimeoutError):
                await rt.wait_for("never", timeout=0.05)


async def test_update_session_returns_session_or_raises() -> None:
    async def script(peer: Peer) -> None:
        await peer.hello()
        await peer.recv()  # the first update
        await peer.send("session.updated", session={**SESSION, "instructions": "hi"})
        second = await peer.recv()
        await peer.send("error", error={"type": "invalid_request_error", "code": "invalid_value",
                                        "message": "bad rate", "event_id": second["event_id"]})
        await peer.drain()

    async with fake_server(script) as (url, peers):
        async with await RealtimeClient.connect(url) as rt:
            session = await rt.update_session({"instructions": "hi"})
            assert session["instructions"] == "hi" and rt.session is session
            with pytest.raises(RealtimeError) as info:
                await rt.update_session({"audio": {"input": {"format": {"rate": 1}}}})
            assert info.value.code == "invalid_value"
            assert rt.session["instructions"] == "hi"  # unchanged by the failure
    assert [e["type"] for e in peers[0].received] == ["session.update"] * 2 + ["session.close"]


async def test_collect_response_concatenates_audio_and_transcript() -> None:
    async def script(peer: Peer) -> None:
        await peer.hello()
        assert (await peer.recv())["type"] == "response.create"
        await _response(peer, "resp_1", [b"\x00\x01", b"\x02\x03", b"\x04"],
                        ["Hello", ", ", "world"])
        assert (await peer.recv())["type"] == "response.create"
        await _response(peer, "resp_2", [b"\x09"], ["again"])
        await peer.drain()

    async with fake_server(script) as (url, _):
        async with await RealtimeClient.connect(url) as rt:
            await rt.create_response()
            # Events read before collect_response (here by wait_for) still belong to it.
            await rt.wait_for("response.output_audio.delta")
            result = await rt.collect_response(timeout=5)
            assert result.audio == b"\x00\x01\x02\x03\x04"
            assert result.transcript == "Hello, world" and result.text == ""
            assert result.response_id == "resp_1" and result.status == "completed"
            assert result.events[0]["type"] == "response.created"
            assert result.events[-1] is result.done
            await rt.create_response({"instructions": "again"})
            second = await rt.collect_response(timeout=5)
            assert second.audio == b"\x09" and second.transcript == "again"
            assert second.events[0]["response"]["id"] == "resp_2"


async def test_collect_response_raises_when_response_refused() -> None:
    async def script(peer: Peer) -> None:
        await peer.hello()
        await peer.recv()
        await peer.send("error", error={"code": "conversation_already_has_active_response",
                                        "message": "busy"})
        await peer.drain()

    async with fake_server(script) as (url, _):
        async with await RealtimeClient.connect(url) as rt:
            await rt.create_response()
            with pytest.raises(RealtimeError, match="busy"):
                await rt.collect_response(timeout=5)


def _write_wav(path: Path, frames: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(frames.astype("<i2").tobytes())


def test_wav_16k_stereo_becomes_24k_mono(tmp_path: Path) -> None:
    t = np.arange(16000) / 16000
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
    # Right channel at a third of the left: averaging (not picking a channel) gives 2/3.
    _write_wav(tmp_path / "in.wav", np.stack([tone, tone // 3], axis=1), 16000)
    pcm = talk.load_audio_pcm16(str(tmp_path / "in.wav"), 24000)
    out = np.frombuffer(pcm, dtype="<i2")
    assert len(out) == 24000  # 1 s at 24 kHz
    peak = np.abs(out[1000:-1000]).max()
    assert abs(peak - 8000 * (1 + 1 / 3) / 2) < 200


async def test_talk_commits_manually_when_vad_is_off(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    no_vad = {**SESSION, "audio": {**SESSION["audio"],
                                   "input": {**SESSION["audio"]["input"], "turn_detection": None}}}

    async def script(peer: Peer) -> None:
        await peer.hello(no_vad)
        while (await peer.recv())["type"] != "response.create":
            pass
        await _response(peer, "resp_1", [bytes(4800), bytes(4800)], ["Hi", "!"])
        await peer.drain()

    _write_wav(tmp_path / "in.wav", np.zeros((8000, 1)), 16000)
    samples, rate = talk.read_audio(str(tmp_path / "in.wav"))
    async with fake_server(script) as (url, peers):
        args = argparse.Namespace(url=url, api_key=None, model=None, chunk_ms=100,
                                  no_realtime=True, timeout=5.0, out=str(tmp_path / "out.wav"),
                                  out_rate=None, out_channels=1)
        assert await talk._talk(args, samples, rate) == 0
    sent = [e["type"] for e in peers[0].received]
    assert sent[-3:] == ["input_audio_buffer.commit", "response.create", "session.close"]
    appended = sum(len(base64.b64decode(e["audio"])) for e in peers[0].received
                   if e["type"] == "input_audio_buffer.append")
    assert appended == 2 * (12000 + 12 * 2400)  # 0.5 s of input + 1.2 s of silence at 24 kHz
    with wave.open(str(tmp_path / "out.wav"), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getnframes()) == (24000, 1, 4800)
    out = capsys.readouterr().out
    assert "assistant: Hi!" in out and "TTFA (commit -> first audio)" in out


async def test_talk_leaves_the_turn_to_server_vad(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(talk, "TRAILING_SILENCE_S", 0.1)  # keep the paced run short

    async def script(peer: Peer) -> None:
        await peer.hello()
        await peer.recv()
        await peer.send("input_audio_buffer.speech_started", audio_start_ms=0, item_id="u1")
        await peer.recv()
        await peer.send("input_audio_buffer.speech_stopped", audio_end_ms=60, item_id="u1")
        await _response(peer, "resp_1", [bytes(480)], ["ok"])
        await peer.drain()

    _write_wav(tmp_path / "in.wav", np.zeros((4800, 2)), 48000)
    samples, rate = talk.read_audio(str(tmp_path / "in.wav"))
    async with fake_server(script) as (url, peers):
        args = argparse.Namespace(url=url, api_key=None, model=None, chunk_ms=50,
                                  no_realtime=False, timeout=5.0, out=str(tmp_path / "out.wav"),
                                  out_rate=None, out_channels=1)
        assert await talk._talk(args, samples, rate) == 0
    sent = {e["type"] for e in peers[0].received}
    assert sent == {"input_audio_buffer.append", "session.close"}  # no commit or response.create
    out = capsys.readouterr().out
    assert "assistant: ok" in out and "TTFA (speech_stopped -> first audio)" in out


def test_run_talk_reports_connection_failure(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _write_wav(tmp_path / "in.wav", np.zeros((1600, 1)), 16000)
    args = argparse.Namespace(audio=str(tmp_path / "in.wav"), out=str(tmp_path / "o.wav"),
                              url="ws://127.0.0.1:1/v1/realtime", api_key=None, model=None,
                              chunk_ms=20, no_realtime=True, timeout=2.0, out_rate=None,
                              out_channels=1)
    assert talk.run_talk(args) == 2
    assert "cannot connect" in capsys.readouterr().err
