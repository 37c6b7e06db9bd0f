"""One bounded, seq-numbered log: the structure under every replayable stream.

A realtime session's journal (``vllm_duplex.replay.journal``) and a resumable
text stream (``vllm_duplex.text.streams``) are the same idea: events numbered
1, 2, 3 … with no gap, kept for a client that lost its connection and comes
back with a cursor, and bounded so that nobody grows server memory without
bound. ``SeqLog`` is that idea once:

* **Seq**: ``append`` gives the next seq (``head_seq + 1``); the retained
  entries are always the contiguous run ``first_seq .. head_seq``.
* **Bounds per log**, in events, bytes and age (``SeqBounds``). ``append``
  trims the oldest entries until the log fits — never the one just appended,
  so the worst case is the bounds plus one event.
* **A byte budget shared by many logs** (``ByteBudget``): every log's bytes are
  counted against one process-wide bound. *Which* log gives way when the
  budget is over is the owner's policy (the journal trims the appender's own
  history, the stream store trims finished streams first), so the log only
  counts; ``stamp`` orders entries across the logs of one budget, so an owner
  can find the log holding the oldest one.
* **Cursors**: ``after(seq)`` answers the entries after a cursor, or ``None``
  when the cursor fell out of retention — never a gap. Releasing (an ack) and
  trimming (a bound) both drop from the front; only trimming is counted.

Sizes are the owner's estimate of an entry's wire size, computed once.
Sans-I/O and not thread-safe: one writer (the session, the generation) calls
everything on the event loop.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


class ByteBudget:
    """Bytes retained by every log that shares it, against one bound."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.trimmed_total = 0  # entries dropped by a bound, in every log
        self._stamps = itertools.count()

    @property
    def over(self) -> bool:
        return self.used > self.max_bytes

    def stamp(self) -> int:
        """The next append order, comparable across this budget's logs."""
        return next(self._stamps)


@dataclass(frozen=True)
class SeqBounds:
    """What one log may retain (the newest entry always stays)."""

    max_events: int
    max_bytes: int
    max_age_s: float = math.inf


@dataclass(frozen=True, slots=True)
class Entry(Generic[T]):
    seq: int
    item: T
    size: int  # the owner's wire-size estimate: what the byte bounds count
    at: float  # when it was appended (age bound)
    stamp: int  # append order across the logs of one budget


class SeqLog(Generic[T]):
    def __init__(self, bounds: SeqBounds, budget: ByteBudget | None = None) -> None:
        self.bounds = bounds
        self.budget = budget or ByteBudget(bounds.max_bytes)
        self._entries: deque[Entry[T]] = deque()
        self.head_seq = 0  # the last appended seq, 0 before the first
        self.bytes = 0
        self.trimmed = 0  # dropped by a bound, not released

    @property
    def first_seq(self) -> int:
        """The oldest retained seq; ``head_seq + 1`` when nothing is retained."""
        return self.head_seq + 1 - len(self._entries)

    @property
    def oldest(self) -> Entry[T] | None:
        return self._entries[0] if self._entries else None

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(self._entries)

    def append(self, item: T, size: int, now: float) -> Entry[T]:
        """Retain ``item`` as seq ``head_seq + 1``, then trim the oldest entries
        until this log is within its own bounds (the shared budget is the
        owner's to enforce)."""
        entry = Entry(self.head_seq + 1, item, size, now, self.budget.stamp())
        self._entries.append(entry)
        self.head_seq = entry.seq
        self._grow(size)
        self.expire(now)
        bounds = self.bounds
        while len(self._entries) > 1 and (len(self._entries) > bounds.max_events
                                          or self.bytes > bounds.max_bytes):
            self.trim_oldest()
        return entry

    def expire(self, now: float) -> None:
        """Trim entries older than ``max_age_s`` (the newest always stays)."""
        max_age = self.bounds.max_age_s
        while len(self._entries) > 1 and now - self._entries[0].at > max_age:
            self.trim_oldest()

    def trim_oldest(self) -> Entry[T]:
        """A bound drops the oldest entry (counted, here and in the budget)."""
        entry = self._entries.popleft()
        self._grow(-entry.size)
        self.trimmed += 1
        self.budget.trimmed_total += 1
        return entry

    def release_through(self, seq: int) -> int:
        """The reader has everything up to ``seq``: forget it. Returns how many
        entries were released."""
        released = 0
        while self._entries and self._entries[0].seq <= seq:
            self._grow(-self._entries.popleft().size)
            released += 1
        return released

    def entry(self, seq: int) -> Entry[T]:
        """The retained entry ``seq`` (``IndexError`` outside ``first_seq .. head_seq``)."""
        index = seq - self.first_seq
        if index < 0:
            raise IndexError(f"seq {seq} is not retained (oldest is {self.first_seq})")
        return self._entries[index]

    def after(self, seq: int) -> tuple[Entry[T], ...] | None:
        """The entries with seq > ``seq``, or ``None`` when some of them are no
        longer retained (the caller must resync). ``seq`` must be <= head."""
        first = self.first_seq
        if seq + 1 < first:
            return None
        return tuple(itertools.islice(self._entries, seq + 1 - first, None))

    def restart_after(self, seq: int) -> None:
        """An empty log whose next entry is ``seq + 1`` (a session rebuilt from
        a store goes on numbering where its dead owner stopped)."""
        self.clear()
        self.head_seq = seq

    def clear(self) -> None:
        """Release everything (the log's owner ended)."""
        self._grow(-self.bytes)
        self._entries.clear()

    def _grow(self, delta: int) -> None:
        self.bytes += delta
        self.budget.used += delta
