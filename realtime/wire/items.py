"""Conversation items of client events (``conversation.item.create``'s
``item``, ``response.create``'s ``input``) parsed into ``ConversationItem``.

Every bad field raises ``DuplexError`` (``invalid_value`` unless noted) with
``param`` set to the field path; a valid GA item or part this engine cannot
honour is ``unsupported_option`` naming it (``refusals.py``).
"""

from __future__ import annotations

from typing import Any

from vllm_duplex.domain.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.media.data_url import data_url_bytes
from vllm_duplex.realtime.wire.aliases import _MISSING, CONTENT_GA_TO_BETA
from vllm_duplex.realtime.wire.values import _b64, _bad, _obj, _opt_str, _req_str, _str
from vllm_duplex.realtime.wire.mcp_items import MCP_ITEM_TYPES, mcp_item
from vllm_duplex.realtime.wire.refusals import refused

# Content part types each role may send, mapped to the stored (GA) type.
_PART_TYPES: dict[Role, dict[str, str]] = {
    Role.USER: {"input_text": "input_text", "input_audio": "input_audio", "input_image": "input_image"},
    Role.SYSTEM: {"input_text": "input_text"},
    Role.ASSISTANT: {
        "output_text": "output_text",
        "output_audio": "output_audio",
        **{beta: ga for ga, beta in CONTENT_GA_TO_BETA.items()},
    },
}


def _content_part(raw: Any, role: Role, p: str) -> ContentPart:
    part = _obj(raw, p)
    wire_type = part.get("type")
    kind = _PART_TYPES[role].get(wire_type) if isinstance(wire_type, str) else None
    if kind is None:
        raise _bad(f"{p}.type", f"content type {part.get('type')!r} is not valid for role {role.value!r}")
    if kind in ("input_text", "output_text"):
        text = _str(part.get("text"), f"{p}.text")
        return ContentPart(kind, text="" if text is _MISSING else text)
    if kind == "input_image":
        detail = part.get("detail")
        if detail is not None and detail != "auto":
            if detail not in ("low", "high"):
                raise _bad(f"{p}.detail", f'{p}.detail must be "auto", "low" or "high"')
            raise refused(f"{p}.detail", "the vision stage sizes every image itself (auto)")
        url = _str(part.get("image_url"), f"{p}.image_url")
        data_url_bytes(url, f"{p}.image_url")  # validated here; decoded by the session
        return ContentPart(kind, image_url=url)
    transcript = _opt_str(part.get("transcript"), f"{p}.transcript")
    if part.get("audio") is not None:
        _b64(part["audio"], f"{p}.audio")
        if transcript is None:  # the models read words: audio with none would be dropped unheard
            raise refused(f"{p}.audio", "audio in an item is not transcribed; send it with "
                          "input_audio_buffer.append, or give its transcript")
    return ContentPart(kind, transcript=transcript)


def _item(raw: Any, p: str = "item") -> ConversationItem:
    item = _obj(raw, p)
    item_id = _opt_str(item.get("id"), f"{p}.id") or ""
    kind_name = item.get("type")
    if isinstance(kind_name, str) and kind_name in MCP_ITEM_TYPES:
        return mcp_item(item, item_id, ItemType(kind_name), p)
    try:
        kind = ItemType(item.get("type", "message"))
    except (ValueError, TypeError):
        raise _bad(f"{p}.type", f"unsupported item type {item.get('type')!r}") from None
    if kind is ItemType.MESSAGE:
        try:
            role = Role(item.get("role"))
        except (ValueError, TypeError):
            raise _bad(f"{p}.role", 'role must be "user", "assistant" or "system"') from None
        content = item.get("content")
        if content is None:
            content = []
        if not isinstance(content, list):
            raise _bad(f"{p}.content", f"{p}.content must be a list")
        parts = [_content_part(c, role, f"{p}.content[{i}]") for i, c in enumerate(content)]
        return ConversationItem(id=item_id, type=kind, role=role, content=parts)
    if kind is ItemType.FUNCTION_CALL:
        args = _str(item.get("arguments"), f"{p}.arguments")
        return ConversationItem(
            id=item_id,
            type=kind,
            call_id=_opt_str(item.get("call_id"), f"{p}.call_id"),
            name=_req_str(item, "name", f"{p}.name"),
            arguments="" if args is _MISSING else args,
        )
    return ConversationItem(
        id=item_id,
        type=kind,
        call_id=_req_str(item, "call_id", f"{p}.call_id"),
        output=_req_str(item, "output", f"{p}.output"),
    )
