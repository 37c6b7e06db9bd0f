"""Stand-ins for the read-only ``SessionView`` a pure policy is driven with
(unit tests of ``models/``): a test module subclasses ``PolicyView`` with its
policy's config and state."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.domain.conversation import ConversationItem
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.models.cascade.policy import CascadeState


@dataclass
class PolicyView:
    config: SessionConfig = field(default_factory=lambda: SessionConfig("m", "scripted"))
    items: list[ConversationItem] = field(default_factory=list)
    active_response_id: str | None = None
    user_speaking: bool = False
    policy_state: Any = None
    fence: Fence = field(default_factory=lambda: Fence("s"))
    output_paused: bool = False

    @property
    def output_modalities(self) -> tuple[str, ...]:
        return tuple(self.config.output_modalities)


@dataclass
class CascadeView(PolicyView):
    config: SessionConfig = field(default_factory=lambda: SessionConfig(
        model="m", policy="cascade", instructions="Be brief."))
    policy_state: CascadeState = field(default_factory=CascadeState)
