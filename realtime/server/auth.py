"""API keys: where a request carries one. Whether it may pass is
``RealtimeSessions.check_key`` (``host/sessions.py``: ``check_api_key``)."""

from __future__ import annotations


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
