"""A small async client for ``WS /v1/generate/stream`` (one generation whose
input streams in; the protocol is in ``docs/api.md``).

    async with await GenerateStreamClient.connect("ws://127.0.0.1:8000/v1/generate/stream",
                                                  model=MODEL) as gen:
        for piece in ("What is the ", "capital of ", "France?"):
            await gen.send(piece)             # seq 1, 2, 3
        await gen.end()
        reply = await gen.collect()           # reply.text, reply.finish

Reading is lazy (no background task): frames are read inside ``recv``,
``send(wait=True)``, iteration and ``collect``, and every frame read is kept
in ``frames``. A terminal ``error`` raises ``DuplexAPIError``; frame-level
errors (a gap, input after end) do not end the stream and are yielded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from vllm_duplex.realtime.client.http import (
    OWNER_HEADER,
    DuplexAPIError,
    GenerateEvent,
    Reply,
)
from websockets.asyncio.client import ClientConnection, connect

Frame = dict[str, Any]
PATH = "/v1/generate/stream"


def stream_url(url: str) -> str:
    """``http(s)://host:port`` (a base URL) or a ``ws(s)://`` URL -> the socket's URL."""
    if url.startswith(("http://", "https://")):
        url = "ws" + url[4:]
    return url if url.rstrip("/").endswith(PATH) else url.rstrip("/") + PATH


def is_terminal(frame: Frame) -> bool:
    """``finish``, or an ``error`` that ends the stream. A generation's own
    error frame carries no ``terminal`` field; it is the last frame too."""
    if frame.get("type") == "finish":
        return True
    return frame.get("type") == "error" and frame.get("terminal", True) is not False


class GenerateStreamClient:
    def __init__(self, ws: ClientConnection, started: Frame) -> None:
        self.ws = ws
        self.started = started  # the ``started`` frame
        self.request_id: str = started.get("request_id", "")
        self.frames: list[Frame] = []  # every frame read after ``started``
        self.sent: dict[int, str] = {}  # seq -> text, for ``resend``
        self.next_seq = 1
        self.finished: Frame | None = None  # the terminal frame, once read
        self._read = 0  # frames already handed out by ``recv``

    @classmethod
    async def connect(cls, url: str = "ws://127.0.0.1:8000" + PATH, *, api_key: str | None = None,
                      owner_instance_id: str | None = None, open_timeout: float = 10,
                      **start: Any) -> GenerateStreamClient:
        """Open the socket and send ``start`` (``model``, ``messages``, ``options``,
        ``session_id``...). Raises ``DuplexAPIError`` when the start is refused."""
        headers: dict[str, str] = {}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if owner_instance_id:
            headers[OWNER_HEADER] = owner_instance_id
        ws = await connect(stream_url(url), additional_headers=headers, open_timeout=open_timeout)
        try:
            await ws.send(json.dumps({"type": "start", **start}))
            async with asyncio.timeout(open_timeout):
                frame = json.loads(await ws.recv())
            if frame.get("type") != "started":
                raise DuplexAPIError(frame.get("error") or {"code": "invalid_event",
                                                            "message": f"unexpected {frame!r}"})
        except BaseException:
            await ws.close()
            raise
        return cls(ws, frame)

    async def __aenter__(self) -> GenerateStreamClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the socket (before the terminal frame this cancels the generation)."""
        await self.ws.close()

    # ---- sending ---------------------------------------------------------------------

    async def send_frame(self, frame: Frame) -> None:
        await self.ws.send(json.dumps(frame))

    async def send(self, text: str, *, wait: bool = False, timeout: float = 30) -> Frame | None:
        """Send ``text`` as the next seq. ``wait=True`` reads up to its ``ack``
        and returns it; an error frame read on the way raises ``DuplexAPIError``."""
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        self.sent[seq] = text
        return await self.resend(seq, wait=wait, timeout=timeout)

    async def resend(self, seq: int, *, wait: bool = False, timeout: float = 30) -> Frame | None:
        """Send chunk ``seq`` again (after a lost ack: the server acks it as a
        duplicate and ignores it)."""
        await self.send_frame({"type": "input", "seq": seq, "text": self.sent[seq]})
        return await self._answer(seq, timeout) if wait else None

    async def end(self, last_seq: int | None = None) -> None:
        """End of input: the model answers. ``last_seq`` (optional) is checked."""
        frame: Frame = {"type": "end"}
        if last_seq is not None:
            frame["last_seq"] = last_seq
        await self.send_frame(frame)

    async def cancel(self, close_session: bool = False) -> None:
        """Stop the generation (the stream then ends with ``finish`` ``cancelled``);
        ``close_session`` also closes a bound application session."""
        await self.send_frame({"type": "cancel", "close_session": close_session})

    async def _answer(self, seq: int, timeout: float) -> Frame:
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.recv()
                if frame.get("type") == "ack" and frame.get("seq") == seq:
                    return frame
                if frame.get("type") == "error":
                    raise DuplexAPIError(frame.get("error") or {})

    # ---- receiving -------------------------------------------------------------------

    async def _receive(self) -> Frame:
        frame: Frame = json.loads(await self.ws.recv())
        self.frames.append(frame)
        if is_terminal(frame):
            self.finished = frame
        return frame

    async def recv(self, timeout: float | None = None) -> Frame:
        """The next frame not yet handed out (acks and errors included)."""
        async with asyncio.timeout(timeout):
            while self._read >= len(self.frames):
                await self._receive()
        self._read += 1
        return self.frames[self._read - 1]

    async def events(self, timeout: float | None = 120) -> AsyncIterator[Frame]:
        """Frames up to and including the terminal one; a terminal ``error``
        raises ``DuplexAPIError``. ``timeout`` bounds the whole wait."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            frame = await self.recv(None if deadline is None else max(0.0, deadline - loop.time()))
            if is_terminal(frame) and frame["type"] == "error":
                raise DuplexAPIError(frame.get("error") or {})
            yield frame
            if is_terminal(frame):
                return

    async def collect(self, timeout: float | None = 120) -> Reply:
        """Read to the terminal frame: the reply (text, tool calls, finish)."""
        reply = Reply()
        events = self.events(timeout)
        try:
            async for frame in events:
                if frame["type"] not in ("ack", "error"):
                    reply.add(GenerateEvent.of(frame))
        finally:
            await events.aclose()
        return reply
