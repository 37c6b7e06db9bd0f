"""One session's view of its conversation through the model's context: the
messages ``domain/truncation.py`` keeps when the conversation outgrew it.

Each message's tokens are counted once (the stage's tokenizer, off the event
loop for a long one) and remembered while the conversation holds it; the
count adds the chat template's few tokens around a message (a generous
``TEMPLATE_TOKENS``: counting high truncates a little early, never late).
What the last fit dropped is dropped again first, so the kept prefix stays
the same -- and cached -- until it no longer fits. It is remembered by
conversation item, not by count: a client that deletes an item the model no
longer sees (or inserts one among them) moves nothing the model still sees.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from vllm_duplex.domain.payloads import ContextMessage
from vllm_duplex.domain.truncation import Truncation, fit

# ~0.3 ms on the event loop; longer texts are counted in a worker thread
INLINE_CHARS = 512

TEMPLATE_TOKENS = 8  # <|im_start|>role\n ... <|im_end|>\n is 5 for SmolLM2's template
MAX_REMEMBERED = 4096  # counts kept (a conversation holds fewer messages)


class ContextWindow:
    def __init__(self, encode: Callable[[str], list[int]],
                 off_loop: Callable[..., Awaitable[list[int]]]) -> None:
        self._encode = encode
        self._off_loop = off_loop
        self._counts: dict[tuple[str, str], int] = {}
        self.dropped = 0  # conversation messages the last fit left out
        self.truncations = 0  # fits that dropped more than the one before
        self._dropped_items: set[str] = set()  # the items of those messages

    async def fit(self, messages: Sequence[ContextMessage], truncation: Truncation,
                  room: int) -> tuple[ContextMessage, ...]:
        """The messages that fit ``room`` tokens under ``truncation``."""
        if truncation.type == "disabled":
            return tuple(messages)
        for m in messages:
            key = (m.role, m.text)
            if key not in self._counts:
                ids = (self._encode(m.text) if len(m.text) <= INLINE_CHARS
                       else await self._off_loop(self._encode, m.text))
                self._counts[key] = len(ids) + TEMPLATE_TOKENS
        n_head = next((i for i, m in enumerate(messages) if m.role != "system"), len(messages))
        body = messages[n_head:]
        before = self.dropped
        if self._dropped_items:  # up to the newest message of an item left out before
            before = 1 + max((i for i, m in enumerate(body) if m.item_id in self._dropped_items),
                             default=-1)
        fitted = fit(messages, lambda m: self._counts[(m.role, m.text)], room, truncation,
                     dropped_before=before, is_instructions=lambda m: m.role == "system")
        if fitted.dropped > before:
            self.truncations += 1
        self.dropped = fitted.dropped
        self._dropped_items = {m.item_id for m in body[:fitted.dropped] if m.item_id is not None}
        if len(self._counts) > MAX_REMEMBERED:  # forget what the conversation no longer holds
            held = {(m.role, m.text) for m in messages}
            self._counts = {k: v for k, v in self._counts.items() if k in held}
        return fitted.kept
