"""Model policies, one sub-package per model family, found by the entry point
group ``vllm_duplex.models``: pure functions of (session view, input) to a
plan and of (stage output) to the steps the session takes (``domain/contracts.py``)
— no I/O, no engine handles.

They see only ``vllm_duplex.domain`` and ``vllm_duplex.policy`` (an
import-linter contract), so a model author needs nothing else.
"""
