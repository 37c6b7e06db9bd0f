"""The routes of Twilio phone calls (with a ``twilio:`` config section):

- ``POST /v1/telephony/twilio/voice``: the number's "A call comes in"
  webhook. Its ``X-Twilio-Signature`` is checked when an auth token is
  configured (``403 invalid_signature`` otherwise); ``?profile=NAME`` picks a
  session profile. It answers TwiML, built with the ``twilio`` package:
  ``<Connect><Stream url="wss://…/v1/telephony/twilio/stream">`` whose
  ``<Parameter>``s carry our call id, the profile, the caller's and the
  called number, and the stream token (``twilio_auth``) back to us in the
  stream's ``start``. At capacity it answers ``<Reject reason="busy"/>``: the
  caller hears a busy signal instead of Twilio's application-error message.
- ``WS /v1/telephony/twilio/stream``: the Media Stream (``twilio_stream``).

Errors before the TwiML are the typed HTTP errors of every route.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket
from twilio.twiml.voice_response import Connect, Stream, VoiceResponse
from vllm_duplex.domain.errors import Capacity, DuplexError
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.host.twilio import Twilio
from vllm_duplex.realtime.server.port.calls import Calls
from vllm_duplex.realtime.server.port.session_port import SessionPort, realtime_codec
from vllm_duplex.realtime.server.telephony.twilio_auth import TwilioAuth
from vllm_duplex.realtime.server.telephony.twilio_stream import (
    Refused,
    TwilioCall,
    await_start,
    phone_patch,
    refuse,
)

log = logging.getLogger(__name__)

VOICE_PATH = "/v1/telephony/twilio/voice"
STREAM_PATH = "/v1/telephony/twilio/stream"
MAX_WEBHOOK_BYTES = 64 << 10  # Twilio's form is a few dozen short fields


def twilio_routes(sessions: RealtimeSessions, settings: Twilio | None, calls: Calls,
                  error_response: Callable[[DuplexError], JSONResponse]) -> list[Route | WebSocketRoute]:
    if settings is None:
        return []
    api_keys = sessions.api_keys
    api_key = settings.api_key or (api_keys[0] if api_keys else None)
    if api_keys and api_key not in api_keys:
        raise ValueError("twilio.api_key must be one of api_keys")
    codec = realtime_codec(sessions)
    profiles: dict[str, SessionPatch] = {}
    for name, raw in settings.profiles.items():
        try:
            profiles[name] = codec.session_patch(raw, param=f"twilio.profiles.{name}")
        except DuplexError as err:
            raise ValueError(f"twilio.profiles.{name}: {err.message}") from None
    auth = TwilioAuth(settings.auth_token, require_token=bool(api_keys))
    count_error = sessions.count_error

    def signed_url(request: Request) -> str:
        """The URL Twilio requested, which its signature covers."""
        if settings.public_url is None:
            return str(request.url)
        query = request.url.query
        return settings.public_url + request.url.path + (f"?{query}" if query else "")

    def stream_url(request: Request) -> str:
        base = settings.public_url or f"{request.url.scheme}://{request.url.netloc}"
        return base.replace("https://", "wss://", 1).replace("http://", "ws://", 1) + STREAM_PATH

    async def voice(request: Request) -> Response:
        try:
            if int(request.headers.get("content-length") or 0) > MAX_WEBHOOK_BYTES:
                raise DuplexError("payload_too_large", "the webhook body is larger than "
                                  "Twilio's form")
            form = await request.form(max_files=0, max_fields=128)
            try:
                fields = {k: v for k, v in form.items() if isinstance(v, str)}
            finally:
                await form.close()
            auth.check_signature(signed_url(request), fields,
                                 request.headers.get("x-twilio-signature"))
            profile = request.query_params.get("profile") or ("default" if "default" in profiles
                                                              else "")
            if profile and profile not in profiles:
                raise DuplexError("invalid_value", f"no session profile {profile!r} "
                                  "(twilio.profiles)", param="profile")
            call_sid = fields.get("CallSid")
            if not call_sid:
                raise DuplexError("invalid_value", "the webhook has no CallSid: is it Twilio's "
                                  "voice webhook?", param="CallSid")
        except DuplexError as err:
            count_error(err.code)
            return error_response(err)
        response = VoiceResponse()
        try:
            # Twilio signs the webhook (checked above); the key is the one the
            # call's session opens with. The room after the signature, so a
            # forged webhook never learns it; at capacity the caller hears busy.
            call_id = sessions.admit(api_key, call="tw")
        except Capacity:
            log.info("twilio call %s refused: at capacity", call_sid)
            response.reject(reason="busy")
            return Response(str(response), media_type="application/xml")
        stream = Stream(url=stream_url(request))
        stream.parameter(name="call_id", value=call_id)
        stream.parameter(name="token", value=auth.stream_token(call_sid, call_id, profile,
                                                               time.time()))
        if profile:
            stream.parameter(name="profile", value=profile)
        for field, name in (("From", "from"), ("To", "to")):
            if fields.get(field):
                stream.parameter(name=name, value=fields[field])
        connect = Connect()
        connect.append(stream)
        response.append(connect)
        log.info("twilio call %s (%s): streaming to %s", call_id, call_sid, stream_url(request))
        return Response(str(response), media_type="application/xml")

    async def media_stream(ws: WebSocket) -> None:
        await ws.accept()
        # The call's events for its sideband sockets; Twilio's own frames are twilio_codec's.
        sideband_codec = realtime_codec(sessions)
        try:
            start = await await_start(ws, count_error)
            if start is None:  # a stop (or the socket's end) before any start
                try:
                    await ws.close()
                except Exception:  # already gone
                    pass
                return
            if not start.media_format.is_mulaw_8k:
                fmt = start.media_format
                raise DuplexError("unsupported_audio_format", f"the stream is {fmt.encoding} at "
                                  f"{fmt.sample_rate} Hz; a bidirectional stream is audio/x-mulaw "
                                  "at 8000 Hz", param="start.mediaFormat")
            params = start.custom_parameters
            token, profile = params.get("token"), params.get("profile", "")
            call_id = params.get("call_id", "") if token is not None else ""
            auth.check_stream_token(token, start.call_sid, call_id, profile, time.time())
            if profile and profile not in profiles:
                raise DuplexError("invalid_value", f"no session profile {profile!r}",
                                  param="profile")
            port = await SessionPort.open(sessions, sideband_codec, api_key,
                                          phone_patch(profiles.get(profile)),
                                          transport=SessionPatch.played_here())
        except Refused as refused:
            await refuse(ws, refused.err, count_error)
            return
        except DuplexError as err:
            await refuse(ws, err, count_error)
            return
        call = TwilioCall(port, ws, start, call_id or sessions.mint_id("tw"), on_end=calls.remove)
        calls.add(call)
        log.info("twilio call %s (%s): session %s", call.call_id, start.call_sid,
                 port.session.session_id)
        await call.run()

    return [Route(VOICE_PATH, voice, methods=["POST"]),
            WebSocketRoute(STREAM_PATH, media_stream)]
