"""``sip:`` in a deployment config -- the SIP user agent of the server
(``vllm_duplex.realtime.server.telephony``, docs/telephony.md).

```yaml
sip:
  host: 0.0.0.0            # where SIP listens (UDP and TCP, the same port)
  port: 5060               # 0: a free port (tests); no `sip:` section: no SIP at all
  media_address: 203.0.113.7   # the address our SDP gives for RTP (default: host,
                               # or 127.0.0.1 when host is 0.0.0.0)
  webhook_url: https://example.com/hooks/calls   # realtime.call.incoming goes there
  webhook_secret: whsec_...  # env VLLM_DUPLEX_SIP_WEBHOOK_SECRET overrides it
  accept: {instructions: ...}  # instead of a webhook: every call accepted at once
                               # with this session (the body of POST .../accept)
  api_key: sk-...           # the key an accepted-at-once call's session belongs to
                            # (default: the first of api_keys)
  ring_timeout_s: 30        # a call nobody accepts or rejects gets 480
  tls_port: 5061            # also SIP over TLS (signalling only: no SRTP), with
  tls_certfile: /etc/ssl/sip.pem   # this certificate chain
  tls_keyfile: /etc/ssl/sip.key    # and its key
```
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, fields
from typing import Any

_TRANSPORTS = ("udp", "tcp")


@dataclass(frozen=True)
class Sip:
    host: str = "127.0.0.1"
    port: int = 5060
    transports: tuple[str, ...] = _TRANSPORTS
    media_address: str | None = None
    webhook_url: str | None = None
    webhook_secret: str | None = None
    accept: dict[str, Any] | None = None
    api_key: str | None = None
    ring_timeout_s: float = 30.0
    max_ringing: int = 64  # calls waiting for accept/reject; more get 486 Busy Here
    tls_port: int | None = None  # None: no TLS; 0: a free port (tests)
    tls_certfile: str | None = None
    tls_keyfile: str | None = None

    def tls_context(self) -> ssl.SSLContext | None:
        """The server context for SIP over TLS, or None without ``tls_port``."""
        if self.tls_port is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls_certfile or "", self.tls_keyfile)
        return context

    @property
    def advertised_address(self) -> str:
        if self.media_address:
            return self.media_address
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    @classmethod
    def from_raw(cls, raw: Any) -> Sip | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ValueError("sip must be a mapping")
        bad = set(raw) - {f.name for f in fields(cls)}
        if bad:
            raise ValueError(f"unknown sip keys: {sorted(bad)}")
        transports = tuple(raw.get("transports", _TRANSPORTS))
        if not transports or set(transports) - set(_TRANSPORTS):
            raise ValueError(f"sip.transports are some of {list(_TRANSPORTS)}")
        accept = raw.get("accept")
        if accept is not None and not isinstance(accept, dict):
            raise ValueError("sip.accept is a session object (the body of POST .../accept)")
        if accept is None and not raw.get("webhook_url"):
            raise ValueError("sip needs webhook_url (calls are offered to it) or accept "
                             "(calls are accepted at once)")
        secret = os.environ.get("VLLM_DUPLEX_SIP_WEBHOOK_SECRET") or raw.get("webhook_secret")
        if secret is not None and not str(secret).startswith("whsec_"):
            raise ValueError("sip.webhook_secret is a Standard Webhooks secret: 'whsec_' + base64")
        tls_port = raw.get("tls_port")
        if tls_port is not None and not raw.get("tls_certfile"):
            raise ValueError("sip.tls_port needs tls_certfile (and tls_keyfile, unless the "
                             "certificate file holds the key)")
        return cls(host=str(raw.get("host", cls.host)), port=int(raw.get("port", cls.port)),
                   transports=transports, media_address=raw.get("media_address"),
                   webhook_url=raw.get("webhook_url"), webhook_secret=secret,
                   accept=dict(accept) if accept is not None else None,
                   api_key=raw.get("api_key"),
                   ring_timeout_s=float(raw.get("ring_timeout_s", cls.ring_timeout_s)),
                   max_ringing=int(raw.get("max_ringing", cls.max_ringing)),
                   tls_port=int(tls_port) if tls_port is not None else None,
                   tls_certfile=raw.get("tls_certfile"), tls_keyfile=raw.get("tls_keyfile"))
