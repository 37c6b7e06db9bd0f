"""Resumable streams in the store: mirrored while they live here, taken over
by another worker when their owner is gone.

A stream is kept under ``stream:<id>``: a ``StreamRecord`` (status, the API
key's hash, TTL, when it completed), saved at create and at complete, and
its events journaled as plain ``(seq, event, data)`` tuples. A follower gets
an event only once the store holds it (``StreamCopy.reached``: the stream's
``DurableMark``; a degraded store bypasses it, as for realtime sessions), so
whatever a client saw, another worker can replay. Deleted or expired: dropped
from the store; a process stopping: released (another worker takes it at once).

Taken over (``StreamKeeper.reach``), a stream is rebuilt with its retained
events and seqs. A completed one replays as it was until its TTL. One that
was still generating cannot go on (its generation died with its worker): it
ends with a terminal ``error`` event, ``engine_dead`` with ``reason:
owner_lost``, written to the store too, and is completed.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.durable.records import STREAM_PREFIX, StreamRecord
from vllm_duplex.durable.store import Drop, LeaseHeld, Stored, StoreUnavailable, sha
from vllm_duplex.durable.takeover import OneAtATime, take_over
from vllm_duplex.durable.writer import Durability
from vllm_duplex.replay.outbox import DurableMark
from vllm_duplex.text.events import ErrorEvent
from vllm_duplex.text.streams import ResumableStream, StreamEvent, StreamStatus, StreamStore

log = logging.getLogger(__name__)

TERMINAL = ("finish", "error")  # exactly one of them ends every generation


def owner_lost(owner: str | None) -> ErrorEvent:
    """The terminal event of a stream whose generation died with its worker."""
    return ErrorEvent(DuplexError(
        "engine_dead", "the worker generating this stream died: the generation cannot go on "
        "(the events before this one are as it sent them)",
        details={"reason": "owner_lost", "owner_instance_id": owner}))


@dataclass(eq=False)
class StreamCopy:
    """``Mirrored`` (for the writer) and ``StreamMirror`` (for the stream)."""

    stream: ResumableStream
    key_sha: str | None
    keeper: StreamKeeper
    generated_by: str  # the worker its generation ran on
    mark: DurableMark = field(default_factory=DurableMark)
    kind = "stream"

    @property
    def session_id(self) -> str:
        return STREAM_PREFIX + self.stream.stream_id

    def durable_state(self) -> StreamRecord:
        s, clock = self.stream, self.keeper.streams.clock
        wall = time.time() - clock.now()  # this clock's zero, in unix seconds
        done = s.completed_at is not None and s.status is not StreamStatus.ACTIVE
        return StreamRecord("completed" if done else "active", self.key_sha,
                            self.keeper.streams.ttl_s,
                            wall + s.completed_at if done and s.completed_at is not None else None,
                            wall + s.created_at, self.generated_by)

    def durable_journal(self) -> Iterator[tuple[int, int, Any]]:
        for ev in self.stream.retained():
            yield ev.seq, ev.size, (ev.seq, ev.event, ev.data)

    async def drop_moved(self) -> None:
        self.keeper.moved += 1
        await self.keeper.streams.forget(self.stream.stream_id)

    # ---- StreamMirror ---------------------------------------------------------

    def appended(self, ev: StreamEvent) -> None:
        self.keeper.durability.append(self.session_id, ev.seq, ev.size, (ev.seq, ev.event, ev.data))

    def completed(self) -> None:
        self.keeper.durability.changed(self.session_id)

    def ended(self, status: StreamStatus | None) -> None:
        self.keeper.durability.ended(self.session_id, release=status is None)

    def holds(self, seq: int) -> bool:
        return self.mark.bypass or self.mark.through >= seq

    async def reached(self, seq: int) -> None:
        await self.mark.reached(seq)


def events_of(payloads: list[Any]) -> list[StreamEvent]:
    """The journaled ``(seq, event, data)`` as stream events: the last
    contiguous run (what a client can be replayed without a gap)."""
    out: list[StreamEvent] = []
    for p in payloads:
        if not (isinstance(p, tuple) and len(p) == 3 and isinstance(p[0], int)
                and isinstance(p[1], str) and isinstance(p[2], dict)):
            continue
        seq, event, data = p
        if out and seq != out[-1].seq + 1:
            out = []
        out.append(StreamEvent(seq, event, data, len(json.dumps(data)) + len(event)))
    return out


class StreamKeeper:
    """The ``StreamKeeper`` of one instance's resumable streams, in a durable
    store (``StreamStore.keeper``)."""

    def __init__(self, streams: StreamStore, durability: Durability) -> None:
        self.streams = streams
        self.durability = durability
        self._takeovers = OneAtATime()
        self.adopted = 0  # streams taken over from a worker that was gone
        self.moved = 0  # streams another worker took over from this one

    def _key(self, stream_id: str) -> str:
        return STREAM_PREFIX + stream_id

    async def claim(self, stream_id: str) -> int:
        d = self.durability
        try:
            return await d.store.acquire(self._key(stream_id), d.holder, d.lease_ttl_s, new=True)
        except (DuplexError, LeaseHeld) as err:
            if isinstance(err, DuplexError) and err.code != "duplicate_id":
                raise
            raise DuplexError("duplicate_id", f"stream_id {stream_id!r} is a duplicate",
                              param="stream_id") from None
        except StoreUnavailable:
            return 1  # degraded: the stream goes on here; its first save creates it

    async def unclaim(self, stream_id: str, generation: int) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self.durability.store.apply([Drop(self._key(stream_id), generation,
                                                    forget=True)])

    def keep(self, stream: ResumableStream, api_key: str | None, generation: int) -> None:
        self._mirror(stream, sha(api_key), generation, 0,
                     self.durability.holder.split("#", 1)[0])

    def _mirror(self, stream: ResumableStream, key_sha: str | None, generation: int,
                head_seq: int, generated_by: str) -> StreamCopy:
        copy = StreamCopy(stream, key_sha, self, generated_by)
        stream.mirror = copy
        copy.mark = self.durability.follow(copy, generation, head_seq)
        return copy

    async def reach(self, stream_id: str, api_key: str | None, key_id: str | None, *,
                    patient: bool = True) -> None:
        async with self._takeovers.turn(stream_id):
            if self.streams.held(stream_id):
                return  # the caller before took it over
            await self._take(stream_id, api_key, key_id, patient)

    async def _take(self, stream_id: str, api_key: str | None, key_id: str | None,
                    patient: bool) -> None:
        d, key = self.durability, self._key(stream_id)
        try:
            stored = await d.store.load(key)
            if stored is None or not isinstance(stored.state, StreamRecord):
                return
            if stored.state.key_sha is not None and (api_key is None or not hmac.compare_digest(
                    stored.state.key_sha, sha(api_key) or "")):
                return  # another key's: unknown, as here
            stored, generation = await take_over(d, key, stored, kind="stream",
                                                 entry_id=stream_id, patient=patient)
            payloads = await d.store.events_after(key, stored.first_seq - 1)
            if payloads is None:  # trimmed by age meanwhile: what is retained now
                stored = await d.store.load(key) or stored
                payloads = await d.store.events_after(key, stored.first_seq - 1) or []
        except StoreUnavailable as unreachable:
            raise DuplexError("store_unavailable", f"the session store cannot be reached "
                              f"({unreachable}): stream {stream_id!r} is not held here and cannot "
                              "be looked up now; retry", param="stream_id") from None
        if not isinstance(stored.state, StreamRecord):
            return
        try:
            self._restore(stream_id, key_id, stored, generation, events_of(payloads))
        except BaseException:
            with contextlib.suppress(StoreUnavailable):  # another worker may take it
                await d.store.apply([Drop(key, generation, release_only=True)])
            raise

    def _restore(self, stream_id: str, key_id: str | None, stored: Stored, generation: int,
                 events: list[StreamEvent]) -> None:
        record: StreamRecord = stored.state  # type: ignore[assignment]
        ended = bool(events) and events[-1].event in TERMINAL and events[-1].seq == stored.head_seq
        completed_ago: float | None = None
        if record.status == "completed" and record.completed_at is not None:
            # Its expiry stays where it was (completed_at + its ttl), under this store's ttl.
            left = record.completed_at + record.ttl_s - time.time()
            completed_ago = self.streams.ttl_s - left
        elif ended:
            completed_ago = 0.0  # its terminal event is stored, its status was not yet
        stream = self.streams.restore(stream_id, key_id, events, next_seq=stored.head_seq + 1,
                                      completed_ago_s=completed_ago)
        stream.created_at = self.streams.clock.now() - (time.time() - record.created_at)
        copy = self._mirror(stream, record.key_sha, generation, stored.head_seq,
                            record.generated_by)
        self.adopted += 1
        self.durability.adopted += 1  # /health counts every kind taken over
        if completed_ago is None:  # it was generating: that generation is gone
            lost = owner_lost(record.generated_by or None)
            stream.append(lost.type, lost.data())
            stream.complete()
        elif record.status != "completed":
            copy.completed()  # its status, saved
        log.info("stream %s taken over (generation %d, seqs %d..%d, %s)", stream_id, generation,
                 stream.first_seq, stream.head_seq, record.status)
