"""``session.instructions.append`` and ``session.thinking.append``: text the
client adds to the append-only context, as a system message item of the
session's conversation (the same ``ItemCreate`` a Realtime client's
``conversation.item.create`` makes, parsed by the Realtime codec).

Instructions are a standing rule, taken as written; thinking is something
the model should know without saying it, so it is framed as such. The
``*.appended`` acknowledgement is sent when the session has added the item
(its ``conversation.item.added``): "accepted into the session timeline".
A ``delegation_id`` must name a client delegation of the session
(``delegated.py`` checks it); ``session.commentary.append`` is
``delegated.py``'s, whose acknowledgement is owed here too (``owe``).
"""

from __future__ import annotations

import itertools
import json
import secrets
from collections.abc import Callable
from typing import Any

from vllm_duplex.domain.commands import ItemCreate
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.codec import RealtimeCodec

APPENDS = {
    "session.instructions.append": ("session.instructions.appended", "{}"),
    "session.thinking.append": ("session.thinking.appended",
                                "Something to know, not to say aloud unless asked: {}"),
}


class Appends:
    def __init__(self, realtime: RealtimeCodec,
                 check_delegation_id: Callable[[Any], object] = lambda raw: None) -> None:
        self._realtime = realtime
        self._check_delegation_id = check_delegation_id
        self._ids = (f"item_live{secrets.token_hex(3)}_{n}" for n in itertools.count(1))
        self._pending: dict[str, tuple[str, str | None]] = {}  # item id -> (ack type, event_id)

    def parse(self, kind: str, obj: dict[str, Any], eid: str | None) -> ItemCreate:
        content = obj.get("content")
        if not isinstance(content, str) or not content.strip():
            raise DuplexError("invalid_value", "content must be a non-empty string",
                              param="content")
        self._check_delegation_id(obj.get("delegation_id"))
        ack, frame = APPENDS[kind]
        item_id = next(self._ids)
        command = self._realtime.parse(json.dumps({
            "type": "conversation.item.create", "event_id": eid,
            "item": {"id": item_id, "type": "message", "role": "system",
                     "content": [{"type": "input_text", "text": frame.format(content)}]}}))
        assert isinstance(command, ItemCreate)
        self.owe(item_id, ack, eid)
        return command

    def owe(self, item_id: str, ack: str, eid: str | None) -> None:
        """Acknowledge with ``ack`` once the session has added ``item_id``."""
        self._pending[item_id] = (ack, eid)

    def added(self, item: dict[str, Any]) -> tuple[str, str | None] | None:
        """The acknowledgement owed for an item the session added, if any."""
        return self._pending.pop(item.get("id", ""), None)
