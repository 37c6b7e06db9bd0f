"""The replay journal of a realtime session (sans-I/O).

Every journaled server event (an ``Envelope`` with ``seq`` +1 each) is kept
until the client acknowledges it (``session.event_ack``) or a bound drops it:
per session in events, bytes and age, and across all sessions in bytes (a
shared ``JournalBudget``; a session over the shared budget trims its own
oldest events, so a heavy session cannot push out a quiet one's history).
A reconnecting client asks for everything after ``last_seq``: the journal
answers exactly those events, or says the cursor fell out of retention
(``resync_required``) — it never answers with a gap. Journaling goes on after
a resync; only what was dropped is gone.

Sizes are estimates of the wire size (audio is base64 on the wire, so its
bytes count 4/3), computed once per event.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields

from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.events import Envelope

_OVERHEAD = 160  # type, ids, seq, fence metadata


def wire_size(env: Envelope) -> int:
    """An estimate of ``env``'s JSON size: cheap, and exact enough for bounds."""
    size = _OVERHEAD
    event = env.event
    for f in fields(event):  # type: ignore[arg-type]
        value = getattr(event, f.name)
        if isinstance(value, (bytes, bytearray)):
            size += len(value) * 4 // 3 + 4
        elif isinstance(value, str):
            size += len(value) + 8
        elif isinstance(value, (dict, list)):
            size += len(repr(value))
        else:
            size += 16
    return size


class JournalBudget:
    """Bytes journaled by every session of a process, against one bound."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used = 0
        self.trimmed_total = 0

    @property
    def over(self) -> bool:
        return self.used > self.max_bytes


@dataclass(frozen=True)
class Replay:
    """The answer to a resume: the events after the cursor, or a resync."""

    events: tuple[Envelope, ...]
    resync: bool  # the cursor fell out of retention: ``events`` is empty
    first_seq: int  # oldest retained seq (head + 1 when none)
    head_seq: int


class Journal:
    def __init__(self, *, max_events: int, max_bytes: int, max_age_s: float,
                 budget: JournalBudget | None = None) -> None:
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.budget = budget or JournalBudget(max_bytes)
        self._items: deque[tuple[Envelope, int, float]] = deque()  # (env, size, at)
        self.bytes = 0
        self.head_seq = 0
        self.acked_seq = 0
        self.trimmed = 0  # dropped by a bound, not by an ack

    @property
    def first_seq(self) -> int:
        return self._items[0][0].seq if self._items else self.head_seq + 1

    def __len__(self) -> int:
        return len(self._items)

    def append(self, env: Envelope, now: float) -> None:
        if env.seq != self.head_seq + 1:
            raise ValueError(f"journal seq {env.seq} after {self.head_seq}")
        size = wire_size(env)
        self._items.append((env, size, now))
        self.head_seq = env.seq
        self._grow(size)
        self.expire(now)
        while len(self._items) > 1 and (len(self._items) > self.max_events or self.bytes > self.max_bytes
                                        or self.budget.over):
            self._drop()

    def expire(self, now: float) -> None:
        """Drop events older than ``max_age_s`` (the newest always stays)."""
        while len(self._items) > 1 and now - self._items[0][2] > self.max_age_s:
            self._drop()

    def ack(self, seq: int) -> int:
        """The client has everything up to ``seq``: forget it. Returns how many
        events were released."""
        if seq > self.head_seq:
            raise DuplexError("invalid_value", f"ack of seq {seq} beyond the last event "
                              f"({self.head_seq})", param="seq")
        self.acked_seq = max(self.acked_seq, seq)
        released = 0
        while self._items and self._items[0][0].seq <= seq:
            _, size, _ = self._items.popleft()
            self._grow(-size)
            released += 1
        return released

    def replay(self, last_seq: int) -> Replay:
        """Events with seq > ``last_seq``; ``invalid_value`` for a cursor past the head."""
        if last_seq > self.head_seq or last_seq < 0:
            raise DuplexError("invalid_value", f"last_seq {last_seq} is not within [0, "
                              f"{self.head_seq}]", param="last_seq")
        first = self.first_seq
        if last_seq + 1 < first:
            return Replay((), True, first, self.head_seq)
        events = tuple(env for env, _, _ in self._items if env.seq > last_seq)
        return Replay(events, False, first, self.head_seq)

    def clear(self) -> None:
        """Release everything (the session closed)."""
        self._grow(-self.bytes)
        self._items.clear()

    def _drop(self) -> None:
        _, size, _ = self._items.popleft()
        self._grow(-size)
        self.trimmed += 1
        self.budget.trimmed_total += 1

    def _grow(self, delta: int) -> None:
        self.bytes += delta
        self.budget.used += delta
