"""``session.start``'s ``session.input``: the conversation a session starts
with (the SDK's ``InitialItem``: developer, user and assistant messages,
each of exactly one text part).

Each becomes the item a Realtime client's ``conversation.item.create`` would
make (parsed by the Realtime codec, so it is the same ``ItemCreate``), in
order, before the session hears anything: a developer message is a system
message, a user message ``input_text``, an assistant message
``output_text``. As GPT-Live says, only the role and the text are used: an
item's ``id`` is not kept (the session names its items) and an
``incomplete`` message is history like any other, never resumed.

Everything is checked before the session opens, so a bad history refuses the
``session.start`` (typed, ``param`` naming the field) and leaves nothing.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_duplex.domain.commands import ItemCreate
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.codec import RealtimeCodec

# The SDK's roles, their text part types, and the Realtime message each becomes.
_ROLES: dict[str, tuple[tuple[str, ...], str, str]] = {
    "developer": (("input_text",), "system", "input_text"),
    "user": (("input_text",), "user", "input_text"),
    "assistant": (("text", "output_text"), "assistant", "output_text"),
}
_STATUSES = (None, "completed", "incomplete")


def history_items(raw: Any, realtime: RealtimeCodec) -> tuple[ItemCreate, ...]:
    """``session.input`` as the items to create, in order (typed errors)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _bad("session.input", "session.input must be a list of messages")
    return tuple(_item(item, f"session.input[{i}]", realtime) for i, item in enumerate(raw))


def _item(raw: Any, p: str, realtime: RealtimeCodec) -> ItemCreate:
    if not isinstance(raw, dict):
        raise _bad(p, f"{p} must be an object")
    role = raw.get("role")
    if role not in _ROLES:
        raise _bad(f"{p}.role", 'role must be "developer", "user" or "assistant"')
    if raw.get("type", "message") != "message":
        raise _bad(f"{p}.type", f'{p}.type must be "message"')
    if raw.get("status") not in _STATUSES:
        raise _bad(f"{p}.status", f'{p}.status must be "completed" or "incomplete"')
    if raw.get("id") is not None and not isinstance(raw["id"], str):
        raise _bad(f"{p}.id", f"{p}.id must be a string")
    content = raw.get("content")
    if not isinstance(content, list) or len(content) != 1 or not isinstance(content[0], dict):
        raise _bad(f"{p}.content", f"{p}.content must be exactly one text part")
    part = content[0]
    types, as_role, as_type = _ROLES[role]
    default = types[0] if role != "assistant" else "text"  # the SDK's default per role
    if part.get("type", default) not in types:
        raise _bad(f"{p}.content[0].type", f"a {role} message's text part is of type "
                   f"{' or '.join(repr(t) for t in types)}")
    text = part.get("text")
    if not isinstance(text, str):
        raise _bad(f"{p}.content[0].text", f"{p}.content[0].text must be a string")
    try:
        command = realtime.parse(json.dumps({
            "type": "conversation.item.create",
            "item": {"type": "message", "role": as_role,
                     "content": [{"type": as_type, "text": text}]}}))
    except DuplexError as err:  # the Realtime codec's own limits, named by our field
        raise DuplexError(err.code, err.message, param=f"{p}.content[0].text") from None
    assert isinstance(command, ItemCreate)
    return command


def _bad(param: str, message: str) -> DuplexError:
    return DuplexError("invalid_value", message, param=param)
