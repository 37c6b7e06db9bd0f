"""The GPT-Live routes: ``WS /v1/live/sessions`` (the primary socket,
``socket.py``), ``WS …/{id}/attach`` (the sideband, ``sideband.py``), the
WebRTC sessions and forks (``webrtc_routes.py``), the SIP call control
(``call_routes.py``), and ``GET …/{id}/content``, a stored session's
recording.

``WS /v1/live/sessions/{id}/fork`` (the SDK's ``live.forks``) is a session
that starts from a stored one (``socket.py``); ``POST …/{id}/fork`` the
same onto a new WebRTC connection. The SDK's paths
(``openai/resources/live/``): ``POST /live/sessions`` (create: a WebRTC
session), ``…/{id}/accept``, ``/reject``, ``/refer``, ``/hangup`` (SIP),
``…/{id}/fork``, ``GET …/{id}/content`` and ``WS …/{id}/attach``.

The recording (``download_recording``, ``Accept: application/binary``) is
a stereo WAV, 24 kHz 16-bit, left the caller as the session heard them,
right the engine's voice as played (``media/recording.py``), kept with the
stored session (``durable/live_sessions.py``): the same owner, store and
lifetime, and as fresh as its last save -- a session still running answers
with its recording up to its last reply. An id never stored, another key's
or one the store forgot: ``session_not_found`` (404).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
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

    async def recording(request: Request):
        try:
            key = bearer_key(request.headers)
            sessions.check_key(key)
            stored = await sessions.find_live(request.path_params["session_id"], key)
        except DuplexError as err:
            sessions.count_error(err.code)
            return error_response(err)
        return Response(stored.recording, media_type="audio/wav")

    async def fork(ws: WebSocket):  # a new session from a stored one (live.forks.connect)
        await LiveSocket(sessions, ws, lines, chooser, fork_of=ws.path_params["session_id"]).serve()

    routes: list[Route | WebSocketRoute] = [
        WebSocketRoute("/v1/live/sessions", live),
        WebSocketRoute("/v1/live/sessions/{session_id}/fork", fork),
        WebSocketRoute("/v1/live/sessions/{session_id}/attach", attach),
    ]
    routes += live_webrtc_routes(sessions, webrtc, calls, lines)
    routes += live_call_routes(sessions, calls, sip, lines)
    routes.append(Route("/v1/live/sessions/{session_id}/content", recording, methods=["GET"]))
    return routes
