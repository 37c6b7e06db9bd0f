"""Model policies: the protocol a model author implements, its optional
base class, and the registry that finds installed policies through entry
points.

``from vllm_duplex.policy import PolicyBase, SessionView`` is all a policy
needs besides the core types (``vllm_duplex.core``).
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
