"""The model policy protocol: what a model author writes.

A policy is pure: functions of (session view, input) -> plan and
(session view, stage output) -> decision. No I/O, no awaits, no engine
handles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from vllm_duplex.core.commands import ResponseOptions
from vllm_duplex.core.contracts import (
    AppendPlan,
    Capabilities,
    OutputDecision,
    SamplingConfig,
)
from vllm_duplex.core.conversation import ConversationItem
from vllm_duplex.core.fence import Fence
from vllm_duplex.core.payloads import StageOutput
from vllm_duplex.core.session_config import SessionConfig


class SessionView(Protocol):
    """What a policy may read of a session (read-only)."""

    @property
    def fence(self) -> Fence: ...

    @property
    def config(self) -> SessionConfig: ...

    @property
    def items(self) -> Sequence[ConversationItem]: ...

    @property
    def active_response_id(self) -> str | None: ...

    @property
    def user_speaking(self) -> bool: ...

    @property
    def output_modalities(self) -> tuple[str, ...]:
        """The active response's output modalities (the session's when none)."""
        ...

    @property
    def policy_state(self) -> dict[str, Any]:
        """Per-session scratch space owned by the policy (e.g. which words were
        already pushed to the LLM). Policies are shared by all sessions, so
        per-session memory lives here, and dies with the session."""
        ...


class ModelPolicy(Protocol):
    name: str

    def capabilities(self) -> Capabilities: ...

    def configure_sampling_params(
        self, view: SessionView, options: ResponseOptions
    ) -> SamplingConfig: ...

    def plan_append(self, view: SessionView, payload: Any) -> AppendPlan: ...

    def decide_output(self, view: SessionView, output: StageOutput) -> OutputDecision: ...

    # Optional: ``shape_context(view, messages) -> messages`` adjusts the
    # context of a response (e.g. adds the newest camera scene); without it
    # the model gets the conversation as it is.
