"""Call control of SIP calls, as OpenAI's (``/v1/realtime/calls/{call_id}/…``):

- ``accept``: answer a ringing call; the body is the session (what a
  ``session.update`` would set, ``type: "realtime"``), parsed by the same
  codec as every session config. The session belongs to the caller's key.
- ``reject``: ``{"status_code": 486}`` (default 603 Decline).
- ``refer``: ``{"target_uri": "tel:+14155550123"}`` -> SIP REFER to the
  caller's side; the call ends when the transfer succeeds.
- ``hangup`` is ``webrtc/routes.py``'s: SIP calls are in the same registry.

Errors are the typed HTTP errors of every route.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.port.session_port import realtime_codec
from vllm_duplex.realtime.server.telephony.sip_agent import SipAgent
from vllm_duplex.realtime.server.telephony.sip_call import SipCall

_MAX_BODY = 1 << 20


def sip_routes(sessions: RealtimeSessions, calls: Any, agent: Callable[[], SipAgent | None],
               error_response: Callable[[DuplexError], JSONResponse]) -> list[Route]:
    codec = realtime_codec(sessions)

    def the_agent() -> SipAgent:
        sip = agent()
        if sip is None:
            raise DuplexError("call_not_found", "this server takes no SIP calls", param="call_id")
        return sip

    async def body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > _MAX_BODY:
            raise DuplexError("invalid_value", "the body is too large", param="body")
        if not raw.strip():
            return {}
        try:
            data = json.loads(raw)
        except ValueError:
            raise DuplexError("invalid_json", "the body is not JSON") from None
        if not isinstance(data, dict):
            raise DuplexError("invalid_value", "the body is a JSON object", param="body")
        return data

    def authorized(request: Request) -> str | None:
        """The caller's key. No room asked here: ``accept`` opens at once
        (the open asks as it takes the seat, after the session's config, so
        a bad body is answered as such); ``reject`` and ``refer`` take none."""
        key = bearer_key(request.headers)
        sessions.admit(key, room=False)
        return key

    async def accept(request: Request):
        try:
            key = authorized(request)
            raw = await body(request)
            patch = codec.session_patch(raw) if raw else None
            await the_agent().accept(request.path_params["call_id"], key, patch)
        except DuplexError as err:
            sessions.count_error(err.code)
            return error_response(err)
        return Response(status_code=200)

    async def reject(request: Request):
        try:
            authorized(request)
            status = (await body(request)).get("status_code", 603)
            if not isinstance(status, int) or isinstance(status, bool):
                raise DuplexError("invalid_value", "status_code is an integer", param="status_code")
            the_agent().reject(request.path_params["call_id"], status)
        except DuplexError as err:
            return error_response(err)
        return Response(status_code=200)

    async def refer(request: Request):
        try:
            key = authorized(request)
            target = (await body(request)).get("target_uri")
            await SipCall.transfer(calls.get(request.path_params["call_id"], key), target)
        except DuplexError as err:
            return error_response(err)
        return Response(status_code=200)

    return [
        Route("/v1/realtime/calls/{call_id}/accept", accept, methods=["POST"]),
        Route("/v1/realtime/calls/{call_id}/reject", reject, methods=["POST"]),
        Route("/v1/realtime/calls/{call_id}/refer", refer, methods=["POST"]),
    ]
