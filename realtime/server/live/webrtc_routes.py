"""``POST /v1/live/sessions`` (the SDK's ``client.live.create``): a GPT-Live
WebRTC session from the browser's SDP offer, answered as
``POST /v1/realtime/calls`` answers one (``webrtc/routes.py``: the same
admission, offer checks, peer connection and media path), the session
speaking GPT-Live (``webrtc_call.py``).

The body is JSON: ``{"session": MediaSessionConfig, "transport": {"type":
"webrtc", "sdp": offer}}``; the answer ``{"session": {"id"}, "transport":
{"type": "webrtc", "sdp": answer}}`` (``LiveCreateResponse``). The id is
the call's: its sideband attaches with it, ``…/hangup`` ends it. The
session config is a ``session.start``'s (the live codec parses it), but
what WebRTC negotiates (``audio.format``: refused) and what this engine
does not do: ``wake_policy`` and ``idle_timeout_s`` pause and wake
inference, and nothing here pauses (refused by name, ``unsupported_option``).
``store: true`` keeps it as a WebSocket session is kept (``stored.py``).

``POST /v1/live/sessions/{id}/fork`` (the SDK's ``live.sessions.fork``) is
the same with a stored session's config and conversation: its body's
``session`` is the overrides only (``MediaSessionForkConfigParam``:
``client``, ``delegation``, ``store``; absent or ``{}`` inherits all), read
as ``realtime/wire/live/forks.py`` reads a WebSocket fork's, and the stored
conversation is the new session's first items, delivered before the peer
can speak. Answered as ``SessionForkResponse``: the new session's id and
the SDP answer. An id never stored, another key's or one the store forgot:
``session_not_found`` (404), before any ICE work.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.host.deploy import WebRtc
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.http_errors import error_response
from vllm_duplex.realtime.server.live.lines import LiveLines
from vllm_duplex.realtime.server.live.webrtc_call import DataChannelPolicy, LiveRtcCall
from vllm_duplex.realtime.server.port.calls import Calls
from vllm_duplex.realtime.server.port.session_port import realtime_codec
from vllm_duplex.realtime.server.webrtc.ice import use_host_addresses
from vllm_duplex.realtime.server.webrtc.offer import MAX_OFFER_BYTES, check_offer
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.forks import fork_start
from vllm_duplex.realtime.wire.live.history import history_items

_NO_PAUSE = ("this engine does not pause inference on idle (its stages run only on speech): "
             "{} is not supported")


def live_webrtc_routes(sessions: RealtimeSessions, settings: WebRtc, calls: Calls,
                       lines: LiveLines) -> list[Route]:
    use_host_addresses(settings.host_addresses)

    async def read(request: Request, *, fork: bool = False) -> tuple[str, dict[str, Any]]:
        raw = await request.body()
        if len(raw) > MAX_OFFER_BYTES + (64 << 10):
            raise DuplexError("invalid_sdp", "the request is too large for an SDP offer",
                              param="transport.sdp")
        try:
            body = json.loads(raw)
        except ValueError:
            raise DuplexError("invalid_json", "the body is not JSON") from None
        if not isinstance(body, dict):
            raise DuplexError("invalid_value", "the body is a JSON object", param="body")
        transport, session = body.get("transport"), body.get("session", {} if fork else None)
        if not isinstance(transport, dict) or transport.get("type") != "webrtc" \
                or not isinstance(transport.get("sdp"), str):
            raise DuplexError("invalid_value", 'transport is {"type": "webrtc", "sdp": offer}',
                              param="transport")
        if not isinstance(session, dict):
            raise DuplexError("invalid_value", "session is required", param="session")
        return transport["sdp"], session

    def check(session: dict[str, Any]) -> None:
        if (session.get("audio") or {}).get("format") is not None:
            raise DuplexError("invalid_value", "WebRTC negotiates the audio format: omit "
                              "audio.format", param="session.audio.format")
        for name in ("wake_policy", "idle_timeout_s"):
            if session.get(name) is not None:
                raise DuplexError("unsupported_option", _NO_PAUSE.format(name),
                                  param=f"session.{name}")

    async def answer(key: str | None, call_id: str, sdp: str, session: dict[str, Any],
                     history: list[dict[str, Any]] | None = None):
        """The session and its call, with what it starts with; the answer's JSON."""
        check(session)
        policy = DataChannelPolicy.parse(session.get("client"))
        codec = LiveCodec(max_event_bytes=sessions.max_event_bytes,
                          model_aliases=sessions.model_aliases, clock=sessions.now)
        codec.session_id = call_id
        _, patch = codec.call_session_patch({k: v for k, v in session.items()
                                               if k != "client"}, storable=True)
        items = history_items(history, realtime_codec(sessions)) if history else ()
        offer = check_offer(sdp, settings.host_addresses)
        call, answer = await LiveRtcCall.answer(sessions, settings, call_id, key, offer,
                                                patch, on_end=calls.remove, codec=codec)
        assert isinstance(call, LiveRtcCall)
        call.policy = policy  # before the channel opens: nothing was sent on it yet
        if not call.ended.is_set():
            try:
                for item in items:  # the stored conversation, before the peer can speak
                    call.port.deliver(item)
                if codec.store:
                    await call.store(key)
            except BaseException:
                await call.hangup()
                raise
            calls.add(call)
            lines.add(call_id, call.line)
        return JSONResponse({"session": {"id": call_id},
                             "transport": {"type": "webrtc", "sdp": answer}})

    async def create(request: Request):
        try:
            key = bearer_key(request.headers)
            # The room before the offer is read or any ICE work, as /v1/realtime/calls.
            call_id = sessions.admit(key, call="rtc")
            sdp, session = await read(request)
            return await answer(key, call_id, sdp, session)
        except DuplexError as err:
            sessions.count_error(err.code)
            return error_response(err)

    async def fork(request: Request):
        try:
            key = bearer_key(request.headers)
            call_id = sessions.admit(key, call="rtc")
            sdp, overrides = await read(request, fork=True)
            stored = await sessions.find_live(request.path_params["session_id"], key)
            start = fork_start({"type": "session.start", "session": overrides},
                               stored.config, stored.items, webrtc=True)["session"]
            history = start.pop("input")
            return await answer(key, call_id, sdp, start, history)
        except DuplexError as err:
            sessions.count_error(err.code)
            return error_response(err)

    return [Route("/v1/live/sessions", create, methods=["POST"]),
            Route("/v1/live/sessions/{session_id}/fork", fork, methods=["POST"])]
