"""Every response names the instance that served it: ``Duplex-Owner-Instance``.

Behind a router a client does not know which worker it reached. Ids this
server mints carry their owner (``vllm_duplex.domain.owner_ids``); for an id a
client chose (a ``stream_id``, a ``request_id``) the client needs the owner
to route later requests by it: it sends this header back. An ASGI
middleware, so HTTP responses and WebSocket handshakes (``websocket.accept``
headers) get it alike, from any route, errors included.
"""

from __future__ import annotations

from typing import Any

from vllm_duplex.domain.owner_ids import OWNER_HEADER

_NAME = OWNER_HEADER.lower().encode()


class OwnerHeader:
    def __init__(self, app: Any, instance_id: str) -> None:
        self.app = app
        self.header = (_NAME, instance_id.encode())

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return

        async def send_named(message: dict) -> None:
            if message["type"] in ("http.response.start", "websocket.accept"):
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)
