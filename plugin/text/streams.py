"""Resumable streams: bounded, seq-numbered event buffers a client can replay and follow.

A generation opted in with a ``stream_id`` appends its SSE events to a ``ResumableStream``;
a client that lost its connection calls ``GET /v1/streams/{id}?from=<seq>`` and gets every
retained event with ``seq >= from``, then the live tail: no gap, no duplicate::

    create ─▶ ACTIVE ─complete/stop─▶ COMPLETED ─ttl/evicted─▶ EXPIRED  (tombstone)
                └──────── delete ─────────┴──────────────────▶ DELETED  (tombstone)

* One writer per stream: only the generation calls ``append``/``complete``; both are sync
  and never wait for readers, so a slow client cannot stall the engine. Followers keep
  their own cursor and sleep on a per-stream ``asyncio.Event`` that every change sets and
  replaces (no polling, any number of followers).
* Memory is bounded by trimming the oldest events, never by blocking the writer: each
  stream's events are a ``SeqLog`` (``vllm_duplex.replay.seqlog``, the structure under the
  realtime journal too) bounded in event count and bytes, and all streams share one
  ``ByteBudget`` (``max_total_bytes``: completed streams lose history first, then the
  stream holding the oldest event). The event just appended is never trimmed, so the
  worst case is the bounds plus one event per stream. A cursor or follower behind the
  retained window gets ``resync_required``, never a gap.
* Errors come early: ``follow`` is a plain method that validates the cursor *before* it
  returns the async generator, so the HTTP layer can answer 4xx before starting a 200.
* Ids, ownership, tombstones and the reaper are the ``Registry``'s
  (``vllm_duplex.leases.registry``), as for sessions: ``key_id`` is the caller's HMAC of
  the API key; a stream or tombstone of another owner looks exactly like an unknown id
  (no existence leak); tombstones (bounded LRU of owner + final status) answer for
  deleted/expired ids and keep the id from being reused while they remain.
* TTL applies to COMPLETED streams only (an active one belongs to its generation). Every
  accessor runs ``collect`` first, so a stream past its TTL is expired on access even
  before the reaper's next pass: answers never depend on reaper timing.
* With a durable store (``durability: store: redis``) a ``StreamKeeper``
  (``vllm_duplex.durable.streams``) makes a stream outlive its worker: each stream's
  ``StreamMirror`` journals its events and status in the store, and a follower gets an
  event only once the store holds it (``reached``); ``reach`` has the keeper take over,
  before any route looks it up, a stream kept elsewhere whose owner is gone.

Not thread-safe: call everything on the event loop (``append`` sets an ``asyncio.Event``).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
from collections import Counter, OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.leases.registry import ID, Registry, owned
from vllm_duplex.replay.seqlog import ByteBudget, SeqBounds, SeqLog
from vllm_duplex.text.stream_keeping import StreamKeeper, StreamMirror

log = logging.getLogger(__name__)


class StreamStatus(str, Enum):
    ACTIVE = "active"
    COMPLETED = "completed"
    EXPIRED = "expired"
    DELETED = "deleted"
    UNKNOWN = "unknown"  # only in ``lookup`` answers


_GONE = (StreamStatus.EXPIRED, StreamStatus.DELETED)


@dataclass(frozen=True)
class StreamEvent:
    seq: int  # 1, 2, 3 ... per stream, strictly +1
    event: str  # SSE event name: "text-delta", "finish", "error", "control", ...
    data: dict[str, Any]  # JSON object; the writer must not mutate it after append
    size: int  # len(json.dumps(data)) + len(event): what the byte bounds count


def _resync(seq: int, first: int) -> DuplexError:
    msg = f"seq {seq} was trimmed; oldest retained seq is {first}"
    return DuplexError("resync_required", msg, param="from", details={"first_seq": first})


class ResumableStream:
    """One generation's events. Created by ``StreamStore.create``, which supplies the
    clock, the bounds and the cross-stream byte accounting."""

    def __init__(self, stream_id: str, key_id: str | None, store: StreamStore) -> None:
        self.stream_id = stream_id
        self.key_id = key_id  # owner: HMAC of the API key, or None
        self.created_at = store.clock.now()
        self.on_stop: Callable[[], Awaitable[None]] | None = None  # set by the generation's runner
        self.mirror: StreamMirror | None = None  # set by a keeper (a durable store)
        self._store = store
        # Read-only for callers; written only here and by the store.
        self.status = StreamStatus.ACTIVE
        self.completed_at: float | None = None
        self._log: SeqLog[StreamEvent] = SeqLog(
            SeqBounds(store.max_events_per_stream, store.max_bytes_per_stream), store.budget)
        self._changed = asyncio.Event()
        self._stopping: asyncio.Task[None] | None = None

    @property
    def head_seq(self) -> int:
        """The last appended seq, 0 before the first."""
        return self._log.head_seq

    @property
    def first_seq(self) -> int:
        """The oldest retained seq; ``head_seq + 1`` when nothing is retained."""
        return self._log.first_seq

    @property
    def retained_bytes(self) -> int:
        return self._log.bytes

    def append(self, event: str, data: dict[str, Any]) -> StreamEvent:
        """Add the next event; never blocks. ``RuntimeError`` unless ACTIVE."""
        if self.status is not StreamStatus.ACTIVE:
            raise RuntimeError(f"stream {self.stream_id!r} is {self.status.value}, not active")
        if not event or "\n" in event or "\r" in event:
            # The name becomes an SSE "event:" line; a newline would forge fields.
            raise ValueError("event name must be a non-empty single line")
        size = len(json.dumps(data)) + len(event)  # TypeError for non-JSON data, before any change
        ev = StreamEvent(self._log.head_seq + 1, event, data, size)
        self._log.append(ev, size, self._store.clock.now())  # trims to the per-stream bounds
        self._store._enforce_total(self)
        if self.mirror is not None:
            self.mirror.appended(ev)
        self._wake()
        return ev

    def complete(self) -> None:
        """ACTIVE → COMPLETED (idempotent; no-op once deleted/expired). Followers drain and end."""
        if self.status is StreamStatus.ACTIVE:
            self.status = StreamStatus.COMPLETED
            self.completed_at = self._store.clock.now()
            self._store._completed[self.stream_id] = self  # completion order == expiry order
            if self.mirror is not None:
                self.mirror.completed()
            self._wake()

    async def stop(self) -> None:
        """Stop the generation: ``on_stop`` runs at most once, then ``complete()``.

        It runs in its own shielded task: concurrent callers join it, and a caller that
        is cancelled (client gone) does not abort it half-way. A stream that is no longer
        ACTIVE has no generation left to stop, so ``on_stop`` is not called for it."""
        if self._stopping is None:
            on_stop = self.on_stop
            if self.status is not StreamStatus.ACTIVE or on_stop is None:
                self.complete()
                return
            self._stopping = asyncio.create_task(
                self._run_stop(on_stop), name=f"duplex-stream-stop-{self.stream_id}"
            )
        await asyncio.shield(self._stopping)

    async def _run_stop(self, on_stop: Callable[[], Awaitable[None]]) -> None:
        try:
            await on_stop()
        except Exception:
            # A failing stop must not leave the stream active forever (TTL never starts).
            log.exception("stream %s on_stop failed", self.stream_id)
        finally:
            self.complete()

    def check_cursor(self, from_seq: int) -> None:
        """Raise the wire error for a cursor ``follow`` cannot serve; see ``follow``."""
        if self.status in _GONE:  # raced with delete/expiry after ``get``
            raise self._store._gone(self.stream_id, self.status)
        last = self.head_seq + 1  # "from" = head + 1 is valid: wait for the next event
        if isinstance(from_seq, bool) or not isinstance(from_seq, int) or not 1 <= from_seq <= last:
            raise DuplexError("invalid_value", f"from must be an integer in [1, {last}]", param="from")
        if from_seq < self.first_seq:
            raise _resync(from_seq, self.first_seq)

    def follow(self, from_seq: int = 1) -> AsyncGenerator[StreamEvent, None]:
        """Events with ``seq >= from_seq``: the retained ones, then each new one as it is
        appended; ends once the stream is no longer ACTIVE and everything up to head was
        yielded (or at once when it is deleted/expired mid-iteration).

        Validation is eager: this is a plain method, so ``check_cursor``'s
        ``invalid_value``/``resync_required`` raise *here*, before any await and before
        the HTTP layer starts a 200 response. Later, a follower that falls behind the
        bounds gets ``resync_required`` from the iterator itself."""
        self.check_cursor(from_seq)
        return self._follow(from_seq)

    async def _follow(self, next_seq: int) -> AsyncGenerator[StreamEvent, None]:
        # Re-derive the position from (first_seq, head) on every step, because the writer
        # may trim or append while this consumer is suspended at a ``yield``.
        while True:
            if self.status in _GONE:
                return  # events were freed: the stream is gone, the follower just ends
            if next_seq <= self.head_seq:
                mirror = self.mirror
                if mirror is not None and not mirror.holds(next_seq):
                    await mirror.reached(next_seq)  # what a client has, the store has
                    continue
                first = self.first_seq
                if next_seq < first:  # this follower fell behind the bounds
                    raise _resync(next_seq, first)
                yield self._log.entry(next_seq).item
                next_seq += 1
            elif self.status is StreamStatus.ACTIVE:
                await self._changed.wait()
            else:
                return

    def retained(self) -> Iterator[StreamEvent]:
        """The retained events, oldest first."""
        return (entry.item for entry in self._log)

    # -- internals, driven by the store --------------------------------------------

    def _wake(self) -> None:
        # Set-and-replace: every waiter of this round wakes once; later waiters wait anew.
        self._changed.set()
        self._changed = asyncio.Event()

    def _free(self, status: StreamStatus | None) -> None:
        """Deleted or expired (``status``); None: moved to another worker (nothing is told)."""
        mirror, self.mirror = self.mirror, None
        self.status = status or StreamStatus.DELETED
        self._log.clear()
        if mirror is not None and status is not None:
            mirror.ended(status)
        self._wake()


class StreamStore(Registry[ResumableStream, StreamStatus]):
    """All resumable streams of one instance; ids are 1–128 chars of ``[A-Za-z0-9._:-]``."""

    kind = "stream"
    reaper_name = "duplex-stream-reaper"

    def __init__(
        self,
        *,
        max_streams: int = 1024,
        max_events_per_stream: int = 4096,
        max_bytes_per_stream: int = 1 << 20,
        max_total_bytes: int = 64 << 20,
        ttl_s: float = 300.0,
        reap_interval_s: float = 1.0,
        tombstones: int = 10_000,
        clock: Clock | None = None,
    ) -> None:
        if min(max_streams, max_events_per_stream, max_bytes_per_stream, max_total_bytes) < 1:
            raise ValueError("stream limits must be >= 1")
        if not ttl_s >= 0 or not reap_interval_s > 0 or tombstones < 0:
            raise ValueError("need ttl_s >= 0, reap_interval_s > 0, tombstones >= 0")
        super().__init__(reap_interval_s=reap_interval_s, tombstones=tombstones, clock=clock)
        self.max_streams = max_streams
        self.max_events_per_stream = max_events_per_stream
        self.max_bytes_per_stream = max_bytes_per_stream
        self.max_total_bytes = max_total_bytes
        self.ttl_s = ttl_s
        # Completed streams in completion order; one ttl for all makes it expiry order too,
        # so collect() and eviction only ever look at the front.
        self._completed: OrderedDict[str, ResumableStream] = OrderedDict()
        self.budget = ByteBudget(max_total_bytes)  # every stream's retained bytes
        self.keeper: StreamKeeper | None = None  # set by the host with a durable store
        self._moved: OrderedDict[str, None] = OrderedDict()  # ids taken over elsewhere from here
        self._stats = Counter(created_total=0, expired_total=0, evicted_total=0, deleted_total=0)

    # -- helpers -----------------------------------------------------------------

    def _gone(self, stream_id: str, status: StreamStatus | None = None) -> DuplexError:
        """The wire error for an id that is not live: only EXPIRED is told apart."""
        return self._expired(stream_id) if status is StreamStatus.EXPIRED else self._unknown(stream_id)

    def _bury(self, stream: ResumableStream, status: StreamStatus) -> bool:
        sid = stream.stream_id
        if self._live.get(sid) is not stream:
            return False
        del self._live[sid]
        self._completed.pop(sid, None)
        stream._free(status)
        self._entomb(sid, stream.key_id, status)
        return True

    def _find(self, stream_id: str, key_id: str | None) -> ResumableStream | StreamStatus | None:
        """The owned live stream or tombstone status; None for unknown *and* foreign ids."""
        stream = self._live.get(stream_id)
        if stream is not None:
            return stream if owned(stream.key_id, key_id) else None
        return self._tomb(stream_id, key_id)

    def _enforce_total(self, appender: ResumableStream) -> None:
        """Trim other streams' oldest events while over ``max_total_bytes``: completed
        streams first, then whichever holds the oldest event; the appender's own older
        events only as a last resort (its newest is never trimmed)."""
        budget = self.budget
        if not budget.over:
            return
        # (active?, oldest stamp): False sorts first, so completed streams go first.
        heap = [
            (s.status is StreamStatus.ACTIVE, oldest.stamp, s.stream_id, s._log)
            for s in self._live.values()
            if s is not appender and (oldest := s._log.oldest) is not None
        ]
        heapq.heapify(heap)
        while budget.over and heap:
            active, _, sid, log = heap[0]
            log.trim_oldest()
            if (oldest := log.oldest) is not None:
                heapq.heapreplace(heap, (active, oldest.stamp, sid, log))
            else:
                heapq.heappop(heap)
        while budget.over and len(appender._log) > 1:
            appender._log.trim_oldest()

    # -- public API --------------------------------------------------------------

    def create(self, stream_id: str, key_id: str | None) -> ResumableStream:
        self.collect()
        self._check_new_id(stream_id)  # any owner's: ids are global
        if self._stopped:
            raise DuplexError("resource_exhausted", "stream store is shutting down; retry later")
        if len(self._live) >= self.max_streams:
            if not self._completed:
                raise DuplexError("resource_exhausted", "stream limit reached; retry later")
            # Make room from finished history, never by cutting off a running generation.
            self._bury(next(iter(self._completed.values())), StreamStatus.EXPIRED)
            self._stats["evicted_total"] += 1
        stream = ResumableStream(stream_id, key_id, self)
        self._live[stream_id] = stream
        self._stats["created_total"] += 1
        return stream

    async def open(self, stream_id: str, key_id: str | None, api_key: str | None) -> ResumableStream:
        """``create``, and with a keeper: the id claimed wherever streams are
        kept first, the stream mirrored from now on."""
        keeper = self.keeper
        if keeper is None:
            return self.create(stream_id, key_id)
        self.collect()
        self._check_new_id(stream_id)
        generation = await keeper.claim(stream_id)
        try:
            stream = self.create(stream_id, key_id)
        except BaseException:
            await keeper.unclaim(stream_id, generation)
            raise
        keeper.keep(stream, api_key, generation)
        return stream

    async def reach(self, stream_ids: Sequence[str], api_key: str | None,
                    key_id: str | None) -> dict[str, DuplexError]:
        """Before a route looks ids up: the keeper takes over those not here
        (neither live nor remembered by a tombstone) that are kept elsewhere
        and whose owner is gone. Returns the errors of those it could not take
        (``wrong_instance``: their owner lives); without a keeper, nothing."""
        keeper = self.keeper
        if keeper is None:
            return {}
        self.collect()
        wanted = [sid for sid in dict.fromkeys(stream_ids)
                  if isinstance(sid, str) and ID.fullmatch(sid) and not self._taken(sid)]
        results = await asyncio.gather(
            *(keeper.reach(sid, api_key, key_id, patient=sid not in self._moved) for sid in wanted),
            return_exceptions=True)
        errors: dict[str, DuplexError] = {}
        for sid, result in zip(wanted, results, strict=True):
            if isinstance(result, DuplexError):
                errors[sid] = result
            elif isinstance(result, BaseException):
                raise result
        return errors

    def restore(self, stream_id: str, key_id: str | None, events: Sequence[StreamEvent], *,
                next_seq: int, completed_ago_s: float | None) -> ResumableStream:
        """A stream taken over from a worker that is gone, rebuilt here: its
        retained ``events`` with their seqs (contiguous; ``next_seq``: where
        numbering goes on when none is retained), ACTIVE or completed
        ``completed_ago_s`` ago (its TTL runs from then)."""
        self._moved.pop(stream_id, None)
        stream = self.create(stream_id, key_id)
        now = self.clock.now()
        stream._log.restart_after((events[0].seq if events else next_seq) - 1)
        for ev in events:
            stream._log.append(ev, ev.size, now)
        self._enforce_total(stream)
        if completed_ago_s is not None:
            stream.complete()
            stream.completed_at = now - completed_ago_s
            # Expiry order is completion order: the rebuilt one takes its place in it.
            self._completed = OrderedDict(sorted(
                self._completed.items(), key=lambda kv: kv[1].completed_at or 0.0))
        return stream

    async def forget(self, stream_id: str) -> None:
        """Another worker took the stream over: its generation (if any) stops
        here, writing nothing more, and it is forgotten without a tombstone
        (a later request asks the keeper, which names the new owner)."""
        stream = self._live.get(stream_id)
        if stream is None:
            return
        stream.mirror = None
        try:
            await stream.stop()
        finally:
            if self._live.get(stream_id) is stream:
                del self._live[stream_id]
                self._completed.pop(stream_id, None)
                stream._free(None)
                self._moved[stream_id] = None
                while len(self._moved) > 1024:
                    self._moved.popitem(last=False)

    def held(self, stream_id: str) -> bool:
        """Is the stream held here (live, any key)? For trusted callers."""
        return stream_id in self._live

    def get(self, stream_id: str, key_id: str | None) -> ResumableStream:
        """The live stream; ``stream_expired`` for an expired one, ``stream_not_found`` for
        unknown, foreign and deleted ids."""
        self.collect()
        found = self._find(stream_id, key_id)
        if isinstance(found, ResumableStream):
            return found
        raise self._gone(stream_id, found)

    def lookup(self, stream_ids: Sequence[str], key_id: str | None) -> dict[str, StreamStatus]:
        """Status of each named id (de-duplicated, in request order), and only those."""
        if isinstance(stream_ids, str):
            raise TypeError("stream_ids must be a sequence of ids, not one str")
        self.collect()
        out: dict[str, StreamStatus] = {}
        for sid in dict.fromkeys(stream_ids):
            found = self._find(sid, key_id)
            out[sid] = found.status if isinstance(found, ResumableStream) else found or StreamStatus.UNKNOWN
        return out

    async def delete(self, stream_id: str, key_id: str | None) -> StreamStatus:
        """Stop the generation, free the events, leave a DELETED tombstone. Idempotent:
        returns the status before the call (a tombstone's own status on repeats)."""
        self.collect()
        found = self._find(stream_id, key_id)
        if found is None:
            raise self._gone(stream_id)
        if isinstance(found, StreamStatus):
            return found
        before = found.status
        try:
            await found.stop()
        finally:
            # Even if this caller is cancelled mid-stop the stream is deleted; the shielded
            # on_stop finishes on its own and its complete() is then a no-op.
            if self._bury(found, StreamStatus.DELETED):
                self._stats["deleted_total"] += 1
        return before

    def collect(self) -> int:
        """One GC pass: expire completed streams past their TTL; returns how many."""
        now, n = self.clock.now(), 0
        while self._completed:
            stream = next(iter(self._completed.values()))
            assert stream.completed_at is not None
            if now < stream.completed_at + self.ttl_s:
                break
            self._bury(stream, StreamStatus.EXPIRED)
            n += 1
        self._stats["expired_total"] += n
        return n

    async def _reap(self) -> None:
        self.collect()

    async def stop(self) -> None:
        """Cancel the reaper, refuse new streams, stop every active stream (shutdown).
        Completed streams stay readable so followers can drain."""
        await self._stop_reaper()
        active = [s for s in self._live.values() if s.status is StreamStatus.ACTIVE]
        if active:
            await asyncio.gather(*(s.stop() for s in active))
        for stream in self._live.values():  # left in a durable store for another worker
            mirror, stream.mirror = stream.mirror, None
            if mirror is not None:
                mirror.ended(None)

    @property
    def stats(self) -> dict[str, int]:
        live, done = len(self._live), len(self._completed)
        stats = self._stats
        return {"live_streams": live, "active_streams": live - done, "retained_bytes": self.budget.used,
                "tombstones": len(self._tombs), "created_total": stats["created_total"],
                "trimmed_events_total": self.budget.trimmed_total, "expired_total": stats["expired_total"],
                "evicted_total": stats["evicted_total"], "deleted_total": stats["deleted_total"]}
