"""The replay journal of a realtime session (sans-I/O), on a ``SeqLog``.

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

from dataclasses import dataclass, fields

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.events import Envelope
from vllm_duplex.replay.seqlog import ByteBudget, SeqBounds, SeqLog

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


# The shared byte budget of every session's journal in a process.
JournalBudget = ByteBudget


@dataclass(frozen=True)
class Replay:
    """The answer to a resume: the events after the cursor, or a resync."""

    events: tuple[Envelope, ...]
    resync: bool  # the cursor fell out of retention: ``events`` is empty
    first_seq: int  # oldest retained seq (head + 1 when none)
    head_seq: int


class Journal:
    """A session's ``SeqLog`` of envelopes; over the shared budget, it trims
    its own oldest events."""

    def __init__(self, *, max_events: int, max_bytes: int, max_age_s: float,
                 budget: JournalBudget | None = None) -> None:
        self.log: SeqLog[Envelope] = SeqLog(SeqBounds(max_events, max_bytes, max_age_s),
                                            budget or JournalBudget(max_bytes))
        self.acked_seq = 0

    @property
    def budget(self) -> JournalBudget:
        return self.log.budget

    @property
    def head_seq(self) -> int:
        return self.log.head_seq

    @property
    def first_seq(self) -> int:
        return self.log.first_seq

    @property
    def bytes(self) -> int:
        return self.log.bytes

    @property
    def trimmed(self) -> int:
        """Events dropped by a bound, not by an ack."""
        return self.log.trimmed

    def __len__(self) -> int:
        return len(self.log)

    def append(self, env: Envelope, now: float) -> int:
        """Journal ``env`` (its seq must follow the head); returns its wire size."""
        log = self.log
        if env.seq != log.head_seq + 1:
            raise ValueError(f"journal seq {env.seq} after {log.head_seq}")
        size = log.append(env, wire_size(env), now).size
        while len(log) > 1 and log.budget.over:
            log.trim_oldest()
        return size

    def expire(self, now: float) -> None:
        """Drop events older than ``max_age_s`` (the newest always stays)."""
        self.log.expire(now)

    def ack(self, seq: int) -> int:
        """The client has everything up to ``seq``: forget it. Returns how many
        events were released."""
        if seq > self.head_seq:
            raise DuplexError("invalid_value", f"ack of seq {seq} beyond the last event "
                              f"({self.head_seq})", param="seq")
        self.acked_seq = max(self.acked_seq, seq)
        return self.log.release_through(seq)

    def replay(self, last_seq: int) -> Replay:
        """Events with seq > ``last_seq``; ``invalid_value`` for a cursor past the head."""
        if last_seq > self.head_seq or last_seq < 0:
            raise DuplexError("invalid_value", f"last_seq {last_seq} is not within [0, "
                              f"{self.head_seq}]", param="last_seq")
        entries = self.log.after(last_seq)
        if entries is None:
            return Replay((), True, self.first_seq, self.head_seq)
        return Replay(tuple(e.item for e in entries), False, self.first_seq, self.head_seq)

    def clear(self) -> None:
        """Release everything (the session closed)."""
        self.log.clear()
