"""The model policy protocol and its registry.

A policy is pure: functions of (session view, input) -> plan and
(session view, stage output) -> decision. No I/O, no awaits, no engine
handles. Policies are found through the entry point group
``vllm_duplex.models``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol

from .commands import ResponseOptions
from .contracts import AppendPlan, Capabilities, OutputDecision, SamplingConfig
from .conversation import ConversationItem
from .fence import Fence
from .session_config import SessionConfig
from .stages.base import StageOutput

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vllm_duplex.models"


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


_REGISTRY: dict[str, type] = {}
_LOADED = False


def register(name: str, cls: type) -> None:
    """Register a policy class by hand (tests, embedding)."""
    _REGISTRY[name] = cls


def _load_entry_points() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            _REGISTRY[ep.name] = ep.load()
        except Exception:  # a broken third-party policy must not take the server down
            log.exception("failed to load policy entry point %s", ep.name)


def available_policies() -> list[str]:
    _load_entry_points()
    return sorted(_REGISTRY)


def load_policy(name: str, **options: Any) -> ModelPolicy:
    _load_entry_points()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise LookupError(
            f"unknown policy {name!r}; installed: {', '.join(sorted(_REGISTRY)) or 'none'}"
        ) from None
    return cls(**options)
