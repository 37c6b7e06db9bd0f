"""Native omni models (audio + video in, text or speech out): ``OmniPolicy``."""

from vllm_duplex.models.omni.policy import OmniPolicy

__all__ = ["OmniPolicy"]
