"""The next frame of a Starlette WebSocket, as every socket shell reads it."""

from __future__ import annotations

from starlette.websockets import WebSocket, WebSocketDisconnect


async def next_frame(ws: WebSocket) -> tuple[str | bytes | None, int | None]:
    """``(frame, None)`` for a text or binary frame; ``(None, code)`` once the
    socket has ended: the client's close code (1000 / 1001: a clean close,
    which ends a realtime session at once), or None when the socket just
    went away."""
    try:
        message = await ws.receive()
    except (WebSocketDisconnect, RuntimeError):
        return None, None
    if message["type"] == "websocket.disconnect":
        return None, message.get("code")
    frame = message.get("text")
    return (frame if frame is not None else (message.get("bytes") or b"")), None
