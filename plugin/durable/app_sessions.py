"""Application sessions in the store: mirrored while they live here, taken
over by another worker when their owner is gone.

An application session has no journal: its state is its history and its
lease. The state is saved when it changes (open, a finished turn, a renew)
and a turn's ``finish`` goes out only once the store holds the history it
made (``Durability.flushed``), so whatever a client was told, a worker
taking the session over knows. A turn running when its worker died is lost
with its HTTP response (the client saw no ``finish``); the history is as it
was before it, as for a cancelled turn, and the client asks again.

Taken over (``find``), a session is a new incarnation on the new worker:
its live vLLM request is gone, so its next turn prefills the history again.
"""

from __future__ import annotations

import contextlib
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.durable.records import APP_PREFIX, AppSessionRecord
from vllm_duplex.durable.store import Drop, LeaseHeld, StoreUnavailable, sha
from vllm_duplex.durable.takeover import OneAtATime, store_reachable, take_over
from vllm_duplex.durable.writer import Durability
from vllm_duplex.leases.manager import Lease
from vllm_duplex.text.app_sessions import AppSession, AppSessions
from vllm_duplex.text.requests import parse_messages


@dataclass(eq=False)
class AppSessionCopy:
    """``Mirrored`` for an application session: ``record`` reads it now,
    ``drop`` ends it here without writing (another worker took it)."""

    app_session_id: str
    record: Callable[[], AppSessionRecord]
    drop: Callable[[], Awaitable[None]]
    kind = "app"

    @property
    def session_id(self) -> str:
        return APP_PREFIX + self.app_session_id

    def durable_state(self) -> AppSessionRecord:
        return self.record()

    def durable_journal(self) -> tuple[()]:
        return ()

    async def drop_moved(self) -> None:
        await self.drop()


def record_of(*, model: str, messages: list[Any], api_key: str | None, ttl_s: float,
              expires_in_s: float, lease_generation: int, turns: int, created_at: float,
              incarnation: int) -> AppSessionRecord:
    return AppSessionRecord(model, tuple(m.wire() for m in messages), sha(api_key), ttl_s,
                            time.time() + expires_in_s, lease_generation, turns, created_at,
                            incarnation)


async def find(durability: Durability, session_id: str, api_key: str | None, *,
               patient: bool = True) -> tuple[AppSessionRecord, int] | None:
    """The application session ``session_id`` taken over from the store, and
    the generation it is held under; None when the store has no such session
    (the caller answers as for an unknown id). Another key's session is
    ``session_not_found``, one whose lease lapsed ``session_expired``, one
    whose owner lives ``wrong_instance`` (at once when not ``patient``)."""
    store = durability.store
    if not store.durable:
        return None
    key = APP_PREFIX + session_id
    stored = await store.load(key)
    if stored is None or not isinstance(stored.state, AppSessionRecord):
        return None
    record = stored.state
    if record.key_sha is not None and (
            api_key is None or not hmac.compare_digest(record.key_sha, sha(api_key) or "")):
        raise DuplexError("session_not_found", f"session {session_id!r} not found",
                          param="session_id")
    if record.expires_at <= time.time():
        raise DuplexError("session_expired", f"session {session_id!r} expired", param="session_id")
    stored, generation = await take_over(durability, key, stored, kind="session",
                                         entry_id=session_id, patient=patient)
    if not isinstance(stored.state, AppSessionRecord):
        return None
    return stored.state, generation


