"""Server-sent events over ASGI, with disconnect detection.

Starlette's ``StreamingResponse`` only notices a gone client when a write
fails (ASGI 2.4), so a generation that is prefilling or holding a tool call
would run on for nobody. ``EventStreamResponse`` also listens for
``http.disconnect`` and, either way, closes the event iterator at once: the
generation's ``finally`` aborts its vLLM request within one decode step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.types import Receive, Scope, Send
from vllm_duplex.text.events import body

KEEPALIVE_S = 15.0  # a comment line keeps proxies from closing a quiet stream


def sse_frame(event: str, data: Mapping[str, Any], seq: int | None = None) -> bytes:
    """One SSE event: ``event:`` is the text event's type, and ``data:`` its
    one rendering (``text.events.body``: the type again, then the data, as
    OpenAI's streams carry it)."""
    head = f"id: {seq}\n" if seq is not None else ""
    line = json.dumps(body(event, data), separators=(",", ":"))
    return f"{head}event: {event}\ndata: {line}\n\n".encode()


class EventStreamResponse:
    def __init__(self, frames: AsyncIterator[bytes], headers: dict[str, str] | None = None,
                 on_close: Callable[[], Awaitable[None]] | None = None) -> None:
        self.frames = frames
        self.on_close = on_close  # runs even when the client left before the first frame
        self.headers = {"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        headers += [(k.encode(), v.encode()) for k, v in self.headers.items()]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            pump = asyncio.create_task(self._pump(send), name="duplex-sse-pump")
            gone = asyncio.create_task(_disconnected(receive), name="duplex-sse-disconnect")
            try:
                await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (pump, gone):
                    task.cancel()
                await asyncio.gather(pump, gone, return_exceptions=True)
        finally:
            await self.frames.aclose()  # type: ignore[attr-defined]
            if self.on_close is not None:
                await self.on_close()
        if pump.done() and not pump.cancelled() and pump.exception() is None:
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except OSError:
                pass

    async def _pump(self, send: Send) -> None:
        # Each frame is awaited in a task of its own so a quiet stream can send
        # keepalives; cancelling the pump cancels that task, which raises in
        # the event iterator's frame and runs its cleanup (the abort).
        nxt: asyncio.Future[bytes] | None = None
        try:
            while True:
                nxt = asyncio.ensure_future(anext(self.frames))
                while not nxt.done():
                    done, _ = await asyncio.wait({nxt}, timeout=KEEPALIVE_S)
                    if not done:
                        await send({"type": "http.response.body", "body": b": keepalive\n\n",
                                    "more_body": True})
                try:
                    frame = nxt.result()
                except StopAsyncIteration:
                    return
                nxt = None
                await send({"type": "http.response.body", "body": frame, "more_body": True})
        finally:
            if nxt is not None and not nxt.done():
                nxt.cancel()
                await asyncio.gather(nxt, return_exceptions=True)


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
