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

from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.durable.store import SessionState, sha
from vllm_duplex.session.runner import DuplexSession


def state_of(session: DuplexSession, settled_input_seq: int | None = None) -> SessionState:
    """What a session is rebuilt from, copied now (items change in place).
    ``settled_input_seq``: the numbered input chunk up to which the input is
    in the conversation (or was cleared): an adopter has the client resend
    what comes after (the audio of a question half sent, which only the dead
    worker had), so that is what is stored as ``last_input_seq``."""
    core = session.core
    last = core.last_input_seq if settled_input_seq is None else settled_input_seq
    return SessionState(config=core.config, items=copy.deepcopy(tuple(core.items)),
                        token_sha=sha(session.resume_token) or "", key_sha=sha(session.api_key),
                        last_input_seq=last, extra_wire=dict(core.extra_wire),
                        incarnation=session.fence.incarnation, epoch=session.fence.epoch)


@dataclass(eq=False)
class RealtimeCopy:
    """``Mirrored`` for a ``DuplexSession``."""

    session: DuplexSession
    kind = "realtime"

    def __post_init__(self) -> None:
        self.settled_input_seq = self.session.core.last_input_seq

    def input_settled(self) -> None:
        """The input buffer was committed or cleared: its chunks so far are
        in the conversation (or meant to be gone)."""
        self.settled_input_seq = self.session.core.last_input_seq

    @property
    def session_id(self) -> str:
        return self.session.session_id

    def durable_state(self) -> SessionState:
        return state_of(self.session, self.settled_input_seq)

    def durable_journal(self) -> Iterator[tuple[int, int, Any]]:
        for entry in self.session.journal.log:
            yield entry.seq, entry.size, entry.item

    async def drop_moved(self) -> None:
        await self.session.close(CloseReason.MOVED)
