"""The session mailbox: one bounded, multi-lane queue feeding a session's single writer.

Lanes (``Lane``) are served strictly by priority, CONTROL > STAGE > DATA, and
FIFO within a lane, so a ``response.cancel`` never waits behind queued audio.
An *ordered* CONTROL item (a client's urgent command: ``put_nowait(...,
ordered=True)``) overtakes only the DATA items the mailbox's ``passable``
accepts (raw media: audio and video); it waits for every other DATA item that
arrived before it, so a client's commands take effect in the order sent -- a
``response.cancel`` right after a ``response.create`` finds that response, as
OpenAI handles a socket's events in order. The DATA
lane is bounded (it carries client audio, the one thing a client can flood): a full
one refuses (``MailboxFull``). The STAGE lane is bounded by ``stage_capacity``: a full
one makes its producer wait (``put``), after trying to *merge* the new item into the
newest queued one -- as vLLM's one-slot output collector merges the deltas a lagging
consumer has not read yet. CONTROL is unbounded unless ``priority_capacity`` is given
(which bounds STAGE too when ``stage_capacity`` is not).

A lane can be paused (``pause``/``resume``): ``get`` skips it while it still
accepts items up to its bound. The session pauses DATA while its stages are
behind, and keeps serving CONTROL and STAGE, which is what lets stage work drain.

Close semantics: ``close()`` discards every pending item at once and every current and
later ``get()``/``put()`` raises ``MailboxClosed``; a closing session stops processing
instead of draining queued audio.

Waiting uses futures (like ``asyncio.Queue``), never polling.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# merge(older, newer) -> one item meaning both, or None when they must stay apart
Merge = Callable[[T, T], "T | None"]


class Lane(enum.IntEnum):
    """Mailbox lanes, highest priority first."""

    CONTROL = 0  # urgent client commands (cancel, close, ack)
    STAGE = 1  # stage outputs
    DATA = 2  # everything else a client sends (audio, items, updates)


def lane_of(command: Any) -> Lane:
    """The lane a client command rides: urgent ones overtake queued data."""
    return Lane.CONTROL if getattr(command, "urgent", False) else Lane.DATA

_LANES = tuple(sorted(Lane))  # highest priority (lowest value) first


class MailboxFull(Exception):
    """A bounded lane is full; the caller maps it to ``resource_exhausted``."""

    def __init__(self, lane: Lane, capacity: int) -> None:
        super().__init__(f"mailbox lane {lane.name} is full ({capacity} items)")
        self.lane = lane
        self.capacity = capacity


class MailboxClosed(Exception):
    """The mailbox was closed; no more items will be delivered or accepted."""


class Mailbox(Generic[T]):
    def __init__(self, data_capacity: int = 1024, *, priority_capacity: int | None = None,
                 stage_capacity: int | None = None,
                 passable: Callable[[T], bool] = lambda item: True) -> None:
        if data_capacity < 1:
            raise ValueError("data_capacity must be >= 1")
        if stage_capacity is not None and stage_capacity < 1:
            raise ValueError("stage_capacity must be >= 1")
        self.data_capacity = data_capacity
        self.priority_capacity = priority_capacity
        self.stage_capacity = stage_capacity if stage_capacity is not None else priority_capacity
        # Items carry a global arrival number so delivery can tell whether it overtook
        # older DATA items (the "control lane overtakes data lane" metric).
        self._lanes: dict[Lane, deque[tuple[int, T]]] = {lane: deque() for lane in _LANES}
        self._arrival = itertools.count()
        self._passable = passable
        # The newest DATA item an ordered CONTROL item may not pass (its arrival
        # number), and each waiting ordered item's such barrier: while the DATA
        # lane's oldest item is not newer than it, the ordered item waits.
        self._newest_fixed = -1
        self._barriers: dict[int, int] = {}
        self._getters: deque[asyncio.Future[None]] = deque()
        self._putters: dict[Lane, deque[asyncio.Future[None]]] = {lane: deque() for lane in _LANES}
        self._closed = False
        self._paused: set[Lane] = set()
        self.enqueued = 0  # items accepted, all lanes
        self.overtaken = 0  # CONTROL/STAGE deliveries that passed older waiting DATA items
        self.merged = 0  # items merged into a queued one instead of waiting
        self.peak = {lane: 0 for lane in _LANES}  # the longest each lane has been

    @property
    def closed(self) -> bool:
        return self._closed

    def qsize(self, lane: Lane | None = None) -> int:
        if lane is None:
            return sum(len(q) for q in self._lanes.values())
        return len(self._lanes[lane])

    def _capacity(self, lane: Lane) -> int | None:
        if lane is Lane.DATA:
            return self.data_capacity
        return self.stage_capacity if lane is Lane.STAGE else self.priority_capacity

    def _full(self, lane: Lane) -> bool:
        cap = self._capacity(lane)
        return cap is not None and len(self._lanes[lane]) >= cap

    @staticmethod
    def _wake_one(waiters: deque[asyncio.Future[None]]) -> None:
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def put_nowait(self, item: T, lane: Lane, *, ordered: bool = False) -> None:
        """Queue ``item``; ``ordered`` (CONTROL only): it overtakes only
        passable DATA items (see the module docstring)."""
        if self._closed:
            raise MailboxClosed("mailbox is closed")
        if self._full(lane):
            raise MailboxFull(lane, self._capacity(lane) or 0)
        q = self._lanes[lane]
        arrival = next(self._arrival)
        if lane is Lane.DATA and not self._passable(item):
            self._newest_fixed = arrival
        elif ordered and lane is Lane.CONTROL and self._newest_fixed >= 0:
            self._barriers[arrival] = self._newest_fixed
        q.append((arrival, item))
        if len(q) > self.peak[lane]:
            self.peak[lane] = len(q)
        self.enqueued += 1
        if lane not in self._paused:
            self._wake_one(self._getters)

    async def put(self, item: T, lane: Lane, merge: Merge[T] | None = None) -> None:
        """Like ``put_nowait`` but, when the lane is full, first tries to merge
        ``item`` into the newest queued item (``merge``), then waits for room
        (backpressure). A merged item keeps its place (and arrival number)."""
        while self._full(lane) and not self._closed:
            q = self._lanes[lane]
            if merge is not None and q:
                arrival, newest = q[-1]
                merged = merge(newest, item)
                if merged is not None:
                    q[-1] = (arrival, merged)
                    self.merged += 1
                    return
            await self._wait(self._putters[lane])
        self.put_nowait(item, lane)

    def pause(self, lane: Lane) -> None:
        """``get`` skips ``lane`` until ``resume`` (it still accepts items)."""
        self._paused.add(lane)

    def resume(self, lane: Lane) -> None:
        if lane in self._paused:
            self._paused.discard(lane)
            if self._lanes[lane]:
                self._wake_one(self._getters)

    async def get(self) -> tuple[Lane, T]:
        """The oldest item of the highest-priority non-empty lane."""
        while True:
            if self._closed:
                raise MailboxClosed("mailbox is closed")
            for lane in _LANES:
                q = self._lanes[lane]
                if q and lane not in self._paused:
                    at = self._first_due(q) if lane is Lane.CONTROL else 0
                    if at is None:
                        continue  # every CONTROL item waits for DATA sent before it
                    arrival, item = q[at]
                    del q[at]
                    self._barriers.pop(arrival, None)
                    data = self._lanes[Lane.DATA]
                    if lane is not Lane.DATA and data and data[0][0] < arrival:
                        self.overtaken += 1
                    self._wake_one(self._putters[lane])
                    return lane, item
            await self._wait(self._getters)

    def _first_due(self, q: deque[tuple[int, T]]) -> int | None:
        """The index of the first CONTROL item that waits for no DATA item."""
        data = self._lanes[Lane.DATA]
        oldest_data = data[0][0] if data else None
        for i, (arrival, _) in enumerate(q):
            barrier = self._barriers.get(arrival)
            if barrier is None or oldest_data is None or oldest_data > barrier:
                return i
        return None

    async def _wait(self, waiters: deque[asyncio.Future[None]]) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        try:
            await fut
        except BaseException:
            fut.cancel()
            # If we were woken and cancelled in the same tick, pass the wake-up on so
            # no item or free slot is left without a waiter.
            if fut in waiters:
                waiters.remove(fut)
            elif not self._closed:
                self._wake_one(waiters)
            raise

    def close(self) -> int:
        """Close now: discard pending items, wake every waiter. Returns the number of
        items discarded. Idempotent."""
        if self._closed:
            return 0
        self._closed = True
        dropped = self.qsize()
        for q in self._lanes.values():
            q.clear()
        self._barriers.clear()
        for waiters in (self._getters, *self._putters.values()):
            while waiters:
                fut = waiters.popleft()
                if not fut.done():
                    fut.set_result(None)
        return dropped

    def stats(self) -> dict[str, Any]:
        return {
            "enqueued": self.enqueued,
            "overtaken": self.overtaken,
            **{f"qsize_{lane.name.lower()}": len(q) for lane, q in self._lanes.items()},
        }
