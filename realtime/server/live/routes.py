"""The GPT-Live routes: ``WS /v1/live/sessions`` (the primary socket,
``socket.py``), ``WS …/{id}/attach`` (the sideband, ``sideband.py``), the SIP
call control (``call_routes.py``), and the REST calls of the ``openai``
SDK's ``live`` resources not built yet, answered with a typed error naming
what they are (never a bare 404), so a client learns why.

``WS /v1/live/sessions/{id}/fork`` (the SDK's ``live.forks``) is a session
that starts from a stored one (``socket.py``). The SDK's paths (``openai/resources/live/``): ``POST /live/sessions``
(create: a WebRTC/SIP session), ``…/{id}/accept``, ``/reject``, ``/refer``,
``/hangup`` (SIP), ``…/{id}/fork``, ``GET …/{id}/content`` (a stored
session's recording) and ``WS …/{id}/attach`` (the sideband).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from vllm_duplex.domain.decisions import Chooser
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.host.deploy import WebRtc
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.http_errors import error_response
from vllm_duplex.realtime.server.live.call_routes import live_call_routes
from vllm_duplex.realtime.server.live.lines import LiveLines
from vllm_duplex.realtime.server.live.sideband import LiveSideband
from vllm_duplex.realtime.server.live.socket import LiveSocket
from vllm_duplex.realtime.server.live.webrtc_routes import live_webrtc_routes
from vllm_duplex.realtime.server.port.calls import Calls

_NOT_YET = "is not supported by this engine yet (docs/live-conformance.md)"

# REST call -> what it is, for the refusal's message.
_REST = {
    ("POST", "/v1/live/sessions/{session_id}/fork"): "forking a stored GPT-Live session",
    ("GET", "/v1/live/sessions/{session_id}/content"): "a stored GPT-Live session's recording",
}


def live_routes(sessions: RealtimeSessions, webrtc: WebRtc, calls: Calls,
                sip: Callable[[], Any], lines: LiveLines,
                chooser: Chooser | None = None) -> list[Route | WebSocketRoute]:
    """``webrtc``: the WebRTC settings; ``calls`` and ``sip``: this server's
    calls and SIP user agent (None when it takes no SIP calls); ``lines``:
    the live sessions sidebands reach; ``chooser``: what evaluates Decisions
    (the engine's LLM); None: they are refused."""

    async def live(ws: WebSocket):
        await LiveSocket(sessions, ws, lines, chooser).serve()

    async def attach(ws: WebSocket):
        await LiveSideband(sessions, lines, ws).serve()

    def refusal(what: str):
        async def refuse(request: Request):
            try:
                sessions.check_key(bearer_key(request.headers))
                raise DuplexError("capability_unsupported", f"{what} {_NOT_YET}")
            except DuplexError as err:
                return error_response(err)
        return refuse

    async def fork(ws: WebSocket):  # a new session from a stored one (live.forks.connect)
        await LiveSocket(sessions, ws, lines, chooser, fork_of=ws.path_params["session_id"]).serve()

    routes: list[Route | WebSocketRoute] = [
        WebSocketRoute("/v1/live/sessions", live),
        WebSocketRoute("/v1/live/sessions/{session_id}/fork", fork),
        WebSocketRoute("/v1/live/sessions/{session_id}/attach", attach),
    ]
    routes += live_webrtc_routes(sessions, webrtc, calls, lines)
    routes += live_call_routes(sessions, calls, sip, lines)
    routes += [Route(path, refusal(what), methods=[method]) for (method, path), what in _REST.items()]
    return routes
