"""The cascade policy: VAD -> ASR -> LLM (vLLM, streaming input) -> TTS."""

from .policy import CascadePolicy

__all__ = ["CascadePolicy"]
