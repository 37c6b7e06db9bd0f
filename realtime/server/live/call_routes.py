"""GPT-Live's SIP call control (the SDK's ``client.live.sessions.accept``,
``reject``, ``refer``, ``hangup``): the same SIP user agent and calls as
``/v1/realtime/calls/{call_id}/…`` (``telephony/sip_routes.py``), the
session speaking GPT-Live.

The id is the ringing call's: this server announces a call with the
``realtime.call.incoming`` webhook only, and (as the SDK says of a pending
SIP session) the first accept, Realtime's or GPT-Live's, decides the
surface. ``accept``'s body is ``{"session": {"type": "live", "model": …}}``,
parsed by the live codec as a ``session.start``'s config (SIP negotiates the
audio format: ``audio.format`` is refused). ``reject`` needs its
``status_code`` (the SDK's field is required); ``refer`` a ``target_uri``;
``hangup`` ends a SIP call (live or Realtime), or a live WebRTC session. An id that is not a call of
this key's: ``session_not_found`` (404); the rest as the Realtime routes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.http_errors import error_response
from vllm_duplex.realtime.server.live.lines import LiveLines
from vllm_duplex.realtime.server.live.sip_call import LiveSipCall
from vllm_duplex.realtime.server.port.calls import Call, Calls
from vllm_duplex.realtime.server.telephony.sip_call import SipCall
from vllm_duplex.realtime.wire.live.codec import LiveCodec

_MAX_BODY = 1 << 20


def live_call_routes(sessions: RealtimeSessions, calls: Calls | None, agent: Callable[[], Any],
                     lines: LiveLines) -> list[Route]:
    def the_agent() -> Any:
        sip = agent()
        if sip is None:
            raise DuplexError("session_not_found", "this server takes no SIP calls",
                              param="session_id")
        return sip

    async def body(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) > _MAX_BODY:
            raise DuplexError("invalid_value", "the body is too large", param="body")
        try:
            data = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise DuplexError("invalid_json", "the body is not JSON") from None
        if not isinstance(data, dict):
            raise DuplexError("invalid_value", "the body is a JSON object", param="body")
        return data

    def as_live(err: DuplexError) -> DuplexError:
        """The SIP agent's ``call_not_found`` as the live surface's
        ``session_not_found``; its ``call_id`` as the surface's ``session_id``."""
        if err.code == "call_not_found":
            return DuplexError("session_not_found", err.message.replace("call", "session"),
                               param="session_id")
        if err.param == "call_id":
            return DuplexError(err.code, err.message, param="session_id")
        return err

    def the_call(request: Request, key: str | None) -> Call:
        """The call of this key's, by the id in the path."""
        if calls is None:
            raise DuplexError("session_not_found", "this server takes no calls",
                              param="session_id")
        return calls.get(request.path_params["session_id"], key)

    def route(handler: Callable[[Request, str | None], Any]):
        async def endpoint(request: Request):
            try:
                key = bearer_key(request.headers)
                sessions.admit(key, room=False)  # accept asks for the room as it opens
                await handler(request, key)
            except DuplexError as err:
                err = as_live(err)
                sessions.count_error(err.code)
                return error_response(err)
            return Response(status_code=200)
        return endpoint

    async def accept(request: Request, key: str | None) -> None:
        session = (await body(request)).get("session")
        if not isinstance(session, dict):
            raise DuplexError("invalid_value", "session is required: {type: live, model, …}",
                              param="session")
        if session.get("type") != "live":
            raise DuplexError("invalid_value", 'session.type must be "live"',
                              param="session.type")
        if (session.get("audio") or {}).get("format") is not None:
            raise DuplexError("invalid_value", "SIP negotiates the audio format: omit "
                              "audio.format", param="session.audio.format")
        call_id = request.path_params["session_id"]
        codec = LiveCodec(max_event_bytes=sessions.max_event_bytes,
                          model_aliases=sessions.model_aliases, clock=sessions.now)
        codec.session_id = call_id
        _, patch = codec.call_session_patch({k: v for k, v in session.items() if k != "type"})
        call = await the_agent().accept(call_id, key, patch, kind=LiveSipCall, codec=codec)
        assert isinstance(call, LiveSipCall)
        if not call.ended.is_set():
            lines.add(call_id, call.line)

    async def reject(request: Request, key: str | None) -> None:
        status = (await body(request)).get("status_code")
        if not isinstance(status, int) or isinstance(status, bool):
            raise DuplexError("invalid_value", "status_code (an integer) is required",
                              param="status_code")
        the_agent().reject(request.path_params["session_id"], status)

    async def refer(request: Request, key: str | None) -> None:
        target = (await body(request)).get("target_uri")
        await SipCall.transfer(the_call(request, key), target)

    async def hangup(request: Request, key: str | None) -> None:
        await the_call(request, key).hangup()  # a WebRTC session's too

    base = "/v1/live/sessions/{session_id}"
    return [Route(f"{base}/{name}", route(handler), methods=["POST"])
            for name, handler in (("accept", accept), ("reject", reject), ("refer", refer),
                                  ("hangup", hangup))]
