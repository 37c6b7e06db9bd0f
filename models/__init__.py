"""Model policies, one sub-package per model family (entry point group
``vllm_duplex.models``)."""
