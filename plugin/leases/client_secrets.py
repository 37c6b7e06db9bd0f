"""Ephemeral client keys (``POST /v1/realtime/client_secrets``).

A backend that holds an API key mints a short-lived key (``ek_…``) for a
browser or phone, which then opens its realtime session (a WebSocket or a
WebRTC call) with it instead of the API key. A key:

- expires ``ttl_s`` after it was minted (10 s to 2 h, 10 min by default) for
  opening a session; the session it opened goes on after that;
- names its owner (``ek_….w2``, ``domain/owner_ids.py``), like a session id;
- opens **one** session (a second open is ``client_secret_used``: a key copied
  out of a page cannot open more sessions); the id of that session is
  reserved when the key is minted, so the mint's answer names it;
- may carry a session config (``SessionPatch``): the session opens with it,
  and its ``type`` and ``model`` cannot be asked otherwise
  (``client_secret_mismatch``);
- acts as the API key that minted it: what it opens belongs to that key
  (its sideband socket, its resume, ``/v1/sessions`` see it as that key's).
  Before it expires it also authenticates a resume of the session it opened.

Sans-I/O and single-threaded (the server's event loop); the clock is the
runtime's, so tests move time with the virtual clock. Keys are compared in
constant time by looking up their HMAC, never the key itself.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.owner_ids import mint
from vllm_duplex.domain.session_config import SessionPatch

PREFIX = "ek_"
DEFAULT_TTL_S = 600
MIN_TTL_S, MAX_TTL_S = 10, 7200


def is_client_secret(key: str | None) -> bool:
    return key is not None and key.startswith(PREFIX)


@dataclass
class ClientSecret:
    owner_key: str | None  # the API key that minted it (None: a server without keys)
    session_id: str  # the session it opens (reserved at mint)
    patch: SessionPatch | None  # the session config fixed into it
    expires_at: float  # on the runtime's clock
    expires_at_unix: int  # what the client is told
    used: bool = field(default=False)


class ClientSecrets:
    """The live keys of one server process, bounded (oldest forgotten first)."""

    def __init__(self, clock: Clock, instance_id: str, *, max_keys: int = 10_000) -> None:
        self.clock = clock
        self.instance_id = instance_id  # keys name their owner, as session ids do
        self.max_keys = max_keys
        self._secret = secrets.token_bytes(32)
        self._keys: OrderedDict[str, ClientSecret] = OrderedDict()  # by HMAC of the value

    def __len__(self) -> int:
        return len(self._keys)

    def _id(self, value: str) -> str:
        return hmac.new(self._secret, value.encode("utf-8", "surrogateescape"),
                        hashlib.sha256).hexdigest()

    def mint(self, owner_key: str | None, session_id: str, patch: SessionPatch | None,
             ttl_s: float, now_unix: float) -> tuple[str, ClientSecret]:
        """A new key, with ``session_id`` reserved for what it opens."""
        if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
            raise DuplexError("invalid_value", f"expires_after.seconds must be {MIN_TTL_S}–"
                              f"{MAX_TTL_S}", param="expires_after.seconds")
        self._forget_expired()
        while len(self._keys) >= self.max_keys:
            self._keys.popitem(last=False)
        value = mint("ek", self.instance_id)
        now = self.clock.now()
        secret = ClientSecret(owner_key, session_id, patch, now + ttl_s, int(now_unix + ttl_s))
        self._keys[self._id(value)] = secret
        return value, secret

    def _find(self, value: str) -> ClientSecret:
        secret = self._keys.get(self._id(value))
        if secret is None:
            raise DuplexError("unauthorized", "unknown client secret (mint one with "
                              "POST /v1/realtime/client_secrets)")
        if self.clock.now() >= secret.expires_at:
            raise DuplexError("client_secret_expired", "the client secret has expired; "
                              "mint a new one")
        return secret

    def redeem(self, value: str) -> ClientSecret:
        """Open the key's session: once, before it expires."""
        secret = self._find(value)
        if secret.used:
            raise DuplexError("client_secret_used", "this client secret already opened its "
                              "session; mint a new one for another")
        secret.used = True
        return secret

    def owner(self, value: str) -> str | None:
        """The API key an unexpired key acts as (a resume, a sideband socket)."""
        return self._find(value).owner_key

    def _forget_expired(self) -> None:
        now = self.clock.now()
        for key in [k for k, s in self._keys.items() if now >= s.expires_at]:
            del self._keys[key]