class AppSessionKeeper:
    """The ``SessionKeeper`` of one instance's application sessions, in a
    durable store (``AppSessions.keeper``)."""

    def __init__(self, sessions: AppSessions, durability: Durability) -> None:
        self.sessions = sessions
        self.durability = durability
        self._takeovers = OneAtATime()
        self.adopted = 0  # sessions taken over from a worker that was gone
        self.moved = 0  # sessions another worker took over from this one

    async def claim(self, session_id: str) -> None:
        d = self.durability
        try:
            with store_reachable("session", session_id):
                await d.store.acquire(APP_PREFIX + session_id, d.holder, d.lease_ttl_s, new=True)
        except LeaseHeld:  # another worker holds the id: a duplicate as much as a stored one
            raise DuplexError("duplicate_id", f"session_id {session_id!r} is a duplicate",
                              param="session_id") from None

    async def unclaim(self, session_id: str) -> None:
        with contextlib.suppress(StoreUnavailable):  # then it lapses with its lease
            await self.durability.store.apply([Drop(APP_PREFIX + session_id, 1, forget=True)])

    async def keep(self, session: AppSession, api_key: str | None) -> None:
        self._mirror(session, api_key, 1)
        await session.saved()  # type: ignore[misc]

    async def reach(self, session_id: str, api_key: str | None, owner: str | None) -> None:
        manager = self.sessions.manager
        tomb = manager.tombstone(session_id)
        if tomb is not None and tomb.close_reason != "moved":
            return  # closed or expired here: its tombstone answers
        async with self._takeovers.turn(session_id):
            if manager.held(session_id) is not None:
                return  # the caller before took it over
            # A session that moved away from here is answered at once where it went.
            with store_reachable("session", session_id):
                found = await find(self.durability, session_id, api_key, patient=tomb is None)
            if found is not None:
                await self._restore(session_id, api_key, *found)

    async def _restore(self, session_id: str, api_key: str | None, record: AppSessionRecord,
                       generation: int) -> None:
        manager = self.sessions.manager
        now, wall = manager.clock.now(), time.time()
        session = AppSession(session_id, self.sessions.stage, model=record.model,
                             messages=parse_messages(list(record.messages), allow_empty=True),
                             incarnation=record.incarnation + 1)
        session.turns = record.turns
        lease = Lease(record.ttl_s, now + (record.expires_at - wall), record.lease_generation)
        manager.restore(session, api_key=api_key, lease=lease,
                        created_at=now - (wall - record.created_at))
        self._mirror(session, api_key, generation)
        try:
            await session.open()  # its live request: prefilled again at its next turn
        except BaseException:
            # Not served here after all: left in the store for another worker.
            session.ended = None
            self.durability.ended(APP_PREFIX + session_id, release=True)
            await self.sessions.manager.release(session_id, "open_failed")
            raise
        self.adopted += 1
        self.durability.adopted += 1  # /health counts every kind taken over

    def _mirror(self, session: AppSession, api_key: str | None, generation: int) -> None:
        d = self.durability
        key = APP_PREFIX + session.session_id
        d.follow(AppSessionCopy(session.session_id, lambda: self._record(session, api_key),
                                lambda: self._moved(session)), generation)

        async def saved() -> None:
            d.changed(key)
            await d.flushed(key)

        def ended(reason: str) -> None:
            # A process stopping leaves it for another worker at once; an
            # expired one stays as it was (expired wherever it is asked for,
            # until the store forgets it); a closed one is gone.
            if reason != "moved":
                d.ended(key, release=reason in ("shutdown", "expired"))

        session.saved, session.ended = saved, ended

    def _record(self, session: AppSession, api_key: str | None) -> AppSessionRecord:
        manager = self.sessions.manager
        clock, sid = manager.clock, session.session_id
        info = manager.held(sid)
        lease = info.lease if info is not None else Lease(0.0, clock.now(), 1)
        created = info.created_at if info is not None else clock.now()
        running = manager.pinned(sid)  # a turn runs: its lease starts again when it ends
        return record_of(
            model=session.model, messages=session.messages, api_key=api_key, ttl_s=lease.ttl_s,
            expires_in_s=lease.ttl_s if running else lease.expires_at - clock.now(),
            lease_generation=lease.generation, turns=session.turns,
            created_at=time.time() - (clock.now() - created), incarnation=session.fence.incarnation)

    async def _moved(self, session: AppSession) -> None:
        """Another worker took the session over: end it here, writing nothing."""
        self.moved += 1
        await session.close("moved")
        await self.sessions.manager.release(session.session_id, "moved")
        self.sessions.forget(session.session_id)
