"""vllm_duplex: the duplex control plane, stages and vLLM hooks."""

__version__ = "0.1.0"
