"""Reading a policy's steps (``decide_output``) in unit tests of ``models/``."""

from __future__ import annotations

from collections.abc import Sequence

from vllm_duplex.domain.contracts import AppendPlan, PolicyStep, Show


def plan_of(steps: Sequence[PolicyStep]) -> AppendPlan | None:
    """The input the steps cause (None: none); a policy asks for one plan per output."""
    plans = [s for s in steps if type(s) is AppendPlan]
    assert len(plans) <= 1, f"more than one plan: {plans}"
    return plans[0] if plans else None


def kinds(steps: Sequence[PolicyStep]) -> list[type]:
    """The kinds of the steps, in order (what a policy asked for, without the details)."""
    return [type(s) for s in steps]


def shown(steps: Sequence[PolicyStep]) -> bool:
    """The output is shown to the client (as it is, or rendered otherwise)."""
    return any(type(s) is Show for s in steps)


def render_of(steps: Sequence[PolicyStep]) -> object | None:
    """What the output is shown as instead of itself (None: not shown, or shown as it is)."""
    return next((s.render for s in steps if type(s) is Show), None)
