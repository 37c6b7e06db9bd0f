"""SessionManager: admission, leases, API-key scoping, expiry and tombstones.

Lifecycle::

    admit ─▶ ACTIVE ─unpin─▶ DETACHED ─pin─▶ ACTIVE ...
               │                 │
               ├── close/release/stop ─▶ CLOSING ─▶ CLOSED   (tombstone)
               └── lease lapsed, not pinned ─▶ CLOSING ─▶ EXPIRED (tombstone)

A pinned session (an open socket is attached) never expires; ``unpin`` restarts its
lease at "now + ttl". The lease is authoritative: once it has lapsed the session is
treated as expired by every accessor even before the reaper has closed it, so a late
``renew`` cannot resurrect it.

API keys are stored only as an HMAC (``api_key_id``). Any key other than the owner's —
including "no key" versus a key — sees ``session_not_found`` exactly as for an unknown
id, for live sessions and tombstones alike (no existence leak).

Tombstones keep only a frozen ``SessionInfo`` (no session reference), bounded LRU, so
closed sessions are garbage once their owner drops them. Ids, ownership, tombstones and
the reaper are the ``Registry``'s (``vllm_duplex.leases.registry``), shared with the
resumable streams.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import secrets
from collections import Counter
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable, Generic, Protocol, TypeVar

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError, Expired
from vllm_duplex.leases.registry import Registry, owned

log = logging.getLogger(__name__)


class ManagedSession(Protocol):
    session_id: str

    async def close(self, reason: str) -> None: ...


S = TypeVar("S", bound=ManagedSession)


class SessionState(str, Enum):
    ACTIVE = "active"
    DETACHED = "detached"
    CLOSING = "closing"
    CLOSED = "closed"
    EXPIRED = "expired"


@dataclass(frozen=True)
class Lease:
    ttl_s: float
    expires_at: float  # on the manager's clock
    generation: int


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    state: SessionState
    lease: Lease
    api_key_id: str | None  # HMAC of the key, never the key; None = no key
    owner_instance_id: str
    created_at: float
    close_reason: str | None = None


@dataclass
class _Entry(Generic[S]):
    session: S
    info: SessionInfo  # state/lease are replaced in place; the frozen copy is handed out
    pins: int = 0
    closing: asyncio.Task[SessionInfo] | None = None  # the close in flight; concurrent closers await it


class SessionManager(Registry["_Entry[S]", SessionInfo], Generic[S]):
    """Admits and tracks sessions of one instance.

    ``session_id`` supplied by a caller must be 1–128 characters of ``[A-Za-z0-9._:-]``
    and unused (live or tombstoned); minted ids are ``"sess_"`` + 24 url-safe chars.
    ``ttl_s``: ``None`` or ``0`` means the server default; values above ``max_ttl_s``
    are clamped; negative or NaN is ``invalid_value``.
    """

    kind = "session"
    reaper_name = "duplex-reaper"

    def __init__(
        self,
        *,
        max_sessions: int = 256,
        default_ttl_s: float = 60.0,
        max_ttl_s: float = 3600.0,
        max_sessions_per_key: int | None = None,
        clock: Clock | None = None,
        instance_id: str | None = None,
        reap_interval_s: float = 1.0,
        tombstones: int = 10_000,
    ) -> None:
        if not 0 < default_ttl_s <= max_ttl_s:
            raise ValueError("need 0 < default_ttl_s <= max_ttl_s")
        if max_sessions < 1 or reap_interval_s <= 0 or tombstones < 0:
            raise ValueError("max_sessions >= 1, reap_interval_s > 0, tombstones >= 0")
        super().__init__(reap_interval_s=reap_interval_s, tombstones=tombstones, clock=clock)
        self.max_sessions = max_sessions
        self.default_ttl_s = default_ttl_s
        self.max_ttl_s = max_ttl_s
        self.max_sessions_per_key = max_sessions_per_key
        self.instance_id = instance_id or "inst_" + secrets.token_urlsafe(12)
        self._key_secret = secrets.token_bytes(32)  # per process: ids can't be brute-forced offline
        self._per_key: Counter[str | None] = Counter()
        self._stats = Counter(admitted_total=0, rejected_total=0, expired_total=0, closed_total=0)

    # -- helpers -----------------------------------------------------------------

    def key_id(self, api_key: str | None) -> str | None:
        """The HMAC an API key is stored as (what other registries key on)."""
        return self._key_id(api_key)

    def _key_id(self, api_key: str | None) -> str | None:
        if api_key is None:
            return None
        return hmac.new(self._key_secret, api_key.encode(), hashlib.sha256).hexdigest()

    def _ttl(self, ttl_s: float | None, current: float | None = None) -> float:
        if ttl_s is None:
            return current if current is not None else self.default_ttl_s
        try:
            ttl_s = float(ttl_s)
        except OverflowError:  # an integer too large for a float: "as long as allowed"
            ttl_s = math.inf
        if math.isnan(ttl_s) or ttl_s < 0:
            raise DuplexError("invalid_value", "ttl_s must be >= 0 (0 = server default)", param="ttl_s")
        return self.default_ttl_s if ttl_s == 0 else min(ttl_s, self.max_ttl_s)

    def _lapsed(self, entry: _Entry[S]) -> bool:
        return entry.pins == 0 and entry.closing is None and self.clock.now() >= entry.info.lease.expires_at

    def _lookup(self, session_id: str, api_key: str | None) -> _Entry[S] | SessionInfo:
        """The live entry or tombstone owned by ``api_key``; raises the wire errors for
        unknown, foreign-key, expired (also lapsed-not-yet-reaped) sessions."""
        key_id = self._key_id(api_key)
        entry = self._live.get(session_id)
        if entry is None:
            info = self._tomb(session_id, key_id)
            if info is None:
                raise self._unknown(session_id)
            if info.state is SessionState.EXPIRED:
                raise self._expired(session_id)
            return info
        if not owned(entry.info.api_key_id, key_id):
            raise self._unknown(session_id)
        if self._lapsed(entry):
            raise self._expired(session_id)
        return entry

    def _open_entry(self, session_id: str, api_key: str | None) -> _Entry[S]:
        found = self._lookup(session_id, api_key)
        if isinstance(found, SessionInfo) or found.closing is not None:
            raise DuplexError("session_closed", f"session {session_id!r} is closed", param="session_id")
        return found

    def _live_entry(self, session_id: str) -> _Entry[S]:
        """For trusted internal callers (the transport), no key check."""
        entry = self._live.get(session_id)
        if entry is None:
            tomb = self._tomb_of(session_id)
            if tomb is not None and tomb.state is SessionState.EXPIRED:
                raise self._expired(session_id)
            if tomb is not None:
                raise DuplexError("session_closed", f"session {session_id!r} is closed", param="session_id")
            raise self._unknown(session_id)
        if entry.closing is not None:
            raise DuplexError("session_closed", f"session {session_id!r} is closed", param="session_id")
        return entry

    def _set(self, entry: _Entry[S], **changes: object) -> None:
        entry.info = replace(entry.info, **changes)  # type: ignore[arg-type]

    def _bury(self, entry: _Entry[S], state: SessionState, reason: str) -> SessionInfo:
        sid = entry.info.session_id
        if self._live.get(sid) is not entry:
            return self._tomb_of(sid) or replace(entry.info, state=state)
        del self._live[sid]
        self._per_key[entry.info.api_key_id] -= 1
        if self._per_key[entry.info.api_key_id] <= 0:
            del self._per_key[entry.info.api_key_id]
        info = replace(entry.info, state=state, close_reason=reason)
        self._stats["expired_total" if state is SessionState.EXPIRED else "closed_total"] += 1
        self._entomb(sid, info.api_key_id, info)
        return info

    async def _close_entry(self, entry: _Entry[S], reason: str, final: SessionState) -> SessionInfo:
        """Close once; concurrent closers share the result. The close runs in its own
        task and is shielded, so a cancelled caller (client gone) never leaves the
        session half-closed."""
        if entry.closing is None:
            self._set(entry, state=SessionState.CLOSING)
            entry.closing = asyncio.create_task(
                self._finish(entry, reason, final), name=f"duplex-close-{entry.info.session_id}"
            )
        return await asyncio.shield(entry.closing)

    async def _finish(self, entry: _Entry[S], reason: str, final: SessionState) -> SessionInfo:
        try:
            await entry.session.close(reason)
        except Exception:
            # A failing close must not keep the session admitted forever.
            log.exception("session %s close(%r) failed", entry.info.session_id, reason)
        finally:
            info = self._bury(entry, final, reason)
        return info

    # -- public API --------------------------------------------------------------

    def admit(
        self,
        factory: Callable[[str], S],
        *,
        api_key: str | None,
        session_id: str | None = None,
        ttl_s: float | None = None,
        pinned: bool = False,
    ) -> tuple[S, SessionInfo]:
        ttl = self._ttl(ttl_s)
        if session_id is None:
            session_id = "sess_" + secrets.token_urlsafe(18)
            while self._taken(session_id):
                session_id = "sess_" + secrets.token_urlsafe(18)
        else:
            self._check_new_id(session_id)
        key_id = self._key_id(api_key)
        if self._stopped or len(self._live) >= self.max_sessions:
            self._stats["rejected_total"] += 1
            raise DuplexError("resource_exhausted", "session limit reached; retry later")
        per_key = self.max_sessions_per_key
        if per_key is not None and self._per_key[key_id] >= per_key:
            self._stats["rejected_total"] += 1
            raise DuplexError("resource_exhausted", "per-key session limit reached; retry later")
        session = factory(session_id)
        now = self.clock.now()
        info = SessionInfo(
            session_id=session_id,
            state=SessionState.ACTIVE,
            lease=Lease(ttl_s=ttl, expires_at=now + ttl, generation=1),
            api_key_id=key_id,
            owner_instance_id=self.instance_id,
            created_at=now,
        )
        self._live[session_id] = _Entry(session, info, pins=1 if pinned else 0)
        self._per_key[key_id] += 1
        self._stats["admitted_total"] += 1
        return session, info

    def restore(self, session: S, *, api_key: str | None, lease: Lease, created_at: float
                ) -> SessionInfo:
        """Admit ``session``, taken over from another instance, with the lease
        and age it had there (on this manager's clock). A tombstone of the id
        here (the session was here before it moved away) gives way."""
        session_id = session.session_id
        if session_id in self._live:
            raise DuplexError("duplicate_id", f"session {session_id!r} is here already",
                              param="session_id")
        key_id = self._key_id(api_key)
        per_key = self.max_sessions_per_key
        if self._stopped or len(self._live) >= self.max_sessions or (
                per_key is not None and self._per_key[key_id] >= per_key):
            self._stats["rejected_total"] += 1
            raise DuplexError("resource_exhausted", "session limit reached; retry later")
        self._tombs.pop(session_id, None)
        info = SessionInfo(session_id=session_id, state=SessionState.DETACHED, lease=lease,
                           api_key_id=key_id, owner_instance_id=self.instance_id,
                           created_at=created_at)
        self._live[session_id] = _Entry(session, info)
        self._per_key[key_id] += 1
        self._stats["admitted_total"] += 1
        return info

    def held(self, session_id: str) -> SessionInfo | None:
        """The info of a live session, no key check (trusted callers)."""
        entry = self._live.get(session_id)
        return entry.info if entry is not None else None

    def tombstone(self, session_id: str) -> SessionInfo | None:
        """The tombstone of ``session_id``, whoever owns it (trusted callers)."""
        return self._tomb_of(session_id)

    def pinned(self, session_id: str) -> bool:
        entry = self._live.get(session_id)
        return entry is not None and entry.pins > 0

    def get(self, session_id: str, api_key: str | None) -> tuple[S, SessionInfo]:
        """The live session; ``session_closed`` for a closing or closed one."""
        entry = self._open_entry(session_id, api_key)
        return entry.session, entry.info

    def peek(self, session_id: str) -> S | None:
        """The session object while it is open (no key check: callers checked ``info``)."""
        entry = self._live.get(session_id)
        return entry.session if entry is not None and entry.closing is None else None

    def info(self, session_id: str, api_key: str | None) -> SessionInfo:
        """Also answers for tombstones (CLOSED/EXPIRED) and lapsed-not-yet-reaped sessions."""
        try:
            found = self._lookup(session_id, api_key)
        except Expired:
            entry = self._live.get(session_id)
            return replace(entry.info, state=SessionState.EXPIRED) if entry else self._tomb_of(session_id)
        return found if isinstance(found, SessionInfo) else found.info

    def renew(
        self,
        session_id: str,
        api_key: str | None,
        *,
        ttl_s: float | None = None,
        generation: int | None = None,
    ) -> Lease:
        """Extend the lease to now + ttl (``None`` keeps the current ttl) and bump the
        generation. ``generation`` given and stale → ``lease_conflict`` (CAS on resume)."""
        entry = self._open_entry(session_id, api_key)
        lease = entry.info.lease
        if generation is not None and generation != lease.generation:
            raise DuplexError(
                "lease_conflict",
                f"lease generation {generation} is stale (current {lease.generation})",
                param="generation",
            )
        ttl = self._ttl(ttl_s, current=lease.ttl_s)
        new = Lease(ttl_s=ttl, expires_at=self.clock.now() + ttl, generation=lease.generation + 1)
        self._set(entry, lease=new)
        return new

    def pin(self, session_id: str) -> None:
        """A socket attached: the session cannot expire until every pin is released."""
        entry = self._live_entry(session_id)
        if self._lapsed(entry):
            raise self._expired(session_id)
        entry.pins += 1
        self._set(entry, state=SessionState.ACTIVE)

    def unpin(self, session_id: str) -> None:
        """A socket detached: once no pins remain the lease runs from now. Unknown or
        already closed sessions are ignored (the socket may outlive its session)."""
        entry = self._live.get(session_id)
        if entry is None or entry.pins == 0:
            return
        entry.pins -= 1
        if entry.pins == 0 and entry.closing is None:
            lease = entry.info.lease
            self._set(
                entry,
                state=SessionState.DETACHED,
                lease=replace(lease, expires_at=self.clock.now() + lease.ttl_s),
            )

    async def close(self, session_id: str, api_key: str | None, reason: str = "client") -> SessionInfo:
        """Idempotent: a CLOSED session returns its info; expired → ``session_expired``."""
        try:
            found = self._lookup(session_id, api_key)
        except Expired:
            entry = self._live.get(session_id)
            if entry is not None:
                await self._close_entry(entry, "expired", SessionState.EXPIRED)  # reap it now
            raise
        if isinstance(found, SessionInfo):
            info = found
        else:
            info = await self._close_entry(found, reason, SessionState.CLOSED)
        if info.state is SessionState.EXPIRED:  # we joined a close started by the reaper
            raise self._expired(session_id)
        return info

    async def release(self, session_id: str, reason: str) -> None:
        """The session closed itself (e.g. its socket ended): bury it without calling
        its ``close()`` again. No-op if unknown, already closed, or being closed by us."""
        entry = self._live.get(session_id)
        if entry is not None and entry.closing is None:
            self._bury(entry, SessionState.CLOSED, reason)

    async def reap_once(self) -> int:
        """Expire every lapsed, unpinned session; returns how many."""
        due = [e for e in self._live.values() if self._lapsed(e)]
        if due:
            await asyncio.gather(*(self._close_entry(e, "expired", SessionState.EXPIRED) for e in due))
        return len(due)

    async def _reap(self) -> None:
        await self.reap_once()

    async def stop(self) -> None:
        """Stop the reaper, refuse new sessions, close every live one ("shutdown")."""
        # Closes the reaper had started run in their own tasks and are joined below.
        await self._stop_reaper()
        entries = list(self._live.values())
        if entries:
            await asyncio.gather(*(self._close_entry(e, "shutdown", SessionState.CLOSED) for e in entries))

    def stats(self) -> dict[str, int]:
        """``rejected_total`` counts capacity refusals (``resource_exhausted``) only."""
        return {"live": len(self._live), **self._stats}
