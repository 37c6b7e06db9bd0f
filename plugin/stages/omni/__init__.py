"""The omni stage: one native audio/video model on vLLM (Qwen-Omni, MiniCPM-o)
that takes the user's units and answers in text or speech, with the prompt
dialects of those models (``prompt``).
"""
