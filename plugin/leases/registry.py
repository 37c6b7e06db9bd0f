"""``Registry``: what every id-keyed registry of one instance shares — the
sessions of ``SessionManager`` and the resumable streams of ``StreamStore``.

* **Ids**: a caller's id is 1-128 characters of ``[A-Za-z0-9._:-]`` and unused,
  live or tombstoned, by any owner (``invalid_value``, ``duplicate_id``).
* **Ownership**: an entry belongs to the HMAC of an API key (``None``: no key).
  Any other key, "no key" versus a key included, sees exactly what an unknown
  id gets (no existence leak), compared in constant time.
* **Tombstones**: a bounded LRU of ended ids with their owner and final word,
  so a client asking about one is told "expired" apart from "unknown" (and the
  id cannot be reused while the tombstone remains); asking refreshes it.
* **The reaper**: one task that runs ``_reap`` every ``reap_interval_s`` on the
  registry's clock, timed from ``start()`` (deterministic under a virtual
  clock); a failing pass is logged and the next one runs.

The wire errors are named after the registry's ``kind``: ``{kind}_not_found``,
``{kind}_expired``, ``duplicate_id`` with ``param="{kind}_id"``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
from collections import OrderedDict
from typing import Generic, TypeVar

from vllm_duplex.domain.clock import Clock, MonotonicClock
from vllm_duplex.domain.errors import DuplexError

log = logging.getLogger(__name__)

ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

L = TypeVar("L")  # a live entry
T = TypeVar("T")  # what a tombstone keeps besides the owner


def owned(owner: str | None, key_id: str | None) -> bool:
    """Does ``key_id`` own what ``owner`` owns? (None only matches None.)"""
    if owner is None or key_id is None:
        return owner is None and key_id is None
    # bytes, because compare_digest rejects non-ASCII str (key ids may come from callers)
    return hmac.compare_digest(owner.encode(), key_id.encode())


class Registry(Generic[L, T]):
    kind = "entry"  # "session", "stream": names the ids and the wire errors
    reaper_name = "duplex-reaper"

    def __init__(self, *, reap_interval_s: float, tombstones: int, clock: Clock | None) -> None:
        self.reap_interval_s = reap_interval_s
        self.clock: Clock = clock or MonotonicClock()
        self._max_tombstones = tombstones
        self._live: dict[str, L] = {}
        self._tombs: OrderedDict[str, tuple[str | None, T]] = OrderedDict()  # id: (owner, final)
        self._reaper: asyncio.Task[None] | None = None
        self._stopped = False

    # -- ids and errors ------------------------------------------------------------------

    def _taken(self, entry_id: str) -> bool:
        return entry_id in self._live or entry_id in self._tombs

    def _check_new_id(self, entry_id: object) -> None:
        param = f"{self.kind}_id"
        if not isinstance(entry_id, str) or not ID.fullmatch(entry_id):
            raise DuplexError("invalid_value", f"{param} must be 1-128 chars of [A-Za-z0-9._:-]",
                              param=param)
        if self._taken(entry_id):
            raise DuplexError("duplicate_id", f"{param} {entry_id!r} is a duplicate", param=param)

    def _unknown(self, entry_id: str) -> DuplexError:
        return DuplexError(f"{self.kind}_not_found", f"{self.kind} {entry_id!r} not found",
                           param=f"{self.kind}_id")

    def _expired(self, entry_id: str) -> DuplexError:
        return DuplexError(f"{self.kind}_expired", f"{self.kind} {entry_id!r} expired",
                           param=f"{self.kind}_id")

    # -- tombstones ----------------------------------------------------------------------

    def _entomb(self, entry_id: str, owner: str | None, final: T) -> None:
        if self._max_tombstones:
            self._tombs[entry_id] = (owner, final)
            while len(self._tombs) > self._max_tombstones:
                self._tombs.popitem(last=False)

    def _tomb(self, entry_id: str, key_id: str | None) -> T | None:
        """The tombstone ``key_id`` owns (refreshed in the LRU); None for unknown
        and foreign ids alike."""
        tomb = self._tombs.get(entry_id)
        if tomb is None or not owned(tomb[0], key_id):
            return None
        self._tombs.move_to_end(entry_id)  # recently asked-about tombstones stay
        return tomb[1]

    def _tomb_of(self, entry_id: str) -> T | None:
        """The tombstone whoever owns it (trusted callers only)."""
        tomb = self._tombs.get(entry_id)
        return None if tomb is None else tomb[1]

    # -- the reaper ----------------------------------------------------------------------

    async def _reap(self) -> None:
        """One pass: end what is due."""
        raise NotImplementedError

    async def _reap_forever(self) -> None:
        while True:
            await self.clock.sleep(self.reap_interval_s)
            try:
                await self._reap()
            except Exception:
                log.exception("%s reaper pass failed", self.kind)

    async def start(self) -> None:
        self._stopped = False
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.create_task(self._reap_forever(), name=self.reaper_name)
            # Let it reach its first clock.sleep, so reaping is timed from start().
            await asyncio.sleep(0)

    async def _stop_reaper(self) -> None:
        """Refuse new entries and stop the reaper (the subclass then ends its entries)."""
        self._stopped = True
        reaper, self._reaper = self._reaper, None
        if reaper is not None:
            reaper.cancel()
            # wait() (not await) so our own cancellation still propagates.
            await asyncio.wait([reaper])

    def __len__(self) -> int:
        return len(self._live)
