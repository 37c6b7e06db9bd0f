"""What Twilio has played of the replies, from its ``mark`` echoes. Pure:
no I/O, no clock.

Twilio buffers the audio we send and plays it at real time; it tells us how
far it got only by echoing our marks, each once the audio before it has been
played. So every piece of reply audio goes out followed by a mark, and the
mark names the piece: ``Playout.sent`` returns the name to send and keeps
where that piece lies in its item (ms from the item's start). The echo of a
mark means everything up to its piece's end was heard.

``clear`` (barge-in, or a sideband's ``output_audio_buffer.clear``) drops
what Twilio holds. What the caller heard of the cut item ends where the
first piece still pending begins: every earlier one was echoed, none after
it was played. Twilio echoes the pending marks right after a clear, but those
echoes mean "dropped", not "played": their names are forgotten at the clear,
so the echoes find nothing and change nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    response_id: str
    item_id: str
    start_ms: float  # in its item
    end_ms: float


@dataclass(frozen=True)
class Cut:
    """The item a clear cut off, and how much of it the caller heard."""

    response_id: str
    item_id: str
    heard_ms: int


class Playout:
    def __init__(self) -> None:
        self._pending: OrderedDict[str, Piece] = OrderedDict()  # mark name -> piece, in order
        self._position: dict[str, float] = {}  # item -> where its next audio starts
        self._count = 0

    def sent(self, response_id: str, item_id: str, duration_ms: float) -> str:
        """``duration_ms`` of ``item_id`` went out: the mark to send after it."""
        start = self._position.get(item_id, 0.0)
        end = self._position[item_id] = start + duration_ms
        self._count += 1
        name = f"m{self._count}"
        self._pending[name] = Piece(response_id, item_id, start, end)
        return name

    def seek(self, item_id: str, position_ms: int) -> None:
        """The next audio of ``item_id`` starts at ``position_ms`` (a resumed reply)."""
        self._position[item_id] = float(position_ms)

    def echoed(self, name: str) -> Piece | None:
        """Twilio played up to the mark ``name``: its piece, or None for a
        name that is not pending (a dropped one's, or not ours). Marks come
        back in the order sent, so every piece before it was played too."""
        if name not in self._pending:
            return None
        while True:
            key, piece = self._pending.popitem(last=False)
            if key == name:
                return piece

    def clear(self) -> Cut | None:
        """Forget what Twilio was about to play; the cut item and what was
        heard of it, or None when Twilio had nothing unplayed."""
        if not self._pending:
            return None
        first = next(iter(self._pending.values()))
        self._pending.clear()
        return Cut(first.response_id, first.item_id, int(first.start_ms))

    @property
    def playing(self) -> str | None:
        """The response whose audio Twilio is playing (or holds), if any."""
        return next(iter(self._pending.values())).response_id if self._pending else None

    @property
    def unplayed_ms(self) -> float:
        """How much audio Twilio holds that it has not played (its lead)."""
        return sum(p.end_ms - p.start_ms for p in self._pending.values())

    def forget(self, item_id: str) -> None:
        """The item will get no more audio (its response is done)."""
        self._position.pop(item_id, None)
