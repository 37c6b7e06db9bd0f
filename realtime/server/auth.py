"""API keys: where a request carries one, and whether it may pass."""

from __future__ import annotations

import hmac

from vllm_duplex.core.errors import DuplexError
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.leases.client_secrets import is_client_secret


def bearer_key(headers, subprotocols: list[str] = ()) -> str | None:
    """The API key from ``Authorization: Bearer``, or from the browser-style
    ``openai-insecure-api-key.<key>`` subprotocol."""
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip() or None
    for proto in subprotocols:
        if proto.startswith("openai-insecure-api-key."):
            return proto.split(".", 1)[1] or None
    return None


def check_key(runtime: Runtime, key: str | None) -> None:
    """With keys configured, a request must present one of them (compared in
    constant time). Without, every caller is local and keys only scope. A
    client secret (``ek_…``) passes while it is live (it acts as the key that
    minted it; opening a session redeems it, see ``Runtime``)."""
    if is_client_secret(key):
        runtime.client_secrets.owner(key)  # unknown: unauthorized; lapsed: client_secret_expired
        return
    allowed = runtime.config.api_keys
    if not allowed:
        return
    given = key.encode("utf-8", "surrogateescape") if key is not None else None
    if given is None or not any(hmac.compare_digest(given, k.encode()) for k in allowed):
        raise DuplexError("unauthorized", "missing or invalid API key (Authorization: Bearer ...)")
