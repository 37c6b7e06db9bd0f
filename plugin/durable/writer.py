"""``Durability``: a process's live sessions, mirrored into a session store.

What it mirrors is anything ``Mirrored``: a realtime session
(``durable.realtime``), an application session (``durable.app_sessions``), a
resumable stream -- each a state to save, maybe a journal of seq-numbered
events, and what to do when another worker took it over.

One writer task per process owns the queue of writes (one writer per state):
sessions only enqueue (``published``/``append``, ``changed``, ``acked``, ``closed``/``ended``:
never awaited, never blocking the session's single writer; ``flushed`` is
there for the one that must know its state is in the store before it answers). The task sends the
queue in ordered batches (one round trip for many events) and advances each
session's ``DurableMark``, which its sockets wait for before sending an event
(``vllm_duplex.replay.outbox``): what a client holds, the store holds.

A second task renews the leases of the sessions here (every third of the
lease). A session whose write or renewal is refused for its generation was
adopted by another worker: it is closed here, and its sockets with it
(``CloseReason.MOVED``) -- two owners never write.

**Degraded.** When the store cannot be reached the sessions go on: their
marks are bypassed (events flow without waiting), writes wait in a bounded
backlog, and ``/health`` says ``durability: degraded``. When the store
answers again the backlog is written; a session whose backlog overflowed, or
that the store lost (a Redis restarted without persistence), is written
again from what this process holds (its state and its in-memory journal).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from vllm_duplex.domain.clock import Clock, MonotonicClock
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.durable.realtime import RealtimeCopy
from vllm_duplex.durable.store import (
    Append,
    Drop,
    Fenced,
    Lost,
    Save,
    SessionStore,
    StoreUnavailable,
    Trim,
    Write,
)
from vllm_duplex.replay.journal import wire_size
from vllm_duplex.replay.outbox import DurableMark
from vllm_duplex.session.runner import DuplexSession

log = logging.getLogger(__name__)

# Events after which the session's state (config, items) is saved again:
# whatever changes the config or the conversation (not the deltas of a reply
# going out: the journal holds those, and adoption rebuilds a cut reply from them).
_STATE_EVENTS = frozenset({
    "session.created", "session.updated", "input_audio_buffer.committed", "response.created",
    "response.output_item.added", "response.output_item.done", "response.done",
    "conversation.item.added", "conversation.item.done", "conversation.item.created",
    "conversation.item.deleted", "conversation.item.truncated",
    "conversation.item.input_audio_transcription.completed"})
# Events after which the numbered input so far is in the conversation (or
# thrown away): an adopter asks the client to resend only what comes after.
_INPUT_SETTLED = frozenset({"input_audio_buffer.committed", "input_audio_buffer.cleared"})
RETRY_S = 0.5
MAX_BATCH = 512


class Mirrored(Protocol):
    """What the writer keeps a copy of, under ``session_id`` in the store."""

    kind: str  # "realtime", "app", "stream": what /health counts

    @property
    def session_id(self) -> str: ...

    def durable_state(self) -> Any:
        """What a rebuilt copy starts from, copied now."""

    def durable_journal(self) -> Iterable[tuple[int, int, Any]]:
        """The retained events as ``(seq, size, payload)``, oldest first."""

    async def drop_moved(self) -> None:
        """Another worker took it over: end it here, writing nothing."""


@dataclass
class _Tracked:
    item: Mirrored
    generation: int
    mark: DurableMark
    reseed: bool = False  # write it whole again when the store answers
    dirty: bool = False  # its state changed since the last save
    waiting: list[asyncio.Future[None]] = field(default_factory=list)  # for the next save
    saving: list[asyncio.Future[None]] = field(default_factory=list)  # for the save in flight

    def settle(self) -> None:
        """Whoever waits for a save stops waiting (it is written, or cannot be)."""
        for fut in (*self.saving, *self.waiting):
            if not fut.done():
                fut.set_result(None)
        self.saving, self.waiting = [], []


class Durability:
    def __init__(self, store: SessionStore, holder: str, *, lease_ttl_s: float = 5.0,
                 metrics: Metrics | None = None, backlog_bytes: int = 64 << 20,
                 clock: Clock | None = None) -> None:
        self.store = store
        self.clock = clock or MonotonicClock()
        self.holder = holder
        self.lease_ttl_s = lease_ttl_s
        self.backlog_bytes = backlog_bytes
        self._tracked: dict[str, _Tracked] = {}
        self._queue: deque[Write] = deque()
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.degraded_since: float | None = None
        self.fenced = 0
        self.reseeded = 0
        self.adopted = 0
        self.last_adoption_s: float | None = None
        self.last_error: str | None = None
        self._closers: set[asyncio.Task[None]] = set()
        self._closing = False
        self._in_flight = False  # a batch is being written (stop waits for it)
        if metrics is not None:
            metrics.gauge("duplex_durability_degraded",
                          "1 while the session store cannot be reached", lambda: float(
                              self.degraded_since is not None))
            metrics.gauge("duplex_durability_backlog_bytes", "Writes waiting for the store",
                          lambda: float(self._queued_bytes))
            metrics.gauge("duplex_sessions_fenced", "Sessions dropped here: another worker "
                          "took their lease", lambda: float(self.fenced))

    # ---- what sessions call (never awaited) ------------------------------------

    def mark(self, session: DuplexSession) -> DurableMark | None:
        return DurableMark() if self.store.durable else None

    def track(self, session: DuplexSession, generation: int, head_seq: int = 0) -> None:
        """Mirror a realtime session from now on (a new one: generation 1,
        created by its first save; an adopted one: the generation its acquire
        took). A store that does not outlive this process mirrors nothing: the
        session's own journal is the in-memory copy (today's behaviour)."""
        if self.store.durable:
            self.follow(RealtimeCopy(session), generation, head_seq, session.outbox.mark)

    def follow(self, item: Mirrored, generation: int, head_seq: int = 0,
               mark: DurableMark | None = None) -> DurableMark:
        """Mirror ``item`` from now on; its mark says how far its journal is
        durable. Generation 1 is a new one: its first save creates it in the
        store, before any of its events."""
        mark = mark or DurableMark()
        mark.advance(head_seq)
        mark.set_bypass(self.degraded_since is not None or not self.store.durable)
        if not self.store.durable:
            return mark
        t = self._tracked[item.session_id] = _Tracked(item, generation, mark)
        if generation == 1:
            self._put(self._save(t))
        return mark

    def published(self, session: DuplexSession, env: Envelope) -> None:
        # On every event of every session: one lookup, nothing more when it is
        # not mirrored (the in-memory store, the default).
        t = self._tracked.get(session.session_id)
        if t is None:
            return
        kind = env.event.type
        if kind in _INPUT_SETTLED and isinstance(t.item, RealtimeCopy):
            t.item.input_settled()
        if kind in _STATE_EVENTS:
            t.dirty = True  # saved once per batch, after its events
            self._wake.set()
        self._put(Append(session.session_id, t.generation, env.seq, wire_size(env), time.time(),
                         env))

    def append(self, session_id: str, seq: int, size: int, payload: Any) -> None:
        t = self._tracked.get(session_id)
        if t is not None:
            self._put(Append(session_id, t.generation, seq, size, time.time(), payload))

    def changed(self, session_id: str) -> None:
        """Its state changed: saved once, at the end of the next batch."""
        t = self._tracked.get(session_id)
        if t is not None:
            t.dirty = True
            self._wake.set()

    def acked(self, session_id: str, seq: int) -> None:
        """Its client has every event up to ``seq``: the stored journal forgets
        them too (a ``Trim`` queued behind their appends; a burst of acks is
        one trim)."""
        t = self._tracked.get(session_id)
        if t is None:
            return
        last = self._queue[-1] if self._queue else None
        if isinstance(last, Trim) and last.session_id == session_id:
            self._queue[-1] = Trim(session_id, t.generation, max(seq, last.seq))
        else:
            self._put(Trim(session_id, t.generation, seq))

    async def flushed(self, session_id: str) -> None:
        """Returns once the state as it is now is in the store (at once when
        it is not mirrored, or the store cannot be reached: sessions go on)."""
        t = self._tracked.get(session_id)
        if t is None or self.degraded_since is not None or not (t.dirty or t.saving):
            return
        fut = asyncio.get_running_loop().create_future()
        (t.waiting if t.dirty else t.saving).append(fut)
        await fut

    def resumed(self, session: DuplexSession) -> None:
        self.changed(session.session_id)  # the rotated token

    def closed(self, session: DuplexSession, reason: CloseReason) -> None:
        if reason is CloseReason.MOVED:
            self._untrack(session.session_id)
        else:
            # A process stopping (a deploy) leaves its sessions to be adopted at once.
            self.ended(session.session_id, release=reason is CloseReason.SHUTDOWN)

    def release(self, session: DuplexSession) -> None:
        """Stop mirroring ``session`` and leave it in the store for another
        worker (an adoption that could not start it here)."""
        t = self._untrack(session.session_id)
        if t is not None:
            self._put(Drop(session.session_id, t.generation, release_only=True))

    def ended(self, session_id: str, *, release: bool = False) -> None:
        """It ended for good (dropped from the store), or, ``release``, this
        process is stopping: its last state is saved and its lease let go, so
        another worker adopts it at once."""
        t = self._untrack(session_id)
        if t is None:
            return
        if release and t.dirty:
            self._put(self._save(t))  # its last state, for the worker that adopts it
        self._put(Drop(session_id, t.generation, release_only=release))

    def _untrack(self, session_id: str) -> _Tracked | None:
        t = self._tracked.pop(session_id, None)
        if t is not None:
            t.mark.set_bypass(True)  # nothing waits on an ended copy
            t.settle()
        return t

    def _save(self, t: _Tracked) -> Save:
        # Generation 1 is a new session: its first save creates it in the store.
        holder = self.holder if t.generation == 1 or t.reseed else None
        return Save(t.item.session_id, t.generation, t.item.durable_state(), holder,
                    self.lease_ttl_s)

    def _put(self, w: Write) -> None:
        if self._queued_bytes > self.backlog_bytes:
            self._overflow()
        self._queue.append(w)
        self._queued_bytes += w.size if isinstance(w, Append) else 256
        self._wake.set()

    def _overflow(self) -> None:
        """The store has been away too long: forget the backlog; each session
        is written whole again when it answers."""
        self._queue.clear()
        self._queued_bytes = 0
        for t in self._tracked.values():
            t.reseed = True

    # ---- health ------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return {"store": type(self.store).__name__, "durable": self.store.durable,
                "state": "degraded" if self.degraded_since is not None else "ok",
                "degraded_s": (round(self.clock.now() - self.degraded_since, 1)
                               if self.degraded_since is not None else None),
                "sessions": len(self._tracked), "kinds": self._kinds(),
                "backlog_writes": len(self._queue),
                "fenced": self.fenced, "reseeded": self.reseeded, "adopted": self.adopted,
                "last_error": self.last_error}

    def _kinds(self) -> dict[str, int]:
        kinds: dict[str, int] = {}
        for t in self._tracked.values():
            kinds[t.item.kind] = kinds.get(t.item.kind, 0) + 1
        return kinds

    # ---- the tasks ---------------------------------------------------------------

    async def start(self) -> None:
        if not self.store.durable:
            return
        self._tasks = [asyncio.create_task(self._write_loop(), name="duplex-durable-writer"),
                       asyncio.create_task(self._renew_loop(), name="duplex-durable-leases")]

    async def stop(self, flush_s: float = 2.0) -> None:
        """Write what is queued (within ``flush_s``), then stop and close the store."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(flush_s):
                while (self._queue or self._in_flight) and self.degraded_since is None:
                    await asyncio.sleep(0.01)
        # The redis client turns a cancel in the middle of a command into a
        # connection error, which the loops treat as an outage: so they also
        # look at ``_closing``, and a cancel is repeated until they are done.
        self._closing = True
        self._wake.set()
        while self._tasks:
            for task in self._tasks:
                task.cancel()
            _, pending = await asyncio.wait(self._tasks, timeout=1.0)
            self._tasks = list(pending)
        await asyncio.gather(*self._closers, return_exceptions=True)
        await self.store.close()

    async def _write_loop(self) -> None:
        while not self._closing:
            if not self._queue and not any(t.reseed or t.dirty for t in self._tracked.values()):
                self._wake.clear()
                await self._wake.wait()
            batch = self._next_batch()
            self._in_flight = True
            try:
                results = await self.store.apply(batch)
            except StoreUnavailable as err:
                if self._closing:
                    return
                self._degrade(err)
                self._queue.extendleft(reversed(batch))
                await self.clock.sleep(RETRY_S)
                continue
            except Exception:
                log.exception("session store write failed; dropping %d writes", len(batch))
                for t in self._tracked.values():
                    t.settle()  # those saves will not come: nobody waits for them
                continue
            finally:
                self._in_flight = False
            self._queued_bytes -= sum(w.size if isinstance(w, Append) else 256 for w in batch)
            self._queued_bytes = max(0, self._queued_bytes)
            if self.degraded_since is not None:
                self._recover()
            self._settle(results)

    def _next_batch(self) -> list[Write]:
        batch: list[Write] = []
        for t in self._tracked.values():
            if t.reseed:
                batch += self._reseed(t)
        while self._queue and len(batch) < MAX_BATCH:
            batch.append(self._queue.popleft())
        if not self._queue:
            # Every event published so far is in this batch: the state now is
            # the state those events leave, saved once, after them (one copy
            # of the items per batch, not per event, and off the session's path).
            for t in self._tracked.values():
                if t.dirty:
                    t.dirty = False
                    t.saving += t.waiting
                    t.waiting = []
                    batch.append(self._save(t))
        return batch

    def _reseed(self, t: _Tracked) -> list[Write]:
        """The whole session again: its state, then its retained journal."""
        t.reseed = False
        self.reseeded += 1
        sid = t.item.session_id
        writes: list[Write] = [Save(sid, t.generation, t.item.durable_state(), self.holder,
                                    self.lease_ttl_s)]
        for seq, size, payload in t.item.durable_journal():
            writes.append(Append(sid, t.generation, seq, size, time.time(), payload))
        self._queue = deque(w for w in self._queue if w.session_id != sid)
        return writes

    def _settle(self, results: dict[str, int | Fenced | Lost]) -> None:
        for session_id, result in results.items():
            t = self._tracked.get(session_id)
            if t is None:
                continue
            if isinstance(result, Fenced):
                self._fence(t)
            elif isinstance(result, Lost):
                t.reseed = True
            else:
                t.mark.advance(result)
                for fut in t.saving:
                    if not fut.done():
                        fut.set_result(None)
                t.saving = []

    def _degrade(self, err: Exception) -> None:
        self.last_error = str(err)
        if self.degraded_since is None:
            self.degraded_since = self.clock.now()
            log.error("session store unreachable (%s): sessions go on, not durable", err)
            for t in self._tracked.values():
                t.mark.set_bypass(True)
                t.settle()  # sessions go on: nothing waits for a store that is away

    def _recover(self) -> None:
        log.warning("session store reachable again after %.1f s",
                    self.clock.now() - (self.degraded_since or 0))
        self.degraded_since = None
        for t in self._tracked.values():
            # What went out while degraded went out; what comes now waits for
            # its own write, behind the backlog (the order of the writes).
            t.mark.set_bypass(False)
        self._wake.set()

    def _fence(self, t: _Tracked) -> None:
        """Another worker took this session (its generation moved on): drop it here."""
        sid = t.item.session_id
        if self._untrack(sid) is None:
            return
        self.fenced += 1
        log.warning("%s %s was adopted elsewhere (generation > %d): dropping it here",
                    t.item.kind, sid, t.generation)
        self._queue = deque(w for w in self._queue if w.session_id != sid)
        task = asyncio.get_running_loop().create_task(t.item.drop_moved(),
                                                      name=f"duplex-fenced-{sid}")
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    async def _renew_loop(self) -> None:
        while not self._closing:
            await self.clock.sleep(self.lease_ttl_s / 3)
            leases = {sid: (self.holder, t.generation) for sid, t in self._tracked.items()}
            try:
                failed = await self.store.renew(leases, self.lease_ttl_s)
            except StoreUnavailable as err:
                if self._closing:
                    return
                self._degrade(err)
                continue
            if self.degraded_since is not None:
                self._recover()
            for session_id, why in failed.items():
                t = self._tracked.get(session_id)
                if t is None:
                    continue
                if isinstance(why, Fenced):
                    self._fence(t)
                else:
                    t.reseed = True
                    self._wake.set()
