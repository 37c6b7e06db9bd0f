"""Where a session's events go: the replay journal, and the socket attached now.

A session outlives its sockets. Every event is journaled, then offered to
the current ``Attachment`` (one socket's bounded queue, drained by that
socket's writer). A socket that stops reading fills its queue: it is cut off
(``SLOW_CONSUMER``) so server memory stays bounded, while the session and its
journal go on; the client resumes from its last seq (or is told to resync).
A second socket that resumes the session replaces the first (``REPLACED``).
*Watchers* are further sockets that follow the session live without taking
it over (a WebRTC call's sideband WebSocket): each gets every event from the
moment it joined, in its own bounded queue; a slow one is cut off alone.
The session's single writer is the only caller of ``publish``; ``attach``
runs synchronously on the same loop, so the replay it snapshots and the live
events after it never overlap or miss one.

With a durable session store (``vllm_duplex.durable``), an event leaves for a
socket only once the store holds it (``DurableMark``): a client never has an
event that a worker adopting the session after a crash could not replay.
"""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from dataclasses import dataclass

from vllm_duplex.domain.events import Envelope
from vllm_duplex.replay.journal import Journal, Replay, wire_size


class Notice(enum.Enum):
    """Why an attachment ended, for its writer (``None`` = the session closed)."""

    REPLACED = "replaced"
    SLOW_CONSUMER = "slow_consumer"


@dataclass(frozen=True)
class OutboxLimits:
    max_events: int = 8192  # queued for one socket
    max_bytes: int = 16 << 20


class DurableMark:
    """How far a session's events are durable (written by the store's
    writer; awaited by each socket's writer). ``bypass``: durability is
    degraded (the store is unreachable), events flow without waiting."""

    def __init__(self, through: int = 0) -> None:
        self.through = through
        self.bypass = False
        self._changed = asyncio.Event()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def advance(self, seq: int) -> None:
        if seq > self.through:
            self.through = seq
            self._wake()

    def set_bypass(self, bypass: bool) -> None:
        if bypass != self.bypass:
            self.bypass = bypass
            self._wake()

    async def reached(self, seq: int) -> None:
        while not self.bypass and self.through < seq:
            await self._changed.wait()


class Attachment:
    """One socket's queue of events, bounded in events and bytes."""

    def __init__(self, limits: OutboxLimits, mark: DurableMark | None = None) -> None:
        self.limits = limits
        self.mark = mark
        self._queue: asyncio.Queue[Envelope | Notice | None] = asyncio.Queue()
        self._sizes: deque[int] = deque()
        self.pending_bytes = 0
        self.ended: Notice | None = None
        self.closed = False  # no more events will come

    def offer(self, env: Envelope, size: int, *, force: bool = False) -> bool:
        """Queue ``env``; False when the socket is over its bounds."""
        if self.closed:
            return True
        if not force and (self._queue.qsize() >= self.limits.max_events
                          or self.pending_bytes + size > self.limits.max_bytes):
            return False
        self._queue.put_nowait(env)
        self._sizes.append(size)
        self.pending_bytes += size
        return True

    def end(self, why: Notice | None) -> None:
        """No more events; the writer gets ``why`` after what is queued (a slow
        consumer's backlog is dropped: it would only be replayed anyway)."""
        if self.closed:
            return
        self.closed = True
        self.ended = why
        if why is Notice.SLOW_CONSUMER:
            while not self._queue.empty():
                self._queue.get_nowait()
            self._sizes.clear()
            self.pending_bytes = 0
        self._queue.put_nowait(why)

    async def get(self) -> Envelope | Notice | None:
        item = await self._queue.get()
        if isinstance(item, Envelope):
            self.pending_bytes -= self._sizes.popleft()
            if self.mark is not None:
                await self.mark.reached(item.seq)
        return item

    def get_nowait(self) -> Envelope | Notice | None:
        item = self._queue.get_nowait()
        if isinstance(item, Envelope):
            self.pending_bytes -= self._sizes.popleft()
        return item

    def empty(self) -> bool:
        return self._queue.empty()

    def qsize(self) -> int:
        return self._queue.qsize()


class Outbox:
    def __init__(self, journal: Journal, limits: OutboxLimits,
                 mark: DurableMark | None = None) -> None:
        self.journal = journal
        self.limits = limits
        self.mark = mark
        self.attachment: Attachment | None = None
        self.watchers: list[Attachment] = []
        self.slow_consumers = 0

    def publish(self, env: Envelope, now: float) -> bool:
        """Journal ``env`` and send it to the socket; False when that socket
        was just cut off for not reading."""
        size = self.journal.append(env, now)
        for watcher in self.watchers:
            if not watcher.offer(env, size):
                watcher.end(Notice.SLOW_CONSUMER)
        if any(w.closed for w in self.watchers):
            self.watchers = [w for w in self.watchers if not w.closed]
        att = self.attachment
        if att is None or att.offer(env, size):
            return True
        self.slow_consumers += 1
        att.end(Notice.SLOW_CONSUMER)
        self.attachment = None
        return False

    def attach(self, last_seq: int | None = None) -> tuple[Attachment, Replay | None]:
        """A new socket. With ``last_seq``, it first gets every journaled event
        after it (or a resync verdict); the socket attached so far is replaced.
        Raises ``invalid_value`` for a cursor beyond the head, replacing nothing."""
        replay = self.journal.replay(last_seq) if last_seq is not None else None
        if self.attachment is not None:
            self.attachment.end(Notice.REPLACED)
        att = Attachment(self.limits, self.mark)
        for env in replay.events if replay is not None else ():
            att.offer(env, wire_size(env), force=True)  # bounded by the journal already
        self.attachment = att
        return att, replay

    def watch(self) -> Attachment:
        """A socket that follows the session live from now on, beside the
        attached one (it replaces nothing and gets no replay)."""
        att = Attachment(self.limits, self.mark)
        self.watchers.append(att)
        return att

    def unwatch(self, att: Attachment) -> None:
        if att in self.watchers:
            self.watchers.remove(att)
        att.end(None)

    def detach(self, att: Attachment) -> bool:
        """The socket of ``att`` is gone; True when it was the current one."""
        if self.attachment is not att:
            return False
        self.attachment = None
        att.end(None)
        return True

    def close(self) -> None:
        """The session ended: the socket gets the end marker; the journal is freed."""
        if self.attachment is not None:
            self.attachment.end(None)
            self.attachment = None
        for watcher in self.watchers:
            watcher.end(None)
        self.watchers.clear()
        self.journal.clear()
