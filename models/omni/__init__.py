"""Native omni models (audio + video in, text or speech out): ``OmniPolicy``.

Like every policy it sees only the core and the policy protocol.
"""

from vllm_duplex.models.omni.policy import OmniPolicy

__all__ = ["OmniPolicy"]
