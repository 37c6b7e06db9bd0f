"""Who may open a Twilio call here. Pure: no I/O (the clock is an argument).

- The webhook (``POST /v1/telephony/twilio/voice``) is Twilio's when its
  ``X-Twilio-Signature`` verifies against the account's auth token (the
  ``twilio`` package's ``RequestValidator``: HMAC-SHA1 of the URL Twilio
  requested and the sorted form fields).
- The stream socket cannot be checked that way by us for the media it
  carries, and Twilio forbids query strings on the stream URL. So the
  webhook's answer carries a *stream token* among the ``<Parameter>``s, which
  Twilio hands back in the ``start`` message's ``customParameters``: an
  expiry and an HMAC over the call's ``CallSid``, our call id and the session
  profile. A stream whose ``start`` does not carry a valid token for its own
  ``callSid`` is refused -- no one can open a phone session without a
  webhook request that passed the signature check first.

The token's key is derived from the auth token when there is one, so every
worker behind a router accepts the tokens of the others; without one, it is
random per process, and the token is required only when the server has API
keys (an open server opens sessions for anyone anyway).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping

from twilio.request_validator import RequestValidator
from vllm_duplex.domain.errors import DuplexError

TOKEN_TTL_S = 120.0  # Twilio opens the stream within seconds of our answer
_CONTEXT = b"vllm-duplex twilio stream token v1\n"


class TwilioAuth:
    def __init__(self, auth_token: str | None, *, require_token: bool) -> None:
        self._validator = RequestValidator(auth_token) if auth_token else None
        seed = auth_token.encode() if auth_token else secrets.token_bytes(32)
        self._key = hmac.new(seed, _CONTEXT, hashlib.sha256).digest()
        # With an auth token or API keys configured, a stream needs a token.
        self.require_token = require_token or auth_token is not None

    @property
    def checks_signatures(self) -> bool:
        return self._validator is not None

    def check_signature(self, url: str, form: Mapping[str, str], signature: str | None) -> None:
        """Raise ``invalid_signature`` unless Twilio signed this request
        (nothing to check without an auth token)."""
        if self._validator is None:
            return
        if not signature or not self._validator.validate(url, dict(form), signature):
            raise DuplexError("invalid_signature", "X-Twilio-Signature is missing or does not "
                              "match this request and the configured auth token",
                              param="X-Twilio-Signature")

    def stream_token(self, call_sid: str, call_id: str, profile: str, now: float) -> str:
        expires = int(now + TOKEN_TTL_S)
        return f"{expires}.{self._mac(call_sid, call_id, profile, expires)}"

    def check_stream_token(self, token: str | None, call_sid: str, call_id: str, profile: str,
                           now: float) -> None:
        """Raise ``unauthorized`` unless ``token`` was minted by a webhook of
        this call (``call_sid``) for this call id and profile, and is fresh."""
        if token is None and not self.require_token:
            return
        try:
            expires_text, mac = (token or "").split(".", 1)
            expires = int(expires_text)
        except ValueError:
            raise DuplexError("unauthorized", "the stream's start has no valid stream token "
                              "(answer the call with this server's webhook)") from None
        if not hmac.compare_digest(mac, self._mac(call_sid, call_id, profile, expires)):
            raise DuplexError("unauthorized", "the stream token is not for this call")
        if now > expires:
            raise DuplexError("unauthorized", "the stream token expired")

    def _mac(self, call_sid: str, call_id: str, profile: str, expires: int) -> str:
        message = "\n".join((call_sid, call_id, profile, str(expires))).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
