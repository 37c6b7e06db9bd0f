"""What the model still sees of a conversation that outgrew its context
(the session's ``truncation``, as OpenAI Realtime has it).

``auto`` (the default) and ``retention_ratio`` drop the oldest messages after
the instructions when the conversation no longer fits the room the model has
(its context less the reply's tokens, or ``token_limits.post_instructions``):
down to ``retention_ratio`` of that room, so the next turns append to a kept
prefix -- one re-prefill now and then, not one every turn. ``auto`` keeps
``AUTO_RETENTION`` of it. ``disabled``: nothing is dropped, and a reply whose
context does not fit fails (``stage_failed``). The instructions (leading
system messages) and the newest message are never dropped.

Pure: ``fit`` takes the token count of each message from its caller (the
LLM stage, whose tokenizer counts them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

# auto: after a truncation the conversation fills three quarters of the room,
# so about a quarter of it -- several turns -- is appended before the next.
AUTO_RETENTION = 0.75

M = TypeVar("M")


@dataclass(frozen=True)
class Truncation:
    type: str = "auto"  # "auto" | "disabled" | "retention_ratio"
    retention_ratio: float = AUTO_RETENTION
    post_instructions: int | None = None  # token_limits.post_instructions

    def __post_init__(self) -> None:
        if self.type not in ("auto", "disabled", "retention_ratio"):
            raise ValueError(f"unknown truncation type {self.type!r}")
        if not 0.0 <= self.retention_ratio <= 1.0:
            raise ValueError("retention_ratio must be within [0, 1]")
        if self.post_instructions is not None and self.post_instructions < 1:
            raise ValueError("token_limits.post_instructions must be >= 1")

    @property
    def retained(self) -> float:
        return AUTO_RETENTION if self.type == "auto" else self.retention_ratio

    def wire(self) -> Any:
        if self.type != "retention_ratio":
            return self.type
        limits = {"post_instructions": self.post_instructions} if self.post_instructions else None
        return {"type": "retention_ratio", "retention_ratio": self.retention_ratio,
                "token_limits": limits}


@dataclass(frozen=True)
class Fitted:
    kept: tuple[Any, ...]  # the instructions, then the conversation from ``dropped`` on
    dropped: int  # conversation messages (after the instructions) left out


def fit(messages: Sequence[M], tokens: Callable[[M], int], room: int, truncation: Truncation,
        *, dropped_before: int = 0, is_instructions: Callable[[M], bool]) -> Fitted:
    """The messages that fit ``room`` tokens. ``dropped_before``: what the
    last fit left out -- left out again first, so the kept prefix is the same
    while it fits (its KV stays cached)."""
    n_head = 0
    while n_head < len(messages) and is_instructions(messages[n_head]):
        n_head += 1
    head, body = tuple(messages[:n_head]), tuple(messages[n_head:])
    if truncation.type == "disabled" or not body:
        return Fitted(head + body, 0)
    budget = room - sum(tokens(m) for m in head)
    if truncation.post_instructions is not None:
        budget = min(budget, truncation.post_instructions)
    start = min(dropped_before, len(body) - 1)
    sizes = [tokens(m) for m in body]
    total = sum(sizes[start:])
    if total > budget:
        target = truncation.retained * budget
        while start < len(body) - 1 and total > target:
            total -= sizes[start]
            start += 1
    return Fitted(head + body[start:], start)
