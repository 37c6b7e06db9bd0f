"""The ASGI app: a thin I/O shell around the sans-I/O codec and sessions.

Routes:
- ``WS /v1/realtime``    OpenAI Realtime (GA events; beta with ``OpenAI-Beta: realtime=v1``)
- ``GET /v1/models``     what this server serves
- ``GET /v1/capabilities``
- ``GET /health``, ``GET /metrics`` (Prometheus text)
- the text surfaces: ``realtime/text_http.py`` (HTTP) and ``WS /v1/generate/stream``

Each socket has two tasks: the reader parses frames and enqueues commands;
the writer drains the session's ``outbound`` queue. Framing errors (bad JSON,
oversized events) are answered directly and are not journaled.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from ..engine import DuplexEngine
from ..errors import DuplexError
from ..session import DuplexSession
from .generate_ws import GenerateStream
from .protocol import Dialect, RealtimeCodec
from .text_http import text_routes

log = logging.getLogger(__name__)

# WebSocket close codes by session end reason.
CLOSE_CODES = {"client": 1000, "disconnect": 1000, "expired": 1000, "shutdown": 1001,
               "slow_consumer": 1008, "engine_dead": 1011}


def bearer_key(headers, subprotocols: list[str] = ()) -> str | None:
    """The API key from ``Authorization: Bearer``, or from the browser-style
    ``openai-insecure-api-key.<key>`` subprotocol."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    for proto in subprotocols:
        if proto.startswith("openai-insecure-api-key."):
            return proto.split(".", 1)[1] or None
    return None


def check_key(engine: DuplexEngine, key: str | None) -> None:
    """With keys configured, a request must present one of them (compared in
    constant time). Without, every caller is local and keys only scope."""
    allowed = engine.config.api_keys
    if not allowed:
        return
    if key is None or not any(hmac.compare_digest(key, k) for k in allowed):
        raise DuplexError("unauthorized", "missing or invalid API key (Authorization: Bearer ...)")


def error_response(err: DuplexError) -> JSONResponse:
    return JSONResponse({"error": err.to_wire()}, status_code=err.spec.http_status)


def create_app(engine: DuplexEngine) -> Starlette:
    @asynccontextmanager
    async def lifespan(app):
        await engine.start()
        try:
            yield
        finally:
            await engine.stop()

    async def health(request: Request):
        stages = engine.stage_health()
        healthy = all(stages.values())
        return JSONResponse({"status": "ok" if healthy else "unhealthy", "stages": stages,
                             "instance_id": engine.manager.instance_id,
                             "sessions": len(engine.manager)},
                            status_code=200 if healthy else 503)

    async def metrics(request: Request):
        return PlainTextResponse(engine.metrics.render(),
                                 media_type="text/plain; version=0.0.4")

    async def models(request: Request):
        try:
            check_key(engine, bearer_key(request.headers))
        except DuplexError as err:
            return error_response(err)
        return JSONResponse({"object": "list", "data": [
            {"id": engine.model, "object": "model", "created": 0, "owned_by": "vllm-duplex"}]})

    async def capabilities(request: Request):
        try:
            check_key(engine, bearer_key(request.headers))
        except DuplexError as err:
            return error_response(err)
        return JSONResponse(engine.capabilities())

    async def realtime(ws: WebSocket):
        await RealtimeConnection(engine, ws).serve()

    def authorize(request: Request) -> str | None:
        key = bearer_key(request.headers)
        check_key(engine, key)
        return key

    async def generate_stream(ws: WebSocket):
        await ws.accept()
        key = bearer_key(ws.headers, list(ws.scope.get("subprotocols") or []))
        try:
            check_key(engine, key)
            if engine.text is None:
                raise DuplexError("capability_unsupported", "this deployment has no vLLM text stage")
        except DuplexError as err:
            await ws.send_json({"type": "error", "error": err.to_wire(), "terminal": True})
            await ws.close(code=1008, reason=err.code)
            return
        await GenerateStream(engine.text, ws, key).serve()

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/v1/models", models),
            Route("/v1/capabilities", capabilities),
            WebSocketRoute("/v1/realtime", realtime),
            *text_routes(lambda: engine.text, authorize),
            WebSocketRoute("/v1/generate/stream", generate_stream),
        ],
        lifespan=lifespan,
    )


class RealtimeConnection:
    """One WebSocket bound to one session."""

    def __init__(self, engine: DuplexEngine, ws: WebSocket) -> None:
        self.engine = engine
        self.ws = ws
        beta = "realtime=v1" in ws.headers.get("openai-beta", "")
        self.codec = RealtimeCodec(max_event_bytes=engine.config.limits.max_event_bytes,
                                   dialect=Dialect.BETA if beta else Dialect.GA)
        self._send_lock = asyncio.Lock()
        self.session: DuplexSession | None = None

    async def _send(self, text: str) -> None:
        async with self._send_lock:
            await self.ws.send_text(text)

    async def _refuse(self, err: DuplexError, code: int) -> None:
        await self._send(self.codec.render_error(err))
        await self.ws.close(code=code, reason=err.code)

    async def serve(self) -> None:
        offered = list(self.ws.scope.get("subprotocols") or [])
        await self.ws.accept(subprotocol="realtime" if "realtime" in offered else None)
        key = bearer_key(self.ws.headers, offered)
        try:
            check_key(self.engine, key)
            model = self.ws.query_params.get("model")
            if model and model != self.engine.model:
                raise DuplexError("model_not_found",
                                  f"model {model!r} is not served here; this server serves "
                                  f"{self.engine.model!r}", param="model")
            self.session = await self.engine.open_realtime_session(key)
        except DuplexError as err:
            await self._refuse(err, 1008 if err.code != "resource_exhausted" else 1013)
            return
        writer = asyncio.create_task(self._write(), name=f"duplex-ws-writer-{self.session.session_id}")
        try:
            await self._read()
        finally:
            await self.engine.end_session(self.session, self.session.close_reason or "disconnect")
            await asyncio.gather(writer, return_exceptions=True)

    async def _read(self) -> None:
        session = self.session
        assert session is not None
        clock = self.engine.clock
        while True:
            try:
                message = await self.ws.receive()
            except (WebSocketDisconnect, RuntimeError):
                return
            if message["type"] == "websocket.disconnect":
                return
            received_at = clock.now()
            frame = message.get("text")
            if frame is None:
                frame = message.get("bytes") or b""
            try:
                session.deliver(self.codec.parse(frame), received_at)
            except DuplexError as err:
                self.engine.metrics.errors.inc(code=err.code)
                try:
                    await self._send(self.codec.render_error(err, session.fence))
                except Exception:
                    return
                if err.code == "session_closed":
                    return

    async def _write(self) -> None:
        session = self.session
        assert session is not None
        try:
            while True:
                env = await session.outbound.get()
                if env is None:
                    break
                text = self.codec.render(env)
                if text is not None:
                    await self._send(text)
            reason = session.close_reason or "client"
            await self.ws.close(code=CLOSE_CODES.get(reason, 1000), reason=reason)
        except Exception:  # the socket went away under us; the reader will notice
            log.debug("writer for %s stopped", session.session_id, exc_info=True)
