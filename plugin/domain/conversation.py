"""Conversation items and responses, as the session keeps them.

Shapes follow OpenAI Realtime GA (``realtime.item`` / ``realtime.response``);
``wire()`` renders them. Audio is kept as internal PCM so that truncation can
measure what the user actually heard.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.domain.payloads import ContextMessage


class ItemType(str, enum.Enum):
    MESSAGE = "message"
    FUNCTION_CALL = "function_call"
    FUNCTION_CALL_OUTPUT = "function_call_output"
    # Remote MCP tools (domain/mcp.py): the engine lists and calls the server.
    MCP_LIST_TOOLS = "mcp_list_tools"
    MCP_CALL = "mcp_call"
    MCP_APPROVAL_REQUEST = "mcp_approval_request"
    MCP_APPROVAL_RESPONSE = "mcp_approval_response"


class Role(str, enum.Enum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


@dataclass(frozen=True)
class SpokenSegment:
    """A stretch of output audio and the words it speaks (for truncation)."""

    start_ms: int
    end_ms: int
    text: str


@dataclass
class ContentPart:
    """``type`` is one of input_text, input_audio, input_image, output_text,
    output_audio. An ``input_image`` keeps its ``data:`` URL (echoed as given)."""

    type: str
    text: str | None = None
    transcript: str | None = None
    audio_ms: int = 0  # duration of audio that belongs to this part
    # Audio the client was sent: a truncate may reach up to it even after a
    # barge-in cut ``audio_ms`` to the server's estimate of what was heard.
    sent_ms: int = 0
    image_url: str | None = None
    spoken: list[SpokenSegment] = field(default_factory=list)

    def heard_text(self, audio_end_ms: int) -> str:
        """The words a listener heard when playback stopped at ``audio_end_ms``:
        whole segments before it, and a proportional share of the words of
        the segment it cuts through."""
        words: list[str] = []
        for seg in self.spoken:
            seg_words = seg.text.split()
            if seg.end_ms <= audio_end_ms:
                words += seg_words
            elif seg.start_ms < audio_end_ms:
                share = (audio_end_ms - seg.start_ms) / max(1, seg.end_ms - seg.start_ms)
                words += seg_words[: int(len(seg_words) * share)]
        return " ".join(words)

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type in ("input_text", "output_text"):
            out["text"] = self.text or ""
        elif self.type == "input_image":
            out["image_url"] = self.image_url
        else:
            out["transcript"] = self.transcript
        return out


@dataclass
class ConversationItem:
    id: str
    type: ItemType
    role: Role | None = None
    status: str = "completed"
    content: list[ContentPart] = field(default_factory=list)
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    # MCP items
    server_label: str | None = None
    tools: list[dict[str, Any]] | None = None  # mcp_list_tools
    approval_request_id: str | None = None  # mcp_call, mcp_approval_response
    approve: bool | None = None  # mcp_approval_response
    reason: str | None = None  # mcp_approval_response
    error: dict[str, Any] | None = None  # mcp_call: protocol, execution or HTTP error

    def text(self) -> str:
        """The words of this item as the model should see them."""
        if self.type in (ItemType.FUNCTION_CALL, ItemType.MCP_CALL):
            return f"{self.name}({self.arguments})"
        if self.type is ItemType.FUNCTION_CALL_OUTPUT:
            return self.output or ""
        return " ".join(
            (p.text if p.text is not None else p.transcript) or "" for p in self.content
        ).strip()

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "object": "realtime.item", "type": self.type.value}
        if self.type is ItemType.MESSAGE:
            out["role"] = self.role.value if self.role else None
            out["status"] = self.status
            out["content"] = [p.wire() for p in self.content]
        elif self.type is ItemType.FUNCTION_CALL:
            out.update(status=self.status, call_id=self.call_id, name=self.name,
                       arguments=self.arguments or "")
        elif self.type is ItemType.MCP_LIST_TOOLS:
            out.update(server_label=self.server_label, tools=list(self.tools or []))
        elif self.type is ItemType.MCP_CALL:
            out.update(server_label=self.server_label, name=self.name,
                       arguments=self.arguments or "", approval_request_id=self.approval_request_id,
                       output=self.output, error=self.error)
        elif self.type is ItemType.MCP_APPROVAL_REQUEST:
            out.update(server_label=self.server_label, name=self.name,
                       arguments=self.arguments or "")
        elif self.type is ItemType.MCP_APPROVAL_RESPONSE:
            out.update(approval_request_id=self.approval_request_id, approve=bool(self.approve),
                       reason=self.reason)
        else:
            out.update(call_id=self.call_id, output=self.output or "")
        return out


class ResponseStatus(str, enum.Enum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


@dataclass
class Response:
    id: str
    conversation_id: str | None
    output_modalities: tuple[str, ...]
    output_format: dict[str, Any]
    voice: str
    max_output_tokens: int | None = None
    metadata: dict[str, Any] | None = None
    status: ResponseStatus = ResponseStatus.IN_PROGRESS
    status_details: dict[str, Any] | None = None
    output: list[ConversationItem] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "realtime.response",
            "status": self.status.value,
            "status_details": self.status_details,
            "conversation_id": self.conversation_id,
            "output": [i.wire() for i in self.output],
            "output_modalities": list(self.output_modalities),
            "audio": {"output": {"format": self.output_format, "voice": self.voice}},
            "max_output_tokens": "inf" if self.max_output_tokens is None else self.max_output_tokens,
            "metadata": self.metadata,
            "usage": {
                "total_tokens": self.input_tokens + self.output_tokens,
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
            },
        }


# Items the model does not read: the engine acts on them.
_NOT_SEEN = (ItemType.MCP_LIST_TOOLS, ItemType.MCP_APPROVAL_REQUEST, ItemType.MCP_APPROVAL_RESPONSE)


def context_messages(items: Iterable[ConversationItem], instructions: str = "") -> tuple[ContextMessage, ...]:
    """The conversation as the model sees it: instructions, then every item
    with words (truncated items hold only what the user heard)."""
    messages = [ContextMessage("system", instructions)] if instructions else []
    for item in items:
        if item.type is ItemType.MCP_CALL:  # the call and what it gave, as a function's
            if item.output is not None or item.error is not None:
                messages.append(ContextMessage("assistant", item.text(), item.id))
                result = item.output if item.error is None else f"error: {item.error.get('message', '')}"
                messages.append(ContextMessage("tool", result or "", item.id))
            continue
        if item.type in _NOT_SEEN:
            continue
        text = item.text()
        if not text:
            continue
        if item.type is ItemType.FUNCTION_CALL_OUTPUT:
            messages.append(ContextMessage("tool", text, item.id))
        elif item.type is ItemType.FUNCTION_CALL:
            messages.append(ContextMessage("assistant", text, item.id))
        else:
            messages.append(ContextMessage(item.role.value if item.role else "user", text, item.id))
    return tuple(messages)
