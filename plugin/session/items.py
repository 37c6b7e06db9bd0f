"""A session's conversation: its items in order, bounded, found by id.

Pure bookkeeping for the session core: the typed errors a client can cause
(``item_not_found``, a duplicate id, a bad truncate, too many items) are
raised here, and the core turns them into error events.
"""

from __future__ import annotations

from collections.abc import Iterator

from vllm_duplex.domain.conversation import ConversationItem, Role
from vllm_duplex.domain.errors import DuplexError


class ItemStore:
    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._items: list[ConversationItem] = []

    def __iter__(self) -> Iterator[ConversationItem]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def snapshot(self) -> tuple[ConversationItem, ...]:
        return tuple(self._items)

    @property
    def last(self) -> ConversationItem | None:
        return self._items[-1] if self._items else None

    def get(self, item_id: str, param: str = "item_id") -> ConversationItem:
        for item in self._items:
            if item.id == item_id:
                return item
        raise DuplexError("item_not_found", f"no item with id {item_id!r}", param=param)

    def has(self, item_id: str) -> bool:
        return any(i.id == item_id for i in self._items)

    def insert(self, item: ConversationItem, after: str | None = None) -> str | None:
        """Insert a client's or a turn's item (``after``: an item id, "root",
        or None for the end); returns the id of the item before it."""
        if len(self._items) >= self.max_items:
            raise DuplexError("resource_exhausted", "the conversation holds too many items")
        if after is None:
            index = len(self._items)
        elif after == "root":
            index = 0
        else:
            index = self._items.index(self.get(after, param="previous_item_id")) + 1
        self._items.insert(index, item)
        return self._items[index - 1].id if index > 0 else None

    def append(self, item: ConversationItem) -> None:
        """An item of the response in progress (its message, its tool calls)."""
        self._items.append(item)

    def transcribed(self, item_id: str, transcript: str) -> int | None:
        """A user item's final transcript; returns its audio length (None: no
        such item yet -- the commit takes the transcript then)."""
        for item in self._items:
            if item.id == item_id and item.content:
                item.content[0].transcript = transcript
                return item.content[0].audio_ms
        return None

    def delete(self, item_id: str) -> None:
        self._items.remove(self.get(item_id))

    def truncate(self, item_id: str, content_index: int, audio_end_ms: int) -> None:
        """Cut an assistant audio part to what the client played."""
        item = self.get(item_id)
        if item.role is not Role.ASSISTANT:
            raise DuplexError("invalid_value", "only assistant items can be truncated",
                              param="item_id")
        if not 0 <= content_index < len(item.content) or \
                item.content[content_index].type != "output_audio":
            raise DuplexError("invalid_value", "content_index does not name an audio part",
                              param="content_index")
        part = item.content[content_index]
        sent_ms = max(part.audio_ms, part.sent_ms)
        if audio_end_ms > sent_ms:
            raise DuplexError("invalid_value",
                              f"audio_end_ms {audio_end_ms} is beyond the audio ({sent_ms} ms)",
                              param="audio_end_ms")
        part.transcript = part.heard_text(audio_end_ms)
        part.audio_ms = part.sent_ms = audio_end_ms  # the client dropped the rest
