"""The cascade policy: VAD -> ASR -> LLM (vLLM, streaming input) -> TTS.

Like every policy it sees only the core and the policy protocol.
"""

from vllm_duplex.models.cascade.policy import CascadePolicy

__all__ = ["CascadePolicy"]
