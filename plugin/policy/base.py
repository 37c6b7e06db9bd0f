"""``PolicyBase``: the optional half of ``ModelPolicy``, written once.

A policy that subclasses it writes only what is particular to its model
(capabilities, the stages it needs, sampling, plans and the steps it answers
outputs with); the session calls every hook directly and never probes a
policy for what it happens to define.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic

from vllm_duplex.domain.commands import ResponseOptions
from vllm_duplex.domain.contracts import (
    AppendPlan,
    Capabilities,
    PolicyStep,
    SamplingConfig,
    StageNeeds,
)
from vllm_duplex.domain.payloads import ContextMessage, StageOutput
from vllm_duplex.policy.protocol import S, SessionView


@dataclass
class NoState:
    """The per-session state of a policy that remembers nothing."""


class PolicyBase(abc.ABC, Generic[S]):
    name: str

    @abc.abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abc.abstractmethod
    def stage_needs(self) -> StageNeeds: ...

    @abc.abstractmethod
    def configure_sampling_params(
        self, view: SessionView[S], options: ResponseOptions
    ) -> SamplingConfig: ...

    @abc.abstractmethod
    def plan_append(self, view: SessionView[S], payload: Any) -> AppendPlan: ...

    @abc.abstractmethod
    def decide_output(self, view: SessionView[S],
                      output: StageOutput) -> Sequence[PolicyStep]: ...

    def new_state(self) -> S:
        """Override to keep per-session state; the default keeps none."""
        return NoState()  # type: ignore[return-value]

    def shape_context(self, view: SessionView[S],
                      messages: tuple[ContextMessage, ...]) -> tuple[ContextMessage, ...]:
        """Override to adjust a response's context; the default is the
        conversation as it is."""
        return messages
