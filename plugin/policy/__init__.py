"""Model policies: the protocol a model author implements, its optional
base class, and the registry that finds installed policies through entry
points.

``from vllm_duplex.policy import PolicyBase, SessionView`` is all a policy
needs besides the core types (``vllm_duplex.domain``). Just above the core, so
policies (``vllm_duplex.models``) never see sessions, stages or engines, and
everything that runs a policy can import the protocol.
"""

from vllm_duplex.policy.base import NoState, PolicyBase
from vllm_duplex.policy.protocol import ModelPolicy, SessionView
from vllm_duplex.policy.registry import (
    ENTRY_POINT_GROUP,
    available_policies,
    load_policy,
    register,
)

__all__ = ["ENTRY_POINT_GROUP", "ModelPolicy", "NoState", "PolicyBase", "SessionView",
           "available_policies", "load_policy", "register"]
