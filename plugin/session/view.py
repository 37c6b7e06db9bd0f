"""What the policy may read of a session (``policy.SessionView``), answered
from the session's parts: the gate's fence, the config, the conversation,
the floor's reply and phase, the user's turn, the policy's own state.

The session core is this view (it passes itself to the policy); the
properties live here so the core's file holds what the core does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_duplex.domain.conversation import ConversationItem
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.gate import FenceGate
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.session.floor import Floor
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.phase import Phase
from vllm_duplex.session.reply import Reply
from vllm_duplex.session.user_turn import UserTurn


class SessionViewOfParts:
    gate: FenceGate
    conversation: ItemStore
    floor: Floor
    user: UserTurn
    _config: SessionConfig
    _policy_state: Any
    _generator: str

    @property
    def fence(self) -> Fence:
        return self.gate.fence

    @property
    def config(self) -> SessionConfig:
        return self._config

    @property
    def items(self) -> Sequence[ConversationItem]:
        return self.conversation.snapshot()

    @property
    def active_response_id(self) -> str | None:
        return self.shown.id if self.shown else None

    @property
    def user_speaking(self) -> bool:
        return self.user.speaking

    @property
    def output_modalities(self) -> tuple[str, ...]:
        """What the reply in progress produces: a ``response.create`` may ask
        for other modalities than the session's."""
        shown = self.shown
        if shown is not None and shown.record is not None:
            return shown.record.response.output_modalities
        return tuple(self._config.output_modalities)

    @property
    def policy_state(self) -> Any:
        return self._policy_state

    @property
    def generator(self) -> str:
        """The stage that writes replies."""
        return self._generator

    @property
    def output_paused(self) -> bool:
        """The reply is paused by speech over it (adaptive interruptions)."""
        return self.floor.phase.value is Phase.BARGE_PAUSED

    @property
    def shown(self) -> Reply | None:
        """The reply the client sees (None: none, or one still held)."""
        return self.floor.shown
