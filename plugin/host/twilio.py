"""``twilio:`` in a deployment config -- phone calls through Twilio Media
Streams (``vllm_duplex.realtime.server.telephony``, docs/telephony.md).
No ``twilio:`` section: no Twilio routes at all.

```yaml
twilio:
  auth_token: ...        # the account's auth token: X-Twilio-Signature is checked
                         # on the webhook (env TWILIO_AUTH_TOKEN overrides it)
  public_url: https://voice.example.com   # how Twilio reaches this server: the
                         # URL it signs and the base of the stream's wss:// URL
                         # (default: the webhook request's own URL)
  api_key: sk-...        # the key the calls' sessions belong to (a sideband socket
                         # attaches with it; default: the first of api_keys)
  profiles:              # session configs by name: ?profile=NAME on the webhook
    default: {instructions: "You answer the phone for ..."}   # used when none is named
```
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Twilio:
    auth_token: str | None = None
    public_url: str | None = None
    api_key: str | None = None
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_raw(cls, raw: Any) -> Twilio | None:
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ValueError("twilio must be a mapping (twilio: {} turns it on)")
        bad = set(raw) - {f.name for f in fields(cls)}
        if bad:
            raise ValueError(f"unknown twilio keys: {sorted(bad)}")
        profiles = raw.get("profiles") or {}
        if not isinstance(profiles, dict) or not all(
                isinstance(k, str) and k and isinstance(v, dict) for k, v in profiles.items()):
            raise ValueError("twilio.profiles maps names to session objects")
        public_url = raw.get("public_url")
        if public_url is not None and not str(public_url).startswith(("https://", "http://")):
            raise ValueError("twilio.public_url is the http(s):// base URL Twilio reaches")
        token = os.environ.get("TWILIO_AUTH_TOKEN") or raw.get("auth_token")
        return cls(auth_token=str(token) if token else None,
                   public_url=str(public_url).rstrip("/") if public_url else None,
                   api_key=raw.get("api_key"),
                   profiles={k: dict(v) for k, v in profiles.items()})
