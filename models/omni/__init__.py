"""Native omni models (audio + video in, text or speech out): ``OmniPolicy``."""

from .policy import OmniPolicy

__all__ = ["OmniPolicy"]
