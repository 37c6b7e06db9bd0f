"""Taking a stored copy over from an owner that is gone.

The lease of another holder is waited on for up to one lease period (a
request may come a few milliseconds after a crash, before the supervisor
has marked the dead process in the store); a lease still held then is a live
owner's, answered ``wrong_instance`` with that worker's id
(``details.owner_instance_id``): the caller goes there. Otherwise the lease
is taken (generation + 1: the old owner is fenced from then on) and the copy
read again, now that nobody else can write it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.durable.store import LeaseHeld, StoreUnavailable, Stored
from vllm_duplex.durable.writer import Durability

POLL_S = 0.05


class OneAtATime:
    """Takeovers of one id run one at a time in this process: each caller, in
    turn, finds what the one before it left (taken over and held here, or
    not: then it tries for itself -- another key's refusal is not its own)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # id -> (lock, callers)

    @contextlib.asynccontextmanager
    async def turn(self, entry_id: str) -> AsyncIterator[None]:
        lock, callers = self._locks.get(entry_id, (asyncio.Lock(), 0))
        self._locks[entry_id] = (lock, callers + 1)
        try:
            async with lock:
                yield
        finally:
            lock, callers = self._locks[entry_id]
            if callers == 1:
                del self._locks[entry_id]
            else:
                self._locks[entry_id] = (lock, callers - 1)


@contextlib.contextmanager
def store_reachable(kind: str, entry_id: str) -> Iterator[None]:
    """A store that cannot be reached while a request looks for a copy it
    does not hold here: the typed, retryable answer (the copies this worker
    holds go on meanwhile)."""
    try:
        yield
    except StoreUnavailable as err:
        raise DuplexError("store_unavailable", f"the session store cannot be reached ({err}): "
                          f"{kind} {entry_id!r} is not held here and cannot be looked up now; "
                          "retry", param=f"{kind}_id") from None


def moved(kind: str, entry_id: str, owner: str) -> DuplexError:
    return DuplexError("wrong_instance", f"{kind} {entry_id!r} is held by worker {owner!r} "
                       "now: ask there", param=f"{kind}_id", details={"owner_instance_id": owner})


async def take_over(durability: Durability, key: str, stored: Stored, *, kind: str,
                    entry_id: str, patient: bool = True) -> tuple[Stored, int]:
    """``stored`` (what ``load(key)`` found) taken over: the copy as it is
    once the lease is ours, and the generation we hold it under. Not
    ``patient``: a live lease is answered at once (it moved from here to a
    worker that lives)."""
    store, clock = durability.store, durability.clock
    deadline = clock.now() + durability.lease_ttl_s + 0.5
    while stored.holder is not None and stored.holder != durability.holder:
        if not patient or clock.now() > deadline:  # renewed all along: a live owner
            raise moved(kind, entry_id, stored.holder.split("#", 1)[0])
        await clock.sleep(POLL_S)
        stored = await store.load(key) or stored
    try:
        generation = await store.acquire(key, durability.holder, durability.lease_ttl_s)
    except LeaseHeld as held:
        raise moved(kind, entry_id, held.owner) from None
    return await store.load(key) or stored, generation
