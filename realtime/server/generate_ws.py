"""``WS /v1/generate/stream``: the WebSocket shell of streaming input
(``vllm_duplex.text.input_stream``, which documents the frames). Frames are
JSON text; bad JSON is ``invalid_json``, answered and not terminal; after the
one terminal frame the socket closes (1000). A disconnect stops the engine
work.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.text.input_stream import StreamingInput

if TYPE_CHECKING:
    from vllm_duplex.text.service import TextService


class GenerateStream:
    def __init__(self, service: TextService, ws: WebSocket, api_key: str | None) -> None:
        self.ws = ws
        self.core = StreamingInput(service, api_key, ws.headers.get("duplex-owner-instance"),
                                   self._send, self._close)

    async def _send(self, frame: dict[str, Any]) -> None:
        await self.ws.send_text(json.dumps(frame, separators=(",", ":")))

    async def _close(self) -> None:
        await self.ws.close(code=1000)

    async def serve(self) -> None:
        core = self.core
        try:
            while not core.terminal_sent:
                try:
                    message = await self.ws.receive()
                except (WebSocketDisconnect, RuntimeError):
                    return
                if message["type"] == "websocket.disconnect":
                    return
                try:
                    await core.handle(_decode(message.get("text") or message.get("bytes") or b""))
                except DuplexError as err:
                    await core.error(err)
        finally:
            await core.finish()


def _decode(raw: str | bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise DuplexError("invalid_json", "the frame is not JSON") from None
