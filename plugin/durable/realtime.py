"""A realtime session as the writer mirrors it (``Durability.track``).

What a rebuilt realtime session starts from (``state_of``), the events its
journal retains (written again whole when the store lost them), and what
happens to it here when another worker took it over: it closes as ``moved``
(4009), and its sockets with it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from vllm_duplex.core.close_reason import CloseReason
from vllm_duplex.durable.store import SessionState, sha
from vllm_duplex.session.runner import DuplexSession


def state_of(session: DuplexSession) -> SessionState:
    """What a session is rebuilt from, copied now (items change in place)."""
    core = session.core
    return SessionState(config=core.config, items=copy.deepcopy(tuple(core.items)),
                        token_sha=sha(session.resume_token) or "", key_sha=sha(session.api_key),
                        last_input_seq=core.last_input_seq, extra_wire=dict(core.extra_wire),
                        incarnation=session.fence.incarnation, epoch=session.fence.epoch)


@dataclass(eq=False)
class RealtimeCopy:
    """``Mirrored`` for a ``DuplexSession``."""

    session: DuplexSession
    kind = "realtime"

    @property
    def session_id(self) -> str:
        return self.session.session_id

    def durable_state(self) -> SessionState:
        return state_of(self.session)

    def durable_journal(self) -> Iterator[tuple[int, int, Any]]:
        for entry in self.session.journal.log:
            yield entry.seq, entry.size, entry.item

    async def drop_moved(self) -> None:
        await self.session.close(CloseReason.MOVED)
