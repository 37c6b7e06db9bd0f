"""Which worker processes a deployment runs (``workers:`` in a deploy config).

``workers: 4`` (or ``serve --workers 4``) runs four workers with owner ids
``w1``..``w4``; on one of several machines, ``machine: m2`` makes them
``m2w1``..``m2w4`` (an edge router sends ``m2…`` to this machine, this
machine's router sends ``m2w3`` to its third worker); ``ids:`` names them
outright. Every id is routable (``vllm_duplex.domain.owner_ids``)::

    workers:
      count: 2
      machine: m2              # optional: owner ids m2w1, m2w2
      spare_engine_slots: 4    # restarts a shared vLLM core can take (vllm_duplex.fleet.engine_core)
      restart_backoff_s: 1.0   # first wait before a dead worker is restarted (doubles)
      ports: [8101, 8102]      # optional: the workers' loopback ports (default: free ones)

``count: 1`` is a single server process, as without ``workers:`` (its
instance id is still ``w1`` / ``m2w1`` when given, so an edge can route to it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from vllm_duplex.domain.owner_ids import check_routable

# Letters then digits: an owner id "<machine>w<n>" then splits one way only.
_MACHINE = re.compile(r"[A-Za-z]{1,8}[0-9]{1,6}")


@dataclass(frozen=True)
class Workers:
    count: int = 1
    machine: str | None = None
    ids: tuple[str, ...] = ()
    spare_engine_slots: int | None = None  # default: 2 per worker
    restart_backoff_s: float = 1.0
    ports: tuple[int, ...] = ()
    configured: bool = False  # a `workers:` key was given (instance ids are then routable)

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError("workers.count must be >= 1")
        if self.machine is not None and not _MACHINE.fullmatch(self.machine):
            raise ValueError("workers.machine must be letters then digits, e.g. m2")
        if self.ids:
            if len(self.ids) != self.count or len(set(self.ids)) != self.count:
                raise ValueError("workers.ids must name each worker once")
            for owner in self.ids:
                check_routable(owner)
        if self.ports and (len(self.ports) != self.count or len(set(self.ports)) != self.count):
            raise ValueError("workers.ports must give each worker its own port")
        if self.spare_engine_slots is not None and self.spare_engine_slots < 0:
            raise ValueError("workers.spare_engine_slots must be >= 0")
        if self.restart_backoff_s < 0:
            raise ValueError("workers.restart_backoff_s must be >= 0")

    @classmethod
    def from_raw(cls, raw: int | Mapping[str, Any] | None) -> Workers:
        if raw is None:
            return cls()
        if isinstance(raw, bool) or not isinstance(raw, (int, Mapping)):
            raise ValueError("workers must be a count or a mapping")
        if isinstance(raw, int):
            return cls(count=raw, configured=True)
        unknown = set(raw) - ({f.name for f in fields(cls)} - {"configured"})
        if unknown:
            raise ValueError(f"unknown workers keys: {sorted(unknown)}")
        return cls(count=int(raw.get("count", 1)), machine=raw.get("machine"),
                   ids=tuple(raw.get("ids") or ()), spare_engine_slots=raw.get("spare_engine_slots"),
                   restart_backoff_s=float(raw.get("restart_backoff_s", 1.0)),
                   ports=tuple(int(p) for p in raw.get("ports") or ()), configured=True)

    def with_count(self, count: int) -> Workers:
        """``serve --workers N`` over the config's own ``workers:``."""
        return Workers(count=count, machine=self.machine,
                       ids=self.ids if len(self.ids) == count else (),
                       spare_engine_slots=self.spare_engine_slots,
                       restart_backoff_s=self.restart_backoff_s,
                       ports=self.ports if len(self.ports) == count else (), configured=True)

    def instance_ids(self) -> tuple[str, ...]:
        if self.ids:
            return self.ids
        prefix = self.machine or ""
        return tuple(check_routable(f"{prefix}w{i}") for i in range(1, self.count + 1))

    @property
    def spare_slots(self) -> int:
        return 2 * self.count if self.spare_engine_slots is None else self.spare_engine_slots
