"""The ``realtime.call.incoming`` webhook, signed as Standard Webhooks (and
OpenAI's webhooks) are.

``signed(secret, event)`` is sans-I/O: the body and the three headers
``webhook-id``, ``webhook-timestamp`` and ``webhook-signature``
(``v1,`` + base64 of HMAC-SHA256 over ``{id}.{timestamp}.{body}``, keyed by
the base64 part of the ``whsec_…`` secret), so any Standard Webhooks library
(``standardwebhooks``, ``openai.webhooks.unwrap``) verifies it.

``WebhookSender`` POSTs it; a receiver that fails (non-2xx, unreachable) is
retried a few times with back-off, as Standard Webhooks senders do. It never
raises into the SIP agent: a webhook that never got through leaves the call
ringing until its ring timeout.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

_RETRY_DELAYS_S = (0.5, 2.0, 5.0)


@dataclass(frozen=True)
class SignedWebhook:
    body: bytes
    headers: dict[str, str]


def secret_bytes(secret: str) -> bytes:
    """The key of a ``whsec_<base64>`` secret (a bare base64 key works too)."""
    raw = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        raise ValueError("a webhook secret is 'whsec_' and base64") from None


def signature(secret: str, webhook_id: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret_bytes(secret), f"{webhook_id}.{timestamp}.".encode() + body,
                   hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def incoming_call(call_id: str, sip_headers: list[tuple[str, str]], now: float) -> dict[str, Any]:
    """The event, as OpenAI sends it for a SIP call."""
    return {"object": "event", "id": f"evt_{secrets.token_hex(12)}",
            "type": "realtime.call.incoming", "created_at": int(now),
            "data": {"call_id": call_id,
                     "sip_headers": [{"name": n, "value": v} for n, v in sip_headers]}}


def signed(secret: str | None, event: dict[str, Any], now: float) -> SignedWebhook:
    """``event`` as a webhook delivery; unsigned (no signature header) without a secret."""
    body = json.dumps(event, separators=(",", ":")).encode()
    webhook_id, timestamp = f"wh_{secrets.token_hex(12)}", int(now)
    headers = {"content-type": "application/json", "webhook-id": webhook_id,
               "webhook-timestamp": str(timestamp),
               "user-agent": "vllm-duplex (+docs/telephony.md)"}
    if secret:
        headers["webhook-signature"] = signature(secret, webhook_id, timestamp, body)
    return SignedWebhook(body, headers)


class WebhookSender:
    def __init__(self, url: str, secret: str | None, *, timeout_s: float = 5.0) -> None:
        import httpx  # the telephony extra

        self.url, self.secret = url, secret
        self._http = httpx.AsyncClient(timeout=timeout_s)

    async def send(self, event: dict[str, Any]) -> bool:
        """Deliver ``event`` (each try signed anew: its own timestamp);
        True when the receiver took it (2xx)."""
        for delay in (0.0, *_RETRY_DELAYS_S):
            if delay:
                await asyncio.sleep(delay)
            hook = signed(self.secret, event, time.time())
            try:
                reply = await self._http.post(self.url, content=hook.body, headers=hook.headers)
            except Exception as exc:  # unreachable, timed out: try again
                log.warning("webhook %s: %s", self.url, exc)
                continue
            if 200 <= reply.status_code < 300:
                return True
            log.warning("webhook %s answered %d", self.url, reply.status_code)
        return False

    async def close(self) -> None:
        await self._http.aclose()
