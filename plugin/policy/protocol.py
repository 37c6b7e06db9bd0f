"""The model policy protocol: what a model author writes.

A policy is pure: functions of (session view, input) -> plan and
(session view, stage output) -> steps, in the session's own vocabulary
(``domain/contracts.py``). No I/O, no awaits, no engine
handles. One policy object serves every session of a deployment, so what it
remembers about one session lives in that session's *policy state*: a
dataclass the policy makes (``new_state``), the session keeps, and the view
hands back (``view.policy_state``). ``PolicyBase`` (``policy/base.py``)
supplies the optional parts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from vllm_duplex.domain.commands import ResponseOptions
from vllm_duplex.domain.contracts import (
    AppendPlan,
    Capabilities,
    PolicyStep,
    SamplingConfig,
    StageNeeds,
)
from vllm_duplex.domain.conversation import ConversationItem
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import ContextMessage, StageOutput
from vllm_duplex.domain.session_config import SessionConfig

S = TypeVar("S")
S_co = TypeVar("S_co", covariant=True)


class SessionView(Protocol[S_co]):
    """What a policy may read of a session (read-only, except its own state)."""

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
    def output_paused(self) -> bool:
        """The reply's output is paused by speech over it, waiting for the
        policy to interrupt or dismiss (adaptive interruptions)."""
        ...

    @property
    def policy_state(self) -> S_co:
        """This session's state of the policy (what ``new_state`` made): e.g.
        which words were already pushed to the LLM. It dies with the session."""
        ...


class ModelPolicy(Protocol[S]):
    name: str

    def capabilities(self) -> Capabilities: ...

    def stage_needs(self) -> StageNeeds:
        """The stages this policy submits to (checked when a deployment loads)."""
        ...

    def new_state(self) -> S:
        """A fresh per-session state (a dataclass) for a new session."""
        ...

    def configure_sampling_params(
        self, view: SessionView[S], options: ResponseOptions
    ) -> SamplingConfig: ...

    def plan_append(self, view: SessionView[S], payload: Any) -> AppendPlan: ...

    def decide_output(self, view: SessionView[S],
                      output: StageOutput) -> Sequence[PolicyStep]:
        """What ``output`` means, as steps the session carries out in the
        order given (``domain/contracts.py``): e.g. ``[Show(), ForwardTo("tts")]``
        for reply text that is spoken, ``[Show(), CommitTurn(), Respond()]`` for
        server VAD's end of speech, ``DROP`` (no steps) for an output the
        client never sees. The session checks where it is (a ``Respond`` while
        a reply is shown, an ``Interrupt`` with none, a ``CommitTurn`` of an
        empty buffer do nothing), so the policy need not track it."""
        ...

    def shape_context(self, view: SessionView[S],
                      messages: tuple[ContextMessage, ...]) -> tuple[ContextMessage, ...]:
        """The context of a response (e.g. with the newest camera scene added)."""
        ...
