"""What the floor shows of an MCP item of the reply (``session/rendering.py``
calls ``render_item``), and a listed MCP tool as the model is offered it.
The decisions are ``mcp_calls.py``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.conversation import ConversationItem, ItemType

if TYPE_CHECKING:
    from vllm_duplex.session.rendering import Scope


@dataclass(frozen=True)
class McpItemShown:
    """A payload of the reply shown: its ``mcp_call`` starting, or its
    ``mcp_approval_request`` (``render_item`` makes the events)."""

    response_id: str
    item: ConversationItem


def function_tool(t: dict[str, Any], about: str | None) -> dict[str, Any]:
    """A listed MCP tool as the function tool the model is offered."""
    description = " ".join(x for x in (about, t.get("description")) if x)
    fn: dict[str, Any] = {"type": "function", "name": t["name"]}
    if description:
        fn["description"] = description
    if isinstance(t.get("input_schema"), dict):
        fn["parameters"] = t["input_schema"]
    return fn


# ---- what the floor shows of an MCP item (session/rendering.py) -----------------------


def render_item(s: Scope, p: McpItemShown) -> list[ev.ServerEvent]:
    """An MCP item joins the reply shown: added (a call with its arguments
    streamed, then in progress; an approval request, done at once)."""
    reply = s.reply(p.response_id)
    if reply is None or reply.record is None:
        return []
    s.latency.first_words(reply.times, s.now)
    record, item = reply.record, p.item
    index, previous = record.add_output(item)
    calling = item.type is ItemType.MCP_CALL
    added = {**item.wire(), "arguments": ""} if calling else item.wire()
    out: list[ev.ServerEvent] = [ev.OutputItemAdded(response_id=reply.id, output_index=index,
                                                    item=added)]
    if record.in_conversation:
        s.conversation.append(item)
        out.append(ev.ConversationItemAdded(item=added, previous_item_id=previous))
    if calling:
        ids = {"response_id": reply.id, "item_id": item.id, "output_index": index}
        return out + [ev.McpCallArgumentsDelta(**ids, delta=item.arguments or ""),
                      ev.McpCallArgumentsDone(**ids, arguments=item.arguments or ""),
                      ev.McpCallInProgress(item_id=item.id, output_index=index)]
    out.append(ev.OutputItemDone(response_id=reply.id, output_index=index, item=item.wire()))
    if record.in_conversation:
        out.append(ev.ConversationItemDone(item=item.wire(), previous_item_id=previous))
    return out
