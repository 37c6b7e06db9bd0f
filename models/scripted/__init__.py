"""The scripted model family: a policy for the deterministic scripted stages
(energy VAD -> scripted LLM -> tone TTS), used by control-plane tests and
benchmarks. Registered as entry point ``scripted`` of ``vllm_duplex.models``.
Like every policy it sees only the core and the policy protocol.
"""

from vllm_duplex.models.scripted.policy import ScriptedPolicy

__all__ = ["ScriptedPolicy"]
