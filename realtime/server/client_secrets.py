"""``POST /v1/realtime/client_secrets`` (OpenAI GA): an API key mints a
short-lived client key (``ek_…``) for a browser or phone, optionally with the
session config its session opens with (``vllm_duplex.leases.client_secrets``
has the rules: one session per key, expiry, ownership).

Body: ``{"expires_after": {"anchor": "created_at", "seconds": 10..7200},
"session": {"type": "realtime" | "transcription", ...}}`` (both optional).
Answer: ``{"value": "ek_…", "expires_at": <unix s>, "session": {...}}`` --
the session object the key's session opens with, its id included.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.session_config import session_wire
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.leases.client_secrets import DEFAULT_TTL_S, is_client_secret
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.port.session_port import realtime_codec


def client_secret_routes(sessions: RealtimeSessions, max_request_bytes: int,
                         error_response: Callable[[DuplexError], JSONResponse]) -> list[Route]:
    codec = realtime_codec(sessions)

    def parse(body: bytes) -> tuple[float, object]:
        if len(body) > max_request_bytes:
            raise DuplexError("payload_too_large", "the request body is too large")
        try:
            raw = json.loads(body) if body.strip() else {}
        except ValueError:
            raise DuplexError("invalid_json", "the body is not JSON") from None
        if not isinstance(raw, dict):
            raise DuplexError("invalid_value", "the body must be a JSON object")
        expires = raw.get("expires_after")
        ttl: object = DEFAULT_TTL_S
        if expires is not None:
            if not isinstance(expires, dict):
                raise DuplexError("invalid_value", "expires_after must be an object",
                                  param="expires_after")
            if expires.get("anchor", "created_at") != "created_at":
                raise DuplexError("invalid_value", 'expires_after.anchor must be "created_at"',
                                  param="expires_after.anchor")
            ttl = expires.get("seconds", DEFAULT_TTL_S)
            if isinstance(ttl, bool) or not isinstance(ttl, int):
                raise DuplexError("invalid_value", "expires_after.seconds must be an integer",
                                  param="expires_after.seconds")
        return float(ttl), raw.get("session")

    async def create(request: Request):
        try:
            key = bearer_key(request.headers)
            if is_client_secret(key):
                raise DuplexError("unauthorized", "a client secret cannot mint client secrets; "
                                  "use an API key (on your server)")
            sessions.check_key(key)
            ttl, session = parse(await request.body())
            patch = codec.session_patch(session) if session is not None else None
            value, secret, config = sessions.mint_client_secret(key, patch, ttl, time.time())
        except DuplexError as err:
            sessions.count_error(err.code)
            return error_response(err)
        wire = session_wire(config, session_id=secret.session_id)
        return JSONResponse({"value": value, "expires_at": secret.expires_at_unix,
                             "session": wire})

    return [Route("/v1/realtime/client_secrets", create, methods=["POST"])]
