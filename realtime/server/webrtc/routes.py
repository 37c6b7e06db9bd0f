"""The HTTP side of WebRTC calls (OpenAI GA):

- ``POST /v1/realtime/calls``: an SDP offer in -- the body as
  ``application/sdp``, or ``multipart/form-data`` with ``sdp`` and an optional
  ``session`` (JSON, the session config) -- the SDP answer out (201), the
  call id in ``Location: /v1/realtime/calls/{call_id}``. The key may be an API
  key or a client secret (``ek_…``, what a browser holds).
- ``POST /v1/realtime/calls/{call_id}/hangup``: end a call (its owner's key).

Errors are the typed HTTP errors of every route (``{"error": {...}}``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.host.deploy import WebRtc
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.port.calls import Calls
from vllm_duplex.realtime.server.port.session_port import realtime_codec
from vllm_duplex.realtime.server.webrtc.call import RtcCall
from vllm_duplex.realtime.server.webrtc.ice import use_host_addresses
from vllm_duplex.realtime.server.webrtc.offer import MAX_OFFER_BYTES, check_offer


def call_routes(sessions: RealtimeSessions, settings: WebRtc, calls: Calls,
                error_response: Callable[[DuplexError], JSONResponse]) -> list[Route]:
    use_host_addresses(settings.host_addresses)
    codec = realtime_codec(sessions)

    async def read_offer(request: Request) -> tuple[str, SessionPatch | None]:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        size = int(request.headers.get("content-length") or 0)
        if size > MAX_OFFER_BYTES + (64 << 10):
            raise DuplexError("invalid_sdp", "the request is too large for an SDP offer",
                              param="sdp")
        if ctype == "application/sdp":
            body = await request.body()
            try:
                return body.decode("utf-8"), None
            except UnicodeDecodeError:
                raise DuplexError("invalid_sdp", "the SDP offer is not UTF-8", param="sdp") from None
        if ctype == "multipart/form-data":
            form = await request.form(max_files=0, max_fields=4)
            try:
                sdp, session = form.get("sdp"), form.get("session")
                if not isinstance(sdp, str):
                    raise DuplexError("invalid_sdp", "the multipart body has no sdp field",
                                      param="sdp")
                if session is None:
                    return sdp, None
                try:
                    raw = json.loads(str(session))
                except ValueError:
                    raise DuplexError("invalid_value", "the session field is not JSON",
                                      param="session") from None
                return sdp, codec.session_patch(raw)
            finally:
                await form.close()
        raise DuplexError("invalid_sdp", "send the offer as Content-Type application/sdp, or "
                          "multipart/form-data with sdp (and session)", param="sdp")

    async def create_call(request: Request):
        try:
            key = bearer_key(request.headers)
            # The room before the offer is read or any ICE work (the open asks
            # again as it takes the seat).
            call_id = sessions.admit(key, model=request.query_params.get("model"), call="rtc")
            sdp, patch = await read_offer(request)
            offer = check_offer(sdp, settings.host_addresses)
            call, answer = await RtcCall.answer(sessions, settings, call_id, key, offer, patch,
                                                on_end=calls.remove)
        except DuplexError as err:
            sessions.count_error(err.code)
            return error_response(err)
        if not call.ended.is_set():
            calls.add(call)
        return Response(answer, status_code=201, media_type="application/sdp",
                        headers={"Location": f"/v1/realtime/calls/{call_id}"})

    async def hangup(request: Request):
        try:
            key = bearer_key(request.headers)
            sessions.check_key(key)
            call = calls.get(request.path_params["call_id"], key)
        except DuplexError as err:
            return error_response(err)
        await call.hangup()
        return Response(status_code=200)

    return [
        Route("/v1/realtime/calls", create_call, methods=["POST"]),
        Route("/v1/realtime/calls/{call_id}/hangup", hangup, methods=["POST"]),
    ]
