"""The events of the text surfaces, typed: what a stateless step, an
application-session turn and a streaming-input generation produce.

Each event is a frozen dataclass; ``TextEvent`` is their union. ``wire()`` is
the one rendering, shared by every transport: the SSE ``data:`` of
``POST /v1/generate`` and the session routes (whose ``event:`` line is the same
``type``, as OpenAI's streams carry it), the frames of ``WS /v1/generate/stream``
and the resumable streams (which store ``type`` and ``data()`` apart, and
give them back to ``from_wire``).

``control`` carries ``waiters``: futures that whoever writes the event resolves
with the seq it got (``/control`` answers where its change took effect).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm_duplex.domain.errors import DuplexError


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int | None = None  # None: the surface does not split reasoning off

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"prompt_tokens": self.prompt_tokens,
                               "completion_tokens": self.completion_tokens,
                               "total_tokens": self.prompt_tokens + self.completion_tokens}
        if self.reasoning_tokens is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.reasoning_tokens}
        return out


@dataclass(frozen=True)
class TextDeltaEvent:
    type: ClassVar[str] = "text-delta"
    delta: str

    def data(self) -> dict[str, Any]:
        return {"delta": self.delta}


@dataclass(frozen=True)
class ReasoningDeltaEvent:
    type: ClassVar[str] = "reasoning-delta"
    delta: str

    def data(self) -> dict[str, Any]:
        return {"delta": self.delta}


@dataclass(frozen=True)
class ToolCallDeltaEvent:
    """A streamed piece of call ``index``: ``name`` on its first delta."""

    type: ClassVar[str] = "tool-call-delta"
    index: int
    id: str
    arguments_delta: str
    name: str | None = None

    def data(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "id": self.id}
        if self.name is not None:
            out["name"] = self.name
        out["arguments_delta"] = self.arguments_delta
        return out


@dataclass(frozen=True)
class ToolCallEvent:
    """A whole call; ``arguments`` is the JSON text of an object."""

    type: ClassVar[str] = "tool-call"
    index: int
    id: str
    name: str
    arguments: str

    def data(self) -> dict[str, Any]:
        return {"index": self.index, "id": self.id, "name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class ControlEvent:
    """A ``/control`` change took effect here, after ``output_tokens``."""

    type: ClassVar[str] = "control"
    applied: Mapping[str, Any]
    output_tokens: int
    waiters: tuple[asyncio.Future[int], ...] = field(default=(), compare=False)

    def data(self) -> dict[str, Any]:
        return {"applied": dict(self.applied), "output_tokens": self.output_tokens}


@dataclass(frozen=True)
class FinishEvent:
    type: ClassVar[str] = "finish"
    request_id: str
    finish_reason: str  # stop | length | tool_calls | cancelled
    usage: Usage

    def data(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "finish_reason": self.finish_reason,
                "usage": self.usage.wire()}


@dataclass(frozen=True)
class ErrorEvent:
    type: ClassVar[str] = "error"
    error: DuplexError

    def data(self) -> dict[str, Any]:
        return {"error": self.error.to_wire()}


TextEvent = (TextDeltaEvent | ReasoningDeltaEvent | ToolCallDeltaEvent | ToolCallEvent
             | ControlEvent | FinishEvent | ErrorEvent)
TERMINAL = (FinishEvent, ErrorEvent)  # exactly one of them ends every generation


def body(type: str, data: Mapping[str, Any]) -> dict[str, Any]:
    """The one rendering of an event: its JSON object, ``type`` first."""
    return {"type": type, **data}


def wire(event: TextEvent) -> dict[str, Any]:
    return body(event.type, event.data())


def from_wire(type: str, data: Mapping[str, Any]) -> TextEvent:
    """An event read back from its ``data`` (a resumable stream stores that)."""
    if type in ("text-delta", "reasoning-delta"):
        return (TextDeltaEvent if type == "text-delta" else ReasoningDeltaEvent)(data["delta"])
    if type == "tool-call-delta":
        return ToolCallDeltaEvent(data["index"], data["id"], data["arguments_delta"], data.get("name"))
    if type == "tool-call":
        return ToolCallEvent(data["index"], data["id"], data["name"], data["arguments"])
    if type == "control":
        return ControlEvent(data["applied"], data["output_tokens"])
    if type == "finish":
        u = data["usage"]
        details = u.get("completion_tokens_details")
        return FinishEvent(data["request_id"], data["finish_reason"], Usage(
            u["prompt_tokens"], u["completion_tokens"],
            details["reasoning_tokens"] if details is not None else None))
    if type == "error":
        e = dict(data["error"])
        known = {k: e.pop(k, None) for k in ("type", "code", "message", "param", "event_id", "retryable")}
        return ErrorEvent(DuplexError(known["code"], known["message"], param=known["param"],
                                      event_id=known["event_id"], details=e))
    raise ValueError(f"unknown text event type {type!r}")


async def collect(events: AsyncIterator[TextEvent]) -> dict[str, Any]:
    """A whole step as one JSON answer (``stream: false``)."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    async for ev in events:
        if isinstance(ev, TextDeltaEvent):
            text.append(ev.delta)
        elif isinstance(ev, ReasoningDeltaEvent):
            reasoning.append(ev.delta)
        elif isinstance(ev, ToolCallEvent):
            calls.append({"id": ev.id, "type": "function", "function": {
                "name": ev.name, "arguments": ev.arguments}})
        elif isinstance(ev, (FinishEvent, ErrorEvent)):
            result = ev.data()
    return {"output": {"text": "".join(text), "reasoning": "".join(reasoning), "tool_calls": calls},
            **result}
