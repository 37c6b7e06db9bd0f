"""The ASGI app: a thin I/O shell around the sans-I/O codec and sessions.

Routes:
- ``WS /v1/realtime``    OpenAI Realtime (GA events; beta with ``OpenAI-Beta: realtime=v1``;
  ``?intent=transcription``; ``?call_id=`` a call's sideband)
- ``POST /v1/realtime/calls`` (+ ``…/{call_id}/hangup``): WebRTC calls (``webrtc/``)
- with ``sip:`` in the config, a SIP user agent and ``…/{call_id}/accept``,
  ``/reject``, ``/refer`` (``telephony/``; ``hangup`` ends SIP calls too)
- ``POST /v1/realtime/client_secrets``: ephemeral client keys
- with a ``twilio:`` config section, ``POST /v1/telephony/twilio/voice`` (TwiML) and
  ``WS /v1/telephony/twilio/stream`` (Twilio Media Streams): phone calls (``telephony/``)
- ``WS /v1/live/sessions``: OpenAI GPT-Live (``live/``; its REST calls refused by name)
- ``GET /v1/models``     what this server serves
- ``GET /v1/capabilities``
- ``GET /health``, ``GET /metrics`` (Prometheus text)
- the text surfaces: ``text_routes`` (HTTP) and ``WS /v1/generate/stream``
- ``GET /`` (and ``/playground``): the browser playground, one static page whose
  files (``static/``) are all served here -- no build step, nothing from elsewhere
- with a ``grpc_port``, the OpenEngine gRPC services beside them (``openengine``)

A realtime socket is a ``RealtimeConnection`` (``connection``). Every
transport stands on the session port (``port/``) and is given
``RealtimeSessions`` (``host/sessions.py``), not the runtime.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.client_secrets import client_secret_routes
from vllm_duplex.realtime.server.connection import RealtimeConnection
from vllm_duplex.realtime.server.generate_ws import GenerateStream
from vllm_duplex.realtime.server.http_errors import error_response
from vllm_duplex.realtime.server.live.lines import LiveLines
from vllm_duplex.realtime.server.live.routes import live_routes
from vllm_duplex.realtime.server.owner_header import OwnerHeader
from vllm_duplex.realtime.server.port.calls import Calls
from vllm_duplex.realtime.server.text_routes import text_routes

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "static"
# The page is small and changes with the server: always revalidate it.
_NO_CACHE = {"Cache-Control": "no-cache"}


def _decision_chooser(runtime: Runtime):
    """What evaluates GPT-Live Decisions: the engine's own LLM, the stage the
    text surfaces run on (None where the deployment has none)."""
    if runtime.text is None:
        return None
    from vllm_duplex.text.decisions import EngineChooser  # imports vLLM: only with its stage

    return EngineChooser(runtime.text.generator.host, runtime.model)


def create_app(runtime: Runtime, grpc_port: int | None = None, grpc_host: str = "127.0.0.1"
               ) -> Starlette:
    """``grpc_port``: also serve the OpenEngine gRPC services there, in this
    process and on this runtime (started after it, stopped before it)."""
    from vllm_duplex.realtime.server.webrtc.routes import call_routes

    sessions = runtime.sessions  # all a transport gets of the runtime
    calls = Calls(sessions)
    live_lines = LiveLines(sessions)
    sip = _sip_agent(runtime, sessions, calls)
    phone_routes = []
    if runtime.config.twilio is not None:  # the twilio package is the telephony extra's
        from vllm_duplex.realtime.server.telephony.twilio_routes import twilio_routes

        phone_routes = twilio_routes(sessions, runtime.config.twilio, calls, error_response)

    @asynccontextmanager
    async def lifespan(app):
        await runtime.start()
        grpc_server = None
        try:
            if grpc_port is not None:
                from vllm_duplex.realtime.server.openengine.server import GrpcServer

                grpc_server = GrpcServer(runtime, grpc_host, grpc_port)
                await grpc_server.start()
            if sip is not None:
                await sip.start()
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop()
            if sip is not None:
                await sip.stop()  # ringing calls, SIP calls, its sockets
            await calls.close()  # their sessions, peer connections and UDP sockets
            await runtime.stop()

    async def health(request: Request):
        stages = runtime.stage_health()
        healthy = all(stages.values())
        return JSONResponse({"status": "ok" if healthy else "unhealthy", "stages": stages,
                             "instance_id": runtime.manager.instance_id,
                             "sessions": len(runtime.manager), "capacity": sessions.capacity_report(),
                             "durability": runtime.durability.health(),
                             "machine": runtime.machine()},
                            status_code=200 if healthy else 503)

    async def metrics(request: Request):
        return PlainTextResponse(runtime.metrics.render(),
                                 media_type="text/plain; version=0.0.4")

    async def models(request: Request):
        try:
            sessions.check_key(bearer_key(request.headers))
        except DuplexError as err:
            return error_response(err)
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": 0, "owned_by": "vllm-duplex",
             **({} if name == runtime.model else {"root": runtime.model})}
            for name in runtime.config.model_names]})

    async def capabilities(request: Request):
        try:
            sessions.check_key(bearer_key(request.headers))
        except DuplexError as err:
            return error_response(err)
        return JSONResponse(runtime.capabilities())

    async def playground(request: Request):
        return FileResponse(STATIC / "index.html", headers=_NO_CACHE)

    async def realtime(ws: WebSocket):
        await RealtimeConnection(sessions, ws, calls).serve()

    def authorize(request: Request) -> str | None:
        key = bearer_key(request.headers)
        sessions.check_key(key)
        return sessions.caller_key(key)

    async def generate_stream(ws: WebSocket):
        await ws.accept()
        key = bearer_key(ws.headers, list(ws.scope.get("subprotocols") or []))
        try:
            sessions.check_key(key)
            if runtime.text is None:
                raise DuplexError("capability_unsupported", "this deployment has no vLLM text stage")
        except DuplexError as err:
            await ws.send_json({"type": "error", "error": err.to_wire(), "terminal": True})
            await ws.close(code=1008, reason=err.code)
            return
        await GenerateStream(runtime.text, ws, key).serve()

    app = Starlette(
        routes=[
            Route("/", playground),
            Route("/playground", playground),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/v1/models", models),
            Route("/v1/capabilities", capabilities),
            WebSocketRoute("/v1/realtime", realtime),
            # GPT-Live: the same sessions and calls, another dialect; Decisions on the engine's LLM
            *live_routes(sessions, runtime.config.webrtc, calls, lambda: sip, live_lines,
                         _decision_chooser(runtime)),
            *call_routes(sessions, runtime.config.webrtc, calls, error_response),
            *_sip_routes(sessions, calls, sip),
            *client_secret_routes(sessions, runtime.config.limits.max_request_bytes,
                                  error_response),
            *phone_routes,
            # A client given the server's base URL instead of the socket's (Pipecat
            # takes ``base_url`` as the socket URL itself) reaches the same socket.
            WebSocketRoute("/v1", realtime),
            WebSocketRoute("/", realtime),
            *text_routes(lambda: runtime.text, authorize),
            WebSocketRoute("/v1/generate/stream", generate_stream),
        ],
        lifespan=lifespan,
        middleware=[Middleware(OwnerHeader, instance_id=runtime.manager.instance_id)],
    )
    app.state.calls = calls  # tests and benchmarks look at the live calls
    app.state.sip = sip
    app.state.live_lines = live_lines  # the GPT-Live sessions a sideband may attach to
    return app


def _sip_agent(runtime: Runtime, sessions: RealtimeSessions, calls: Calls):
    """The SIP user agent when the config has ``sip:`` (telephony/)."""
    if runtime.config.sip is None:
        return None
    from vllm_duplex.realtime.server.telephony.sip_agent import SipAgent

    return SipAgent(sessions, calls, runtime.config.sip)


def _sip_routes(sessions: RealtimeSessions, calls: Calls, sip) -> list[Route]:
    if sip is None:
        return []
    from vllm_duplex.realtime.server.telephony.sip_routes import sip_routes

    return sip_routes(sessions, calls, lambda: sip, error_response)
