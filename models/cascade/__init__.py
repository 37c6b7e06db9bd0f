"""The cascade policy: VAD -> ASR -> LLM (vLLM, streaming input) -> TTS."""

from vllm_duplex.models.cascade.policy import CascadePolicy

__all__ = ["CascadePolicy"]
