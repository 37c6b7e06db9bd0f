"""The GPT-Live routes: ``WS /v1/live/sessions`` (the primary socket,
``socket.py``) and the REST calls of the ``openai`` SDK's ``live``
resources, which this first slice answers with a typed error naming what
is not built yet (never a bare 404), so a client learns why.

``WS /v1/live/sessions/{id}/fork`` (the SDK's ``live.forks``) is a session
that starts from a stored one (``socket.py``). The SDK's paths (``openai/resources/live/``): ``POST /live/sessions``
(create: a WebRTC/SIP session), ``…/{id}/accept``, ``/reject``, ``/refer``,
``/hangup`` (SIP), ``…/{id}/fork``, ``GET …/{id}/content`` (a stored
session's recording) and ``WS …/{id}/attach`` (the sideband).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from vllm_duplex.domain.decisions import Chooser
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.http_errors import error_response
from vllm_duplex.realtime.server.live.socket import LiveSocket

_NOT_YET = "is not supported by this engine yet (docs/live-conformance.md)"

# REST call -> what it is, for the refusal's message.
_REST = {
    ("POST", "/v1/live/sessions"): "creating a GPT-Live WebRTC/SIP session (live.create)",
    ("POST", "/v1/live/sessions/{session_id}/accept"): "accepting a GPT-Live SIP call",
    ("POST", "/v1/live/sessions/{session_id}/reject"): "rejecting a GPT-Live SIP call",
    ("POST", "/v1/live/sessions/{session_id}/refer"): "referring a GPT-Live SIP call",
    ("POST", "/v1/live/sessions/{session_id}/hangup"): "hanging up a GPT-Live SIP call",
    ("POST", "/v1/live/sessions/{session_id}/fork"): "forking a stored GPT-Live session onto "
    "a WebRTC connection (fork over WebSocket: WS /v1/live/sessions/{id}/fork, live.forks)",
    ("GET", "/v1/live/sessions/{session_id}/content"): "a stored GPT-Live session's recording "
    "(a stored session keeps its conversation for forks, not its audio)",
}


def live_routes(sessions: RealtimeSessions,
                chooser: Chooser | None = None) -> list[Route | WebSocketRoute]:
    """``chooser``: what evaluates Decisions (the engine's LLM); None: they are refused."""

    async def live(ws: WebSocket):
        await LiveSocket(sessions, ws, chooser).serve()

    async def attach(ws: WebSocket):
        await ws.accept()
        codec = LiveSocket(sessions, ws).codec
        err = DuplexError("capability_unsupported", f"the GPT-Live sideband {_NOT_YET}",
                          param="session_id")
        try:
            sessions.check_key(bearer_key(ws.headers, list(ws.scope.get("subprotocols") or [])))
        except DuplexError as denied:
            err = denied
        await ws.send_text(codec.render_error(err))
        await ws.close(code=1008, reason=err.code)

    def refusal(what: str):
        async def refuse(request: Request):
            try:
                sessions.check_key(bearer_key(request.headers))
                raise DuplexError("capability_unsupported", f"{what} {_NOT_YET}")
            except DuplexError as err:
                return error_response(err)
        return refuse

    async def fork(ws: WebSocket):  # a new session from a stored one (live.forks.connect)
        await LiveSocket(sessions, ws, chooser, fork_of=ws.path_params["session_id"]).serve()

    routes: list[Route | WebSocketRoute] = [
        WebSocketRoute("/v1/live/sessions", live),
        WebSocketRoute("/v1/live/sessions/{session_id}/fork", fork),
        WebSocketRoute("/v1/live/sessions/{session_id}/attach", attach),
    ]
    routes += [Route(path, refusal(what), methods=[method]) for (method, path), what in _REST.items()]
    return routes
