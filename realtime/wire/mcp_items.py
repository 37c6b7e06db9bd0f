"""The MCP items of client events (``conversation.item.create``'s ``item``,
``response.create``'s ``input``): ``mcp_approval_response`` (the client's
answer to an ``mcp_approval_request``: the engine runs or drops the call,
``session/mcp_calls.py``), and ``mcp_call``, ``mcp_list_tools`` and
``mcp_approval_request`` as conversation history a client restores (the
model reads a finished ``mcp_call`` as a tool's call and result).

Every bad field is ``invalid_value`` naming it, as for the other items.
"""

from __future__ import annotations

from typing import Any

from vllm_duplex.domain.conversation import ConversationItem, ItemType
from vllm_duplex.realtime.wire.aliases import _MISSING
from vllm_duplex.realtime.wire.values import _bad, _obj, _opt_str, _req_str, _str

MCP_ITEM_TYPES = frozenset(t.value for t in (ItemType.MCP_CALL, ItemType.MCP_LIST_TOOLS,
                                             ItemType.MCP_APPROVAL_REQUEST,
                                             ItemType.MCP_APPROVAL_RESPONSE))
# The error kinds of an mcp_call, and whether each carries a numeric code.
_ERRORS = {"protocol_error": True, "tool_execution_error": False, "http_error": True}


def _error(raw: Any, p: str) -> dict[str, Any] | None:
    if raw is None:
        return None
    err = _obj(raw, p)
    kind = err.get("type")
    if kind not in _ERRORS:
        raise _bad(f"{p}.type", f'{p}.type must be "protocol_error", "tool_execution_error" '
                   'or "http_error"')
    out: dict[str, Any] = {"type": kind, "message": _opt_str(err.get("message"), f"{p}.message") or ""}
    if _ERRORS[kind]:
        code = err.get("code", 0)
        if isinstance(code, bool) or not isinstance(code, int):
            raise _bad(f"{p}.code", f"{p}.code must be an integer")
        out["code"] = code
    return out


def _tool(raw: Any, p: str) -> dict[str, Any]:
    tool = _obj(raw, p)
    out: dict[str, Any] = {"name": _req_str(tool, "name", f"{p}.name"),
                           "input_schema": tool.get("input_schema")}
    description = _opt_str(tool.get("description"), f"{p}.description")
    if description is not None:
        out["description"] = description
    if tool.get("annotations") is not None:
        out["annotations"] = _obj(tool["annotations"], f"{p}.annotations")
    return out


def mcp_item(item: dict[str, Any], item_id: str, kind: ItemType, p: str) -> ConversationItem:
    if kind is ItemType.MCP_APPROVAL_RESPONSE:
        approve = item.get("approve")
        if not isinstance(approve, bool):
            raise _bad(f"{p}.approve", f"{p}.approve must be a boolean")
        return ConversationItem(id=item_id, type=kind, approve=approve,
                                approval_request_id=_req_str(item, "approval_request_id",
                                                             f"{p}.approval_request_id"),
                                reason=_opt_str(item.get("reason"), f"{p}.reason"))
    label = _req_str(item, "server_label", f"{p}.server_label")
    if kind is ItemType.MCP_LIST_TOOLS:
        tools = item.get("tools")
        if not isinstance(tools, list):
            raise _bad(f"{p}.tools", f"{p}.tools must be a list")
        return ConversationItem(id=item_id, type=kind, server_label=label,
                                tools=[_tool(t, f"{p}.tools[{i}]") for i, t in enumerate(tools)])
    args = _str(item.get("arguments"), f"{p}.arguments")
    out = ConversationItem(id=item_id, type=kind, server_label=label,
                           name=_req_str(item, "name", f"{p}.name"),
                           arguments="" if args is _MISSING else args)
    if kind is ItemType.MCP_CALL:
        out.approval_request_id = _opt_str(item.get("approval_request_id"),
                                           f"{p}.approval_request_id")
        out.output = _opt_str(item.get("output"), f"{p}.output")
        out.error = _error(item.get("error"), f"{p}.error")
    return out
