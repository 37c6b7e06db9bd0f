"""Ordering rules of streaming input (sans-I/O), shared by every surface that
takes numbered chunks (``WS /v1/generate/stream``, gRPC ``GenerateStream``,
numbered realtime appends).

Chunks carry ``seq`` 1, 2, 3...: the next expected one is accepted; one
already accepted is a duplicate (a client retrying after a lost ack), which
is acknowledged and ignored; one that skips ahead is ``sequence_gap`` naming
the expected seq, and is not accepted (the client resends from there). After
end-of-input every chunk is ``input_after_end``. Sizes are bounded per chunk
and in total.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from vllm_duplex.domain.errors import DuplexError


class Accepted(str, Enum):
    NEW = "new"
    DUPLICATE = "duplicate"


@dataclass
class InputSequence:
    max_chunk_bytes: int
    max_total_bytes: int
    next_seq: int = 1
    total_bytes: int = 0
    ended: bool = False

    def accept(self, seq: Any, size: int) -> Accepted:
        """Check chunk ``seq`` of ``size`` bytes; raises the typed error."""
        if self.ended:
            raise DuplexError("input_after_end", "input arrived after end-of-input", param="seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise DuplexError("invalid_value", "seq must be an integer >= 1", param="seq")
        if seq < self.next_seq:
            return Accepted.DUPLICATE
        if seq > self.next_seq:
            raise DuplexError("sequence_gap", f"expected seq {self.next_seq}, got {seq}",
                              param="seq", details={"expected_seq": self.next_seq})
        if size > self.max_chunk_bytes:
            raise DuplexError("payload_too_large", f"a chunk holds at most {self.max_chunk_bytes} "
                              "bytes", param="text")
        if self.total_bytes + size > self.max_total_bytes:
            raise DuplexError("payload_too_large", f"the input of one generation is at most "
                              f"{self.max_total_bytes} bytes", param="text")
        self.next_seq += 1
        self.total_bytes += size
        return Accepted.NEW

    def end(self, last_seq: Any = None) -> None:
        """End-of-input; ``last_seq`` (optional) must be the last accepted seq."""
        if self.ended:
            raise DuplexError("input_after_end", "end-of-input was already sent")
        if last_seq is not None and last_seq != self.next_seq - 1:
            raise DuplexError("sequence_gap", f"end says last seq {last_seq}, but the last "
                              f"accepted is {self.next_seq - 1}", param="last_seq",
                              details={"expected_seq": self.next_seq})
        self.ended = True
