"""The in-memory session store: one process, today's behaviour.

Nothing outlives the process, so nothing is ever adopted from it by another;
it keeps the same contract as the Redis store (leases with generations and
fencing, bounded journals) so the host has one code path, and so the
contract is tested without a network (``tests/unit/test_session_store.py``,
on a virtual clock). Events are kept as the objects they are (no encoding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.durable.store import (
    Append,
    Bounds,
    Drop,
    Fenced,
    LeaseHeld,
    Lost,
    Save,
    SessionState,
    SessionStore,
    Stored,
    Trim,
    Write,
)
from vllm_duplex.replay.seqlog import SeqBounds, SeqLog


@dataclass
class _Record:
    log: SeqLog[Any]
    generation: int = 0
    holder: str | None = None
    expires_at: float = float("-inf")
    state: SessionState | None = None
    touched: float = 0.0
    dead: bool = field(default=False)


class MemoryStore(SessionStore):
    def __init__(self, clock: Clock, bounds: Bounds = Bounds(), *, shared: bool = False) -> None:
        # shared: several runtimes of one process use it as they would Redis
        # (the adoption tests); alone, nothing outlives the process with it.
        self.durable = shared
        self.clock = clock
        self.bounds = bounds
        self._records: dict[str, _Record] = {}
        self._dead: set[str] = set()

    def __len__(self) -> int:
        return len(self._records)

    def _record(self, session_id: str) -> _Record:
        b = self.bounds
        return self._records.setdefault(
            session_id, _Record(SeqLog(SeqBounds(b.max_events, b.max_bytes, b.max_age_s))))

    def _live(self, session_id: str) -> _Record | None:
        rec = self._records.get(session_id)
        if rec is not None and self.clock.now() - rec.touched > self.bounds.keep_s:
            del self._records[session_id]  # every key of a session expires together
            return None
        return rec

    async def acquire(self, session_id: str, holder: str, ttl_s: float, *,
                      new: bool = False) -> int:
        now = self.clock.now()
        rec = self._live(session_id)
        if new and rec is not None:
            raise DuplexError("duplicate_id", f"session {session_id!r} exists", param="session_id")
        if not new and (rec is None or rec.state is None):
            raise DuplexError("session_not_found", f"no session {session_id!r}",
                              param="session_id")
        rec = rec or self._record(session_id)
        if (rec.holder is not None and rec.holder != holder and now < rec.expires_at
                and rec.holder not in self._dead):
            raise LeaseHeld(rec.holder, rec.generation)
        rec.generation += 1
        rec.holder, rec.expires_at, rec.touched = holder, now + ttl_s, now
        return rec.generation

    async def renew(self, leases: dict[str, tuple[str, int]], ttl_s: float
                    ) -> dict[str, Fenced | Lost]:
        now, failed = self.clock.now(), {}
        for session_id, (holder, generation) in leases.items():
            rec = self._live(session_id)
            if rec is None:
                failed[session_id] = Lost(session_id)
            elif rec.generation != generation:
                failed[session_id] = Fenced(session_id)
            else:
                rec.holder, rec.expires_at, rec.touched = holder, now + ttl_s, now
        return failed

    async def apply(self, writes: list[Write]) -> dict[str, int | Fenced | Lost]:
        out: dict[str, int | Fenced | Lost] = {}
        now = self.clock.now()
        for w in writes:
            if isinstance(out.get(w.session_id), (Fenced, Lost)):
                continue
            rec = self._live(w.session_id)
            if rec is None and isinstance(w, Save) and w.holder is not None:
                rec = self._record(w.session_id)
                rec.generation, rec.holder, rec.expires_at = w.generation, w.holder, now + w.ttl_s
            if rec is None:
                out[w.session_id] = Lost(w.session_id)
                continue
            if rec.generation != w.generation:
                out[w.session_id] = Fenced(w.session_id)
                continue
            rec.touched = now
            if isinstance(w, Append):
                if w.seq <= rec.log.head_seq:
                    continue  # written already (a batch retried after a lost answer)
                if w.seq != rec.log.head_seq + 1:
                    rec.log.clear()
                    rec.log.head_seq = w.seq - 1  # a gap the writer chose (after an outage)
                rec.log.append(w.payload, w.size, now)  # the age bound on our clock
                out[w.session_id] = rec.log.head_seq
            elif isinstance(w, Save):
                rec.state = w.state
                out.setdefault(w.session_id, rec.log.head_seq)
            elif isinstance(w, Trim):
                rec.log.release_through(w.seq)  # acked: not counted as trimmed by a bound
                out[w.session_id] = rec.log.head_seq
            elif isinstance(w, Drop):
                rec.holder, rec.expires_at = None, float("-inf")
                if w.forget:
                    del self._records[w.session_id]
                elif not w.release_only:
                    # Its generation stays (until keep_s): an older owner that
                    # wakes up is fenced, never told the store lost it.
                    rec.log.clear()
                    rec.state = None
                out[w.session_id] = rec.log.head_seq
        return out

    async def load(self, session_id: str) -> Stored | None:
        rec = self._live(session_id)
        if rec is None or rec.state is None:
            return None
        live = rec.holder is not None and self.clock.now() < rec.expires_at \
            and rec.holder not in self._dead
        rec.log.expire(self.clock.now())
        return Stored(session_id, rec.state, rec.generation, rec.holder if live else None,
                      rec.log.first_seq, rec.log.head_seq)

    async def events_after(self, session_id: str, seq: int) -> list[Any] | None:
        rec = self._live(session_id)
        if rec is None:
            return None
        rec.log.expire(self.clock.now())
        entries = rec.log.after(min(seq, rec.log.head_seq))
        return None if entries is None else [e.item for e in entries]

    async def mark_dead(self, holder: str) -> None:
        self._dead.add(holder)

    async def ping(self) -> bool:
        return True
