"""Where a deployment keeps its sessions (``durability:`` in a deploy config).

::

    durability:
      store: redis               # memory (the default: one process) or redis
      url: redis://10.0.0.5:6379/0   # an external Redis; without it, `serve --workers N`
                                 # starts and supervises a private redis-server
      lease_ttl_s: 5.0           # a dead owner's sessions are adoptable this long after
                                 # its last renewal (at once when its supervisor saw it die)

With ``memory`` a session lives and dies with its process (today's
behaviour); with ``redis`` it outlives it (``vllm_duplex.durable``). The
supervisor hands its private Redis to the workers in ``VLLM_DUPLEX_STORE_URL``,
which also overrides ``url`` for a worker started by hand.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

STORE_URL_ENV = "VLLM_DUPLEX_STORE_URL"


@dataclass(frozen=True)
class StoreConfig:
    store: str = "memory"
    url: str | None = None
    lease_ttl_s: float = 5.0

    def __post_init__(self) -> None:
        if self.store not in ("memory", "redis"):
            raise ValueError("durability.store must be memory or redis")
        if self.url is not None and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("durability.url must be a redis://, rediss:// or unix:// URL")
        if self.store == "memory" and self.url is not None:
            raise ValueError("durability.url needs durability.store: redis")
        if not 0.5 <= self.lease_ttl_s <= 300:
            raise ValueError("durability.lease_ttl_s must be within [0.5, 300]")

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any] | None) -> StoreConfig:
        if raw is None:
            return cls()
        if not isinstance(raw, Mapping):
            raise ValueError("durability must be a mapping")
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown durability keys: {sorted(unknown)}")
        return cls(store=str(raw.get("store", "memory")), url=raw.get("url"),
                   lease_ttl_s=float(raw.get("lease_ttl_s", 5.0)))

    @property
    def durable(self) -> bool:
        return self.store == "redis"

    def resolved_url(self) -> str | None:
        """The URL a worker connects to (the supervisor's private Redis first)."""
        return os.environ.get(STORE_URL_ENV) or self.url
